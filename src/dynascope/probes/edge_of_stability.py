"""The edge of stability of gradient descent, momentum and Adam: each optimizer's stability
threshold, and Adam's preconditioner P, whose preconditioned sharpness λ_max(P⁻¹H) Adam's
threshold bounds (computed by :func:`~dynascope.probes.preconditioned_sharpness`).

Glossary:
    η:        the learning rate (one value over the optimizer's param_groups).
    H:        the ``[P, P]`` Hessian of the training loss (never formed; Hessian-vector products).
    λ_max(H): the sharpness, H's largest algebraic eigenvalue.
    v̂:        Adam's bias-corrected second moment, ``v̂ = exp_avg_sq / (1 − β₂^t)`` after ``t``
              steps (``max_exp_avg_sq`` with ``amsgrad``), elementwise, the shape of each tensor.
    P:        Adam's diagonal preconditioner ``P = diag(√v̂ + ε)``: the update is
              ``θ ← θ − η m̂ / (√v̂ + ε) = θ − η P⁻¹ m̂`` (torch's ``Adam``/``AdamW``, exactly).
    λ_max(P⁻¹H): the preconditioned sharpness. P⁻¹H is not symmetric, but it is similar to
              ``P^{-1/2} H P^{-1/2}`` (conjugate by ``P^{1/2}``), which is: both have the same
              real spectrum, and the second is the Hessian of the loss in the coordinates
              ``u = P^{1/2} θ``, so the Lanczos of ``hessian_top_eigenvalues`` applies as is.

Thresholds: on a quadratic with curvature ``a`` along an eigenvector, each optimizer is a linear
recurrence, stable iff ``a`` is below (Cohen et al. 2021, §3 and Appendix; 2022, §2):

    gradient descent                 a < 2/η
    heavy-ball momentum β, dampening d  a < (2 + 2β) / ((1 − d) η)     (torch SGD, nesterov=False)
    Nesterov momentum β              a < (2 + 2β) / ((1 + 2β) η)        (torch SGD, nesterov=True)
    Adam, β₁, P frozen               a < (2 + 2β₁) / ((1 − β₁) η)      for a = eigenvalue of P⁻¹H
                                     (= 38/η at β₁ = 0.9)

The heavy-ball line: ``θ_{t+1} = θ_t − η a θ_t + β(θ_t − θ_{t−1})`` has characteristic polynomial
``z² − (1 + β − η a) z + β``, whose root crosses ``z = −1`` at ``η a = 2 + 2β``. Adam's first
moment ``m ← β₁ m + (1 − β₁) g`` is heavy-ball momentum with step ``(1 − β₁) η``. What these
thresholds leave out: Adam's bias correction of ``m`` (a factor ``1/(1 − β₁^t)`` on the step,
below 1.01 once ``t ≥ 44`` at β₁ = 0.9), the change of P between steps, and weight decay
(torch's coupled ``weight_decay`` adds ``wd·I`` to the Hessian of what is minimized; AdamW's
decoupled decay multiplies θ by ``1 − η·wd``). Include an L2 term in the loss you probe if it
is part of the objective.

References:
    Cohen, Kaur, Li, Kolter & Talwalkar (2021), "Gradient Descent on Neural Networks Typically
    Occurs at the Edge of Stability", ICLR, arXiv 2103.00065 (2/η, §3; momentum, Appendix).
    Cohen, Ghorbani, Krishnan, Agarwal, Medapati, Badura, Suo, Cardoze, Nado, Dahl & Gilmer
    (2022), "Adaptive Gradient Methods at the Edge of Stability", arXiv 2207.14484
    (preconditioned sharpness λ_1(P⁻¹H) and the threshold (2 + 2β₁)/((1 − β₁)η), §2–3).
    Kingma & Ba (2015), "Adam: A Method for Stochastic Optimization", ICLR, arXiv 1412.6980.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = [
    "THRESHOLD_OPTIMIZERS",
    "StabilityThreshold",
    "adam_preconditioner",
    "stability_threshold",
]

_ADAPTIVE = (torch.optim.Adam, torch.optim.AdamW)
THRESHOLD_OPTIMIZERS = (torch.optim.SGD, *_ADAPTIVE)
"""Optimizer classes :func:`stability_threshold` knows (and their subclasses)."""


class StabilityThreshold(NamedTuple):
    """The result of :func:`stability_threshold`.

    Attributes:
        value: the largest stable curvature, loss units per parameter unit squared (the unit
            of H's eigenvalues; of P⁻¹H's when ``preconditioned``).
        preconditioned: whether ``value`` bounds λ_max(P⁻¹H) (Adam, AdamW) rather than λ_max(H).
        rule: the formula with its numbers, e.g. ``"(2 + 2β)/η, β=0.9, η=0.1"``.
    """

    value: float
    preconditioned: bool
    rule: str


def _shared(optimizer: torch.optim.Optimizer, key: str) -> object:
    values = {repr(group[key]) for group in optimizer.param_groups}
    if len(values) != 1:
        raise ValueError(
            f"the optimizer's param_groups must share one {key} for a stability threshold "
            f"(got {sorted(values)})"
        )
    return optimizer.param_groups[0][key]


def stability_threshold(optimizer: torch.optim.Optimizer | float) -> StabilityThreshold:
    """The optimizer's edge of stability: the largest curvature its update is stable on.

    A float is the step size η of plain gradient descent: ``2/η``. ``torch.optim.SGD``:
    ``2/η`` without momentum, ``(2 + 2β)/((1 − d)η)`` with heavy-ball momentum β and dampening
    d, ``(2 + 2β)/((1 + 2β)η)`` with Nesterov momentum. ``torch.optim.Adam``/``AdamW``:
    ``(2 + 2β₁)/((1 − β₁)η)`` on the preconditioned sharpness (38/η at β₁ = 0.9). Derivations
    and what they leave out: module docstring. Hyperparameters are read now (schedules are
    followed).

    Args:
        optimizer: an optimizer of a class in :data:`THRESHOLD_OPTIMIZERS`, or η > 0.
    Returns:
        :class:`StabilityThreshold` ``(value, preconditioned, rule)``.
    Raises:
        ValueError: if η is not a finite number > 0; if the optimizer is of another class
            (the message names it and the supported ones); if its param_groups differ in
            ``lr``, ``momentum``, ``dampening``, ``nesterov`` or ``betas``.
    References:
        Cohen et al. (2021), arXiv 2103.00065, §3 and Appendix; Cohen et al. (2022),
        arXiv 2207.14484, §2.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        lr = optimizer
        if isinstance(lr, bool) or not isinstance(lr, int | float) or not 0 < lr < math.inf:
            raise ValueError(f"lr must be a finite float > 0 or an optimizer (got lr={lr!r})")
        return StabilityThreshold(2.0 / lr, False, f"2/η, η={lr:g}")
    if not isinstance(optimizer, THRESHOLD_OPTIMIZERS):
        names = ", ".join(f"torch.optim.{c.__name__}" for c in THRESHOLD_OPTIMIZERS)
        raise ValueError(f"stability_threshold knows {names} (got {type(optimizer).__name__})")
    lr = float(_shared(optimizer, "lr"))  # type: ignore[arg-type]
    if isinstance(optimizer, _ADAPTIVE):
        beta1 = float(_shared(optimizer, "betas")[0])  # type: ignore[index]
        value = (2 + 2 * beta1) / ((1 - beta1) * lr)
        return StabilityThreshold(value, True, f"(2 + 2β₁)/((1 − β₁)η), β₁={beta1:g}, η={lr:g}")
    beta = float(_shared(optimizer, "momentum"))  # type: ignore[arg-type]
    if beta == 0:
        return StabilityThreshold(2.0 / lr, False, f"2/η, η={lr:g}")
    if _shared(optimizer, "nesterov"):
        value = (2 + 2 * beta) / ((1 + 2 * beta) * lr)
        return StabilityThreshold(value, False, f"(2 + 2β)/((1 + 2β)η), β={beta:g}, η={lr:g}")
    damp = float(_shared(optimizer, "dampening"))  # type: ignore[arg-type]
    value = (2 + 2 * beta) / ((1 - damp) * lr) if damp < 1 else math.inf
    return StabilityThreshold(
        value, False, f"(2 + 2β)/((1 − d)η), β={beta:g}, d={damp:g}, η={lr:g}"
    )


