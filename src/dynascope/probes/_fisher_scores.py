"""Per-example scores for the Neural Fisher Kernel and their centring: the JEM and conditional
scores of a classifier and the mean score gradient ``g_bar`` (glossary and score forms in
:mod:`dynascope.probes.fisher`, which re-exports these).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dynascope.probes import _fisher_ops as ops


def jem_score(logits: Tensor) -> Tensor:
    """JEM score ``s(x) = logsumexp_y f(x)_y = -E(x)`` of a classifier, per example.

    Args:
        logits: ``[N, n_classes]``.
    Returns:
        ``[N]``, nats (an unnormalised log-density).
    References:
        Grathwohl et al. (2020), arXiv 1912.03263 (the classifier's energy
        ``E(x) = -logsumexp_y f(x)_y``).
    """
    return torch.logsumexp(logits, dim=-1)


def conditional_score(logits: Tensor, y: Tensor) -> Tensor:
    """Conditional log-likelihood ``log p(y | x) = log softmax(f(x))_y`` per example.

    Args:
        logits: ``[N, n_classes]``.
        y: ``[N]`` integer labels in ``[0, n_classes)`` (the label, or a sample of p(.|x)).
    Returns:
        ``[N]``, nats.
    """
    return torch.log_softmax(logits, dim=-1).gather(-1, y.unsqueeze(-1)).squeeze(-1)


def _params(params: dict[str, Tensor]) -> dict[str, Tensor]:
    if not isinstance(params, dict) or not params:
        raise ValueError(f"params must be a non-empty dict of tensors (got {type(params)})")
    return {k: v.detach() for k, v in params.items()}


def _check_chunk(chunk_size: int | None) -> None:
    if chunk_size is not None and (isinstance(chunk_size, bool) or chunk_size < 1):
        raise ValueError(f"chunk_size must be None or an integer >= 1 (got {chunk_size!r})")


def mean_score_gradient(
    score_fn: ops.ScoreFn, params: dict[str, Tensor], x: Any, *, chunk_size: int | None = None
) -> Tensor:
    """``g_bar = (1/N) sum_i grad_theta s(x_i)`` ``[P]`` by one reverse pass per chunk.

    Pass model samples ``x' ~ p_theta`` as ``x`` for the energy-based score's expectation term;
    the scored set itself for the JEM stand-in.

    Args:
        score_fn: ``score_fn(params, x) -> [N]``.
        params: parameters (detached inside).
        x: ``[N, ...]`` inputs (or a tuple of them).
        chunk_size: examples per reverse pass (memory bound); ``None``: all at once.
    Returns:
        ``[P]`` in the parameters' dtype, flattened in ``params`` order.
    Raises:
        ValueError: for empty ``params``, inconsistent ``x`` or a bad ``chunk_size``.
    """
    params = _params(params)
    _check_chunk(chunk_size)
    n = ops.n_examples(x)
    ref = next(iter(params.values()))
    ones = torch.full((n, 1), 1.0 / n, dtype=ref.dtype, device=ref.device)
    return ops.vjp_columns(score_fn, params, x, ones, chunk_size)[:, 0]


def _centre(score_fn, params, x, center, mean_grad, chunk_size) -> Tensor | None:
    if not center:
        return None
    if mean_grad is None:
        return mean_score_gradient(score_fn, params, x, chunk_size=chunk_size)
    if mean_grad.shape != (ops.n_params(params),):
        raise ValueError(
            f"mean_grad must be [P] with P={ops.n_params(params)} (got {tuple(mean_grad.shape)})"
        )
    return mean_grad
