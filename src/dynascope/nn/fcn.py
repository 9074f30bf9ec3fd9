"""Fully connected classifier (FCN): dense layers with a pointwise activation, then a readout.

Glossary (everything right-multiplies, ``x @ W``; papers and ``nn.Linear`` store the transpose):
    batch:      inputs per batch.
    d_in:       input width. An input ``[batch, n_ctx, d_patch]`` (a task's patches) is flattened
                row-major to ``[batch, n_ctx * d_patch]``, so ``d_in = n_ctx * d_patch``.
    hidden:     the hidden widths ``(d_1, ..., d_L)``; ``L = len(hidden)`` hidden layers.
    d_out:      output width (classes).
    blocks.i.W: ``[d_i, d_{i+1}]`` weight of hidden layer ``i`` (``d_0 = d_in``).
    blocks.i.b: ``[d_{i+1}]`` its bias.
    W_U, b_U:   ``[d_L, d_out]``, ``[d_out]`` the readout (classification) layer, named as the
                Transformer's unembedding so that :func:`dynascope.probes.last_layer_name` finds
                it (S13's last-layer norm ``N_t = ||W_U||_F``, bias excluded).

Forward::

    h = flatten(x)                                   # [batch, d_in]
    for block in blocks: h = act(h @ block.W + block.b)   # [batch, d_{i+1}]
    logits = h @ W_U + b_U                           # [batch, d_out]

Initialisation: PyTorch's ``nn.Linear`` default for every layer (S13, "Open details": init
PyTorch default), i.e. ``W, b ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in))``, drawn in ``nn.Linear``'s
order (the ``[out, in]`` weight, then the bias, layer by layer). Under the same seed an ``FCN``
therefore holds exactly the weights (transposed) of ``nn.Sequential(nn.Linear, act, ...,
nn.Linear)``.

References:
    Thilak et al. (2022), "The Slingshot Mechanism: An Empirical Study of Adaptive Optimizers and
    the Grokking Phenomenon", arXiv 2206.04817, Fig. 1 (an FCN on 200 CIFAR-10 images; here
    SYSTEMS S13's FCN 64-256-256-10 on 200 digits).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["FCN", "FCNActivation"]

FCNActivation = Literal["relu", "gelu", "tanh"]
_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "tanh": torch.tanh}


def _linear_default(d_from: int, d_to: int) -> tuple[Tensor, Tensor]:
    """``nn.Linear(d_from, d_to)``'s default weight (transposed to ``[d_from, d_to]``) and bias."""
    weight = torch.empty(d_to, d_from)  # nn.Linear layout [out, in], drawn as nn.Linear does
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
    bound = 1.0 / math.sqrt(d_from)
    bias = torch.empty(d_to).uniform_(-bound, bound)
    return weight.T.contiguous(), bias


class _Dense(nn.Module):
    """One hidden layer's parameters: ``W`` ``[d_from, d_to]`` and ``b`` ``[d_to]``."""

    def __init__(self, d_from: int, d_to: int) -> None:
        super().__init__()
        weight, bias = _linear_default(d_from, d_to)
        self.W = nn.Parameter(weight)
        self.b = nn.Parameter(bias)


