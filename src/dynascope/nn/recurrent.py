"""Gated linear RNNs, the LRU, LSTM/GRU baselines, and the exact linear-attention construction.

Glossary (right-multiplying, ``x @ W``):
    batch, pos:   sequences and positions (t = 0 .. pos−1).
    d_model:      token width (input and output of a layer).
    d_hidden:     recurrent neurons (diagonal recurrence).
    d_gate:       width of the output gate.
    n_heads, d_head, W_Q, W_K, W_V: ``[n_heads, d_model, d_head]``, W_O: ``[n_heads, d_head,
                  d_model]`` (TransformerLens layout) of the linear attention being matched.
    λ:            ``[d_hidden]`` decays; real ``λ = exp(−exp(ν_log))`` ∈ (0, 1], complex (LRU)
                  ``λ = exp(−exp(ν_log) + i·exp(θ_log))``, |λ| < 1.
    γ:            ``exp(γ_log)`` ``[d_hidden]``, input normalisation, initialised at √(1 − |λ|²).

Gated linear RNN layer (:class:`GatedLinearRNN`)::

    g_t = (x_t @ W_in_x) ⊙ (x_t @ W_in_g) [⊙ γ]           # [batch, pos, d_hidden]
    h_t = λ ⊙ h_{t−1} + g_t,  h_{−1} = 0                     # parallel scan (nn/_scan.py)
    y_t = (Re(h_t @ W_out_h) ⊙ (x_t @ W_out_x)) @ D [+ x_t]  # [batch, pos, d_model]

(complex kind: ``Re(h @ W_out_h)`` with ``W_out_h = W_out_h_re + i·W_out_h_im``).

Causal linear self-attention (:func:`causal_linear_attention`), per head h::

    LSA(x)_t = Σ_h Σ_{s ≤ t} (q_t · k_s) v_s @ W_O[h]
    q = x @ W_Q[h],  k = x @ W_K[h],  v = x @ W_V[h]

no softmax, no normalisation; a 1/√d_head scale, if wanted, is folded into W_Q.

References:
    Zucchet, Kobayashi, Akram, von Oswald, Larcher, Steger & Sacramento (2023), "Gated recurrent
    neural networks discover attention", arXiv 2309.01775 (Sec. 3: the construction).
    Orvieto, Smith, Gu, Fernando, Gulcehre, Pascanu & De (2023), "Resurrecting recurrent neural
    networks for long sequences", ICML, arXiv 2303.06349 (Sec. 3: the LRU, eqs. 6–7, γ).
    Zucchet, minimal-LRU ``lru/model.py`` (initialisations, the LRU block).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

from ._lru import LRU as LRU
from ._lru import LRUBlock as LRUBlock
from ._lru import LRUNetwork as LRUNetwork
from ._lru import RNNBaseline as RNNBaseline
from ._recurrence import _check_x, _init_nu_theta, _positive
from ._scan import linear_scan, sequential_scan
from .capture import CapturePoint

__all__ = [
    "GatedLinearRNN",
    "LRU",
    "LRUBlock",
    "LRUNetwork",
    "RNNBaseline",
    "causal_linear_attention",
    "construction_counts",
    "gated_rnn_from_linear_attention",
]

LambdaKind = Literal["real", "complex"]


def causal_linear_attention(
    x: Tensor, W_Q: Tensor, W_K: Tensor, W_V: Tensor, W_O: Tensor
) -> Tensor:
    """Causal linear self-attention ``Σ_h Σ_{s≤t} (q_t·k_s) v_s @ W_O[h]`` (no scale, no bias).

    Args:
        x: ``[batch, pos, d_model]``.
        W_Q, W_K, W_V: ``[n_heads, d_model, d_head]``; W_O: ``[n_heads, d_head, d_model]``.
    Returns:
        ``[batch, pos, d_model]``.
    Raises:
        ValueError: if the weight shapes disagree with each other or with ``x``.
    References:
        von Oswald et al. (2023), arXiv 2212.07677, eq. (3); Zucchet et al. (2023),
        arXiv 2309.01775, Sec. 3.
    """
    if not (W_Q.ndim == 3 and W_Q.shape == W_K.shape == W_V.shape):
        raise ValueError(
            "W_Q, W_K, W_V must share a shape [n_heads, d_model, d_head] "
            f"(got {list(W_Q.shape)}, {list(W_K.shape)}, {list(W_V.shape)})"
        )
    n_heads, d_model, d_head = W_Q.shape
    if W_O.shape != (n_heads, d_head, d_model):
        raise ValueError(
            f"W_O must have shape [n_heads, d_head, d_model] = {[n_heads, d_head, d_model]} "
            f"(got {list(W_O.shape)})"
        )
    _check_x(x, d_model)
    q, k, v = (torch.einsum("bpm,hmd->bhpd", x, W) for W in (W_Q, W_K, W_V))
    scores = (q @ k.transpose(-1, -2)).tril()  # [batch, n_heads, query_pos, key_pos]
    return torch.einsum("bhpd,hdm->bpm", scores @ v, W_O)


class GatedLinearRNN(nn.Module):
    """Gated linear RNN layer: input gate, diagonal linear recurrence, output gate (module doc).

    Initialisation: ``W_in_x, W_in_g, W_out_x ~ N(0, 1/d_model)``, ``W_out_h ~ N(0, 1/d_hidden)``
    (``W_out_h_im`` too, complex kind), ``D ~ N(0, 1/d_gate)``; λ by the LRU ring init with
    |λ| ~ U[r_min, r_max] (real) or |λ|² ~ U[r_min², r_max²] and arg λ ~ U[0, max_phase]
    (complex); ``γ_log = log √(1 − |λ|²)``, a separate trainable parameter (minimal-LRU).

    Args:
        d_model: token width.
        d_hidden: recurrent neurons.
        d_gate: output-gate width; ``None`` means ``d_hidden``.
        lambda_kind: ``"real"`` (λ ∈ (0, 1], can reach exactly 0 and 1 as ν_log → ±∞) or
            ``"complex"`` (LRU).
        use_gamma_norm: multiply the input gate by ``γ = exp(γ_log)``.
        use_skip: add ``x`` to the output.
        r_min, r_max: ring of the initial |λ|, ``0 <= r_min < r_max <= 1``.
        max_phase: largest initial arg λ (radians, complex kind).
    Raises:
        ValueError: if a width is not a positive int, ``lambda_kind`` is unknown, or the ring
            is not ``0 <= r_min < r_max <= 1``.
    References:
        Zucchet et al. (2023), arXiv 2309.01775, Sec. 3; Orvieto et al. (2023), arXiv 2303.06349.
    """

    def __init__(
        self,
        d_model: int,
        d_hidden: int,
        d_gate: int | None = None,
        *,
        lambda_kind: LambdaKind = "real",
        use_gamma_norm: bool = False,
        use_skip: bool = False,
        r_min: float = 0.0,
        r_max: float = 1.0,
        max_phase: float = 2 * math.pi,
    ) -> None:
        super().__init__()
        d_gate = d_hidden if d_gate is None else d_gate
        for name, value in (("d_model", d_model), ("d_hidden", d_hidden), ("d_gate", d_gate)):
            _positive(name, value)
        if lambda_kind not in ("real", "complex"):
            raise ValueError(f"lambda_kind must be 'real' or 'complex' (got {lambda_kind!r})")
        self.d_model, self.d_hidden, self.d_gate = d_model, d_hidden, d_gate
        self.lambda_kind, self.use_gamma_norm, self.use_skip = lambda_kind, use_gamma_norm, use_skip
        is_complex = lambda_kind == "complex"
        nu_log, theta_log, gamma_log = _init_nu_theta(
            d_hidden, r_min, r_max, max_phase, lambda_kind
        )
        self.W_in_x = nn.Parameter(torch.randn(d_model, d_hidden) / math.sqrt(d_model))
        self.W_in_g = nn.Parameter(torch.randn(d_model, d_hidden) / math.sqrt(d_model))
        self.nu_log = nn.Parameter(nu_log)
        self.theta_log = nn.Parameter(theta_log) if is_complex else None
        self.gamma_log = nn.Parameter(gamma_log) if use_gamma_norm else None
        self.W_out_h = nn.Parameter(torch.randn(d_hidden, d_gate) / math.sqrt(d_hidden))
        self.W_out_h_im = (
            nn.Parameter(torch.randn(d_hidden, d_gate) / math.sqrt(d_hidden))
            if is_complex
            else None
        )
        self.W_out_x = nn.Parameter(torch.randn(d_model, d_gate) / math.sqrt(d_model))
        self.D = nn.Parameter(torch.randn(d_gate, d_model) / math.sqrt(d_gate))
        self.hook_hidden = CapturePoint()  # h: [batch, pos, d_hidden] (complex for that kind)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, d_hidden={self.d_hidden}, d_gate={self.d_gate}, "
            f"lambda_kind={self.lambda_kind!r}, use_gamma_norm={self.use_gamma_norm}, "
            f"use_skip={self.use_skip}"
        )

    def lambdas(self) -> Tensor:
        """λ ``[d_hidden]``: ``exp(−exp(ν_log))`` (real) or ``exp(−exp(ν_log) + i·exp(θ_log))``."""
        if self.theta_log is None:
            return torch.exp(-torch.exp(self.nu_log))
        return torch.exp(torch.complex(-torch.exp(self.nu_log), torch.exp(self.theta_log)))

    def input_gate(self, x: Tensor) -> Tensor:
        """``g = (x @ W_in_x) ⊙ (x @ W_in_g) [⊙ γ]``, ``[batch, pos, d_hidden]``."""
        g = (x @ self.W_in_x) * (x @ self.W_in_g)
        return g if self.gamma_log is None else g * torch.exp(self.gamma_log)

    def hidden(self, x: Tensor, *, sequential: bool = False) -> Tensor:
        """States ``h`` ``[batch, pos, d_hidden]`` (parallel scan, or the loop if ``sequential``).

        Raises:
            ValueError: if ``x`` is not ``[batch, pos, d_model]``.
        """
        _check_x(x, self.d_model)
        lam = self.lambdas()
        g = self.input_gate(x).to(lam.dtype)
        return (sequential_scan if sequential else linear_scan)(lam, g)

    def readout(self, h: Tensor, x: Tensor) -> Tensor:
        """``y = (Re(h @ W_out_h) ⊙ (x @ W_out_x)) @ D [+ x]``, ``[batch, pos, d_model]``."""
        if h.is_complex():
            gate = h.real @ self.W_out_h - h.imag @ self.W_out_h_im
        else:
            gate = h @ self.W_out_h
        y = (gate * (x @ self.W_out_x)) @ self.D
        return x + y if self.use_skip else y

    def forward(self, x: Tensor, *, sequential: bool = False) -> Tensor:
        """Run the layer over ``x`` ``[batch, pos, d_model]`` -> ``[batch, pos, d_model]``.

        Args:
            x: inputs.
            sequential: use the step-by-step loop instead of the parallel scan (same function).
        Raises:
            ValueError: if ``x`` is not ``[batch, pos, d_model]``.
        """
        h = self.hook_hidden(self.hidden(x, sequential=sequential))
        return self.readout(h, x)


def construction_counts(d_model: int, n_heads: int, d_head: int) -> dict[str, int]:
    """Sizes of :func:`gated_rnn_from_linear_attention` against the attention it copies.

    ``neurons = d_hidden = d_gate = n_heads·d_head²``; the RNN's parameters are
    ``4·d_model·neurons`` (W_in_x, W_in_g, W_out_x, D) ``+ neurons²`` (W_out_h, the identity)
    ``+ neurons`` (ν_log); linear attention has ``4·n_heads·d_model·d_head``.

    Raises:
        ValueError: if a size is not a positive int.
    """
    for name, value in (("d_model", d_model), ("n_heads", n_heads), ("d_head", d_head)):
        _positive(name, value)
    n = n_heads * d_head**2
    return {
        "neurons": n,
        "rnn_parameters": 4 * d_model * n + n * n + n,
        "attention_parameters": 4 * n_heads * d_model * d_head,
    }


def gated_rnn_from_linear_attention(
    W_Q: Tensor, W_K: Tensor, W_V: Tensor, W_O: Tensor
) -> GatedLinearRNN:
    """A :class:`GatedLinearRNN` whose output equals :func:`causal_linear_attention` exactly.

    One neuron per (head h, value coordinate a, key coordinate b), n = (h·d_head + a)·d_head + b::

        W_in_x[:, n] = W_V[h, :, a]    W_in_g[:, n] = W_K[h, :, b]    λ_n = 1 (ν_log = −∞)
        W_out_h = I                    W_out_x[:, n] = W_Q[h, :, b]   D[n, :] = W_O[h, a, :]

    so ``h_{t,n} = Σ_{s≤t} v_{s,a} k_{s,b}`` and ``y_t = Σ_{h,a,b} h_{t,n} q_{t,b} W_O[h,a,:]``
    ``= LSA(x)_t``. Neurons ``n_heads·d_head²``; parameters ``4·d_model·n + n² + n`` against
    ``4·n_heads·d_model·d_head`` for the attention (:func:`construction_counts`): O(d⁴) with
    the full W_out_h, O(d³) without it. Real λ, no γ, no skip; dtype and device of ``W_Q``;
    the global RNG is left as it was.

    Args:
        W_Q, W_K, W_V: ``[n_heads, d_model, d_head]``; W_O: ``[n_heads, d_head, d_model]``.
    Returns:
        The gated RNN (fresh parameters holding copies of the weights).
    Raises:
        ValueError: if the shapes disagree (as :func:`causal_linear_attention`).
    References:
        Zucchet et al. (2023), arXiv 2309.01775, Sec. 3.1 (the construction).
    """
    if not (W_Q.ndim == 3 and W_Q.shape == W_K.shape == W_V.shape):
        raise ValueError(
            "W_Q, W_K, W_V must share a shape [n_heads, d_model, d_head] "
            f"(got {list(W_Q.shape)}, {list(W_K.shape)}, {list(W_V.shape)})"
        )
    H, d_model, d_head = W_Q.shape
    if W_O.shape != (H, d_head, d_model):
        raise ValueError(
            f"W_O must have shape [n_heads, d_head, d_model] = {[H, d_head, d_model]} "
            f"(got {list(W_O.shape)})"
        )
    n = H * d_head * d_head
    shape = (H, d_model, d_head, d_head)  # [h, model, a, b]

    def columns(W: Tensor) -> Tensor:  # [h, model, a, b] -> [model, n]
        return W.permute(1, 0, 2, 3).reshape(d_model, n)

    with torch.random.fork_rng(devices=[]):  # every parameter is overwritten: keep the caller's RNG
        rnn = GatedLinearRNN(d_model, n, n).to(device=W_Q.device, dtype=W_Q.dtype)
    with torch.no_grad():
        rnn.W_in_x.copy_(columns(W_V.detach()[:, :, :, None].expand(shape)))
        rnn.W_in_g.copy_(columns(W_K.detach()[:, :, None, :].expand(shape)))
        rnn.W_out_x.copy_(columns(W_Q.detach()[:, :, None, :].expand(shape)))
        rnn.D.copy_(
            W_O.detach()[:, :, None, :].expand(H, d_head, d_head, d_model).reshape(n, d_model)
        )
        rnn.W_out_h.copy_(torch.eye(n, dtype=W_Q.dtype, device=W_Q.device))
        rnn.nu_log.fill_(-math.inf)  # λ = exp(−exp(−∞)) = 1 exactly
    return rnn
