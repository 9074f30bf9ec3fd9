"""A stub study for executor, resume and report tests: runs that finish, raise, die or stall.

Importable by name (``_stub_study``) once this folder is on ``sys.path``, so executors in other
processes can unpickle its builds by reference. Each run trains on the engine and logs ``x`` at
steps 0..steps, drawn from its seed (so two executions of one run give equal rows).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict
from torch import Tensor, nn

from dynascope.monitor import EveryN
from dynascope.report.figures import new_figure, save_figure
from dynascope.studies.base import Analysis, RunSpec, Study, Verdict
from dynascope.train import EngineRunConfig, Loop, Parts, SeedStreams, StepContext

Behaviour = Literal["ok", "raise", "die", "slow"]


class StubRun(EngineRunConfig):
    behaviour: Behaviour = "ok"
    sleep_s: float = 0.0


class StubPreset(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    behaviours: tuple[Behaviour, ...] = ("ok", "ok")
    steps: int = 4
    sleep_s: float = 0.0


class _StubStep:
    """Sleeps ``sleep_s`` per step; ``die`` kills its own process at step 1."""

    def __init__(self, config: StubRun) -> None:
        self.config = config

    def __call__(self, model: nn.Module, batch, ctx: StepContext) -> Tensor:
        if self.config.behaviour == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(self.config.sleep_s)
        return torch.zeros(())


def build_stub(config: StubRun, streams: SeedStreams) -> Parts:
    """Logs ``x`` at steps 0..steps (drawn from the seed, one draw per step, so a resumed run's
    rows equal an uninterrupted run's); ``raise`` fails while building."""
    if config.behaviour == "raise":
        raise RuntimeError("stub failure")

    def x(model: nn.Module, ctx) -> dict[str, float]:
        generator = torch.Generator().manual_seed(config.seed)
        for _ in range(ctx.step):  # the draws of the earlier steps, one at a time
            torch.randn((), generator=generator)
        return {"x": float(torch.randn((), generator=generator)), "device": 0.0}

    model = nn.Linear(1, 1)
    return Parts(model=model, data={}, step=_StubStep(config), probes=[(x, EveryN(1, also=[0]))])


def build_runs(preset: StubPreset, seed: int) -> list[RunSpec]:
    loop = Loop(steps=preset.steps, log_every=1, checkpoint_every=1)
    return [
        RunSpec(
            f"r{i}_{b}",
            StubRun(seed=seed + i, loop=loop, behaviour=b, sleep_s=preset.sleep_s),
            build_stub,
        )
        for i, b in enumerate(preset.behaviours)
    ]


def analyze(runs, figures_dir: Path) -> Analysis:
    finished = [r for r in runs.values() if r.status == "finished"]
    total = sum(r.last("x") for r in finished)
    fig, (ax,) = new_figure(title="stub: x per run")
    for run in finished:
        series = run.scalar("x")
        ax.plot(series.index, series.values, label=run.name)
    ax.set(xlabel="step", ylabel="x")
    path = save_figure(fig, figures_dir / "x.png")
    return Analysis(
        verdicts=[
            Verdict("s1: sum of last x", "sum over finished runs", total, 0.0, total > 0.0),
            Verdict("s2: finished runs", "count", float(len(finished)), 1.0, len(finished) >= 1),
        ],
        figures=[path],
    )


def make_study(
    behaviours: tuple[str, ...] = ("ok", "ok"),
    *,
    name: str = "stub",
    steps: int = 4,
    sleep_s: float = 0.0,
) -> Study:
    preset = StubPreset(behaviours=behaviours, steps=steps, sleep_s=sleep_s)
    return Study(
        name=name,
        claim="a stub claim for the executor tests",
        source="tests",
        presets={"smoke": lambda: preset, "fast": lambda: preset, "paper": lambda: preset},
        build_runs=build_runs,
        analyze=analyze,
    )
