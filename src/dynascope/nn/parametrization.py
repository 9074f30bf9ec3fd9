"""abc-parametrizations (standard, NTK, muP) and their per-parameter learning rates.

Glossary (everything right-multiplies, ``x @ W``; ``nn.Linear`` stores ``[fan_out, fan_in]``):
    n, n0:       a width and the base width the parametrization is anchored at.
    m:           the width multiplier ``n / n0`` of one parameter (see :func:`infer_shapes`).
    role:        what a parameter is to the width limit, from its number of infinite dims:
                 ``hidden`` (2: matrix-like, fan-in and fan-out grow), ``input`` (1, its fan-out
                 grows: input weights, embeddings), ``readout`` (1, its fan-in grows: the output
                 layer), ``vector`` (1-D with a growing dim: biases, LayerNorm gains), ``fixed``
                 (no growing dim: scalar-like, e.g. the output bias).
    a, b, c:     the abc exponents (Yang & Hu 2021) relative to the base width: a layer computes
                 ``x @ (m^-a W)`` with ``W ~ std0 · m^-b · N(0, 1)`` and trains with learning
                 rate ``lr · m^-c``; ``std0`` is the init the layer has at the base width.

Rules (relative to the base width; at ``m = 1`` every parametrization here is the same model
with the same learning rates, which is what makes a base-width sweep transfer):

===========  ==========================  =============================  =======================
role         standard (SP)               muP                            NTK
===========  ==========================  =============================  =======================
input        a 0, b 0, c 0               a 0, b 0, c 0 (SGD: c −1)      a 0, b 0, c ½ (SGD: 0)
hidden       a 0, b ½, c 0               a 0, b ½, c 1 (SGD: fi/fo)     a ½, b 0, c ½ (SGD: 0)
readout      a 0, b ½, c 0               a 1, b 0, c 0 (SGD: c −1)      a ½, b 0, c ½ (SGD: 0)
vector       c 0                         c 0 (SGD: c −1)                c ½ (SGD: 0)
===========  ==========================  =============================  =======================

muP under Adam follows microsoft/mup's ``MuAdam`` (matrix-like lr ÷ m; vector-like and
scalar-like unchanged) and ``MuReadout`` (forward ``x @ W / m``; ``W`` drawn at the base-width
init and rescaled by ``m^½``, or zero); under SGD ``MuSGD`` (vector-like lr × m, matrix-like
lr ÷ (fan-in multiplier / fan-out multiplier), i.e. "fi/fo" above). NTK: weights ``N(0, 1)``
times ``1/sqrt(fan_in)`` in the forward pass; for SGD the learning rate is width-free, for Adam
(and SignSGD) every parameter's learning rate scales as ``m^-½`` so the function moves by Θ(1)
in one step (S09, derived, not quoted from TP IVb); features then move by ``O(m^-½)``.

Attention under muP: scores ``q·k · sqrt(d_head0) / d_head`` (1/d_head instead of
1/sqrt(d_head), equal to the standard scale at the base head width ``d_head0``; "8/d_head" at
``d_head0 = 64``).

References:
    G. Yang, E. J. Hu (2021), "Tensor Programs IV: Feature Learning in Infinite-Width Neural
        Networks", arXiv 2011.14522, Sec. 3 (abc-parametrizations).
    G. Yang et al. (2022), "Tensor Programs V: Tuning Large Neural Networks via Zero-Shot
        Hyperparameter Transfer", arXiv 2203.03466, Table 3 (muP per-layer rules; unverified
        here), Sec. 4 (attention 1/d).
    G. Yang, E. Littwin (2023), "Tensor Programs IVb: Adaptive Optimization in the
        Infinite-Width Limit", arXiv 2308.01814 (muP and NTK limits under Adam).
    microsoft/mup 1.0.0: ``mup/optim.py``, ``mup/layer.py``, ``mup/shape.py`` (reference code).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from ._param_shapes import ParamShape as ParamShape
from ._param_shapes import Role as Role
from ._param_shapes import infer_shapes as infer_shapes
from .attention import MultiHeadAttention

__all__ = [
    "ABC",
    "PARAMETRIZATIONS",
    "ParamShape",
    "Parametrization",
    "abc_rule",
    "ReadoutMultiplier",
    "apply_mup_attention",
    "apply_mup_readout",
    "infer_shapes",
    "mup_parameter_groups",
    "parameter_groups",
]

Parametrization = Literal["standard", "ntk", "mup"]
PARAMETRIZATIONS: tuple[str, ...] = ("standard", "ntk", "mup")
OptimizerKind = Literal["adam", "sgd"]
_OPTIMIZERS = ("adam", "sgd")


@dataclass(frozen=True)
class ABC:
    """The abc exponents of one role: multiplier ``m^-a``, init std ``× m^-b``, lr ``× m^-c``.

    ``c`` is ``None`` for SGD's hidden role under muP, whose learning-rate factor is the
    fan-in/fan-out multiplier ratio (see :func:`parameter_groups`).
    """

    a: float
    b: float
    c: float | None


_TABLE: dict[tuple[str, str], dict[str, ABC]] = {
    ("standard", "adam"): {
        "input": ABC(0, 0, 0),
        "hidden": ABC(0, 0.5, 0),
        "readout": ABC(0, 0.5, 0),
        "vector": ABC(0, 0, 0),
    },
    ("mup", "adam"): {
        "input": ABC(0, 0, 0),
        "hidden": ABC(0, 0.5, 1),
        "readout": ABC(1, 0, 0),
        "vector": ABC(0, 0, 0),
    },
    ("ntk", "adam"): {
        "input": ABC(0, 0, 0.5),
        "hidden": ABC(0.5, 0, 0.5),
        "readout": ABC(0.5, 0, 0.5),
        "vector": ABC(0, 0, 0.5),
    },
    ("mup", "sgd"): {
        "input": ABC(0, 0, -1),
        "hidden": ABC(0, 0.5, None),
        "readout": ABC(1, 0, -1),
        "vector": ABC(0, 0, -1),
    },
    ("ntk", "sgd"): {
        "input": ABC(0, 0, 0),
        "hidden": ABC(0.5, 0, 0),
        "readout": ABC(0.5, 0, 0),
        "vector": ABC(0, 0, 0),
    },
}
_TABLE[("standard", "sgd")] = _TABLE[("standard", "adam")]


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed} (got {name}={value!r})")


def abc_rule(parametrization: Parametrization, optimizer: OptimizerKind = "adam") -> dict[str, ABC]:
    """The abc exponents per role (``input``, ``hidden``, ``readout``, ``vector``).

    Args:
        parametrization: ``"standard"``, ``"ntk"`` or ``"mup"``.
        optimizer: ``"adam"`` (any entry-wise adaptive optimizer: Adam, AdamW, SignSGD) or
            ``"sgd"``.
    Returns:
        ``{role: ABC}``; see the module docstring's table. ``fixed`` parameters always get
        ``ABC(0, 0, 0)``.
    Raises:
        ValueError: for an unknown parametrization or optimizer.
    References:
        Yang & Hu (2021), arXiv 2011.14522, Sec. 3; Yang et al. (2022), arXiv 2203.03466,
        Table 3; microsoft/mup ``optim.py``.
    """
    _check_choice("parametrization", parametrization, PARAMETRIZATIONS)
    _check_choice("optimizer", optimizer, _OPTIMIZERS)
    return {**_TABLE[(parametrization, optimizer)], "fixed": ABC(0, 0, 0)}


def _lr_factor(rule: ABC, shape: ParamShape) -> float:
    if rule.c is None:  # MuSGD's matrix-like rule
        return shape.fan_out_mult / shape.fan_in_mult
    return shape.width_mult ** (-rule.c)


def parameter_groups(
    model: nn.Module,
    base_model: nn.Module,
    *,
    lr: float,
    parametrization: Parametrization = "mup",
    optimizer: OptimizerKind = "adam",
    weight_decay: float = 0.0,
    decoupled_wd: bool = True,
) -> list[dict[str, Any]]:
    """Optimizer parameter groups with each parameter's learning rate scaled for its width.

    Pass the result to your own optimizer: ``torch.optim.Adam(parameter_groups(model, base,
    lr=1e-2))``. Parameters with the same role and learning rate share a group; each group
    carries ``"role"`` and ``"width_mult"`` entries (torch optimizers keep extra keys).

    Weight decay follows ``MuAdam``/``MuSGD``: with ``decoupled_wd=False`` (L2 decay inside
    the gradient) it is multiplied by the inverse of the learning-rate factor, so lr·wd stays
    width-free; with ``decoupled_wd=True`` (AdamW) it is left as given.

    Args:
        model: the model at width n (only ``requires_grad`` parameters are grouped); wrapped in
            DDP or ``torch.compile`` or not (see :func:`infer_shapes`).
        base_model: the same architecture at the base width (see :func:`infer_shapes`).
        lr: the base learning rate (the one tuned at the base width), > 0.
        parametrization: ``"standard"`` (one learning rate), ``"ntk"`` or ``"mup"``.
        optimizer: ``"adam"`` for entry-wise adaptive optimizers (Adam, AdamW, SignSGD) or
            ``"sgd"``.
        weight_decay: base weight decay, >= 0.
        decoupled_wd: whether the optimizer decays decoupled from the gradient (AdamW).
    Returns:
        A list of ``{"params", "lr", "weight_decay", "role", "width_mult"}`` dicts.
    Raises:
        ValueError: for ``lr <= 0``, ``weight_decay < 0``, an unknown parametrization or
            optimizer, and as :func:`infer_shapes`.
    References:
        microsoft/mup ``mup/optim.py`` (``MuAdam``, ``MuSGD``); Yang et al. (2022), arXiv
        2203.03466, Table 3.
    """
    if not lr > 0:
        raise ValueError(f"lr must be > 0 (got lr={lr})")
    if not weight_decay >= 0:
        raise ValueError(f"weight_decay must be >= 0 (got weight_decay={weight_decay})")
    rules = abc_rule(parametrization, optimizer)
    shapes = infer_shapes(model, base_model)
    groups: dict[tuple[str, float], dict[str, Any]] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        shape = shapes[name]
        factor = _lr_factor(rules[shape.role], shape)
        key = (shape.role, factor)
        if key not in groups:
            wd = weight_decay if decoupled_wd else weight_decay / factor
            groups[key] = {
                "params": [],
                "lr": lr * factor,
                "weight_decay": wd,
                "role": shape.role,
                "width_mult": shape.width_mult,
            }
        groups[key]["params"].append(param)
    return list(groups.values())


def mup_parameter_groups(
    model: nn.Module, base_model: nn.Module, *, lr: float, optimizer: OptimizerKind = "adam"
) -> list[dict[str, Any]]:
    """Shorthand for ``parameter_groups(..., parametrization="mup")``.

    Raises:
        ValueError: as :func:`parameter_groups`.
    """
    return parameter_groups(model, base_model, lr=lr, parametrization="mup", optimizer=optimizer)


def apply_mup_attention(model: nn.Module, base_d_head: int) -> int:
    """Set every :class:`MultiHeadAttention` in ``model`` to muP's ``sqrt(d_head0) / d_head``.

    The score scale becomes ``1/d_head`` up to the constant that makes it equal to the standard
    ``1/sqrt(d_head)`` at the base head width (``8/d_head`` for ``d_head0 = 64``).

    Args:
        model: any module; its dynascope attention layers are changed in place.
        base_d_head: the head width ``d_head0`` of the base model, >= 1.
    Returns:
        The number of attention layers changed.
    Raises:
        ValueError: if ``base_d_head < 1``.
    References:
        Yang et al. (2022), arXiv 2203.03466, Sec. 4 and Appendix J.2.1 (attention 1/d).
    """
    if base_d_head < 1:
        raise ValueError(f"base_d_head must be >= 1 (got base_d_head={base_d_head})")
    n = 0
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            module.scale = math.sqrt(base_d_head) / module.d_head
            n += 1
    return n


class ReadoutMultiplier(nn.Module):
    """``torch.nn.utils.parametrize`` module: the stored weight ``W`` is used as ``W / m``.

    Registered on a readout weight it makes the forward pass ``x @ W / m`` (muP's readout
    multiplier, ``MuReadout``) while the optimizer sees ``W`` and its gradient ``∂L/∂W``, which
    is ``1/m`` of the gradient through the product. Parameter names gain the
    ``parametrizations.<name>.original`` wrapping, which :func:`infer_shapes` understands.

    Args:
        width_mult: m > 0.
    Raises:
        ValueError: if ``width_mult <= 0``.
    """

    def __init__(self, width_mult: float) -> None:
        super().__init__()
        if not width_mult > 0:
            raise ValueError(f"width_mult must be > 0 (got width_mult={width_mult})")
        self.width_mult = float(width_mult)

    def forward(self, weight: Tensor) -> Tensor:
        return weight / self.width_mult


def apply_mup_readout(
    model: nn.Module, name: str, width_mult: float, *, zero_init: bool = False
) -> None:
    """Turn the readout weight ``model.<name>`` into muP's: multiplier ``1/m``, rescaled init.

    The stored weight is multiplied by ``m^½`` (the SP→muP rescale of ``MuReadout``: a fan-in
    init at width n becomes the base width's init scale) or zeroed, and the forward pass uses
    ``W / m`` (:class:`ReadoutMultiplier`). At ``m = 1`` the model is unchanged.

    Args:
        model: the module owning the readout weight (e.g. a :class:`Transformer`, ``"W_U"``).
        name: attribute name of the readout weight on ``model``.
        width_mult: m = fan-in / base fan-in of the readout, > 0.
        zero_init: zero the readout weight instead (the mup MLP example's choice).
    Raises:
        ValueError: if ``model`` has no parameter ``name`` or ``width_mult <= 0``.
    References:
        microsoft/mup ``mup/layer.py`` (``MuReadout``, ``_rescale_parameters``).
    """
    weight = getattr(model, name, None)
    if not isinstance(weight, nn.Parameter):
        raise ValueError(f"name must name a parameter of model (got name={name!r})")
    multiplier = ReadoutMultiplier(width_mult)
    with torch.no_grad():
        if zero_init:
            weight.zero_()
        else:
            weight.mul_(math.sqrt(width_mult))
    parametrize.register_parametrization(model, name, multiplier)
