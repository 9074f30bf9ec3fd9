"""Runs of ``ntk-lazy-validity`` (S11): the alpha-scaled net and its linearized twin trained by
one engine step (notes: docs/studies/ntk-lazy-validity.md).

Glossary:
    N:        training inputs; d_in: input width; m: hidden width (``width``).
    g(w; x):  ``v^T tanh(W x / sqrt(d_in)) / sqrt(m)`` (:class:`dynascope.nn.mlp.MLP`, NTK
              parametrization, depth 1, no bias).
    h(w):     ``[N]`` outputs on the training inputs, ``h(w0) = 0`` by centering.
    centering: ``antisymmetric`` or ``offset`` give ``h(w0) = 0`` (the paper's setting);
              ``none`` is the plain net ``h = g`` (``h(w0) != 0``), the ablation control.
    hbar(w):  the linearized twin ``h(w0) + Dh(w0)(w - w0)`` (the map of
              :func:`dynascope.probes.linearize`, as products with ``Dh(w0)``).
    alpha:    the output scale; objective ``L(w) = ||alpha h(w) - f*||^2 / (2 alpha^2)``.
    t:        time ``eta * step``.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, field_validator
from torch import Tensor, nn
from torch.func import jacrev

from dynascope.monitor import EveryN, LogSchedule
from dynascope.nn.mlp import MLP
from dynascope.probes.kernels import empirical_ntk, ntk_relative_change
from dynascope.train import EngineRunConfig, Parts, SeedStreams, StepContext

__all__ = ["LazyPair", "LazyRun", "LazyStep", "build_h", "build_lazy", "two_layer"]

_ACTIVATIONS = {"tanh": torch.tanh, "relu": F.relu, "gelu": F.gelu}


class LazyRun(EngineRunConfig):
    """One S11 run: every alpha of ``alphas`` trained at once from the same w0 and data."""

    width: int = Field(256, ge=1, description="m, hidden width")
    d_in: int = Field(5, ge=1)
    n_train: int = Field(32, ge=1, description="N training inputs")
    activation: Literal["tanh", "relu", "gelu"] = "tanh"
    centering: Literal["antisymmetric", "offset", "none"] = Field(
        "antisymmetric",
        description="h(w0) = 0 by two copies or by an offset; none: h = g (the ablation)",
    )
    target_std: float = Field(1.0, gt=0, description="f* ~ N(0, target_std^2 I)")
    alphas: list[float] = Field(min_length=1, description="output scales (each > 0)")
    lr: float = Field(1e-2, gt=0, description="GD step eta (time t = eta * step)")
    kernel_points: int = Field(15, ge=1, description="log-spaced eNTK measurements")
    probe_every: int = Field(10, ge=1, description="steps between D rows (and steps 1-9)")

    @field_validator("alphas")
    @classmethod
    def _positive(cls, alphas: list[float]) -> list[float]:
        bad = [a for a in alphas if not a > 0]
        if bad:
            raise ValueError(f"alphas must all be > 0 (got {bad})")
        return alphas


def two_layer(w: dict[str, Tensor], x: Tensor, activation: str, scale: float = 1.0) -> Tensor:
    """S11's net ``g(x) = v^T phi(W x / sqrt(d)) / sqrt(m)`` (times ``scale``), ``[n, 1]``.

    ``w = {"W": [d, m], "v": [m, 1]}`` (or with a leading alpha axis ``[A, ...]``): the same
    function as :class:`dynascope.nn.mlp.MLP` (``depth=1, parametrization="ntk"``, no bias)
    with ``layers.0.weight = W`` and ``layers.1.weight = v`` (a test checks it). The constant
    is a product with a ``[1, 1]`` matrix: under ``torch.func.jvp`` a tensor-times-scalar was
    measured at ~1.5 ms against ~0.2 ms for a matmul.
    """
    phi = _ACTIVATIONS[activation]
    d, m = w["W"].shape[-2:]
    c = torch.full((1, 1), scale / math.sqrt(m), dtype=x.dtype, device=x.device)
    return (phi((x / math.sqrt(d)) @ w["W"]) @ w["v"]) @ c


def build_h(config: LazyRun, generator: torch.Generator, dtype: torch.dtype):
    """``(h_fn, w0)``: ``h_fn(w, x) -> [n, 1]``, with ``h(w0) = 0`` on every input unless
    ``centering`` is ``none``.

    Weights as :class:`dynascope.nn.mlp.MLP` draws them (NTK parametrization: N(0, 1)).
    ``antisymmetric``: two copies with identical initial weights, ``h = (g(w_a) - g(w_b)) /
    sqrt(2)``, both trained. ``offset``: ``h = g(w) - g(w0; x)`` with ``g(w0)`` frozen.
    ``none``: ``h = g(w)``, so ``alpha h(w0) = O(alpha)``: the initial residual grows with
    alpha and the bound ``C T / alpha`` (which carries it) no longer falls (Chizat, Oyallon &
    Bach 2019, Sec. 2; the ablation of S11's ``h(w0) = 0``).
    """
    net = MLP(config.d_in, config.width, 1, depth=1, parametrization="ntk",
              activation=config.activation, generator=generator, dtype=dtype)  # fmt: skip
    base = {"W": net.layers[0].weight.detach(), "v": net.layers[1].weight.detach()}
    act = config.activation
    if config.centering == "antisymmetric":
        w0 = {"a_W": base["W"], "a_v": base["v"], "b_W": base["W"], "b_v": base["v"]}
        r = 1 / math.sqrt(2.0)

        def h_fn(w: dict[str, Tensor], x: Tensor) -> Tensor:
            ga = two_layer({"W": w["a_W"], "v": w["a_v"]}, x, act, r)
            return ga - two_layer({"W": w["b_W"], "v": w["b_v"]}, x, act, r)

        return h_fn, {k: v.clone() for k, v in w0.items()}

    if config.centering == "none":

        def h_plain(w: dict[str, Tensor], x: Tensor) -> Tensor:
            return two_layer(w, x, act)

        return h_plain, {k: v.clone() for k, v in base.items()}

    def h_offset(w: dict[str, Tensor], x: Tensor) -> Tensor:
        return two_layer(w, x, act) - two_layer({k: v.to(x) for k, v in base.items()}, x, act)

    return h_offset, {k: v.clone() for k, v in base.items()}


class LazyPair(nn.Module):
    """The trained weights ``w`` (parameters) and the twin's ``wbar`` (buffers), ``[A, ...]``
    for A alphas, with the running sups the step keeps (``d_sup``, ``move_sup``,
    ``oracle_sup`` ``[A]``) and the closed-form twin output ``closed`` ``[A, N]`` (``alpha
    h(w0)`` at the start: 0 when centered): all of it is in the state dict, so a checkpoint
    resumes the sups exactly."""

    def __init__(self, w0: dict[str, Tensor], n_alphas: int, n_train: int) -> None:
        super().__init__()
        stacked = {k: v.expand(n_alphas, *v.shape).clone() for k, v in w0.items()}
        self.w = nn.ParameterDict({k: nn.Parameter(v) for k, v in stacked.items()})
        self.bar = nn.Module()
        for k, v in stacked.items():
            self.bar.register_buffer(k, v.clone())
        dtype = next(iter(w0.values())).dtype
        for name in ("d_sup", "move_sup", "oracle_sup"):
            self.register_buffer(name, torch.zeros(n_alphas, dtype=dtype))
        self.register_buffer("closed", torch.zeros(n_alphas, n_train, dtype=dtype))

    def weights(self) -> dict[str, Tensor]:
        return dict(self.w.items())

    def twin(self) -> dict[str, Tensor]:
        return dict(self.bar.named_buffers())


class LazyStep:
    """One GD step of ``alpha h`` (autograd) and of its twin, every alpha at once; before it,
    the running sups take in the current state's gap, output and oracle error.

    The twin is linear in its weights, so its output and gradient are two products with the
    Jacobian ``J = Dh(w0)`` ``[N, P]`` (computed once, ``torch.func.jacrev``):
    ``hbar(wbar) = h(w0) + (wbar - w0) J^T`` and ``grad = J^T r``. This is the same map as
    :func:`dynascope.probes.linearize` and its vjp (a test checks it), at a fraction of the
    cost of a ``jvp`` and a ``vjp`` per step.
    """

    def __init__(self, h_fn, w0b: dict[str, Tensor], x: Tensor, f_star: Tensor, alphas: Tensor,
                 lr: float, K0: Tensor) -> None:  # fmt: skip
        self.h_fn, self.w0b = h_fn, w0b
        self.x, self.f_star, self.scale, self.lr = x, f_star, alphas[:, None], lr
        w0 = {k: v[0] for k, v in w0b.items()}  # every alpha starts from the same w0
        jac = jacrev(lambda w: h_fn(w, x)[:, 0])(w0)  # {key: [N, *shape]}
        self.keys = list(w0b)
        self.shapes = [w0[k].shape for k in self.keys]
        self.J = torch.cat([jac[k].flatten(1) for k in self.keys], dim=1)  # [N, P]
        self.h0 = h_fn(w0, x)[:, 0].detach()  # [N], zero by centering
        self.step_matrix = torch.eye(len(x), dtype=x.dtype) - lr * K0  # closed-form twin

    def _flat(self, w: dict[str, Tensor]) -> Tensor:
        """``w - w0`` as ``[A, P]`` (the keys in order, each flattened)."""
        return torch.cat([(w[k] - self.w0b[k]).flatten(1) for k in self.keys], dim=1)

    def twin_output(self, twin: dict[str, Tensor]) -> Tensor:
        """``alpha hbar`` ``[A, N]``."""
        return self.scale * (self.h0 + self._flat(twin) @ self.J.T)

    def twin_gradient(self, out_lin: Tensor) -> dict[str, Tensor]:
        """The twin's gradient ``J^T (alpha hbar - f*) / alpha`` per key, ``[A, *shape]``."""
        flat = ((out_lin - self.f_star) / self.scale) @ self.J  # [A, P]
        parts = flat.split([s.numel() for s in self.shapes], dim=1)
        return {k: p.view(-1, *s) for k, p, s in zip(self.keys, parts, self.shapes, strict=True)}

    def outputs(self, model: LazyPair) -> tuple[Tensor, Tensor]:
        """``(alpha h, alpha hbar)`` ``[A, N]`` now (``alpha h`` keeps its graph)."""
        out = self.scale * self.h_fn(model.weights(), self.x)[..., 0]
        with torch.no_grad():
            out_lin = self.twin_output(model.twin())
        return out, out_lin

    def __call__(self, model: LazyPair, batch: object, ctx: StepContext) -> Tensor:
        out, out_lin = self.outputs(model)
        r = out - self.f_star
        loss = 0.5 * ((r / self.scale) ** 2).sum()  # sum over alpha of L_alpha
        grads = torch.autograd.grad(loss, list(model.w.values()))
        with torch.no_grad():
            _take_sups(model, out.detach(), out_lin, self.start())
            eta = self.lr * ctx.lr_factor
            for p, g in zip(model.w.values(), grads, strict=True):
                p.sub_(eta * g)
            for k, g_lin in self.twin_gradient(out_lin).items():
                model.bar.get_buffer(k).sub_(eta * g_lin)
            # alpha hbar_t = f* - (I - eta K)^t (f* - alpha h(w0)), rows per alpha (K symmetric)
            model.closed.copy_(self.f_star - (self.f_star - model.closed) @ self.step_matrix)
        return loss.detach()

    def start(self) -> Tensor:
        """``alpha h(w0)`` ``[A, N]`` (0 when centered)."""
        return self.scale * self.h0


def _take_sups(model: LazyPair, out: Tensor, out_lin: Tensor, start: Tensor) -> None:
    model.d_sup.copy_(torch.maximum(model.d_sup, torch.linalg.vector_norm(out - out_lin, dim=-1)))
    moved = torch.linalg.vector_norm(out - start, dim=-1)
    model.move_sup.copy_(torch.maximum(model.move_sup, moved))
    err = (out_lin - model.closed).abs().amax(-1)
    model.oracle_sup.copy_(torch.maximum(model.oracle_sup, err))


def _dist(w: dict[str, Tensor], w0: dict[str, Tensor]) -> Tensor:
    """``||w - w0||`` per alpha ``[A]`` (every non-leading axis summed)."""
    return torch.sqrt(sum(((w[k] - w0[k]) ** 2).flatten(1).sum(1) for k in w0))


def build_lazy(config: LazyRun, streams: SeedStreams) -> Parts:
    """The S11 run: inputs and targets from stream ``task``, w0 from stream ``model``.

    Probes (``[A]`` tensors, at steps 0-9 and every ``probe_every`` steps; the sups cover every
    step): ``D`` = sup ``||alpha h - alpha hbar||_2``, ``move`` = sup ``||alpha h||_2`` (the
    function's own movement from ``alpha h(w0) = 0``), ``oracle_error`` = sup ``max_i |alpha
    hbar_t - (f* - (I - eta K)^t (f* - alpha h(w0)))|_i`` (K = Dh Dh^T, the eNTK at w0;
    ``move`` and the closed form start from ``alpha h(w0)``, 0 when centered), ``param_dist``
    ``||w - w0||``, ``residual`` ``||alpha h - f*||``; at step 0 ``lr_lambda_max`` (``eta
    lambda_max(K)``, < 2 for stable GD); on ``kernel_points`` log-spaced steps
    ``ntk.relative_change`` of h's eNTK.
    """
    dtype = getattr(torch, config.loop.dtype)
    g = streams.generator("task")
    x = torch.randn(config.n_train, config.d_in, generator=g, dtype=dtype)
    f_star = config.target_std * torch.randn(config.n_train, generator=g, dtype=dtype)
    h_fn, w0 = build_h(config, streams.generator("model"), dtype)
    alphas = torch.tensor(config.alphas, dtype=dtype)
    K0 = empirical_ntk(h_fn, w0, x)[:, :, 0, 0]  # [N, N], shared by every alpha
    lam_max = float(torch.linalg.eigvalsh(K0)[-1])
    model = LazyPair(w0, len(alphas), config.n_train)
    w0b = {k: v.detach().clone() for k, v in model.w.items()}
    step = LazyStep(h_fn, w0b, x, f_star, alphas, config.lr, K0)
    model.closed.copy_(step.start())

    @torch.no_grad()
    def lazy(model: LazyPair, ctx: object) -> dict:
        out, out_lin = step.outputs(model)
        out = out.detach()
        d = torch.maximum(model.d_sup, torch.linalg.vector_norm(out - out_lin, dim=-1))
        move = torch.maximum(model.move_sup, torch.linalg.vector_norm(out - step.start(), dim=-1))
        oracle = torch.maximum(model.oracle_sup, (out_lin - model.closed).abs().amax(-1))
        values = {"D": d, "move": move, "oracle_error": oracle,
                  "param_dist": _dist(model.weights(), w0b),
                  "residual": torch.linalg.vector_norm(out - f_star, dim=-1)}  # fmt: skip
        if getattr(ctx, "step", None) == 0:
            values.update(alphas=alphas, lr_lambda_max=config.lr * lam_max)
        return values

    def kernel(model: LazyPair, ctx: object) -> dict:
        w = {k: v.detach() for k, v in model.weights().items()}
        changes = [
            ntk_relative_change(
                empirical_ntk(h_fn, {k: v[i] for k, v in w.items()}, x)[..., 0, 0], K0
            )
            for i in range(len(alphas))
        ]
        return {"ntk.relative_change": torch.stack(changes)}

    steps = config.loop.steps
    return Parts(
        model=model,
        data={},
        step=step,
        probes=[
            (lazy, EveryN(config.probe_every, also=[*range(1, 10), steps])),
            (kernel, LogSchedule(steps, config.kernel_points)),
        ],
    )
