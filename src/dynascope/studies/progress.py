"""How far a study has come while it runs, read from its directory without locking anything
(``dynascope show STUDY_DIR --follow`` and the progress bar of ``dynascope study run``).

Glossary:
    state:    a run's state as the watcher shows it: ``pending`` (no store or no status yet),
              ``running``, ``done`` (finished), ``diverged``, ``failed``, ``interrupted``
              (stopped by a signal, or left ``running`` by a study process that is gone).
    active:   a process is executing the study: ``Study.run`` holds a shared ``flock`` on
              ``STUDY/.lock`` while it plans, trains and analyses (:func:`executing_study`);
              the operating system drops it when that process dies, SIGKILL included.
    concluded: ``verdict.json`` is at least as new as ``study.json``: the analysis of the runs
              the directory was last planned for is written.
    ETA:      seconds left, from the rate of steps seen since the watcher started (per run:
              that run's steps per second; overall: every run's steps per second, so runs in
              parallel count), ``None`` until a step has been seen to pass. Ended runs count
              their whole budget of steps, so a diverged or failed run costs no more time.

The steps are those committed to each run's store (``RunStore`` commits at least every two
seconds while a run logs), the budget of a run is its config's ``loop.steps`` (an engine run)
or ``train.steps`` (a registry run), as ``study.json`` records it.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynascope.store import (
    METRICS_FILE,
    STUDY_FILE,
    VERDICT_FILE,
    RunPeek,
    lock_is_free,
    peek_run,
)

__all__ = [
    "ENDED",
    "RunProgress",
    "StudyProgress",
    "StudyWatcher",
    "executing_study",
    "study_is_active",
]

STUDY_LOCK = ".lock"
"""The file ``Study.run`` holds a shared ``flock`` on, in the study directory."""

ENDED = ("done", "diverged", "failed", "interrupted")
"""States a run does not leave while the study process that set them runs."""

_STATE = {"finished": "done", "diverged": "diverged", "failed": "failed"}


@contextlib.contextmanager
def executing_study(out: str | os.PathLike[str]) -> Iterator[None]:
    """Mark the study directory ``out`` (which must exist) as being executed, for as long as
    the block runs: a shared ``flock`` on ``out/.lock``. Shared: two processes may both hold it
    (whether they may run the same study at once is ``Study.run``'s business, not this mark's).
    """
    import fcntl

    fd = os.open(Path(out) / STUDY_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # releases the lock


def study_is_active(out: str | os.PathLike[str]) -> bool:
    """Whether a live process holds :func:`executing_study` on ``out`` (on this host: ``flock``
    is per host)."""
    return not lock_is_free(out)


@dataclass(frozen=True)
class RunProgress:
    """One run of a study as the watcher sees it (module glossary).

    Attributes:
        name: the run's name (its directory under ``STUDY/runs/``).
        state: ``pending``, ``running``, ``done``, ``diverged``, ``failed`` or ``interrupted``.
        step: the last committed step, ``None`` before any.
        total: the run's budget of steps, ``None`` where its config does not say.
        loss: the last committed ``train.loss``, ``None`` before any.
        eta_s: seconds left at the run's own rate, ``None`` when unknown (or ended: 0).
    """

    name: str
    state: str
    step: int | None
    total: int | None
    loss: float | None
    eta_s: float | None

    @property
    def done_steps(self) -> int:
        """Steps towards the study's total: the whole budget once the run has ended."""
        if self.state in ENDED and self.total is not None:
            return self.total
        return min(self.step or 0, self.total) if self.total is not None else self.step or 0


@dataclass(frozen=True)
class StudyProgress:
    """A study directory at one moment (:meth:`StudyWatcher.read`).

    Attributes:
        study, preset: from ``study.json``.
        runs: every planned run, in ``study.json``'s order, then runs found only on disk.
        active: a process executes the study (module glossary).
        verdict: the status in ``verdict.json`` once the study has concluded, else ``None``.
        eta_s: seconds left for the whole study at the rate seen so far (``None``: unknown;
            0 once every run has ended).
    """

    study: str
    preset: str
    runs: list[RunProgress]
    active: bool
    verdict: str | None
    eta_s: float | None

    @property
    def steps(self) -> tuple[int, int]:
        """``(done, total)`` steps over the runs whose budget is known."""
        return _steps(self.runs)

    def count(self, *states: str) -> int:
        return sum(r.state in states for r in self.runs)


