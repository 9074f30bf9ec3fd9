"""Each parameter's role and width multipliers, found by comparing a model with the same
architecture at the base width (:func:`infer_shapes`), for the parametrizations of
:mod:`dynascope.nn.parametrization` (glossary there, which re-exports them).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.nn import DataParallel
from torch.nn.parallel import DistributedDataParallel

from .attention import MultiHeadAttention

Role = Literal["input", "hidden", "readout", "vector", "fixed"]


@dataclass(frozen=True)
class ParamShape:
    """How one parameter grows with width (the ``mup`` library's infshape, our layout).

    Attributes:
        role: ``input``, ``hidden``, ``readout``, ``vector`` or ``fixed``.
        width_mult: the multiplier m of the main growing dim (fan-in for ``hidden`` and
            ``readout``, the growing dim otherwise; 1.0 for ``fixed``).
        fan_in_mult, fan_out_mult: multipliers of the fan-in and fan-out dims (1.0 if fixed).
    """

    role: Role
    width_mult: float
    fan_in_mult: float
    fan_out_mult: float


def _fan_dims(module: nn.Module, attr: str, ndim: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(fan-in dims, fan-out dims) of a parameter of ``ndim`` >= 2 dims, by its layout."""
    if isinstance(module, nn.Linear | nn.Bilinear):
        return (1,), (0,)
    if isinstance(module, nn.Embedding):
        return (0,), (1,)
    if isinstance(module, MultiHeadAttention) and attr in ("W_Q", "W_K", "W_V"):
        return (1,), (0, 2)  # [n_heads, d_model, d_head]: heads are fan-out
    return tuple(range(ndim - 1)), (ndim - 1,)  # x @ W: the last dim is fan-out


def _plain(name: str) -> str:
    """A parameter's name without ``torch.nn.utils.parametrize``'s wrapping."""
    return name.replace("parametrizations.", "").replace(".original", "")


def _unwrap(model: nn.Module) -> tuple[nn.Module, str]:
    """The module inside DDP / DataParallel / ``torch.compile`` wrappers (any nesting), and the
    prefix the wrappers add to its parameter names (``"module."``, ``"_orig_mod."``)."""
    dynamo = sys.modules.get("torch._dynamo.eval_frame")  # not imported -> nothing compiled
    compiled = getattr(dynamo, "OptimizedModule", None)
    prefix = ""
    while True:
        if isinstance(model, (DistributedDataParallel, DataParallel)):
            model, prefix = model.module, prefix + "module."
        elif compiled is not None and isinstance(model, compiled):
            model, prefix = model._orig_mod, prefix + "_orig_mod."
        else:
            return model, prefix


def _ratio(shape: torch.Size, base: torch.Size, dims: tuple[int, ...]) -> float:
    return math.prod(shape[d] for d in dims) / math.prod(base[d] for d in dims)


def infer_shapes(model: nn.Module, base_model: nn.Module) -> dict[str, ParamShape]:
    """Each parameter's role and width multipliers, by comparing it with the base model's.

    A dim "grows" if it differs between ``model`` and ``base_model`` (the mup library's
    ``set_base_shapes(model, base)``, with the delta model replaced by the rule that a dim equal
    to the base's is finite). Fan-in is the input side of the parameter's layout: dims 0..-2 for
    ``x @ W`` weights and attention's ``W_O``, ``d_model`` for ``W_Q, W_K, W_V``, dim 1 for
    ``nn.Linear``.

    Args:
        model: the model at width n; it may be wrapped in ``DistributedDataParallel``,
            ``DataParallel`` or ``torch.compile`` (the module inside is read).
        base_model: the same architecture at the base width (parameter names must match),
            wrapped or not.
    Returns:
        ``{parameter name: ParamShape}`` for every parameter of ``model``, under the names
        ``model.named_parameters()`` gives (with the wrappers' ``module.`` / ``_orig_mod.``).
    Raises:
        ValueError: if the parameter names or ranks of the two models differ.
    """
    model, prefix = _unwrap(model)
    base = {_plain(k): p for k, p in _unwrap(base_model)[0].named_parameters()}
    modules = dict(model.named_modules())
    out: dict[str, ParamShape] = {}
    for inner_name, param in model.named_parameters():
        raw_name, name = prefix + inner_name, _plain(inner_name)
        if name not in base or base[name].ndim != param.ndim:
            raise ValueError(
                f"base_model must have the same parameters as model (parameter {name!r} is "
                "missing or has another rank)"
            )
        shape, bshape = param.shape, base[name].shape
        grows = [d for d in range(param.ndim) if shape[d] != bshape[d]]
        if not grows:
            out[raw_name] = ParamShape("fixed", 1.0, 1.0, 1.0)
            continue
        if param.ndim == 1:
            mult = shape[0] / bshape[0]
            out[raw_name] = ParamShape("vector", mult, 1.0, mult)
            continue
        module_name, _, attr = name.rpartition(".")
        fan_in, fan_out = _fan_dims(modules[module_name], attr, param.ndim)
        fi, fo = _ratio(shape, bshape, fan_in), _ratio(shape, bshape, fan_out)
        in_grows, out_grows = any(d in grows for d in fan_in), any(d in grows for d in fan_out)
        if in_grows and out_grows:
            out[raw_name] = ParamShape("hidden", fi, fi, fo)
        elif in_grows:
            out[raw_name] = ParamShape("readout", fi, fi, fo)
        else:
            out[raw_name] = ParamShape("input", fo, fi, fo)
    return out
