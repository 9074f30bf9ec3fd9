"""Assignment primitives shared by the chain and transformer matchings: the Hungarian
algorithm on a similarity, cosine similarities of activations, inverse permutations.

Convention: ``perm[j]`` is the unit of net b matched to (and moved to) position ``j`` of net a.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor


def invert_permutation(perm: Tensor) -> Tensor:
    """``inv`` with ``inv[perm[j]] = j`` (int64, same device)."""
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(len(perm), device=perm.device, dtype=perm.dtype)
    return inv


def match_units(similarity: Tensor) -> Tensor:
    """The permutation maximising ``sum_j similarity[j, perm[j]]`` (Hungarian algorithm).

    Args:
        similarity: ``[d, d]`` finite scores.
    Returns:
        ``perm`` int64 ``[d]`` on CPU.
    Raises:
        ValueError: if ``similarity`` is not square or holds NaN/inf.
    References:
        Crouse (2016), "On implementing 2D rectangular assignment algorithms", IEEE TAES
        (``scipy.optimize.linear_sum_assignment``).
    """
    if similarity.ndim != 2 or similarity.shape[0] != similarity.shape[1]:
        raise ValueError(f"similarity must be square [d, d] (got {tuple(similarity.shape)})")
    scores = similarity.detach().to("cpu", torch.float64)
    if not torch.isfinite(scores).all():
        raise ValueError("similarity must be finite (got NaN or inf entries)")
    rows, cols = linear_sum_assignment(scores.numpy(), maximize=True)
    perm = np.empty(len(rows), dtype=np.int64)
    perm[rows] = cols
    return torch.from_numpy(perm)


def activation_similarity(
    acts_a: Tensor, acts_b: Tensor, *, center: bool = False, eps: float = 1e-8
) -> Tensor:
    """``S = Â^T B̂``: cosine between unit ``j`` of a and unit ``k`` of b over the n rows.

    ``Â[:, j] = A[:, j] / (||A[:, j]|| + eps)`` (S7 step 2; ``center=True`` subtracts each
    column's mean first, giving Pearson correlations). A dead unit (all-zero column) has
    similarity 0 to every unit. Computed in float64.

    Args:
        acts_a, acts_b: ``[n, d]`` activations of the same inputs.
        center: subtract column means first.
        eps: added to each column norm (S7: 1e-8).
    Returns:
        ``[d, d]`` float64, entries in [-1, 1].
    Raises:
        ValueError: if the shapes are not equal ``[n, d]`` or hold NaN.
    """
    if acts_a.ndim != 2 or acts_a.shape != acts_b.shape:
        raise ValueError(
            f"acts_a and acts_b must both be [n, d] (got {tuple(acts_a.shape)}, "
            f"{tuple(acts_b.shape)})"
        )
    a, b = acts_a.to(torch.float64), acts_b.to(torch.float64)
    if a.isnan().any() or b.isnan().any():
        raise ValueError("acts_a and acts_b must not hold NaN")
    if center:
        a, b = a - a.mean(0), b - b.mean(0)
    a = a / (a.norm(dim=0) + eps)
    b = b / (b.norm(dim=0) + eps)
    return a.mT @ b
