"""σReparam runs: the unit checks on one σReparam ``nn.Linear`` (an engine run with a drift
step) and the ViT sweep on the registry Trainer (on the engine)."""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field
from torch import Tensor, nn

from dynascope.nn.reparam import register_sigma_reparam
from dynascope.train import EngineRunConfig, Parts, SeedStreams, StepContext

__all__ = [
    "CONTROL_DIFF_KEY",
    "CONTROL_ERROR_KEY",
    "DIFF_KEY",
    "ERROR_KEY",
    "UnitCheckRun",
    "build_units",
]

DIFF_KEY = "unit.max_abs_diff"  # max |SN(x) − Linear(x)| (evaluation: step 0 and the end)
CONTROL_DIFF_KEY = "unit.max_abs_diff_gamma_one"  # the same with γ = 1 (u1's control)
ERROR_KEY = "train.sigma_rel_err"  # |σ_running / ‖W‖₂ − 1| after each drift step
CONTROL_ERROR_KEY = "train.sigma_rel_err_fresh_u"  # one iteration from a fresh u (u2's control)


class UnitCheckRun(EngineRunConfig):
    """u1/u2 on a σReparam ``nn.Linear(d_in, d_out)`` (γ = σ₀); ``loop.steps`` drift steps."""

    d_in: int = Field(24, ge=1)
    d_out: int = Field(16, ge=1)
    batch: int = Field(7, ge=1)
    drift_rel: float = Field(0.01, gt=0, description="drift std per step / std of W₀")


def _fresh_sigma(W: Tensor, generator: torch.Generator) -> Tensor:
    """σ of ``W`` [out, in] from one power iteration started at a fresh random u (no memory):
    v = normalize(W u₀), u = normalize(Wᵀ v), σ = vᵀ W u (u2's control)."""
    u = torch.randn(W.shape[1], generator=generator, dtype=W.dtype)
    v = nn.functional.normalize(W @ u, dim=0)
    u = nn.functional.normalize(W.T @ v, dim=0)
    return v @ W @ u


class _DriftStep:
    """Adds N(0, drift_std²) to every entry of W (the ``step`` stream), then one training
    forward (one power iteration; σ written back); returns 0, the σ error and the error of
    the control σ (:func:`_fresh_sigma`, its u₀ drawn after the drift)."""

    def __init__(self, x: Tensor, drift_std: float) -> None:
        self.x, self.drift_std = x, drift_std

    def __call__(self, model: nn.Module, batch: Any, ctx: StepContext) -> tuple[Tensor, dict]:
        W = model.parametrizations.weight.original
        with torch.no_grad():
            noise = torch.randn(W.shape, generator=ctx.generator, dtype=W.dtype)
            W.add_(self.drift_std * noise)
            model(self.x.to(W))
        sigma = model.parametrizations.weight[0].sigma
        exact = torch.linalg.matrix_norm(W.detach().double(), 2)
        error = (sigma.double() / exact - 1).abs()
        fresh = _fresh_sigma(W.detach().double(), ctx.generator)
        metrics = {"sigma_rel_err": error, "sigma_rel_err_fresh_u": (fresh / exact - 1).abs()}
        return torch.zeros((), dtype=W.dtype), metrics


def build_units(config: UnitCheckRun, streams: SeedStreams) -> Parts:
    """A plain ``nn.Linear``, its σReparam copy (same weights, γ = σ₀) and, for u1's control,
    a σReparam copy with γ = 1; x from stream ``x``."""
    plain = nn.Linear(config.d_in, config.d_out)
    converted, gamma_one = (
        nn.Linear(config.d_in, config.d_out),
        nn.Linear(config.d_in, config.d_out),
    )
    converted.load_state_dict(plain.state_dict())
    gamma_one.load_state_dict(plain.state_dict())
    register_sigma_reparam(converted, "weight")
    register_sigma_reparam(gamma_one, "weight", gamma_init="one")
    gamma_one.eval()
    x = torch.randn(config.batch, config.d_in, generator=streams.generator("x"))
    drift_std = config.drift_rel * float(plain.weight.detach().std())

    def evaluate(model: nn.Module) -> dict[str, float]:
        with torch.no_grad():
            out, reference = model(x.to(plain.weight)), plain(x)
            return {
                DIFF_KEY: float((out - reference).abs().max()),
                CONTROL_DIFF_KEY: float((gamma_one(x) - reference).abs().max()),
            }

    return Parts(model=converted, data={}, step=_DriftStep(x, drift_std), evaluate=evaluate)
