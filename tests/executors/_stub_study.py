"""A stub study for executor, resume and report tests: runs that finish, raise, die or stall.

Importable by name (``_stub_study``) once this folder is on ``sys.path``, so executors in other
processes can unpickle its runners by reference. Each run logs ``x`` at steps 0..steps, drawn
from its seed (so two executions of one run give equal rows), and an ``invoked`` event every
time its runner starts (a kept run has exactly one).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict

from dynascope.report.figures import new_figure, save_figure
from dynascope.store import RunStore, load_run
from dynascope.studies.base import Analysis, RunSpec, Study, Verdict

Behaviour = Literal["ok", "raise", "die", "slow"]


class StubRun(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = 0
    steps: int = 4
    behaviour: Behaviour = "ok"
    sleep_s: float = 0.0


class StubPreset(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    behaviours: tuple[Behaviour, ...] = ("ok", "ok")
    steps: int = 4
    sleep_s: float = 0.0


def stub_runner(
    config: StubRun,
    run_dir: Path,
    progress: bool = False,
    device: str = "cpu",
    resume: bool = False,
):
    """Logs ``x`` at steps 0..steps; ``resume`` continues after the last logged row (the rows
    equal an uninterrupted run's: the generator is advanced past the rows already kept)."""
    generator = torch.Generator().manual_seed(config.seed)
    start = 0
    if resume and (Path(run_dir) / "metrics.sqlite").is_file():
        kept = load_run(run_dir).scalars.query("key == 'x'")
        start = int(kept["step"].max()) + 1 if len(kept) else 0
        for _ in range(start):  # the draws of the kept rows, one at a time as they were made
            torch.randn((), generator=generator)
    with RunStore(run_dir) as store:
        store.truncate_after(start - 1)
        store.write_config(config.model_dump(mode="json"))
        store.set_status(start, "running")
        store.event(start, "invoked", f"pid {os.getpid()} device {device}")
        if config.behaviour == "raise":
            raise RuntimeError("stub failure")
        if config.behaviour == "die":
            store.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        for step in range(start, config.steps + 1):
            store.log(step, {"x": float(torch.randn((), generator=generator)), "device": 0.0})
            store.flush()
            time.sleep(config.sleep_s)
        store.set_status(config.steps, "finished")


def build_runs(preset: StubPreset, seed: int) -> list[RunSpec]:
    return [
        RunSpec(
            f"r{i}_{b}",
            StubRun(seed=seed + i, steps=preset.steps, behaviour=b, sleep_s=preset.sleep_s),
            stub_runner,
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
