"""Runs of ``bottleneck-acceleration`` (S16): the bottleneck and all-wide NTK nets trained by GD
on the engine, and two kernel-GD twins as engine steps (notes:
docs/studies/bottleneck-acceleration.md)."""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor, nn
from torch.func import functional_call

from dynascope.monitor import EveryN, LogSchedule
from dynascope.nn.mlp import MLP
from dynascope.probes.kernels import (
    analytic_ntk_relu,
    empirical_ntk,
    model_function,
    ntk_relative_change,
)
from dynascope.probes.latent import latent_covariance_spectrum
from dynascope.train import EngineRunConfig, Parts, SeedStreams, StepContext

__all__ = [
    "BottleneckRun",
    "KernelGD",
    "arm_lr",
    "build_bottleneck",
    "kernel_gd_steps_to_target",
    "make_data",
    "make_net",
]

Net = Literal["bottleneck", "wide", "kernel", "bottleneck_lazy"]


class BottleneckRun(EngineRunConfig):
    """One run: a net (``bottleneck``, ``wide``) trained by full-batch GD on sin(f u^T x), or a
    kernel-GD twin: ``kernel`` (the all-wide net's analytic infinite-width NTK, f_0 = 0) or
    ``bottleneck_lazy`` (the bottleneck net's eNTK at init, f_0 = its initial output). Every arm
    steps at ``lr = c N / lambda_max(Theta_0)`` of its own kernel at init (``kernel_step`` c =
    0.25, fixed on calibration seeds 10000/20000 as the largest of 1, 1/2, 1/4 that kept every
    run off the edge of stability; notes page), unless ``kernel_step=None`` (then ``lr``)."""

    net: Net = "bottleneck"
    width: int = Field(256, ge=1, description="n, the wide layers' width")
    bottleneck: int = Field(4, ge=1, description="d, the bottleneck width")
    d_in: int = Field(16, ge=1)
    n_train: int = Field(256, ge=2, description="N training points")
    frequency: float = Field(3.0, gt=0, description="y = sin(frequency * u^T x)")
    lr: float = Field(1.0, gt=0, description="GD step on (1/2N) sum (F - y)^2 if kernel_step=None")
    kernel_step: float | None = Field(
        0.25,
        gt=0,
        lt=2,
        description="c: each arm's lr = c N / lambda_max(Theta_0), its own kernel at init "
        "(kernel-GD stability: c < 2); None: the fixed lr",
    )
    mse_target: float = Field(1e-3, gt=0, description="train MSE (1/N) sum (F - y)^2 to reach")
    n_kernel: int = Field(64, ge=2, description="training points for the reported eNTK change")
    kernel_chunk: int = Field(32, ge=1, description="examples per eNTK Jacobian block")
    log_points: int = Field(30, ge=2, description="log-spaced steps for per-layer movement")
    power_iters: int = Field(30, ge=1, description="for lambda_max(Theta_0)")

    @model_validator(mode="after")
    def _kernel_points_fit(self) -> BottleneckRun:
        if self.n_kernel > self.n_train:
            raise ValueError(
                f"n_kernel must be <= n_train (got n_kernel={self.n_kernel}, "
                f"n_train={self.n_train})"
            )
        return self


def make_data(config: BottleneckRun, generator: torch.Generator, dtype: torch.dtype):
    """``x`` ``[N, d_in]`` ~ N(0, I), ``y`` ``[N]`` = sin(f u^T x), u a unit vector."""
    u = torch.randn(config.d_in, generator=generator, dtype=torch.float64)
    u = u / u.norm()
    x = torch.randn(config.n_train, config.d_in, generator=generator, dtype=torch.float64)
    return x.to(dtype), torch.sin(config.frequency * (x @ u)).to(dtype)


def make_net(config: BottleneckRun, generator: torch.Generator, dtype: torch.dtype) -> MLP:
    """16 -> n -> d -> n -> 1 (bottleneck after the first layer) or 16 -> n -> n -> n -> 1."""
    common = dict(parametrization="ntk", activation="relu", generator=generator, dtype=dtype)
    if config.net in ("bottleneck", "bottleneck_lazy"):
        return MLP(config.d_in, config.width, 1, depth=2, bottleneck=config.bottleneck,
                   bottleneck_after=1, **common)  # fmt: skip
    return MLP(config.d_in, config.width, 1, depth=3, **common)


