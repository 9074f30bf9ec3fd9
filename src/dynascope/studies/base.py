"""Study: a published finding as a set of runs plus an analysis that returns verdicts.

A study is ``Study(name, claim, source, presets, build_runs, analyze)``:

- ``presets``: ``{"smoke": fn, "fast": fn, "paper": fn}``, and ``"full"`` where the finding
  needs more than ``fast`` (in :data:`PRESETS` order), each returning a frozen pydantic preset
  (the study's own config class);
- ``build_runs(preset, seed) -> list[RunSpec]``: the independent runs; each spec names a
  module-level ``build(config, streams) -> Parts`` (picklable, so any executor can ship it),
  trained by :func:`dynascope.train.run_members`;
- ``analyze(runs, figures_dir) -> Analysis``: reads **only** the run stores (``load_run``)
  and returns verdicts computed from them, plus the figures it drew.

``Study.run(preset, out)`` executes the runs (one run directory each under ``out/runs/``) on
an executor (:mod:`dynascope.executors`: in-process by default, a process pool, or Ray),
analyzes them and writes ``out/verdict.json``, ``out/figures/*.png`` and ``out/report.html``.
A claim that does not hold is a result, not an error, and so is a run that diverges: the other
runs go on and ``analyze`` sees its status. A run that fails with an exception (or whose
process dies) is recorded as ``failed`` and the others go on. A run stopped by SIGINT/SIGTERM
stops the study (:class:`StudyInterrupted`). Running the study again resumes it: finished
runs are kept, interrupted ones continue from their checkpoints, missing ones start
(``studies/_plan.py``; ``out/study.json`` records what the directory holds). While it
executes, ``Study.run`` holds a shared lock on ``out/.lock``, so that ``dynascope show
--follow`` knows the study is live (``studies/progress.py``).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from pydantic import BaseModel

from dynascope.presets import PRESETS as PRESETS  # the preset tiers, cheapest first
from dynascope.presets import REQUIRED_PRESETS as REQUIRED_PRESETS
from dynascope.store import Run, load_run, read_json, safe_name
from dynascope.train import Parts, SeedStreams

from ._plan import MANIFEST, plan_runs, plan_tasks, write_manifest
from .progress import executing_study
from .protocol import Protocol
from .verdict import Verdict

if TYPE_CHECKING:
    from dynascope.executors import Executor

__all__ = [
    "Analysis",
    "AnalysisInterrupted",
    "RunSpec",
    "Study",
    "StudyInterrupted",
    "StudyOutcome",
    "Verdict",
]

# ``--seed`` shifts every run's seed; the bound leaves room for a study's own offsets below the
# engine's seed range [0, 2**64)
MAX_STUDY_SEED = 2**32
# what this call did to a run
_DONE = {"keep": "kept", "resume": "resumed", "start": "started"}


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
class RunSpec:
    """One run of a study: its directory name, config and the build that trains it.

    ``build(config, streams) -> Parts`` must be a module-level function (picklable, named in
    the run's ``runner.json``); ``config`` is an :class:`~dynascope.train.EngineRunConfig`
    or a registry :class:`~dynascope.config.RunConfig` (whose build is
    :func:`~dynascope.train.build_registry`). The run trains as
    ``run_members(build, config, run_dir)`` (:func:`dynascope.train.run_members`). Specs with
    the same ``group`` (and build) train together as one ensemble on the engine, with the list
    of their configs and the list of their run directories; each keeps its own run.

    Raises:
        ValueError: if ``name`` is not a safe path component (:func:`dynascope.store.safe_name`).
    """

    name: str
    config: BaseModel
    build: Callable[[Any, SeedStreams], Parts]
    group: str | None = None

    def __post_init__(self) -> None:
        safe_name(self.name, "run name")


class StudyInterrupted(Exception):
    """A study's run was stopped by a signal; ``signal`` is ``"SIGINT"`` or ``"SIGTERM"``."""

    def __init__(self, run_name: str, signal: str, step: int, *, ended: bool = False) -> None:
        super().__init__(
            f"{signal} after run {run_name} ended"
            if ended
            else f"run {run_name} interrupted by {signal} at step {step}"
        )
        self.run_name = run_name
        self.signal = signal
        self.step = step


class AnalysisInterrupted(KeyboardInterrupt):
    """Ctrl-C after every run had ended, while the study analysed them or wrote its reports."""


@dataclass
class Analysis:
    """What ``analyze`` returns: verdicts, figure paths and free-form measured tables."""

    verdicts: list[Verdict]
    figures: list[Path] = field(default_factory=list)
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


@dataclass
class StudyOutcome:
    """Result of :meth:`Study.run`, also written to ``verdict.json``.

    ``seed`` is the base seed the runs were shifted by (``study run --seed N``; ``None`` when
    the directory's ``study.json`` does not say). ``status``: ``held`` when every claim held,
    ``not held`` when any claim did not hold, else ``inconclusive``.
    """

    study: str
    preset: str
    claims: list[Verdict]
    runs: list[dict[str, Any]]
    seconds: float
    out: Path
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    seed: int | None = None
    protocol: Protocol | None = None

    @property
    def passed(self) -> bool:
        return all(v.passed for v in self.claims)

    @property
    def status(self) -> str:
        statuses = {v.status for v in self.claims}
        if statuses <= {"held"}:
            return "held"
        return "not held" if "not held" in statuses else "inconclusive"

    def to_json(self) -> dict[str, Any]:
        return {
            "study": self.study,
            "preset": self.preset,
            "seed": self.seed,
            "status": self.status,
            "passed": self.passed,
            "protocol": None
            if self.protocol is None
            else {
                "sha256": self.protocol.sha256,
                "amendments": [a.to_json() for a in self.protocol.amendments],
            },
            "claims": [v.to_json() for v in self.claims],
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
    protocol: Protocol | None = None

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
        on_run: Callable[..., None] | None = None,
        on_start: Callable[[], None] | None = None,
        executor: Executor | None = None,
        device: str | None = None,
        fresh: bool = False,
        run_reports: bool = False,
    ) -> StudyOutcome:
        """Execute the runs still to do, analyze, write verdict.json, figures and report.html.

        A rerun into the same directory resumes the study (``studies/_plan.py``): finished and
        diverged runs are kept, interrupted or killed runs resumed, missing and failed runs
        started; run configs that differ from the directory's are refused unless ``fresh``.

        Args:
            preset: ``smoke``, ``fast`` or ``paper``.
            out: the study directory.
            seed: added to every run's seed.
            progress: show per-run progress bars (in-process executor only).
            on_run: called as ``on_run(run_name, status, seconds, action=...)`` after each
                executed run, ``action`` saying what this call did to it (``started``,
                ``resumed``), and for each kept run too (``action="kept"``, with its earlier
                seconds, before any run executes).
            on_start: called once everything is checked and planned, before any run
                executes (a refused call never reaches it).
            executor: where runs execute (:mod:`dynascope.executors`); default in-process.
            device: ``auto``, ``cpu`` or ``cuda`` for every run; ``None`` leaves each run's
                own device.
            fresh: delete the directory's runs and start every run over.
            run_reports: also write each run's ``report.html`` (loss and probe curves); a run
                kept as it was (finished before this call) keeps the report it has.
        Raises:
            ValueError: unknown preset or device, ``seed`` outside [0, 2**32), ``cuda`` without
                CUDA, ``out`` is a run directory or cannot be created or written, or ``out``
                holds runs of other configs (and not ``fresh``).
            dynascope.store.RunLockedError: a run to execute is in use by another process.
            StudyInterrupted: a run was stopped by SIGINT/SIGTERM (rerun to continue).
        """
        from dynascope.executors import LocalExecutor, run_tasks

        out, executor = Path(out), executor or LocalExecutor()
        specs, plan, device = self._plan(preset, out, seed, device, fresh)
        with executing_study(out):  # for `dynascope show --follow` (studies/progress.py)
            tasks, plan = plan_tasks(
                specs, plan, out, device, progress and executor.name == "local"
            )
            start, seconds = time.perf_counter(), _previous_seconds(out)
            report = on_run or (lambda *args, **kwargs: None)
            if on_start is not None:
                on_start()
            kept = {n: load_run(out / "runs" / n) for n, action in plan.items() if action == "keep"}
            for name, run in kept.items():
                report(name, run.status or "unknown", _float(seconds.get(name)), action="kept")
            executed = run_tasks(executor, tasks, report)
            if (stop := executed.interruption) is not None:
                raise StudyInterrupted(stop.run_name, stop.signal, stop.step, ended=stop.ended)
            seconds |= {name: round(share, 2) for name, share in executed.seconds.items()}
            stored = kept | executed.runs
            runs = {name: stored[name] for name in plan}  # in the specs' order
            rows = [_row(name, run.status, seconds, plan[name]) for name, run in runs.items()]
            elapsed = lambda: time.perf_counter() - start  # noqa: E731
            try:
                return self._conclude(
                    out, preset, runs, rows, elapsed, run_reports, frozenset(kept)
                )
            except KeyboardInterrupt as err:
                raise AnalysisInterrupted from err

    def _plan(
        self, preset: str, out: Path, seed: int, device: str | None, fresh: bool
    ) -> tuple[list[RunSpec], dict[str, str], str | None]:
        """Check the call, plan every run (``studies/_plan.py``) and write ``out/study.json``.

        Returns:
            ``(specs, plan, device)``: the study's runs, run name -> ``keep``/``resume``/``start``
            in the specs' order, and the resolved device.
        Raises:
            ValueError, dynascope.store.RunLockedError: as :meth:`run`; nothing is written
                before the preset, seed, device and ``out`` are checked.
        """
        config = self.preset(preset)
        if not 0 <= seed < MAX_STUDY_SEED:
            raise ValueError(f"seed must be in [0, 2**32) (got {seed})")
        device = resolve_device(device)
        specs = self.build_runs(config, seed)
        if (out / "metrics.sqlite").exists():
            raise ValueError(f"out: {str(out)!r} is a run directory, not a study directory")
        configs = {s.name: json.loads(json.dumps(s.config.model_dump(mode="json"))) for s in specs}
        _make_study_dir(out)
        had_runs = _run_dirs(out)
        plan = plan_runs(out, self.name, preset, seed, configs, fresh=fresh)
        write_manifest(out, self.name, preset, seed, configs)
        (out / "runs").mkdir(exist_ok=True)
        if had_runs - _run_dirs(out):  # the old report would link to run reports now gone
            (out / "report.html").unlink(missing_ok=True)
        return specs, plan, device

    def reanalyze(self, out: str | os.PathLike[str], *, run_reports: bool = False) -> StudyOutcome:
        """Analyze the runs already in a study directory again (figures, verdict.json, report).

        Raises:
            FileNotFoundError: if ``out`` holds no ``verdict.json``.
        """
        out = Path(out)
        info = read_json(out / "verdict.json")
        runs = {row["name"]: load_run(out / "runs" / row["name"]) for row in info["runs"]}
        return self._conclude(
            out, info["preset"], runs, info["runs"], lambda: info["seconds"], run_reports
        )

    def _conclude(
        self,
        out: Path,
        preset: str,
        runs: dict[str, Run],
        run_rows: list[dict[str, Any]],
        seconds: Callable[[], float],
        run_reports: bool = False,
        kept: frozenset[str] = frozenset(),
    ) -> StudyOutcome:
        """Analyze ``runs``; write figures, ``verdict.json`` and ``report.html`` under ``out``
        (and each run's own ``report.html`` when ``run_reports``)."""
        figures_dir = out / "figures"
        figures_dir.mkdir(exist_ok=True)
        analysis = self.analyze(runs, figures_dir)
        verdicts = analysis.verdicts
        if self.protocol is not None:
            verdicts = self.protocol.check(verdicts)
        outcome = StudyOutcome(
            study=self.name,
            preset=preset,
            claims=verdicts,
            runs=run_rows,
            seconds=seconds(),
            out=out,
            tables=analysis.tables,
            seed=_base_seed(out),
            protocol=self.protocol,
        )
        (out / "verdict.json").write_text(dump_json(outcome.to_json()))
        from dynascope.report.html import write_study_report

        if run_reports:
            from dynascope.report.run import report_run

            for name in runs:  # a run kept untouched keeps its report
                run_dir = out / "runs" / name
                if name not in kept or not (run_dir / "report.html").is_file():
                    report_run(run_dir)
        # every planned run's config, a run that failed before writing its store included
        configs = {name: run.config for name, run in runs.items() if run.config}
        configs = _manifest(out).get("runs", {}) | configs
        write_study_report(self, outcome, analysis.figures, out / "report.html", configs)
        return outcome


def resolve_device(device: str | None) -> str | None:
    """``auto`` -> ``cuda`` when CUDA is available, else ``cpu``; ``None`` stays ``None``.

    Raises:
        ValueError: for another name, or ``cuda`` when CUDA is not available.
    """
    if device is None:
        return None
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be one of auto, cpu, cuda (got {device!r})")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            "device: cuda is not available here (no CUDA build of torch or no GPU); "
            "use --device cpu or auto"
        )
    return device


