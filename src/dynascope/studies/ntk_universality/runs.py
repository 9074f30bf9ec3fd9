"""ntk-universality runs on the engine: one NTK-parametrized net (MLP, Elman RNN or attention)
of one width and seed, trained by full-batch GD on ``(1/2N) sum (f - y)^2``; a width's seeds
train as one ensemble.

Glossary:
    N:       training inputs; d_in: input (token) width; pos: tokens per sequence (RNN,
             attention); n: width.
    f_t:     ``[N]`` the net's outputs on the training inputs after t GD steps.
    Theta_0: the net's empirical NTK on the training inputs at init ``[N, N]``; Theta_ring: the
             analytic infinite-width NTK (MLP only).
    kGD:     kernel gradient descent ``f <- f - (eta / N) Theta (f - y)`` from the net's f_0.
    muP:     the ablation arm (``parametrization="mup"``): the same NTK net with its output
             multiplied by ``n^-1/2`` and GD's step by ``n``. By the abc-parametrization shift
             of Yang & Hu (2021, arXiv 2011.14522, Sec. 3 and Table 3) this is muP for SGD:
             the same kernel-GD speed at init, ``(eta n / N) Theta_muP = (eta / N) Theta_NTK``,
             but features move by Theta(1) at every width, so the kernel regime is removed.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from dynascope.monitor import EveryN
from dynascope.nn.kernel_nets import ElmanRNN, KernelAttentionNet
from dynascope.nn.mlp import MLP
from dynascope.probes.kernels import (
    analytic_ntk_relu,
    empirical_ntk,
    kernel_gd_predictions,
    model_function,
    ntk_relative_change,
)
from dynascope.train import EngineRunConfig, Parts, SeedStreams

__all__ = [
    "UniversalityProbe",
    "UniversalityRun",
    "build_model",
    "build_universality",
    "gd_lr",
    "make_data",
]


class UniversalityRun(EngineRunConfig):
    """One S17 run: architecture, width, data and full-batch GD (``loop.steps`` steps)."""

    kind: Literal["ntk_universality"] = "ntk_universality"
    arch: Literal["mlp", "rnn", "attention"]
    width: int = Field(ge=1, description="n")
    d_in: int = Field(8, ge=1)
    n_train: int = Field(16, ge=1, description="N")
    pos: int = Field(5, ge=1, description="tokens per sequence (RNN, attention)")
    mlp_depth: int = Field(2, ge=1, description="hidden ReLU layers of the MLP")
    rnn_activation: Literal["tanh", "relu"] = "tanh"
    logit_scale: Literal["1/n", "1/sqrt(n)"] = "1/n"
    lr: float = Field(0.5, gt=0, description="full-batch GD step (NTK; muP takes lr * width)")
    parametrization: Literal["ntk", "mup"] = Field(
        "ntk", description="ntk: the claim's nets; mup: the ablation (output n^-1/2, step x n)"
    )
    kernel_steps: list[int] = Field(default_factory=lambda: [0, 1, 3, 10, 30, 100, 200])


def make_data(config: UniversalityRun, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """``(x, y)`` in float64: inputs on the sphere of radius sqrt(d_in) (per token for
    sequences), ``[N, d_in]`` (MLP) or ``[N, pos, d_in]``, and targets ``y ~ N(0, 1)`` ``[N]``.

    Drawn from ``generator`` alone (the run's stream ``inputs``), so every architecture and
    width of a seed sees the same data.
    """
    shape = (config.n_train, config.d_in) if config.arch == "mlp" else (
        config.n_train, config.pos, config.d_in)  # fmt: skip
    z = torch.randn(*shape, generator=generator, dtype=torch.float64)
    x = math.sqrt(config.d_in) * z / torch.linalg.vector_norm(z, dim=-1, keepdim=True)
    y = torch.randn(config.n_train, generator=generator, dtype=torch.float64)
    return x, y


class _ScaledOutput(nn.Module):
    """``scale * net(x)``: the muP arm's output multiplier on an NTK net."""

    def __init__(self, net: nn.Module, scale: float) -> None:
        super().__init__()
        self.net, self.scale = net, scale

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * self.net(x)


def gd_lr(config: UniversalityRun) -> float:
    """GD's step: ``lr`` (NTK) or ``lr * width`` (muP, the glossary's shift)."""
    return config.lr * (config.width if config.parametrization == "mup" else 1)


def build_model(config: UniversalityRun, generator: torch.Generator | None = None) -> nn.Module:
    """The NTK-parametrized net of ``config.arch`` at ``config.width`` (float64 weights); for
    ``parametrization="mup"`` the same net (same draw) with its output times ``width^-1/2``."""
    kw: dict[str, Any] = {"parametrization": "ntk", "generator": generator, "dtype": torch.float64}
    if config.arch == "mlp":
        net = MLP(config.d_in, config.width, 1, depth=config.mlp_depth, activation="relu", **kw)
    elif config.arch == "rnn":
        net = ElmanRNN(config.d_in, config.width, 1, activation=config.rnn_activation, **kw)
    else:
        net = KernelAttentionNet(config.d_in, config.width, 1, logit_scale=config.logit_scale, **kw)
    if config.parametrization == "mup":
        return _ScaledOutput(net, config.width**-0.5)
    return net


class UniversalityProbe:
    """S17's instruments on one net, from its outputs ``f_t`` on the training inputs.

    Every step: ``f`` ``[N]``. At ``kernel_steps``: ``ntk.relative_change`` (``||Theta_t -
    Theta_0||_F / ||Theta_0||_F``) and ``ntk.trace``; at step 0 also ``lr_lambda_max_over_N``
    (``(eta / N) lambda_max(Theta_0)``; kernel GD is stable below 2). At step 0 and ``last``:
    ``fit.mse`` (``mean (f - y)^2``). At ``last``:
    ``kgd.deviation`` (``sup_t ||f_t - f_t^kGD||_2``, the kernel-GD twin with the net's own
    Theta_0 from its f_0), ``kgd.gap`` ``[last + 1]`` per step, and for the NTK MLP
    ``kgd_analytic.deviation`` (Theta_ring twin) and ``ntk.init_deviation`` (``||Theta_0 -
    Theta_ring||_F / ||Theta_ring||_F``). Its state (Theta_0, the trajectory) is checkpointed.

    References:
        Yang & Littwin (2021), arXiv 2105.03703 (Tensor Programs IIb), Thm. 2.
    """

    def __init__(self, config: UniversalityRun, x: Tensor, y: Tensor, last: int) -> None:
        self.config, self.x, self.y, self.last = config, x, y, last
        self.K0: Tensor | None = None
        self.trajectory: list[Tensor] = []

    def _kernel(self, model: nn.Module, x: Tensor) -> Tensor:
        fn, params = model_function(model)  # eNTK one parameter tensor at a time
        return empirical_ntk(fn, params, x, mode="trace", chunk_size=self.config.n_train)

    def __call__(self, model: nn.Module, ctx: Any) -> dict[str, Tensor | float]:
        step, eta, N = ctx.step, gd_lr(self.config), self.config.n_train
        x = self.x.to(next(model.parameters()))
        with torch.no_grad():
            f = model(x)[:, 0].detach()
        del self.trajectory[step:]  # a resumed run re-probes from its checkpoint
        self.trajectory.append(f.double().cpu())
        out: dict[str, Tensor | float] = {"f": f.cpu()}
        if step == 0 or step == self.last:  # the fit precondition: MSE at init and at the end
            out["fit.mse"] = float((f.double().cpu() - self.y.double()).square().mean())
        if step in self.config.kernel_steps or step == 0:
            K = self._kernel(model, x).double()
            if step == 0:
                self.K0 = K
                out["lr_lambda_max_over_N"] = eta * float(torch.linalg.eigvalsh(K)[-1]) / N
            out["ntk.relative_change"] = float(ntk_relative_change(K, self.K0))
            out["ntk.trace"] = float(torch.trace(K))
        if step == self.last:
            out.update(self._twins(torch.stack(self.trajectory)))
        return out

    def _twins(self, traj: Tensor) -> dict[str, Tensor | float]:
        """Kernel-GD twins from the net's f_0: deviations from the net's trajectory."""
        y, steps = self.y.double(), len(traj) - 1
        twin, _ = kernel_gd_predictions(
            None, self.K0, y, gd_lr(self.config), steps, f0_train=traj[0]
        )
        gaps = torch.linalg.vector_norm(traj - twin[..., 0], dim=-1)  # [steps + 1]
        out: dict[str, Tensor | float] = {"kgd.gap": gaps, "kgd.deviation": float(gaps.max())}
        if self.config.arch == "mlp" and self.config.parametrization == "ntk":
            K_ring = analytic_ntk_relu(self.x.double(), depth=self.config.mlp_depth)
            ring, _ = kernel_gd_predictions(None, K_ring, y, self.config.lr, steps,
                                            f0_train=traj[0])  # fmt: skip
            gap = torch.linalg.vector_norm(traj - ring[..., 0], dim=-1).max()
            out["kgd_analytic.deviation"] = float(gap)
            out["ntk.init_deviation"] = float(ntk_relative_change(self.K0, K_ring))
        return out

    def state_dict(self) -> dict[str, Any]:
        """Theta_0 and the trajectory so far (``[t + 1, N]``)."""
        traj = torch.stack(self.trajectory) if self.trajectory else None
        return {"K0": self.K0, "trajectory": traj}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.K0 = state["K0"]
        traj = state["trajectory"]
        self.trajectory = [] if traj is None else list(traj.unbind(0))


def _mse(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    return 0.5 * ((model(batch["x"])[:, 0] - batch["y"]) ** 2).mean()


def build_universality(config: UniversalityRun, streams: SeedStreams) -> Parts:
    """Full-batch GD (SGD at ``lr``) on the run's own data; the probe every step."""
    x, y = make_data(config, streams.generator("inputs"))
    model = build_model(config, streams.generator("init"))
    return Parts(
        model=model,
        data={"x": x, "y": y},
        loss=_mse,
        optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=gd_lr(config)),
        probes=[(UniversalityProbe(config, x, y, config.loop.steps), EveryN(1))],
    )
