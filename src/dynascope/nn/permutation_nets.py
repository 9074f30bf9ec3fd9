"""Bias-free, Kaiming-initialised ReLU MLP of the permuted-initialisations study (SYSTEMS.md S7).

Glossary:
    batch:     inputs per batch.
    d_in:      input width; ``[batch, d_in]`` or any ``[batch, ...]`` that flattens to it
               (digits: 64 pixels).
    hidden:    hidden widths ``(d_1, ..., d_L)``; ``L = len(hidden)`` hidden layers.
    d_out:     output width (classes).
    layers.i:  ``nn.Linear(d_i, d_{i+1})``; ``weight`` ``[d_{i+1}, d_i]`` (torch's ``[out, in]``
               layout: ``h @ weight.T``; SYSTEMS.md S7 writes ``x @ W`` with ``W = weight.T``),
               ``bias`` ``[d_{i+1}]`` only with ``use_bias=True``. The last layer is the readout.

Why ``nn.Linear`` here rather than dynascope's ``x @ W`` parameters (as :class:`FCN`): the
permutation instruments (:mod:`dynascope.probes.permutation`) read any chain of ``nn.Linear``
and ``nn.Conv2d`` modules, users' ``nn.Sequential`` models included, and both modules keep
output units on axis 0 and input units on axis 1 of ``weight``.

Forward::

    h = flatten(x)                                          # [batch, d_in]
    for layer in layers[:-1]: h = relu(layer(h))            # [batch, d_{i+1}]
    logits = layers[-1](h)                                  # [batch, d_out]

Initialisation (the reference code's ``MyLinear``): every weight, the readout's included,
``~ N(0, 2 / fan_in)`` (Kaiming normal, fan-in mode, gain √2); biases zero. Drawn layer by
layer from ``generator`` (or torch's global generator), so one seed fixes the net.

References:
    Benzing, Schug, Meier, von Oswald, Akram, Zucchet, Aitchison, Steger (2022), "Random
    initialisations performing above chance and how to find them", OPT 2022, arXiv 2209.07509,
    Sec. 2 (``FCNet`` of freedbee/permuted_initialisations).
    He, Zhang, Ren, Sun (2015), "Delving deep into rectifiers", arXiv 1502.01852, Eq. 10.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["KaimingMLP", "kaiming_normal_"]


def kaiming_normal_(weight: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Fill ``weight`` ``[out, in, *kernel]`` in place with ``N(0, 2 / fan_in)`` samples.

    ``fan_in = in * prod(kernel)`` (``nn.init.kaiming_normal_(w, nonlinearity="relu")``, but
    drawn from ``generator``).

    Args:
        weight: a ``[out, in]`` or ``[out, in, kh, kw]`` tensor.
        generator: source of randomness (``None``: torch's global generator).
    Returns:
        ``weight``.
    """
    fan_in = weight[0].numel()
    with torch.no_grad():
        sample = torch.randn(weight.shape, generator=generator, dtype=weight.dtype)
        weight.copy_(sample * math.sqrt(2.0 / fan_in))
    return weight


def _check_width(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1 (got {name}={value!r})")


class KaimingMLP(nn.Module):
    """ReLU MLP ``d_in -> hidden... -> d_out``, bias-free by default (see the module docstring).

    Args:
        d_in: input width (> 0).
        hidden: hidden widths, each > 0; at least one (the study permutes hidden units).
        d_out: output width (> 0).
        use_bias: give every layer a bias (initialised to zero).
        generator: source of the initial weights (``None``: torch's global generator).
    Raises:
        ValueError: if a width is not a positive integer or ``hidden`` is empty.
    """

    def __init__(
        self,
        d_in: int,
        hidden: Sequence[int] = (1000,),
        d_out: int = 10,
        *,
        use_bias: bool = False,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        _check_width("d_in", d_in)
        _check_width("d_out", d_out)
        hidden = tuple(hidden)
        if not hidden:
            raise ValueError("hidden must hold at least one width (got hidden=())")
        for i, value in enumerate(hidden):
            _check_width(f"hidden[{i}]", value)
        self.d_in, self.hidden, self.d_out, self.use_bias = d_in, hidden, d_out, use_bias
        widths = (d_in, *hidden, d_out)
        self.layers = nn.ModuleList(
            nn.Linear(a, b, bias=use_bias) for a, b in zip(widths, widths[1:])
        )
        for layer in self.layers:
            kaiming_normal_(layer.weight, generator)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``[batch, d_out]`` for ``x`` ``[batch, ...]`` flattening to ``d_in`` values.

        Raises:
            ValueError: if ``x`` has fewer than 2 dimensions or does not flatten to ``d_in``.
        """
        if x.ndim < 2 or x[0].numel() != self.d_in:
            raise ValueError(
                f"x must be [batch, ...] flattening to d_in={self.d_in} values "
                f"(got x.shape={list(x.shape)})"
            )
        h = x.reshape(x.shape[0], -1)  # [batch, d_in]
        for layer in self.layers[:-1]:
            h = F.relu(layer(h))  # [batch, d_{i+1}]
        return self.layers[-1](h)  # [batch, d_out]

    def extra_repr(self) -> str:
        return (
            f"d_in={self.d_in}, hidden={list(self.hidden)}, d_out={self.d_out}, "
            f"use_bias={self.use_bias}"
        )
