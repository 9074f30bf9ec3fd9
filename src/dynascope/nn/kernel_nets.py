"""Small nets for NTK-universality experiments (S17): single-head attention and an Elman RNN,
each in standard (SP) or NTK parametrization, with a width argument.

Glossary (everything right-multiplies, ``x @ W``):
    batch, pos:  inputs per batch and tokens per sequence (RNN: time steps).
    d_in:        input width per token.
    width:       n; the attention net's d_model = d_head (one head), the RNN's hidden width.
    d_out:       outputs per sequence.
    W_E:         ``[d_in, n]`` token embedding (attention).
    W_Q, W_K, W_V: ``[n_heads=1, n, n]``, W_O: ``[1, n, n]`` (TransformerLens layout).
    W_in:        ``[d_in, n]`` input map ``U``; W_hh: ``[n, n]`` recurrent map ``W`` (RNN).
    W_U:         ``[n, d_out]`` readout.
    mult(fan_in): the forward multiplier, ``1/sqrt(fan_in)`` under NTK, 1 under SP.

Every weight is ``std * N(0, 1)`` with ``std = 1`` (NTK) or ``1/sqrt(fan_in)`` (SP), so both
parametrizations give the same function at initialisation and differ in their gradients (the
NTK one trains every width with one learning rate). No biases.

Attention (:class:`KernelAttentionNet`)::

    e       = mult(d_in) x @ W_E                           # [batch, pos, n]
    q, k, v = mult(n) e @ W_Q[0], mult(n) e @ W_K[0], mult(n) e @ W_V[0]
    pattern = softmax(logit_scale(n) q k^T)                # [batch, query_pos, key_pos]
    o       = mult(n) (pattern @ v) @ W_O[0]               # [batch, pos, n]
    f       = mult(n) mean_pos(o) @ W_U                    # [batch, d_out]

``logit_scale`` is ``"1/n"`` (default: the scaling under which Tensor Programs II derive the
transformer NTK, as we read them; logits vanish at init as n grows and attention starts uniform)
or ``"1/sqrt(n)"`` (the usual ``1/sqrt(d_head)``). Our reading of the NTK4A notebooks is
unverified; the choice is a config field of S17's study.

RNN (:class:`ElmanRNN`), ``h_0 = 0``, ``phi`` = tanh (default) or relu::

    h_t = phi(mult(n) h_{t-1} @ W_hh + mult(d_in) x_t @ W_in)   # [batch, n]
    f   = mult(n) mean_t(h_t) @ W_U                            # average-pooled readout

References:
    Yang (2020), "Tensor Programs II: Neural Tangent Kernel for Any Architecture",
    arXiv 2006.14548; Yang & Littwin (2021), "Tensor Programs IIb", arXiv 2105.03703 (S17).
    Elman (1990), "Finding Structure in Time", Cognitive Science 14.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

from .capture import CapturePoint

__all__ = ["ElmanRNN", "KernelAttentionNet"]

KernelParametrization = Literal["standard", "ntk"]


def _check(d_in: int, width: int, d_out: int, parametrization: str) -> None:
    for name, value in (("d_in", d_in), ("width", width), ("d_out", d_out)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer (got {value!r})")
    if parametrization not in ("standard", "ntk"):
        raise ValueError(f"parametrization must be 'standard' or 'ntk' (got {parametrization!r})")


class _Net(nn.Module):
    """Shared init: ``_weight(fan_in, shape, generator, dtype)`` draws ``std * N(0, 1)``;
    ``mult(fan_in)`` is the forward multiplier."""

    def __init__(self, parametrization: str) -> None:
        super().__init__()
        self.parametrization = parametrization

    def _weight(self, fan_in: int, shape: tuple[int, ...], generator, dtype) -> nn.Parameter:
        z = torch.randn(*shape, generator=generator, dtype=dtype)
        return nn.Parameter(z if self.parametrization == "ntk" else z / math.sqrt(fan_in))

    def mult(self, fan_in: int) -> float:
        """The forward multiplier of a layer with ``fan_in`` inputs."""
        return 1.0 / math.sqrt(fan_in) if self.parametrization == "ntk" else 1.0

    @staticmethod
    def _check_x(x: Tensor, d_in: int) -> None:
        if x.ndim != 3 or x.shape[-1] != d_in:
            raise ValueError(f"x must be [batch, pos, d_in={d_in}] (got {tuple(x.shape)})")


class KernelAttentionNet(_Net):
    """One single-head attention layer with embedding and average-pooled readout (S17).

    Args:
        d_in: token width (> 0). width: n = d_model = d_head (> 0). d_out: outputs (> 0).
        parametrization: ``"standard"`` or ``"ntk"``.
        logit_scale: ``"1/n"`` or ``"1/sqrt(n)"`` (see the module docstring).
        generator: RNG for the weights. dtype: parameter dtype.
    Raises:
        ValueError: non-positive sizes, unknown ``parametrization`` or ``logit_scale``;
            (forward) ``x`` not ``[batch, pos, d_in]``.
    """

    def __init__(
        self,
        d_in: int,
        width: int,
        d_out: int = 1,
        *,
        parametrization: KernelParametrization = "ntk",
        logit_scale: Literal["1/n", "1/sqrt(n)"] = "1/n",
        generator: torch.Generator | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        _check(d_in, width, d_out, parametrization)
        if logit_scale not in ("1/n", "1/sqrt(n)"):
            raise ValueError(f"logit_scale must be '1/n' or '1/sqrt(n)' (got {logit_scale!r})")
        super().__init__(parametrization)
        self.d_in, self.width, self.d_out, self.n_heads = d_in, width, d_out, 1
        self.d_model = self.d_head = width
        self.logit_scale = logit_scale
        init = (generator, dtype)
        self.W_E = self._weight(d_in, (d_in, width), *init)
        self.W_Q = self._weight(width, (1, width, width), *init)
        self.W_K = self._weight(width, (1, width, width), *init)
        self.W_V = self._weight(width, (1, width, width), *init)
        self.W_O = self._weight(width, (1, width, width), *init)
        self.W_U = self._weight(width, (width, d_out), *init)
        self.hook_pattern = CapturePoint()

    def forward(self, x: Tensor) -> Tensor:
        """``[batch, pos, d_in] -> [batch, d_out]``."""
        self._check_x(x, self.d_in)
        n = self.width
        m = self.mult(n)
        e = self.mult(self.d_in) * (x @ self.W_E)  # [batch, pos, n]
        q, k, v = (m * (e @ W[0]) for W in (self.W_Q, self.W_K, self.W_V))
        scale = 1.0 / n if self.logit_scale == "1/n" else 1.0 / math.sqrt(n)
        pattern = torch.softmax(scale * (q @ k.mT), dim=-1)  # [batch, query_pos, key_pos]
        pattern = self.hook_pattern(pattern[:, None])[:, 0]  # [batch, n_heads=1, ...] exposed
        o = m * ((pattern @ v) @ self.W_O[0])  # [batch, pos, n]
        return m * (o.mean(1) @ self.W_U)


class ElmanRNN(_Net):
    """Elman RNN ``h_t = phi(W h_{t-1} + U x_t)`` with an average-pooled linear readout (S17).

    Args:
        d_in: input width per step (> 0). width: hidden width n (> 0). d_out: outputs (> 0).
        parametrization: ``"standard"`` or ``"ntk"``.
        activation: ``"tanh"`` (default) or ``"relu"``.
        generator: RNG for the weights. dtype: parameter dtype.
    Raises:
        ValueError: non-positive sizes, unknown ``parametrization`` or ``activation``;
            (forward) ``x`` not ``[batch, pos, d_in]``.
    """

    def __init__(
        self,
        d_in: int,
        width: int,
        d_out: int = 1,
        *,
        parametrization: KernelParametrization = "ntk",
        activation: Literal["tanh", "relu"] = "tanh",
        generator: torch.Generator | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        _check(d_in, width, d_out, parametrization)
        if activation not in ("tanh", "relu"):
            raise ValueError(f"activation must be 'tanh' or 'relu' (got {activation!r})")
        super().__init__(parametrization)
        self.d_in, self.width, self.d_out = d_in, width, d_out
        self.activation = activation
        init = (generator, dtype)
        self.W_in = self._weight(d_in, (d_in, width), *init)
        self.W_hh = self._weight(width, (width, width), *init)
        self.W_U = self._weight(width, (width, d_out), *init)

    def forward(self, x: Tensor) -> Tensor:
        """``[batch, pos, d_in] -> [batch, d_out]``."""
        self._check_x(x, self.d_in)
        phi = torch.tanh if self.activation == "tanh" else torch.relu
        m_h, m_x = self.mult(self.width), self.mult(self.d_in)
        u = m_x * (x @ self.W_in)  # [batch, pos, n], all input terms at once
        h = torch.zeros(x.shape[0], self.width, dtype=u.dtype, device=u.device)
        total = torch.zeros_like(h)
        for t in range(x.shape[1]):
            h = phi(m_h * (h @ self.W_hh) + u[:, t])
            total = total + h
        return m_h * ((total / x.shape[1]) @ self.W_U)