class StudyWatcher:
    """Reads a study directory again and again, remembering what it saw to give rates and ETAs.

    Args:
        out: the study directory (what ``dynascope study run --out`` wrote).
        clock: seconds, monotonic (a test passes its own).
    Raises:
        ValueError: one line naming ``STUDY_DIR``, if ``out`` holds no readable ``study.json``.
    """

    def __init__(
        self, out: str | os.PathLike[str], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.out = Path(out)
        self.clock = clock
        self._manifest = _read_manifest(self.out)
        self._first: dict[str, tuple[float, int]] = {}  # run -> (time, step) first seen running
        self._start: tuple[float, int] | None = None  # (time, study's done steps) first read
        self._peeks: dict[str, tuple[tuple, RunPeek | None]] = {}  # run -> (files' stat, peek)

    def read(self) -> StudyProgress:
        """The study as it stands now.

        Raises:
            ValueError: as the constructor, if ``study.json`` became unreadable.
            sqlite3.DatabaseError: if a run's ``metrics.sqlite`` is not a database.
        """
        self._manifest = _read_manifest(self.out)
        now, active = self.clock(), study_is_active(self.out)
        configs = self._manifest.get("runs") or {}
        names = list(configs) + sorted(set(self._on_disk()) - set(configs))
        runs = [self._run(name, configs.get(name), active, now) for name in names]
        done, total = _steps(runs)
        if self._start is None:
            self._start = (now, done)
        return StudyProgress(
            study=str(self._manifest.get("study", self.out.name)),
            preset=str(self._manifest.get("preset", "")),
            runs=runs,
            active=active,
            verdict=self._verdict(),
            eta_s=_eta(self._start, now, done, total),
        )

    def _on_disk(self) -> list[str]:
        runs = self.out / "runs"
        if not runs.is_dir():
            return []
        return [p.name for p in runs.iterdir() if (p / METRICS_FILE).is_file()]

    def _peek(self, name: str) -> RunPeek | None:
        """:func:`~dynascope.store.peek_run`, read again only when the run's database or its
        write-ahead log changed (a run that ended is not reopened on every read)."""
        db = self.out / "runs" / name / METRICS_FILE
        files = []
        for path in (db, db.with_name(db.name + "-wal")):
            try:
                stat = path.stat()
                files.append((stat.st_ino, stat.st_size, stat.st_mtime_ns))
            except FileNotFoundError:
                files.append(None)
        key = tuple(files)
        cached = self._peeks.get(name)
        if cached is None or cached[0] != key or key[0] is None:
            cached = self._peeks[name] = (key, peek_run(db.parent))
        return cached[1]

    def _run(self, name: str, config: Any, active: bool, now: float) -> RunProgress:
        peek = self._peek(name)
        total = _total_steps(config)
        if peek is None or peek.status is None:
            return RunProgress(name, "pending", None, total, None, None)
        state = _STATE.get(peek.status, "interrupted")  # "running" without a live study: killed
        if peek.status == "running" and active:
            state = "running"
        eta = 0.0 if state in ENDED else None
        if state == "running" and peek.step is not None:
            first = self._first.setdefault(name, (now, peek.step))
            if total is not None:
                eta = _eta(first, now, peek.step, total)
        return RunProgress(name, state, peek.step, total, peek.loss, eta)

    def _verdict(self) -> str | None:
        """The verdict's status when ``verdict.json`` is at least as new as ``study.json``."""
        verdict, manifest = self.out / VERDICT_FILE, self.out / STUDY_FILE
        try:
            if verdict.stat().st_mtime_ns < manifest.stat().st_mtime_ns:
                return None
            return str(json.loads(verdict.read_text())["status"])
        except (FileNotFoundError, KeyError, TypeError, ValueError):
            return None


def _steps(runs: list[RunProgress]) -> tuple[int, int]:
    known = [r for r in runs if r.total is not None]
    return sum(r.done_steps for r in known), sum(r.total or 0 for r in known)


def _eta(first: tuple[float, int], now: float, done: int, total: int) -> float | None:
    """Seconds until ``total`` at the rate from ``first`` (time, steps) to ``(now, done)``."""
    if done >= total:
        return 0.0
    seconds, steps = now - first[0], done - first[1]
    if seconds <= 0 or steps <= 0:
        return None
    return (total - done) * seconds / steps


def _total_steps(config: Any) -> int | None:
    """A run's budget of steps from its config as JSON data (module docstring)."""
    if not isinstance(config, dict):
        return None
    for section in ("loop", "train"):
        part = config.get(section)
        steps = part.get("steps") if isinstance(part, dict) else None
        if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0:
            return steps
    return None


def _read_manifest(out: Path) -> dict[str, Any]:
    path = out / STUDY_FILE
    if not path.is_file():
        what = "does not exist" if not out.exists() else "is not a study directory (no study.json)"
        raise ValueError(f"STUDY_DIR: {str(out)!r} {what}")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"STUDY_DIR: {str(path)!r} is not readable ({err})") from None
    if not isinstance(manifest, dict):
        raise ValueError(f"STUDY_DIR: {str(path)!r} is not a study manifest (not an object)")
    return manifest
