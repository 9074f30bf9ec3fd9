"""Diagonal linear recurrences ``h_t = a_t ⊙ h_{t-1} + b_t``, h_{-1} = 0: parallel and sequential.

Glossary:
    batch:     leading dimensions (any number, including none).
    pos:       sequence length T, the scanned axis (second to last).
    d_hidden:  number of independent recurrent neurons (last axis).
    a:         decay per neuron, ``[d_hidden]`` (one λ for every step) or ``[..., pos, d_hidden]``
               (one per step); real or complex.
    b:         inputs ``[..., pos, d_hidden]``, same dtype family as ``a``.

The recurrence is the inclusive scan of the associative operator
``(a_1, b_1) ∘ (a_2, b_2) = (a_1 a_2, a_2 b_1 + b_2)``. :func:`linear_scan` evaluates it in
``ceil(log2 T)`` doubling rounds (Hillis & Steele): O(T log T) work, log depth, no division, so
``a = 0`` and ``a = 1`` are exact (a cumulative-product form ``λ^t Σ_s λ^{-s} b_s`` divides by
λ^s and breaks at λ = 0 and loses precision for λ near 0). :func:`sequential_scan` is the plain
loop, the test oracle.

References:
    Hillis & Steele (1986), "Data parallel algorithms", CACM 29(12) (the doubling scan).
    Blelloch (1990), "Prefix sums and their applications", CMU-CS-90-190 (linear recurrences
    as scans, Sec. 1.4).
    Martin & Cundy (2018), "Parallelizing linear recurrent neural nets over sequence length",
    ICLR, arXiv 1709.04057.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["linear_scan", "sequential_scan"]


def _check(a: Tensor, b: Tensor) -> Tensor:
    """Broadcast ``a`` to ``b``'s shape; raise ``ValueError`` on bad shapes."""
    if b.ndim < 2:
        raise ValueError(f"b must have shape [..., pos, d_hidden] (got b.shape={list(b.shape)})")
    try:
        return a.expand_as(b) if a.ndim < 2 else torch.broadcast_to(a, b.shape)
    except RuntimeError:
        raise ValueError(
            f"a must have shape [d_hidden={b.shape[-1]}] or broadcast to b's {list(b.shape)} "
            f"(got a.shape={list(a.shape)})"
        ) from None


def linear_scan(a: Tensor, b: Tensor) -> Tensor:
    """All states of ``h_t = a_t ⊙ h_{t-1} + b_t`` (h before the first step is 0), in parallel.

    Args:
        a: decays, ``[d_hidden]`` (the same at every step) or broadcastable to ``b``.
        b: inputs ``[..., pos, d_hidden]``.
    Returns:
        ``h`` ``[..., pos, d_hidden]``, the dtype of ``a * b``. Differentiable (no in-place ops).
    Raises:
        ValueError: if ``b`` has fewer than 2 dims or ``a`` does not broadcast to it.
    References:
        Hillis & Steele (1986), CACM 29(12); Blelloch (1990), CMU-CS-90-190, Sec. 1.4.
    """
    a = _check(a, b)
    pos = b.shape[-2]
    offset = 1
    while offset < pos:
        # element t absorbs element t - offset: (a, b)[t] <- (a[t-o], b[t-o]) ∘ (a[t], b[t])
        b = torch.cat(
            [b[..., :offset, :], a[..., offset:, :] * b[..., :-offset, :] + b[..., offset:, :]], -2
        )
        a = torch.cat([a[..., :offset, :], a[..., offset:, :] * a[..., :-offset, :]], -2)
        offset *= 2
    return b


def sequential_scan(a: Tensor, b: Tensor) -> Tensor:
    """The same recurrence as :func:`linear_scan`, one step at a time (test oracle).

    Args:
        a: decays, ``[d_hidden]`` or broadcastable to ``b``.
        b: inputs ``[..., pos, d_hidden]``.
    Returns:
        ``h`` ``[..., pos, d_hidden]``.
    Raises:
        ValueError: if ``b`` has fewer than 2 dims or ``a`` does not broadcast to it.
    """
    a = _check(a, b)
    h = torch.zeros_like(a[..., 0, :] * b[..., 0, :])
    states = []
    for t in range(b.shape[-2]):
        h = a[..., t, :] * h + b[..., t, :]
        states.append(h)
    return torch.stack(states, dim=-2)