class FCN(nn.Module):
    """A fully connected classifier ``d_in -> hidden... -> d_out`` (see the module docstring).

    Args:
        d_in: input width (> 0); inputs ``[batch, d_in]`` or ``[batch, n_ctx, d_patch]`` with
            ``n_ctx * d_patch = d_in``.
        hidden: hidden widths, each > 0; empty gives a linear classifier ``x @ W_U + b_U``.
        d_out: output width (> 0).
        activation: ``"relu"``, ``"gelu"`` or ``"tanh"``, after every hidden layer.
    Raises:
        ValueError: if a width is not a positive integer or ``activation`` is unknown.
    """

    def __init__(
        self,
        d_in: int,
        hidden: Sequence[int] = (256, 256),
        d_out: int = 10,
        *,
        activation: FCNActivation = "relu",
    ) -> None:
        super().__init__()
        for name, value in (("d_in", d_in), ("d_out", d_out)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1 (got {name}={value!r})")
        hidden = tuple(hidden)
        for i, value in enumerate(hidden):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"hidden[{i}] must be an integer >= 1 (got {value!r})")
        if activation not in _ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {', '.join(_ACTIVATIONS)} (got {activation!r})"
            )
        self.d_in = d_in
        self.hidden = hidden
        self.d_out = d_out
        self.activation = activation
        widths = (d_in, *hidden)
        self.blocks = nn.ModuleList(_Dense(a, b) for a, b in zip(widths, widths[1:]))
        weight, bias = _linear_default(widths[-1], d_out)
        self.W_U = nn.Parameter(weight)
        self.b_U = nn.Parameter(bias)

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``[batch, d_out]`` for ``x`` ``[batch, d_in]`` or ``[batch, n_ctx, d_patch]``.

        Raises:
            ValueError: if ``x`` has fewer than 2 dimensions or its flattened width is not
                ``d_in``.
        """
        if x.ndim < 2:
            raise ValueError(f"x must be [batch, d_in] or [batch, n_ctx, d_patch] (got {x.ndim}-D)")
        h = x.reshape(x.shape[0], -1)  # [batch, d_in]
        if h.shape[1] != self.d_in:
            raise ValueError(
                f"x must flatten to d_in={self.d_in} values per input (got x.shape={list(x.shape)})"
            )
        act = _ACTIVATIONS[self.activation]
        for block in self.blocks:
            h = act(torch.addmm(block.b, h, block.W))  # h @ W + b: [batch, d_{i+1}]
        return torch.addmm(self.b_U, h, self.W_U)  # h @ W_U + b_U: [batch, d_out]

    def forward_members(self, params: Mapping[str, Tensor], x: Tensor) -> Tensor:
        """K members' logits ``[K, batch, d_out]`` at once, from their stacked parameters.

        The forward of :meth:`forward` for each member ``k`` (``params[name][k]``), computed
        with batched matrix products; an ensemble (:mod:`dynascope.train.ensemble`) uses it
        instead of vectorizing :meth:`forward` with vmap.

        Args:
            params: every parameter by its name here, stacked: ``blocks.i.W`` ``[K, d_i,
                d_{i+1}]``, ``blocks.i.b`` ``[K, d_{i+1}]``, ``W_U`` ``[K, d_L, d_out]``,
                ``b_U`` ``[K, d_out]``.
            x: inputs ``[K, batch, d_in]`` or ``[K, batch, n_ctx, d_patch]``, member k's in
                ``x[k]``.
        Returns:
            Logits ``[K, batch, d_out]``.
        Raises:
            ValueError: if ``x`` has fewer than 3 dimensions or its flattened width is not
                ``d_in``.
        """
        if x.ndim < 3:
            raise ValueError(
                f"x must be [K, batch, d_in] or [K, batch, n_ctx, d_patch] (got {x.ndim}-D)"
            )
        h = x.reshape(x.shape[0], x.shape[1], -1)  # [K, batch, d_in]
        if h.shape[2] != self.d_in:
            raise ValueError(
                f"x must flatten to d_in={self.d_in} values per input (got x.shape={list(x.shape)})"
            )
        act = _ACTIVATIONS[self.activation]
        for i in range(len(self.blocks)):
            W, b = params[f"blocks.{i}.W"], params[f"blocks.{i}.b"]
            h = act(torch.baddbmm(b[:, None], h, W))  # h @ W + b: [K, batch, d_{i+1}]
        return torch.baddbmm(params["b_U"][:, None], h, params["W_U"])  # [K, batch, d_out]

    def extra_repr(self) -> str:
        return (
            f"d_in={self.d_in}, hidden={list(self.hidden)}, d_out={self.d_out}, "
            f"activation={self.activation!r}"
        )
