"""The LRU (linear recurrent unit), its residual block and network, and the LSTM/GRU baseline:
the recurrent models built around the diagonal recurrence of :mod:`dynascope.nn.recurrent`
(glossary there, which re-exports them).

References:
    Orvieto, Smith, Gu, Fernando, Gulcehre, Pascanu & De (2023), "Resurrecting recurrent neural
    networks for long sequences", ICML, arXiv 2303.06349 (Sec. 3: the LRU, eqs. 6–7, γ).
    Zucchet, minimal-LRU ``lru/model.py`` (initialisations, the LRU block).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._recurrence import _check_x, _init_nu_theta, _positive
from ._scan import linear_scan, sequential_scan


class LRU(nn.Module):
    """Linear recurrent unit: ``h_t = λ ⊙ h_{t−1} + γ ⊙ (x_t @ B)``, ``y_t = Re(h_t C) + D ⊙ x_t``.

    Complex λ and B, C (module glossary); init as minimal-LRU: ``B_re, B_im ~ N(0, 1/(2 d_model))``,
    ``C_re, C_im ~ N(0, 1/d_hidden)``, ``D ~ N(0, 1)``, ν_log and θ_log by the ring init,
    ``γ_log = log √(1 − |λ|²)`` trainable.

    Args:
        d_model: token width; d_hidden: complex state size.
        r_min, r_max: initial |λ| ring; max_phase: largest initial arg λ (radians).
    Raises:
        ValueError: if a width is not a positive int or the ring is invalid.
    References:
        Orvieto et al. (2023), arXiv 2303.06349, Sec. 3 and App. A.
    """

    def __init__(
        self,
        d_model: int,
        d_hidden: int,
        *,
        r_min: float = 0.0,
        r_max: float = 1.0,
        max_phase: float = 2 * math.pi,
    ) -> None:
        super().__init__()
        _positive("d_model", d_model)
        _positive("d_hidden", d_hidden)
        self.d_model, self.d_hidden = d_model, d_hidden
        nu_log, theta_log, gamma_log = _init_nu_theta(d_hidden, r_min, r_max, max_phase, "complex")
        self.nu_log, self.theta_log = nn.Parameter(nu_log), nn.Parameter(theta_log)
        self.gamma_log = nn.Parameter(gamma_log)
        self.B_re = nn.Parameter(torch.randn(d_model, d_hidden) / math.sqrt(2 * d_model))
        self.B_im = nn.Parameter(torch.randn(d_model, d_hidden) / math.sqrt(2 * d_model))
        self.C_re = nn.Parameter(torch.randn(d_hidden, d_model) / math.sqrt(d_hidden))
        self.C_im = nn.Parameter(torch.randn(d_hidden, d_model) / math.sqrt(d_hidden))
        self.D = nn.Parameter(torch.randn(d_model))

    def lambdas(self) -> Tensor:
        """Complex λ ``[d_hidden]``."""
        return torch.exp(torch.complex(-torch.exp(self.nu_log), torch.exp(self.theta_log)))

    def forward(self, x: Tensor, *, sequential: bool = False) -> Tensor:
        """``[batch, pos, d_model]`` -> ``[batch, pos, d_model]``.

        Raises:
            ValueError: if ``x`` is not ``[batch, pos, d_model]``.
        """
        _check_x(x, self.d_model)
        scale = torch.exp(self.gamma_log)
        bx = torch.complex(x @ (self.B_re * scale), x @ (self.B_im * scale))
        h = (sequential_scan if sequential else linear_scan)(self.lambdas(), bx)
        return h.real @ self.C_re - h.imag @ self.C_im + self.D * x


class LRUBlock(nn.Module):
    """LRU → GELU → GLU ``out1(z)·σ(out2(z))`` → residual, LayerNorm after (post) or before (pre).

    Args:
        d_model, d_hidden: widths of the :class:`LRU`.
        norm: ``"post"`` (minimal-LRU default) or ``"pre"``.
    Raises:
        ValueError: if ``norm`` is not ``"post"``/``"pre"`` (and as :class:`LRU`).
    References:
        Orvieto et al. (2023), arXiv 2303.06349, Fig. 1; Zucchet, minimal-LRU ``SequenceLayer``.
    """

    def __init__(
        self, d_model: int, d_hidden: int, *, norm: Literal["post", "pre"] = "post"
    ) -> None:
        super().__init__()
        if norm not in ("post", "pre"):
            raise ValueError(f"norm must be 'post' or 'pre' (got {norm!r})")
        self.norm_kind = norm
        self.lru = LRU(d_model, d_hidden)
        self.out1 = nn.Linear(d_model, d_model)
        self.out2 = nn.Linear(d_model, d_model)
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x: Tensor) -> Tensor:
        """``[batch, pos, d_model]`` -> same shape."""
        z = self.norm(x) if self.norm_kind == "pre" else x
        z = F.gelu(self.lru(z))
        out = x + self.out1(z) * torch.sigmoid(self.out2(z))
        return out if self.norm_kind == "pre" else self.norm(out)


class LRUNetwork(nn.Module):
    """``Linear(d_in, d_model)`` → ``n_layers`` :class:`LRUBlock` → ``Linear(d_model, d_out)``.

    Raises:
        ValueError: if a size is not a positive int.
    """

    def __init__(self, d_in: int, d_model: int, d_hidden: int, n_layers: int, d_out: int) -> None:
        super().__init__()
        for name, value in (("d_in", d_in), ("n_layers", n_layers), ("d_out", d_out)):
            _positive(name, value)
        self.embed = nn.Linear(d_in, d_model)
        self.blocks = nn.ModuleList(LRUBlock(d_model, d_hidden) for _ in range(n_layers))
        self.unembed = nn.Linear(d_model, d_out)

    def forward(self, x: Tensor) -> Tensor:
        """``[batch, pos, d_in]`` -> ``[batch, pos, d_out]``."""
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.unembed(x)


class RNNBaseline(nn.Module):
    """``torch.nn.LSTM`` or ``torch.nn.GRU`` (batch first) with a linear readout per position.

    Args:
        kind: ``"lstm"`` or ``"gru"``.
        d_in, d_hidden, d_out: input, state and output widths; n_layers: stacked layers.
    Raises:
        ValueError: if ``kind`` is unknown or a size is not a positive int.
    References:
        Hochreiter & Schmidhuber (1997), Neural Computation 9(8); Cho et al. (2014),
        arXiv 1406.1078.
    """

    def __init__(
        self, kind: Literal["lstm", "gru"], d_in: int, d_hidden: int, d_out: int, n_layers: int = 1
    ) -> None:
        super().__init__()
        if kind not in ("lstm", "gru"):
            raise ValueError(f"kind must be 'lstm' or 'gru' (got {kind!r})")
        for name, value in (("d_in", d_in), ("d_hidden", d_hidden), ("d_out", d_out)):
            _positive(name, value)
        _positive("n_layers", n_layers)
        cls = nn.LSTM if kind == "lstm" else nn.GRU
        self.kind = kind
        self.rnn = cls(d_in, d_hidden, num_layers=n_layers, batch_first=True)
        self.readout = nn.Linear(d_hidden, d_out)

    def forward(self, x: Tensor) -> Tensor:
        """``[batch, pos, d_in]`` -> ``[batch, pos, d_out]``."""
        return self.readout(self.rnn(x)[0])
