"""One run of a study as a unit of work that any executor can ship: :class:`RunTask`.

Glossary:
    task:     a run to execute now (its name, config, runner, run directory and keyword
              arguments); tasks of one study are independent of each other.
    outcome:  what the executor reports when a task ends (:class:`RunOutcome`); the run's own
              status (``finished``, ``diverged``, ``interrupted``, ``failed``) lives in its store.
    runner:   ``runner(config, run_dir, progress=False[, device="cpu"][, resume=False])``, a
              module-level function (picklable by reference).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

__all__ = [
    "RunOutcome",
    "RunTask",
    "execute_task",
    "record_failure",
    "record_interrupted",
    "runner_kwargs",
]


def runner_kwargs(runner: Callable[..., Any], **offered: Any) -> dict[str, Any]:
    """The keyword arguments among ``offered`` that ``runner`` accepts (by name or ``**kw``).

    Studies written before a keyword existed (``device``, ``resume``) keep working: they are
    simply not offered it.
    """
    params = inspect.signature(runner).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(offered)
    return {k: v for k, v in offered.items() if k in params}


@dataclass(frozen=True)
class RunTask:
    """A run to execute: ``runner(config, run_dir, **kwargs)``.

    Attributes:
        name: the run's name (its directory name under ``STUDY/runs/``).
        runner: module-level runner function.
        config: the run's frozen pydantic config.
        run_dir: the run directory (absolute, so a worker's working directory does not matter).
        kwargs: keyword arguments the runner accepts (:func:`runner_kwargs`).
        uses_cuda: the run asks for a GPU (the Ray executor requests one).
    """

    name: str
    runner: Callable[..., Any]
    config: BaseModel
    run_dir: Path
    kwargs: dict[str, Any] = field(default_factory=dict)
    uses_cuda: bool = False


@dataclass(frozen=True)
class RunOutcome:
    """How a task ended, as seen by the executor.

    Attributes:
        name: the run's name.
        seconds: wall-clock seconds of the runner call (``nan`` when unknown).
        error: ``"Type: message"`` when the runner raised or its process died, else ``None``.
        signal: ``"SIGINT"``/``"SIGTERM"`` when the runner returned a result carrying one.
    """

    name: str
    seconds: float
    error: str | None = None
    signal: str | None = None


def record_failure(run_dir: Path, message: str) -> None:
    """Write an ``error`` event and status ``failed`` into the run's store."""
    from dynascope.store import RunStore

    with RunStore(run_dir) as store:
        store.event(0, "error", message)
        store.set_status(0, "failed")


def record_interrupted(run_dir: Path, signal: str) -> None:
    """Write an ``interrupted`` event and status into the run's store (no checkpoint)."""
    from dynascope.store import RunStore, load_run

    try:
        step = int(load_run(run_dir).scalars["step"].max())
    except (FileNotFoundError, ValueError):
        step = 0
    with RunStore(run_dir) as store:
        store.event(step, "interrupted", signal)
        store.set_status(step, "interrupted")


def execute_task(task: RunTask) -> RunOutcome:
    """Run one task here; an exception is recorded in the run's store as ``failed``.

    ``KeyboardInterrupt`` and ``SystemExit`` propagate (a stop is not a failure of the run).
    A run directory held by another live process (:class:`~dynascope.store.RunLockedError`)
    is not touched: the error is returned and the store is left to its owner.
    """
    from dynascope.store import RunLockedError

    start = time.perf_counter()
    try:
        result = task.runner(task.config, task.run_dir, **task.kwargs)
    except RunLockedError as err:
        return RunOutcome(task.name, time.perf_counter() - start, f"RunLockedError: {err}")
    except Exception as err:  # one failed run is recorded; the others go on
        message = f"{type(err).__name__}: {err}"
        record_failure(task.run_dir, message)
        return RunOutcome(task.name, time.perf_counter() - start, message)
    return RunOutcome(
        task.name, time.perf_counter() - start, signal=getattr(result, "signal", None)
    )
