"""One run of a study as a unit of work that any executor can ship: :class:`RunTask`.

Glossary:
    task:     a run to execute now (its name, config, build, run directory and keyword
              arguments); tasks of one study are independent of each other.
    outcome:  what the executor reports when a task ends (:class:`RunOutcome`); the run's own
              status (``finished``, ``diverged``, ``interrupted``, ``failed``) lives in its store.
    build:    ``build(config, streams) -> Parts``, a module-level function (picklable by
              reference), trained by :func:`dynascope.train.run_members`.
    stop:     SIGINT/SIGTERM while a run executes in a process's main thread. Once training, the
              engine handles signals itself: it checkpoints and returns ``interrupted``; before
              that (while building) the run is stopped where it is (:class:`RunStopped`), and
              its store is marked ``interrupted`` at its last logged step.
"""

from __future__ import annotations

import signal as signal_module
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

__all__ = [
    "quiet_interrupts_in_callbacks",
    "RunOutcome",
    "RunStopped",
    "RunTask",
    "execute_task",
    "record_failure",
    "record_interrupted",
]


def quiet_interrupts_in_callbacks() -> None:
    """Drop a Ctrl-C that lands in a callback Python cannot raise from (a weakref or import-lock
    callback), instead of printing "Exception ignored ... KeyboardInterrupt" with a traceback.

    The first SIGINT/SIGTERM already stops the run cleanly through the normal path; a stop
    that happens to arrive inside such a callback is otherwise reported as unraisable noise.
    Other unraisable exceptions go to the previous hook.
    """
    import sys

    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            return
        previous(unraisable)

    if getattr(previous, "__name__", "") != "hook":
        sys.unraisablehook = hook


@dataclass(frozen=True)
class RunTask:
    """A run to execute: ``run_members(build, config, run_dir, **kwargs)``.

    Attributes:
        name: the run's name (its directory name under ``STUDY/runs/``).
        build: module-level ``build(config, streams) -> Parts``.
        config: the run's frozen pydantic config.
        run_dir: the run directory (absolute, so a worker's working directory does not matter).
        kwargs: keyword arguments of :func:`~dynascope.train.run_members` (``progress``,
            ``device``, ``resume``).
        uses_cuda: the run asks for a GPU (the Ray executor requests one).
        members: for an ensemble task (runs of one group trained together), the member run
            names; ``config`` and ``run_dir`` are then lists in the same order.
    """

    name: str
    build: Callable[..., Any]
    config: BaseModel | list[BaseModel]
    run_dir: Path | list[Path]
    kwargs: dict[str, Any] = field(default_factory=dict)
    uses_cuda: bool = False
    members: tuple[str, ...] = ()

    @property
    def run_dirs(self) -> list[Path]:
        """Every run directory the task writes (one, or each member's of an ensemble)."""
        return list(self.run_dir) if isinstance(self.run_dir, list) else [self.run_dir]


@dataclass(frozen=True)
class RunOutcome:
    """How a task ended, as seen by the executor.

    Attributes:
        name: the run's name.
        seconds: wall-clock seconds of the run (``nan`` when unknown).
        error: ``"Type: message"`` when the run raised or its process died, else ``None``.
        signal: ``"SIGINT"``/``"SIGTERM"`` when the run returned a result carrying one.
        members: the member run names of an ensemble task (empty for one run).
    """

    name: str
    seconds: float
    error: str | None = None
    signal: str | None = None
    members: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """The runs this outcome covers: the members of an ensemble, or the one run."""
        return self.members or (self.name,)


def record_failure(run_dir: Path | list[Path], message: str) -> None:
    """Write an ``error`` event and status ``failed`` into the run's store (each member's)."""
    from dynascope.store import RunStore

    for path in run_dir if isinstance(run_dir, list) else [run_dir]:
        with RunStore(path) as store:
            store.event(0, "error", message)
            store.set_status(0, "failed")


def record_interrupted(run_dir: Path | list[Path], signal: str) -> None:
    """Write an ``interrupted`` event and status into the run's store (no checkpoint)."""
    from dynascope.store import RunStore, load_run

    for path in run_dir if isinstance(run_dir, list) else [run_dir]:
        try:
            step = int(load_run(path).scalars["step"].max())
        except (FileNotFoundError, ValueError):
            step = 0
        with RunStore(path) as store:
            store.event(step, "interrupted", signal)
            store.set_status(step, "interrupted")


class RunStopped(KeyboardInterrupt):
    """Raised inside a runner by the first SIGINT/SIGTERM (``signal``: its name).

    A ``KeyboardInterrupt`` so that a runner's ``except Exception`` does not swallow it.
    """

    def __init__(self, signal: str) -> None:
        super().__init__(signal)
        self.signal = signal


@contextmanager
def _stop_on_signal() -> Iterator[None]:
    """Within ``with``: the first SIGINT/SIGTERM raises :class:`RunStopped`, a second one a
    plain ``KeyboardInterrupt`` (stop at once). A runner may install its own handlers inside
    (the Trainer does) and restore these afterwards. Outside the main thread it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stopped: list[str] = []

    def handle(signum: int, frame: object) -> None:
        if stopped:
            raise KeyboardInterrupt
        stopped.append(signal_module.Signals(signum).name)
        raise RunStopped(stopped[0])

    previous = {
        s: signal_module.signal(s, handle) for s in (signal_module.SIGINT, signal_module.SIGTERM)
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal_module.signal(signum, handler)


def execute_task(task: RunTask) -> RunOutcome:
    """Run one task here; an exception is recorded in the run's store as ``failed``.

    A SIGINT/SIGTERM that reaches a runner without its own signal handling is recorded in the
    run's store as ``interrupted`` (module docstring) and returned as the outcome's ``signal``.
    A second signal and ``SystemExit`` propagate. A run directory held by another live process
    (:class:`~dynascope.store.RunLockedError`) is not touched: the error is returned and the
    store is left to its owner.
    """
    with _stop_on_signal():
        return _execute(task)


def _execute(task: RunTask) -> RunOutcome:
    from dynascope.store import RunLockedError
    from dynascope.train import run_members

    start = time.perf_counter()
    stopped = None
    try:
        result = run_members(task.build, task.config, task.run_dir, **task.kwargs)
    except RunStopped as stop:
        stopped = stop.signal  # recorded below, once the runner's frames (and store) are gone
    except RunLockedError as err:
        message = f"RunLockedError: {err}"
        return RunOutcome(task.name, time.perf_counter() - start, message, members=task.members)
    except Exception as err:  # one failed run is recorded; the others go on
        message = f"{type(err).__name__}: {err}"
        record_failure(task.run_dir, message)
        return RunOutcome(task.name, time.perf_counter() - start, message, members=task.members)
    if stopped is not None:
        for path in task.run_dirs:
            _mark_stopped(path, stopped)
        seconds = time.perf_counter() - start
        return RunOutcome(task.name, seconds, signal=stopped, members=task.members)
    results = result if isinstance(result, list) else [result]
    signal = next((r.signal for r in results if getattr(r, "signal", None)), None)
    return RunOutcome(task.name, time.perf_counter() - start, signal=signal, members=task.members)


def _mark_stopped(run_dir: Path, signal: str) -> None:
    """Record ``interrupted`` unless the run had already ended (its result stands)."""
    from dynascope.store import stored_run

    run = stored_run(run_dir)
    status = None if run is None else run.status
    if status not in ("finished", "diverged", "failed"):
        record_interrupted(run_dir, signal)