def adam_preconditioner(
    optimizer: torch.optim.Optimizer, params: dict[str, Tensor]
) -> dict[str, Tensor]:
    """Adam's diagonal preconditioner ``P = √v̂ + ε`` for each tensor of ``params``, now.

    ``v̂ = v / (1 − β₂^t)`` with ``v`` the state's ``exp_avg_sq`` (``max_exp_avg_sq`` when the
    group has ``amsgrad``), ``t`` the state's ``step``, and β₂, ε the tensor's group's: the
    denominator torch's Adam and AdamW divide the step by.

    Args:
        optimizer: a ``torch.optim.Adam`` or ``AdamW`` (or subclass) that has taken a step.
        params: name -> tensor; each must be one of the optimizer's parameters (the same
            tensor object, e.g. from ``model.named_parameters()``).
    Returns:
        name -> P, the shape, dtype and device of ``params[name]``; every entry ≥ ε.
    Raises:
        ValueError: if the optimizer is not Adam/AdamW (the message names it and what is
            supported); if a tensor is not among its parameters, or has no second-moment
            state yet (take a step first).
    References:
        Kingma & Ba (2015), arXiv 1412.6980, Algorithm 1; Cohen et al. (2022), arXiv
        2207.14484, §2 (P = diag(√v̂ + ε)).
    """
    if not isinstance(optimizer, _ADAPTIVE):
        raise ValueError(
            "preconditioned sharpness needs an optimizer with a second-moment state: "
            f"torch.optim.Adam or torch.optim.AdamW (got {type(optimizer).__name__})"
        )
    group_of = {id(p): group for group in optimizer.param_groups for p in group["params"]}
    out = {}
    for name, p in params.items():
        group = group_of.get(id(p))
        if group is None:
            raise ValueError(f"params[{name!r}] is not a parameter of the optimizer")
        state = optimizer.state.get(p, {})
        key = "max_exp_avg_sq" if group["amsgrad"] else "exp_avg_sq"
        if key not in state:
            raise ValueError(
                f"params[{name!r}] has no Adam second moment yet ({key}): take an optimizer "
                "step before measuring the preconditioned sharpness"
            )
        t = float(state["step"])
        v_hat = state[key].detach().double() / (1 - group["betas"][1] ** t)
        out[name] = (v_hat.sqrt() + group["eps"]).to(dtype=p.dtype, device=p.device)
    return out