class KernelGD:
    """Kernel gradient descent as an engine step: ``f <- f - lr/N K (f - y)`` on the training
    points (the mean square loss), ``f`` the parameter of the module it is given."""

    def __init__(self, K: Tensor, y: Tensor, lr: float) -> None:
        self.K, self.y, self.lr = K, y, lr

    def __call__(self, model: nn.Module, batch: object, ctx: StepContext):
        with torch.no_grad():
            r = model.f - self.y.to(model.f)
            mse = r.square().mean()
            model.f.sub_(self.lr * ctx.lr_factor / len(r) * (self.K.to(r) @ r))
        return 0.5 * mse, {"mse": mse}


def kernel_gd_steps_to_target(K: Tensor, r0: Tensor, lr: float, target: float) -> float:
    """Exact first logged step at which kernel GD's train MSE is <= ``target``, never censored.

    Kernel GD ``r <- r - (lr/N) K r`` (``r = f - y``) in the eigenbasis ``K = V diag(λ) Vᵀ``:
    ``MSE_k = (1/N) Σ_i (1 - lr λ_i / N)^(2k) (Vᵀ r0)_i²`` after k updates. The engine logs
    the MSE before update t at step t, so the first logged step is ``k* + 1`` with ``k*`` the
    fewest updates reaching the target (doubling, then bisection; MSE_k falls monotonically
    while every ``|1 - lr λ_i / N| <= 1``, true for ``kernel_step`` c < 2).

    Args:
        K: ``[N, N]`` symmetric PSD kernel. r0: ``[N]`` initial residual ``f_0 - y``.
        lr: GD step. target: the MSE to reach (> 0).
    Returns:
        The step (a float), or ``inf`` if kernel GD never gets there (within 2^40 updates).
    Raises:
        ValueError: if ``target`` is not positive.
    """
    if not target > 0:
        raise ValueError(f"target must be > 0 (got target={target})")
    lam, V = torch.linalg.eigh(K.double())
    a2 = (V.mT @ r0.double()).square()
    factor = (1 - lr * lam / len(r0)).abs().clamp(max=1.0)

    def mse(k: int) -> float:
        return float((factor.pow(2 * k) * a2).sum() / len(r0))

    if mse(0) <= target:
        return 1.0
    hi = 1
    while mse(hi) > target:
        hi *= 2
        if hi > 2**40:
            return math.inf
    lo = hi // 2  # mse(lo) > target >= mse(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if mse(mid) <= target else (mid, hi)
    return float(hi + 1)


def arm_lr(config: BottleneckRun, lambda_max: float) -> float:
    """The arm's GD step: ``c N / lambda_max(Theta_0)`` (``c = kernel_step``), or ``lr``."""
    if config.kernel_step is None:
        return config.lr
    return config.kernel_step * config.n_train / lambda_max


def _mse_loss(model: nn.Module, batch: dict[str, Tensor]):
    mse = (model(batch["x"])[:, 0] - batch["y"]).square().mean()
    return 0.5 * mse, {"mse": mse}


def _lambda_max(
    model: MLP, x: Tensor, iters: int, generator: torch.Generator | None = None
) -> Tensor:
    """Top eigenvalue of the eNTK Gram ``J J^T`` ``[N, N]`` by power iteration (JVP/VJP), from
    a random start (``generator``) or, without one, from the all-ones vector (deterministic)."""
    params = {k: p.detach() for k, p in model.named_parameters()}
    _, pullback = torch.func.vjp(lambda p: functional_call(model, p, (x,))[:, 0], params)
    if generator is None:
        v = torch.ones(x.shape[0], dtype=x.dtype, device=x.device)
    else:
        v = torch.randn(x.shape[0], generator=generator, dtype=x.dtype)
    v, value = v / v.norm(), torch.zeros((), dtype=x.dtype)
    for _ in range(iters):
        tv = torch.func.jvp(lambda p: functional_call(model, p, (x,))[:, 0], (params,),
                            (pullback(v)[0],))[1]  # fmt: skip
        value, v = v @ tv, tv / tv.norm()
    return value