def _make_study_dir(out: Path) -> None:
    """Create ``out`` (and its parents) or say why it cannot be used.

    Raises:
        ValueError: naming ``out``, when it cannot be created or is not writable.
    """
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise ValueError(
            f"out: {str(out)!r} cannot be created ({reason}); choose another --out"
        ) from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ValueError(f"out: {str(out)!r} is not writable; choose another --out")


def _run_dirs(out: Path) -> set[str]:
    runs = out / "runs"
    return {p.name for p in runs.iterdir() if p.is_dir()} if runs.is_dir() else set()


def _manifest(out: Path) -> dict[str, Any]:
    """``out/study.json`` (:data:`~dynascope.studies._plan.MANIFEST`), or ``{}`` when unreadable."""
    try:
        return read_json(out / MANIFEST)
    except (FileNotFoundError, ValueError):
        return {}


def _base_seed(out: Path) -> int | None:
    """The seed the study's runs were shifted by, from ``out/study.json`` (``None``: unknown)."""
    try:
        return int(_manifest(out)["seed"])
    except (KeyError, TypeError, ValueError):
        return None


def _previous_seconds(out: Path) -> dict[str, Any]:
    """Seconds of each run from the directory's last verdict.json (kept runs keep theirs)."""
    try:
        rows = read_json(out / "verdict.json")["runs"]
        return {row["name"]: row.get("seconds") for row in rows}
    except (FileNotFoundError, KeyError, TypeError, ValueError):
        return {}


def _float(seconds: Any) -> float:
    """Seconds as a float; ``None`` (unknown) -> ``nan``."""
    return math.nan if seconds is None else float(seconds)


def _row(name: str, status: str | None, seconds: dict[str, Any], action: str) -> dict[str, Any]:
    """A run's row in ``verdict.json``: ``action`` is what this call did (``_plan`` actions)."""
    seconds_ = seconds.get(name)
    return {"name": name, "status": status, "seconds": seconds_, "this_call": _DONE[action]}
