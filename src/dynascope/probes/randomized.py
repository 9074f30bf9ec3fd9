"""Evaluating randomized algorithms: success over seeds, worst-case percentiles, majority votes.

Glossary:
    n         number of evaluation inputs x_i.
    m         number of evaluation seeds r_j (the same m seeds for every input).
    b         number of output bits (5 for associative recall); answers are b-bit integers.
    K         number of answer classes (``2^b`` for bit outputs, 3 colours, ...).
    correct   bool ``[n, m]``: seed j's answer to input i is right.
    s_i       per-input success, ``mean_j correct[i, j]``, in [0, 1] (``[n]``).
    p-th percentile worst case: the p-th percentile over inputs of ``s_i`` (the paper's "95th
              percentile" worst case is ``p = 5``: 95% of inputs succeed at least this often).
    V         predictive variance, ``mean_{i,b} Var_j sigmoid(logit[i, j, b])`` (population
              variance over seeds, divisor m): 0 for a model that ignores its seed.

All functions are pure and batched only as stated; no ``.item()``, no device moves.
Majority vote is a plurality over the K answer classes; ties go to the smallest class id (a
deterministic rule, so a vote never depends on hidden randomness). "Sampled" variants replace
each argmax answer by one drawn from the model's output distribution (per-bit
Bernoulli(sigmoid(logit)) for bit outputs).

References:
    von Oswald, Kobayashi, Akram, Steger (2025), "Learning Randomized Algorithms with
    Transformers", ICLR, arXiv 2408.10818, sec. 4.1 and Table 1 (success, 95th-percentile
    worst case, majority vote, sampled variants), Fig. 2 (predictive variance).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "bits_to_int",
    "majority_vote",
    "per_input_success",
    "predictive_variance",
    "sample_bits",
    "success_percentile",
]


def _check_2d(name: str, value: Tensor) -> None:
    if value.ndim != 2 or value.numel() == 0:
        raise ValueError(
            f"{name} must be a non-empty [n, m] tensor (got shape {list(value.shape)})"
        )


def per_input_success(correct: Tensor) -> Tensor:
    """Fraction of seeds whose answer is right, per input.

    Args:
        correct: bool (or 0/1) ``[n, m]``.
    Returns:
        ``[n]`` floats in [0, 1].
    Raises:
        ValueError: if ``correct`` is not a non-empty 2-D tensor.
    References:
        von Oswald et al. (2025), arXiv 2408.10818, sec. 4.1.
    """
    _check_2d("correct", correct)
    return correct.float().mean(dim=1)


def success_percentile(success: Tensor, percentile: float = 5.0) -> Tensor:
    """The ``percentile``-th percentile over inputs of per-input success (linear interpolation).

    Args:
        success: ``[n]`` per-input success in [0, 1].
        percentile: in [0, 100]; 5 is the paper's "95th percentile" worst case, 0 the minimum.
    Returns:
        Scalar tensor.
    Raises:
        ValueError: if ``success`` is not a non-empty 1-D tensor, or ``percentile`` is outside
            [0, 100].
    References:
        von Oswald et al. (2025), arXiv 2408.10818, Table 1.
    """
    if success.ndim != 1 or success.numel() == 0:
        raise ValueError(
            f"success must be a non-empty [n] tensor (got shape {list(success.shape)})"
        )
    if not 0.0 <= percentile <= 100.0:
        raise ValueError(f"percentile must be in [0, 100] (got percentile={percentile!r})")
    return torch.quantile(success.float(), percentile / 100.0)


def majority_vote(answers: Tensor, n_classes: int) -> Tensor:
    """Plurality answer over seeds per input; ties go to the smallest class id.

    Args:
        answers: int64 ``[n, m]`` class ids in ``[0, n_classes)``.
        n_classes: K, ``>= 1``.
    Returns:
        int64 ``[n]``.
    Raises:
        ValueError: if ``answers`` is not a non-empty 2-D tensor, ``n_classes < 1``, or an
            answer is outside ``[0, n_classes)``.
    References:
        von Oswald et al. (2025), arXiv 2408.10818, Table 1 ("majority").
    """
    _check_2d("answers", answers)
    if n_classes < 1:
        raise ValueError(f"n_classes must be >= 1 (got n_classes={n_classes})")
    if bool((answers < 0).any()) or bool((answers >= n_classes).any()):
        raise ValueError(f"answers must lie in [0, n_classes={n_classes}) (got an answer outside)")
    counts = torch.zeros(answers.shape[0], n_classes, dtype=torch.long, device=answers.device)
    counts.scatter_add_(1, answers, torch.ones_like(answers))
    return counts.argmax(dim=1)  # argmax returns the first maximum: smallest id on ties


def bits_to_int(bits: Tensor) -> Tensor:
    """Read the last axis of 0/1 ``bits [..., b]`` as a binary integer, most significant first.

    Returns:
        int64 ``[...]`` in ``[0, 2^b)``.
    """
    b = bits.shape[-1]
    weights = 2 ** torch.arange(b - 1, -1, -1, device=bits.device)
    return (bits.long() * weights).sum(dim=-1)


def sample_bits(logits: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Per-bit Bernoulli(sigmoid(logit)) samples (the "-sampled" answers).

    Args:
        logits: ``[..., b]``.
        generator: source of randomness (on the logits' device).
    Returns:
        int64 ``[..., b]`` of 0/1.
    """
    u = torch.rand(logits.shape, generator=generator, device=logits.device, dtype=logits.dtype)
    return (u < torch.sigmoid(logits)).long()


def predictive_variance(logits: Tensor) -> Tensor:
    """Variance across seeds of the predicted bit probabilities, averaged over inputs and bits.

    ``V = mean_{i,b} (1/m) sum_j (p_ijb - mean_j p_ijb)^2``, ``p = sigmoid(logits)``.

    Args:
        logits: ``[n, m, b]``.
    Returns:
        Scalar tensor in [0, 1/4]; 0 for ``m = 1`` or a seed-independent model.
    Raises:
        ValueError: if ``logits`` is not a non-empty 3-D tensor.
    References:
        von Oswald et al. (2025), arXiv 2408.10818, Fig. 2 (the paper's exact formula is not
        given; this one is SYSTEMS.md S2's).
    """
    if logits.ndim != 3 or logits.numel() == 0:
        raise ValueError(f"logits must be a non-empty [n, m, b] tensor (got {list(logits.shape)})")
    p = torch.sigmoid(logits)
    return p.var(dim=1, unbiased=False).mean()