def build_bottleneck(config: BottleneckRun, streams: SeedStreams) -> Parts:
    """The run: data from stream ``task`` (shared by every arm of a seed), weights from
    ``model``. Nets log ``train.mse`` (every ``loop.log_every`` steps), per-layer
    ``movement.layers`` on ``log_points`` log-spaced steps, and at the end ``movement`` (the
    codes Z of the bottleneck, the middle layer H of the all-wide net), ``ntk.relative_change``
    on ``n_kernel`` points, the per-layer mean |preactivation| and the codes' covariance
    spectrum; at step 0 ``stability.eta_lambda_over_N`` = ``(lr/N) lambda_max(Theta_0)``.
    Kernel twins log ``train.mse``, their ``stability.eta_lambda_over_N`` and
    ``kgd.steps_to_target`` (:func:`kernel_gd_steps_to_target`: exact, whatever the budget)."""
    dtype = getattr(torch, config.loop.dtype)
    x, y = make_data(config, streams.generator("task"), dtype)
    N = config.n_train
    if config.net == "kernel" or config.net == "bottleneck_lazy":
        if config.net == "kernel":  # the all-wide net's limit: 3 hidden ReLU layers
            K, f0 = analytic_ntk_relu(x.double(), depth=3).to(dtype), torch.zeros_like(y)
        else:
            net = make_net(config, streams.generator("model"), dtype)
            fn, params = model_function(net)
            K = empirical_ntk(fn, params, x, chunk_size=config.kernel_chunk)[..., 0, 0]
            f0 = net(x)[:, 0].detach()
        model = nn.Module()
        model.f = nn.Parameter(f0.clone())
        lam_max = float(torch.linalg.eigvalsh(K.double())[-1])
        lr = arm_lr(config, lam_max)

        exact = kernel_gd_steps_to_target(K, f0 - y, lr, config.mse_target)

        def stability(model: nn.Module, ctx: object) -> dict:
            return {"stability.eta_lambda_over_N": lr * lam_max / N, "stability.lr": lr,
                    "kgd.steps_to_target": exact}  # fmt: skip

        return Parts(model=model, data={}, step=KernelGD(K, y, lr),
                     probes=[(stability, EveryN(config.loop.steps))])  # fmt: skip
    net = make_net(config, streams.generator("model"), dtype)
    with torch.no_grad():
        pre0 = [a.clone() for a in net.preactivations(x)[:-1]]
    xk = x[: config.n_kernel]
    fn, params = model_function(net)
    K0 = empirical_ntk(fn, params, xk, chunk_size=config.kernel_chunk)[..., 0, 0]
    lam_max = float(_lambda_max(net, x, config.power_iters, streams.generator("power")))
    lr = arm_lr(config, lam_max)

    @torch.no_grad()
    def movement(model: MLP, ctx: object) -> dict:
        pre = model.preactivations(x.to(pre0[0]))[:-1]
        out = {"movement.layers": torch.stack([(a - b).norm() / b.norm() for a, b in
                                               zip(pre, pre0)])}  # fmt: skip
        if config.net == "bottleneck":  # cheap here: the sharpness along training
            out["stability.sharpness"] = sharpness(model)
        return out

    def sharpness(model: MLP) -> Tensor:
        """``(lr/N) lambda_max(Theta_t)``: GD is stable on the kernel while this is < 2."""
        return _lambda_max(model, x.to(pre0[0]), config.power_iters) * lr / N

    def final(model: MLP, ctx: object) -> dict:
        with torch.no_grad():
            pre = model.preactivations(x.to(pre0[0]))[:-1]
        if getattr(ctx, "step", 0) == 0:
            return {"stability.eta_lambda_over_N": lr * lam_max / N, "stability.lr": lr,
                    "coord.l1.init": torch.stack([a.abs().mean() for a in pre])}  # fmt: skip
        fn, params = model_function(model)
        out = {
            "movement": (pre[1] - pre0[1]).norm() / pre0[1].norm(),
            "stability.sharpness": sharpness(model),
            "coord.l1.final": torch.stack([a.abs().mean() for a in pre]),
            "ntk.relative_change": ntk_relative_change(
                empirical_ntk(fn, params, xk.to(pre0[0]), chunk_size=config.kernel_chunk)[
                    ..., 0, 0], K0),
        }  # fmt: skip
        if config.net == "bottleneck":
            out["latent.spectrum"] = latent_covariance_spectrum(pre[1].double())
        return out

    steps = config.loop.steps
    return Parts(
        model=net,
        data={"x": x, "y": y},
        loss=_mse_loss,
        optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=lr),
        probes=[
            (movement, LogSchedule(steps, config.log_points)),
            (final, EveryN(steps)),
        ],  # fmt: skip
    )
