"""Per-query attention entropy, in nats and normalised by the log of the valid keys, with the
mask checks (glossary and the undefined cases in :mod:`dynascope.probes.attention`, which
re-exports these).

References:
    Zhai et al. (2023), "Stabilizing Transformer Training by Preventing Attention Entropy
    Collapse", ICML, arXiv 2303.06296, sec. 3 (attention entropy ``Ent(A_i)``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

_SUM_TOL = 1e-3


def _sum_tol(dtype: torch.dtype) -> float:
    """Row-sum tolerance: 1e-3, or ``4 eps`` of a coarser dtype (float16 3.9e-3, bf16 3.1e-2)."""
    return max(_SUM_TOL, 4 * torch.finfo(dtype).eps)


def _check_mask(mask: Tensor, shape: torch.Size, name: str) -> None:
    if mask.dtype != torch.bool:
        raise ValueError(f"{name} must be a bool tensor (got dtype {mask.dtype})")
    try:
        broadcast = torch.broadcast_shapes(mask.shape, shape)
    except RuntimeError:
        broadcast = None
    if broadcast != shape:
        raise ValueError(
            f"{name} must be broadcastable to shape {tuple(shape)} (got {tuple(mask.shape)})"
        )


def _entropy_and_counts(pattern: Tensor, mask: Tensor | None, eps: float) -> tuple[Tensor, Tensor]:
    """``(H, T)``: entropy per query (NaN where no valid key) and valid-key counts, validated."""
    if not (isinstance(pattern, Tensor) and pattern.is_floating_point() and pattern.ndim >= 3):
        got = f"{pattern.dtype}, {tuple(pattern.shape)}" if isinstance(pattern, Tensor) else pattern
        raise ValueError(
            "pattern must be a floating-point tensor [*batch, n_heads, query_pos, key_pos] "
            f"(got {got})"
        )
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be finite and >= 0 (got eps={eps})")
    dtype = torch.float64 if pattern.dtype == torch.float64 else torch.float32
    p = pattern.to(dtype)
    if mask is None:
        counts = torch.full(p.shape[:-1], p.shape[-1], dtype=dtype, device=p.device)
    else:
        _check_mask(mask, pattern.shape, "mask")
        mask = mask.to(p.device)
        p = torch.where(mask, p, torch.zeros((), dtype=dtype, device=p.device))
        counts = mask.expand(p.shape).sum(dim=-1).to(dtype)
    n_negative, n_nan, n_inf = int((p < 0).sum()), int(p.isnan().sum()), int(p.isinf().sum())
    if n_negative or n_nan or n_inf:
        raise ValueError(
            "pattern must be finite and non-negative at valid keys "
            f"(got {n_negative} negative, {n_nan} NaN, {n_inf} infinite entries)"
        )
    has_key = counts > 0
    error = torch.where(has_key, (p.sum(dim=-1) - 1).abs(), 0.0)
    tol = _sum_tol(pattern.dtype)
    n_off = int((error > tol).sum())
    if n_off:
        raise ValueError(
            f"pattern rows must sum to 1 over valid keys within {tol:g} (got {n_off} rows off, "
            f"largest |sum - 1| = {float(error.max()):.3g})"
        )
    if eps == 0:
        entropy = -torch.special.xlogy(p, p).sum(dim=-1)
    else:
        entropy = -(p * torch.log(p + eps)).sum(dim=-1)
    entropy = torch.where(has_key, entropy, math.nan)
    return entropy, counts


def attention_entropy(pattern: Tensor, mask: Tensor | None = None, *, eps: float = 0.0) -> Tensor:
    """Entropy of each query's attention, ``H_i = -sum_j A_ij log A_ij`` over valid keys, nats.

    Computed with ``xlogy`` so ``0 log 0 = 0``; ``0 <= H_i <= log T_i`` up to rounding (rows are
    checked, not renormalised: within the row-sum tolerance ``H_i`` can leave the interval by
    O(tolerance)). The pattern's entries lie in ``[0, 1]`` whatever the logits were, so huge
    logits (a softmax of 1e30-scaled scores: one-hot rows) give finite results.

    Args:
        pattern: ``[*batch, n_heads, query_pos, key_pos]``, floating point; each row non-negative
            and summing to 1 over its valid keys within 1e-3 (``4 eps`` for float16/bfloat16,
            whose patterns are computed in float32 here).
        mask: optional bool keys-valid mask broadcastable to ``pattern`` (True = may attend),
            e.g. a causal ``[query_pos, key_pos]`` tril or padding ``[batch, 1, 1, key_pos]``.
            Entries at invalid keys are ignored, whatever they hold.
        eps: 0 for the exact entropy; ``eps > 0`` computes ``-sum_j A_ij log(A_ij + eps)``,
            the reference code's form (it logs with ``eps=1e-6``).
    Returns:
        ``[*batch, n_heads, query_pos]`` entropy in nats; float64 for float64 input, else float32.
        A query with no valid key gives NaN.
    Raises:
        ValueError: if ``pattern`` is not floating point with at least 3 dims; if ``mask`` is not
            bool or not broadcastable to ``pattern``; if ``eps`` is negative or not finite; if an
            entry at a valid key is negative, NaN or infinite; if a row with a valid key does not
            sum to 1 within the tolerance.
    References:
        Zhai et al. (2023), "Stabilizing Transformer Training by Preventing Attention Entropy
        Collapse", arXiv 2303.06296, sec. 3.
    """
    return _entropy_and_counts(pattern, mask, eps)[0]


def normalized_attention_entropy(
    pattern: Tensor, mask: Tensor | None = None, *, eps: float = 0.0
) -> Tensor:
    """Normalised entropy ``H_i / log T_i`` in ``[0, 1]``: 1 uniform, 0 one-hot.

    ``T_i`` is the number of valid keys of query ``i`` (``key_pos``, or ``i + 1`` under a causal
    mask), so a causal model's early queries are measured against their own maximum.

    Args:
        pattern, mask, eps: as :func:`attention_entropy`.
    Returns:
        ``[*batch, n_heads, query_pos]``, dimensionless. NaN where ``T_i <= 1``: no valid key, or
        a single one (``0 / log 1``; a forced one-hot row is not a collapse).
    Raises:
        ValueError: as :func:`attention_entropy`.
    References:
        Zhai et al. (2023), arXiv 2303.06296 (maximum entropy ``log T``).
    """
    entropy, counts = _entropy_and_counts(pattern, mask, eps)
    defined = counts > 1
    return torch.where(defined, entropy / torch.where(defined, counts, 2.0).log(), math.nan)
