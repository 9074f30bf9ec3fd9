"""MLP with a width argument and a choice of parametrization: standard (SP), NTK, or muP.

Glossary (everything right-multiplies, ``x @ W``; papers and ``nn.Linear`` store the transpose):
    batch:      inputs per batch.
    d_in:       input width.
    width:      n, the width of every hidden layer (the one that goes to infinity).
    depth:      L, the number of hidden layers (with activation); ``depth = 1``: d_in -> n -> d_out.
    bottleneck: d, the width of an optional finite linear layer (S16), or ``None``.
    d_out:      output width.
    layers.i.weight: ``[fan_in_i, fan_out_i]``; layers.i.bias: ``[fan_out_i]`` (if ``use_bias``).
    sigma_w, sigma_b: ``W_std`` and ``b_std``.
    m:          the width multiplier ``width / base_width`` (muP only).

Forward (``phi`` = activation; the bottleneck layer and the readout have no activation)::

    h_0 = x                                                    # [batch, d_in]
    z_i = mult_i * (h_{i-1} @ W_i) + b_i                       # [batch, fan_out_i], preactivation
    h_i = phi(z_i)  (hidden layers)   or   h_i = z_i  (bottleneck, readout)

With a bottleneck of width d after hidden layer k (``bottleneck_after = k``), the layers are
``d_in -> n (x k) -> d (linear) -> n (x (L - k)) -> d_out``. S16's net 16 -> n -> d -> n -> 1 is
``depth=2, bottleneck=d, bottleneck_after=1``: ``z = W_2 phi(W_1 x / sqrt(16)) / sqrt(n)``,
``F = v^T phi(W_3 z / sqrt(d)) / sqrt(n)``.

Parametrizations (the abc table of Tensor Programs V, Table 3, with fan_in of each layer; all
weights are drawn ``W = std * N(0, 1)``; biases: under SP and muP the parameter is
``b ~ N(0, sigma_b^2)`` with multiplier 1; under NTK the parameter is ``beta ~ N(0, 1)`` and the
layer adds ``sigma_b * beta`` (Jacot et al.'s ``beta`` factor), so that the bias's share of the
NTK is ``sigma_b^2`` as in the analytic recursion):

=========  ===================  =============================  =============================
param      layer                init std                       forward multiplier ``mult``
=========  ===================  =============================  =============================
standard   every layer          sigma_w / sqrt(fan_in)         1
ntk        every layer          sigma_w                        1 / sqrt(fan_in)
mup        input (first)        sigma_w / sqrt(d_in)           1
mup        hidden (n -> n)      sigma_w / sqrt(fan_in)         1
mup        readout (n -> out)   0 (``readout_init="zero"``),   1 / m, m = width / base_width
                                or sigma_w sqrt(m / fan_in)
=========  ===================  =============================  =============================

SP and NTK give the same function at initialisation (``x @ (sigma_w Z / sqrt(fan_in))`` vs
``(x @ sigma_w Z) / sqrt(fan_in)``) but different gradients: under NTK the gradient of each
entry is ``1/sqrt(fan_in)`` smaller, so one learning rate trains every width (the kernel
regime). muP follows S09 (microsoft/mup's ``MuReadout`` and MLP example, Adam flavour): the
readout is divided by m (and zero-initialised by default, or ``sqrt(m)``-rescaled from the SP
init, as ``MuReadout``'s SP->muP rescale), other layers keep SP init; the learning-rate rules
(matrix-like lr / m under Adam) live in ``dynascope.optim``, not here. At ``width ==
base_width`` (m = 1) with ``readout_init="default"`` muP equals SP exactly.
``layer_roles`` names each parameter ``"input"``, ``"hidden"``, ``"readout"`` or ``"bias"`` so
optimiser rules need not parse names.

References:
    Jacot, Gabriel & Hongler (2018), "Neural Tangent Kernel", NeurIPS, arXiv 1806.07572, eq. (1)
    (NTK parametrization). Yang & Hu (2021), "Tensor Programs IV: Feature Learning in
    Infinite-Width Neural Networks", arXiv 2011.14522, Table 1 (abc-parametrizations).
    Yang et al. (2022), "Tensor Programs V", arXiv 2203.03466, Table 3 (muP). Littwin et al.
    (2021), arXiv 2107.00364 (finite bottleneck, S16).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["MLP", "MLPActivation", "Parametrization"]

Parametrization = Literal["standard", "ntk", "mup"]
MLPActivation = Literal["relu", "tanh", "gelu", "identity"]
_ACTIVATIONS = {"relu": F.relu, "tanh": torch.tanh, "gelu": F.gelu, "identity": lambda z: z}
_PARAMETRIZATIONS = ("standard", "ntk", "mup")


class _Layer(nn.Module):
    """One dense layer: ``weight`` ``[fan_in, fan_out]``, optional ``bias``, a fixed ``mult``."""

    def __init__(
        self, weight: Tensor, bias: Tensor | None, mult: float, role: str, bias_mult: float = 1.0
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = None if bias is None else nn.Parameter(bias)
        self.mult = mult
        self.bias_mult = bias_mult
        self.role = role

    def forward(self, h: Tensor) -> Tensor:
        z = self.mult * (h @ self.weight)
        return z if self.bias is None else z + self.bias_mult * self.bias

    def extra_repr(self) -> str:
        fan_in, fan_out = self.weight.shape
        return f"{fan_in} -> {fan_out}, mult={self.mult:.4g}, role={self.role}"


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer (got {value!r})")
    return value


class MLP(nn.Module):
    """A fully connected net ``d_in -> width (x depth) -> d_out`` in SP, NTK or muP form.

    See the module docstring for the forward pass and the parametrization table.

    Args:
        d_in: input width (> 0); input ``[batch, d_in]``.
        width: n, every hidden layer's width (> 0).
        d_out: output width (> 0); output ``[batch, d_out]``.
        depth: L, hidden layers with activation (>= 1).
        parametrization: ``"standard"``, ``"ntk"`` or ``"mup"``.
        activation: ``"relu"``, ``"tanh"``, ``"gelu"`` or ``"identity"``.
        W_std: sigma_w (> 0), dimensionless.
        b_std: sigma_b (>= 0); biases are drawn ``N(0, b_std^2)``.
        use_bias: add a bias to every layer.
        bottleneck: d, width of a finite linear layer (no activation), or ``None``.
        bottleneck_after: how many hidden layers come before the bottleneck (1..depth-1 puts it
            between hidden layers; ``depth`` puts it right before the readout). Default
            ``depth // 2`` for ``depth >= 2``, else 1.
        base_width: muP's base width (m = width / base_width); ignored otherwise.
        readout_init: muP readout: ``"zero"`` (default) or ``"default"`` (SP init times sqrt(m)).
        generator: RNG for the weights (default: torch's global RNG).
        dtype: parameter dtype.
    Raises:
        ValueError: non-positive ``d_in``, ``width``, ``d_out``, ``depth``, ``bottleneck`` or
            ``base_width``; negative or non-finite ``W_std``/``b_std`` (``W_std`` must be > 0);
            unknown ``parametrization``, ``activation`` or ``readout_init``;
            ``bottleneck_after`` outside 1..depth or without a bottleneck; a bottleneck with
            ``parametrization="mup"`` (its finite layers' muP roles are not defined here).
    """

    def __init__(
        self,
        d_in: int,
        width: int,
        d_out: int = 1,
        *,
        depth: int = 2,
        parametrization: Parametrization = "standard",
        activation: MLPActivation = "relu",
        W_std: float = 1.0,
        b_std: float = 0.0,
        use_bias: bool = False,
        bottleneck: int | None = None,
        bottleneck_after: int | None = None,
        base_width: int = 64,
        readout_init: Literal["zero", "default"] = "zero",
        generator: torch.Generator | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        for name, value in (("d_in", d_in), ("width", width), ("d_out", d_out), ("depth", depth)):
            _positive_int(name, value)
        _positive_int("base_width", base_width)
        if parametrization not in _PARAMETRIZATIONS:
            raise ValueError(
                f"parametrization must be one of {', '.join(_PARAMETRIZATIONS)} "
                f"(got {parametrization!r})"
            )
        if activation not in _ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {', '.join(_ACTIVATIONS)} (got {activation!r})"
            )
        if readout_init not in ("zero", "default"):
            raise ValueError(f"readout_init must be 'zero' or 'default' (got {readout_init!r})")
        if not (math.isfinite(W_std) and W_std > 0):
            raise ValueError(f"W_std must be a finite number > 0 (got {W_std!r})")
        if not (math.isfinite(b_std) and b_std >= 0):
            raise ValueError(f"b_std must be a finite number >= 0 (got {b_std!r})")
        if bottleneck is not None:
            _positive_int("bottleneck", bottleneck)
            if parametrization == "mup":
                raise ValueError(
                    "bottleneck is not supported with parametrization='mup' (got "
                    f"bottleneck={bottleneck}; use 'standard' or 'ntk')"
                )
            after = bottleneck_after if bottleneck_after is not None else max(1, depth // 2)
            if isinstance(after, bool) or not isinstance(after, int) or not 1 <= after <= depth:
                raise ValueError(f"bottleneck_after must be in 1..depth={depth} (got {after!r})")
        elif bottleneck_after is not None:
            raise ValueError(f"bottleneck_after needs a bottleneck (got {bottleneck_after!r})")
        else:
            after = None
        self.d_in, self.width, self.d_out, self.depth = d_in, width, d_out, depth
        self.parametrization = parametrization
        self.activation = activation
        self.W_std, self.b_std, self.use_bias = W_std, b_std, use_bias
        self.bottleneck, self.bottleneck_after = bottleneck, after
        self.base_width = base_width
        self.width_mult = width / base_width if parametrization == "mup" else 1.0
        self.readout_init = readout_init

        # (fan_in, fan_out, has_activation, role) per layer
        plan: list[tuple[int, int, bool, str]] = []
        fan_in = d_in
        for i in range(depth):
            plan.append((fan_in, width, True, "input" if i == 0 else "hidden"))
            fan_in = width
            if after is not None and i + 1 == after:
                plan.append((fan_in, bottleneck, False, "hidden"))
                fan_in = bottleneck
        plan.append((fan_in, d_out, False, "readout"))
        self._activated = [act for _, _, act, _ in plan]
        self.layers = nn.ModuleList(
            self._make_layer(f, o, role, generator, dtype) for f, o, _, role in plan
        )
        self.bottleneck_index = None if after is None else after  # index into layers

    def _make_layer(
        self, fan_in: int, fan_out: int, role: str, generator: torch.Generator | None, dtype
    ) -> _Layer:
        z = torch.randn(fan_in, fan_out, generator=generator, dtype=dtype)
        bias = None
        if self.use_bias:
            bias = torch.randn(fan_out, generator=generator, dtype=dtype)
        if self.parametrization == "ntk":  # b = b_std * beta, beta ~ N(0, 1) the parameter
            return _Layer(self.W_std * z, bias, 1.0 / math.sqrt(fan_in), role, self.b_std)
        bias = None if bias is None else self.b_std * bias
        std = self.W_std / math.sqrt(fan_in)
        if self.parametrization == "mup" and role == "readout":
            m = self.width_mult
            weight = torch.zeros_like(z) if self.readout_init == "zero" else std * math.sqrt(m) * z
            return _Layer(weight, bias, 1.0 / m, role)
        return _Layer(std * z, bias, 1.0, role)

    @property
    def layer_roles(self) -> dict[str, str]:
        """Parameter name -> ``"input"``, ``"hidden"``, ``"readout"`` or ``"bias"``."""
        roles = {}
        for i, layer in enumerate(self.layers):
            roles[f"layers.{i}.weight"] = layer.role
            if layer.bias is not None:
                roles[f"layers.{i}.bias"] = "bias"
        return roles

    def preactivations(self, x: Tensor) -> list[Tensor]:
        """Every layer's preactivation ``z_i`` ``[batch, fan_out_i]``; the last is the output.

        With a bottleneck, ``preactivations(x)[bottleneck_index]`` are the codes Z ``[batch, d]``.

        Raises:
            ValueError: if ``x`` is not ``[batch, d_in]``.
        """
        if x.ndim != 2 or x.shape[-1] != self.d_in:
            raise ValueError(f"x must be [batch, d_in={self.d_in}] (got {tuple(x.shape)})")
        phi = _ACTIVATIONS[self.activation]
        out, h = [], x
        for layer, activated in zip(self.layers, self._activated):
            z = layer(h)
            out.append(z)
            h = phi(z) if activated else z
        return out

    def forward(self, x: Tensor) -> Tensor:
        """``[batch, d_in] -> [batch, d_out]``.

        Raises:
            ValueError: if ``x`` is not ``[batch, d_in]``.
        """
        return self.preactivations(x)[-1]
