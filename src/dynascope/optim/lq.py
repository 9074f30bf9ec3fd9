"""The Lq objective over inputs of the seed-averaged loss (learned randomized algorithms).

Glossary:
    n        number of inputs x_1..x_n (``n_inputs``).
    m        number of random seeds r_1..r_m, the same m seeds for every input (``m_seeds``).
    L_ij     loss of the model on input i with seed j, ``L_ij >= 0``; ``losses [n, m]``.
    l_i      seed-averaged loss of input i, ``(1/m) sum_j L_ij``.
    q        the norm's exponent, ``1 <= q <= inf``.

Objective (von Oswald et al. 2025, eq. 5)::

    L_q = ((1/n) sum_i l_i^q)^(1/q)

q = 1 is the expected loss (ERM); q -> inf is ``max_i l_i``, the loss against an oblivious
adversary that picks the worst input after seeing the algorithm but not its seeds. For large q
the direct formula overflows or underflows; with ``M = max_i l_i`` it is computed as
``M * ((1/n) sum_i (l_i / M)^q)^(1/q)`` (same value; ``M`` is not detached, so its gradient
flows). Every ratio is in [0, 1] and the mean is at least 1/n, so the result is finite for any q.

References:
    von Oswald, Kobayashi, Akram, Steger (2025), "Learning Randomized Algorithms with
    Transformers", ICLR, arXiv 2408.10818, eq. (5) and sec. 3.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["lq_loss"]


def lq_loss(losses: Tensor, q: float, *, validate: bool = True) -> Tensor:
    """Lq norm over inputs of the seed-averaged loss, computed stably.

    Args:
        losses: ``[n_inputs, m_seeds]``, non-negative per-(input, seed) losses (any unit; the
            result has the same unit). A 1-D ``[n_inputs]`` tensor is read as ``m_seeds = 1``.
        q: exponent, a real ``>= 1`` or ``math.inf`` (then the result is ``max_i l_i``).
        validate: check the losses' values (finite, non-negative); this reads them back to the
            host, so a GPU training loop may pass False once its losses are known to be sound.
    Returns:
        Scalar tensor ``((1/n) sum_i l_i^q)^(1/q)``, ``l_i = mean_j losses[i, j]``; 0 when every
        loss is 0 (gradient 0 there).
    Raises:
        ValueError: if ``q`` is not a number ``>= 1`` (or inf); if ``losses`` is not 1-D or 2-D,
            is empty, or (with ``validate``) holds a negative, inf or NaN entry.
    References:
        von Oswald et al. (2025), arXiv 2408.10818, eq. (5).
    """
    if isinstance(q, bool) or not isinstance(q, int | float) or math.isnan(q) or q < 1:
        raise ValueError(f"q must be a number >= 1 or math.inf (got q={q!r})")
    if losses.ndim not in (1, 2) or losses.numel() == 0:
        raise ValueError(
            "losses must be a non-empty [n_inputs, m_seeds] tensor "
            f"(got shape {list(losses.shape)})"
        )
    if validate and (not bool(torch.isfinite(losses).all()) or bool((losses < 0).any())):
        raise ValueError(
            "losses must be finite and non-negative (got a negative, inf or NaN entry)"
        )
    per_input = losses.mean(dim=-1) if losses.ndim == 2 else losses  # [n_inputs]
    top = per_input.max()
    if math.isinf(q):
        return top
    # All losses 0: the value is 0 and so is its gradient. Written with torch.where (no
    # host sync); the branch not taken is kept finite so no NaN reaches the gradient.
    positive = top > 0
    safe_top = torch.where(positive, top, torch.ones_like(top))
    mean = (per_input / safe_top).pow(q).mean()  # ratios in [0, 1]; mean >= 1/n when positive
    safe_mean = torch.where(positive, mean, torch.ones_like(mean))
    return torch.where(positive, safe_top * safe_mean.pow(1.0 / q), torch.zeros_like(top))
