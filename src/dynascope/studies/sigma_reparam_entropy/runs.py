"""σReparam runs: the unit checks on one σReparam ``nn.Linear`` (an engine run with a drift
step) and the ViT sweep on the registry Trainer (on the engine)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from pydantic import Field
from torch import Tensor, nn

from dynascope.config import RunConfig
from dynascope.nn.reparam import register_sigma_reparam
from dynascope.studies.base import one_intra_op_thread
from dynascope.studies.engine_runs import EngineRunConfig
from dynascope.train import Parts, SeedStreams, StepContext, run_training

__all__ = ["DIFF_KEY", "ERROR_KEY", "UnitCheckRun", "build_units", "vit_runner"]

DIFF_KEY = "unit.max_abs_diff"  # max |SN(x) − Linear(x)| (evaluation: step 0 and the end)
ERROR_KEY = "train.sigma_rel_err"  # |σ_running / ‖W‖₂ − 1| after each drift step


class UnitCheckRun(EngineRunConfig):
    """u1/u2 on a σReparam ``nn.Linear(d_in, d_out)`` (γ = σ₀); ``loop.steps`` drift steps."""

    d_in: int = Field(24, ge=1)
    d_out: int = Field(16, ge=1)
    batch: int = Field(7, ge=1)
    drift_rel: float = Field(0.01, gt=0, description="drift std per step / std of W₀")


class _DriftStep:
    """Adds N(0, drift_std²) to every entry of W (the ``step`` stream), then one training
    forward (one power iteration; σ written back); returns 0 and the σ error."""

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
        return torch.zeros((), dtype=W.dtype), {"sigma_rel_err": error}


def build_units(config: UnitCheckRun, streams: SeedStreams) -> Parts:
    """A plain ``nn.Linear`` and its σReparam copy (same weights); x from stream ``x``."""
    plain = nn.Linear(config.d_in, config.d_out)
    converted = nn.Linear(config.d_in, config.d_out)
    converted.load_state_dict(plain.state_dict())
    register_sigma_reparam(converted, "weight")
    x = torch.randn(config.batch, config.d_in, generator=streams.generator("x"))
    drift_std = config.drift_rel * float(plain.weight.detach().std())

    def evaluate(model: nn.Module) -> dict[str, float]:
        return {DIFF_KEY: float((model(x.to(plain.weight)) - plain(x)).abs().max())}

    return Parts(model=converted, data={}, step=_DriftStep(x, drift_std), evaluate=evaluate)


def vit_runner(
    config: RunConfig,
    run_dir: str | os.PathLike[str],
    *,
    progress: bool = False,
    device: str | None = None,
    resume: bool = False,
) -> None:
    """Train on one intra-op thread: this ViT's matrices are too small for a second thread to
    pay (CPU 435 s vs 201 s single-threaded for the 300-step sweep, 2026-12-01)."""
    if device is not None:
        config = config.model_copy(update={"device": device})
    with one_intra_op_thread():
        run_training(config, Path(run_dir), progress=progress, resume=resume)
