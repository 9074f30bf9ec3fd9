"""Helpers shared by the pattern recomputations: name a forward call's inputs, project heads.

Glossary:
    batch, pos: leading axes of a layer input ``x: [batch, pos, d_in]``.
    n_heads, d_head: as in :class:`dynascope.adapters.AttentionView`.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["bind_inputs", "project"]


def bind_inputs(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Name every argument of ``module.forward(*args, **kwargs)``, as the forward would see it.

    Entries caught by a ``**kwargs`` parameter are merged into the result; parameters left at
    their default are absent.

    Raises:
        TypeError: if the arguments do not fit ``module.forward``'s signature.
    """
    bound = inspect.signature(module.forward).bind_partial(*args, **kwargs)
    named: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        if bound.signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        else:
            named[name] = value
    return named


def project(x: Tensor, W: Tensor, b: Tensor | None) -> Tensor:
    """Per-head projection ``x @ W[h] + b[h]``.

    Args:
        x: ``[batch, pos, d_in]``.
        W: ``[n_heads, d_in, d_head]``.
        b: ``[n_heads, d_head]`` or ``None``.
    Returns:
        ``[batch, n_heads, pos, d_head]``.
    """
    out = torch.einsum("bpi,hid->bhpd", x, W)
    if b is not None:
        out = out + b[:, None, :]
    return out
