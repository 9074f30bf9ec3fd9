"""Study: a published finding as a set of runs plus an analysis that returns verdicts.

A study is ``Study(name, claim, source, presets, build_runs, analyze)``:

- ``presets``: ``{"smoke": fn, "fast": fn, "paper": fn}``, each returning a frozen pydantic
  preset (the study's own config class);
- ``build_runs(preset, seed) -> list[RunSpec]``: the independent runs; each spec names a
  module-level ``runner(config, run_dir)`` (picklable, so any executor can ship it);
- ``analyze(runs, figures_dir) -> Analysis``: reads **only** the run stores (``load_run``)
  and returns verdicts computed from them, plus the figures it drew.

``Study.run(preset, out)`` executes the runs (one run directory each under ``out/runs/``),
analyzes them and writes ``out/verdict.json``, ``out/figures/*.png`` and ``out/report.html``.
A claim that does not hold is a result, not an error, and so is a run that diverges: the other
runs go on and ``analyze`` sees its status. A run that fails with an exception is recorded as
``failed`` and the others go on. A run stopped by SIGINT/SIGTERM stops the study
(:class:`StudyInterrupted`); running the study again starts its runs over.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel

from dynascope.store import Run, load_run, safe_name

__all__ = [
    "Analysis",
    "RunSpec",
    "Study",
    "StudyInterrupted",
    "StudyOutcome",
    "Verdict",
    "one_intra_op_thread",
]

PRESETS = ("smoke", "fast", "paper")


@contextmanager
def one_intra_op_thread() -> Iterator[None]:
    """Run torch on one intra-op thread inside the block, then restore the previous count.

    For runners of small models (matrices of a few hundred rows at most): a second thread only
    adds hand-offs, and on a busy 2-core machine the studies' steps were measured 10-18x slower
    with two threads than with one. One thread also makes CPU runs bitwise reproducible.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _finite_or_none(value: Any) -> Any:
    """NaN and inf become ``None`` (JSON ``null``); numpy scalars become Python numbers."""
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_none(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def dump_json(data: dict[str, Any]) -> str:
    """Strict JSON (no NaN literals: unmeasurable values are ``null``), indented."""
    return json.dumps(_finite_or_none(data), indent=2, allow_nan=False)


@dataclass(frozen=True)
class Verdict:
    """One claim checked against measured runs.

    Attributes:
        claim: the claim in words.
        metric: what was measured, with its definition in a few words.
        measured: the measured value (NaN when it could not be measured; ``null`` in
            ``verdict.json``).
        threshold: the frozen threshold it is compared with.
        passed: whether the claim held.
        detail: how the comparison reads (``measured <= threshold``) and notes.
    """

    claim: str
    metric: str
    measured: float
    threshold: float
    passed: bool
    detail: str = ""


@dataclass(frozen=True)
class RunSpec:
    """One run of a study: its directory name, config and the runner that executes it.

    ``runner(config, run_dir, progress=False)`` must be a module-level function (picklable).

    Raises:
        ValueError: if ``name`` is not a safe path component (:func:`dynascope.store.safe_name`).
    """

    name: str
    config: BaseModel
    runner: Callable[..., Any]

    def __post_init__(self) -> None:
        safe_name(self.name, "run name")


class StudyInterrupted(Exception):
    """A study's run was stopped by a signal; ``signal`` is ``"SIGINT"`` or ``"SIGTERM"``."""

    def __init__(self, run_name: str, signal: str, step: int) -> None:
        super().__init__(f"run {run_name} interrupted by {signal} at step {step}")
        self.run_name = run_name
        self.signal = signal
        self.step = step


@dataclass
class Analysis:
    """What ``analyze`` returns: verdicts, figure paths and free-form measured tables."""

    verdicts: list[Verdict]
    figures: list[Path] = field(default_factory=list)
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


@dataclass
class StudyOutcome:
    """Result of :meth:`Study.run`, also written to ``verdict.json``."""

    study: str
    preset: str
    claims: list[Verdict]
    runs: list[dict[str, Any]]
    seconds: float
    out: Path
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(v.passed for v in self.claims)

    def to_json(self) -> dict[str, Any]:
        return {
            "study": self.study,
            "preset": self.preset,
            "passed": self.passed,
            "claims": [asdict(v) for v in self.claims],
            "runs": self.runs,
            "tables": self.tables,
            "seconds": round(self.seconds, 2),
        }


@dataclass(frozen=True)
class Study:
    """A finding made re-runnable (see the module docstring)."""

    name: str
    claim: str
    source: str
    presets: dict[str, Callable[[], BaseModel]]
    build_runs: Callable[[BaseModel, int], list[RunSpec]]
    analyze: Callable[[dict[str, Run], Path], Analysis]

    def preset(self, name: str) -> BaseModel:
        """The preset config called ``name``.

        Raises:
            ValueError: for an unknown preset name.
        """
        if name not in self.presets:
            raise ValueError(f"preset must be one of {', '.join(self.presets)} (got {name!r})")
        return self.presets[name]()

    def run(
        self,
        preset: str = "fast",
        out: str | os.PathLike[str] = "out",
        *,
        seed: int = 0,
        progress: bool = False,
        on_run: Callable[[str, str, float], None] | None = None,
    ) -> StudyOutcome:
        """Execute every run in-process, analyze, write verdict.json, figures and report.html.

        Args:
            preset: ``smoke``, ``fast`` or ``paper``.
            out: the study directory.
            seed: added to every run's seed.
            progress: show per-run progress bars.
            on_run: called as ``on_run(run_name, status, seconds)`` after each run.
        Raises:
            ValueError: unknown preset, or ``out`` is a run directory.
        """
        config = self.preset(preset)
        specs = self.build_runs(config, seed)
        out = Path(out)
        if (out / "metrics.sqlite").exists():
            raise ValueError(f"out: {str(out)!r} is a run directory, not a study directory")
        if (out / "runs").is_dir():  # a re-run replaces every run of the directory
            shutil.rmtree(out / "runs")
        (out / "runs").mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        runs: dict[str, Run] = {}
        run_rows = []
        for spec in specs:
            run_dir = out / "runs" / spec.name
            t0 = time.perf_counter()
            result = None
            try:
                result = spec.runner(spec.config, run_dir, progress=progress)
            except Exception as err:  # one failed run is recorded; the others go on
                from dynascope.store import RunStore

                with RunStore(run_dir) as store:
                    store.event(0, "error", f"{type(err).__name__}: {err}")
                    store.set_status(0, "failed")
            seconds = time.perf_counter() - t0
            run = load_run(run_dir)
            if run.status == "interrupted":  # read from the store: any runner, any return value
                stops = run.events[run.events["kind"] == "interrupted"]
                signal = getattr(result, "signal", None) or (
                    stops["detail"].iloc[-1] if len(stops) else "SIGINT"
                )
                step = int(stops["step"].iloc[-1]) if len(stops) else 0
                raise StudyInterrupted(spec.name, signal, step)
            runs[spec.name] = run
            run_rows.append({"name": spec.name, "status": run.status, "seconds": round(seconds, 2)})
            if on_run is not None:
                on_run(spec.name, run.status or "unknown", seconds)
        return self._conclude(out, preset, runs, run_rows, lambda: time.perf_counter() - start)

    def reanalyze(self, out: str | os.PathLike[str]) -> StudyOutcome:
        """Analyze the runs already in a study directory again (figures, verdict.json, report).

        Raises:
            FileNotFoundError: if ``out`` holds no ``verdict.json``.
        """
        out = Path(out)
        info = json.loads((out / "verdict.json").read_text())
        runs = {p.name: load_run(p) for p in sorted((out / "runs").iterdir()) if p.is_dir()}
        return self._conclude(out, info["preset"], runs, info["runs"], lambda: info["seconds"])

    def _conclude(
        self,
        out: Path,
        preset: str,
        runs: dict[str, Run],
        run_rows: list[dict[str, Any]],
        seconds: Callable[[], float],
    ) -> StudyOutcome:
        """Analyze ``runs``; write figures, ``verdict.json`` and ``report.html`` under ``out``."""
        figures_dir = out / "figures"
        figures_dir.mkdir(exist_ok=True)
        analysis = self.analyze(runs, figures_dir)
        outcome = StudyOutcome(
            study=self.name,
            preset=preset,
            claims=analysis.verdicts,
            runs=run_rows,
            seconds=seconds(),
            out=out,
            tables=analysis.tables,
        )
        (out / "verdict.json").write_text(dump_json(outcome.to_json()))
        from dynascope.report.html import write_study_report

        write_study_report(self, outcome, analysis.figures, out / "report.html")
        return outcome
