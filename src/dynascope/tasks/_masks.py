"""k-hot masks over M modules and the continuous task codes drawn on them, shared by the
modular teacher (:mod:`dynascope.tasks.modular_teacher`, glossary there, which re-exports
them) and the hyperteacher (:mod:`dynascope.tasks.few_shot_hyperteacher`).
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor


def k_hot_masks(h: int, n_modules: int) -> Tensor:
    """All C(M, h) masks with h ones, ``[C(M, h), M]``, in lexicographic order of indices.

    Raises:
        ValueError: unless ``1 <= h <= n_modules``.
    """
    if not 1 <= h <= n_modules:
        raise ValueError(f"h must be in [1, n_modules={n_modules}] (got h={h})")
    combos = list(itertools.combinations(range(n_modules), h))
    masks = torch.zeros(len(combos), n_modules)
    for row, combo in enumerate(combos):
        masks[row, list(combo)] = 1.0
    return masks


def continuous_codes(masks: Tensor, generator: torch.Generator) -> Tensor:
    """``z = (0.5 w + 0.5) ⊙ mask``, ``w = e / (sum e + 1)``, ``e ~ Exp(1)^M ⊙ mask``.

    Args:
        masks: ``[tasks, M]`` 0/1 on the generator's device.
    Returns:
        ``[tasks, M]``: 0 off the mask, in (0.5, 1) on it.
    References:
        Reference ``run_theory.py`` (``SparseData.__call__``; Willms 2021, uniform simplex).
    """
    u = torch.rand(masks.shape, generator=generator, device=masks.device)
    e = -torch.log1p(-u) * masks  # Exp(1) by inversion
    w = e / (e.sum(-1, keepdim=True) + 1)
    return (0.5 * w + 0.5) * masks
