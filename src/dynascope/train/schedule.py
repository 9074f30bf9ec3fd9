"""The learning-rate schedule: one implementation for every run.

The schedule multiplies the optimizer's base learning rate by a factor ``f(t)``, where ``t`` is
the number of optimizer updates already made (``t = 0`` for the first update, so step ``s`` of
the engine uses ``f(s - 1)``):

    warm-up   (t < warmup_steps):  f = (t + 1) / warmup_steps
    constant:                      f = 1
    cosine:                        f = final + (1 - final) * (1 + cos(pi * min(1, u))) / 2
    linear:                        f = 1 - (1 - final) * min(1, u)
    with u = (t - warmup_steps) / max(1, total_steps - warmup_steps), final = ``final_lr_frac``.

So the first update runs at ``1 / warmup_steps`` of the base rate and update ``warmup_steps``
at the full rate; cosine and linear decay reach ``final_lr_frac`` at the last update
(0 by default, as PyTorch's and Hugging Face's cosine schedules).

References:
    Loshchilov & Hutter (2017), "SGDR: Stochastic Gradient Descent with Warm Restarts",
        arXiv 1608.03983, Eq. 5 (cosine annealing).
    Goyal et al. (2017), "Accurate, Large Minibatch SGD", arXiv 1706.02677, §2.2 (warm-up).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["LRSchedule", "lr_factor"]

ScheduleKind = Literal["constant", "cosine", "linear"]


class LRSchedule(BaseModel):
    """Which schedule and its parameters (module docstring for the formulas)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: ScheduleKind = "constant"
    warmup_steps: int = Field(0, ge=0, description="updates of linear warm-up")
    final_lr_frac: float = Field(0.0, ge=0, le=1, description="factor at the end of the decay")

    def factor(self, t: int, total_steps: int) -> float:
        """The factor for update ``t`` (0-based) of a run of ``total_steps`` updates."""
        return lr_factor(t, total_steps, self.kind, self.warmup_steps, self.final_lr_frac)


def lr_factor(
    t: int,
    total_steps: int,
    kind: ScheduleKind = "constant",
    warmup_steps: int = 0,
    final_lr_frac: float = 0.0,
) -> float:
    """Learning-rate factor of update ``t`` (module docstring).

    Args:
        t: updates already made (0-based index of this update), ``t >= 0``.
        total_steps: the run's number of updates.
        kind: ``constant``, ``cosine`` or ``linear``.
        warmup_steps: linear warm-up length in updates (0: none).
        final_lr_frac: the factor the decay ends at.
    Returns:
        The dimensionless factor, in ``(0, 1]`` during warm-up, ``[final_lr_frac, 1]`` after.
    Raises:
        ValueError: for an unknown ``kind``.
    """
    if warmup_steps and t < warmup_steps:
        return (t + 1) / warmup_steps
    if kind == "constant":
        return 1.0
    progress = min(1.0, (t - warmup_steps) / max(1, total_steps - warmup_steps))
    if kind == "cosine":
        return final_lr_frac + (1.0 - final_lr_frac) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if kind == "linear":
        return 1.0 - (1.0 - final_lr_frac) * progress
    raise ValueError(f"schedule kind must be one of constant, cosine, linear (got {kind!r})")
