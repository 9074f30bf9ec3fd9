"""Executing a study's tasks on an executor and reading back what each run stored.

Glossary:
    stored status:  a run's status as its store holds it (``finished``, ``diverged``,
                    ``interrupted``, ``failed``, ...); whatever an executor or a runner returned,
                    the store is what counts.
    interruption:   a run stopped by SIGINT/SIGTERM, or a signal after the runs had ended, or a
                    task the executor never ran because it was stopped (:class:`Interruption`).
                    The caller decides what it means (``Study.run`` raises ``StudyInterrupted``).
    failure:        a run whose runner raised, whose process died, or that wrote no store; it
                    is recorded in its store as ``failed`` and the other runs go on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ._task import RunOutcome, RunTask, record_failure

if TYPE_CHECKING:  # dynascope.store (and torch) load when tasks run, not with the package
    from pathlib import Path

    from dynascope.store import Run

    from . import Executor

__all__ = ["ExecutedRuns", "Interruption", "run_tasks"]

_LOCKED = "RunLockedError: "


@dataclass(frozen=True)
class Interruption:
    """A signal stopped the tasks.

    Attributes:
        run_name: the run it stopped (or, with ``ended``, the last run that had ended).
        signal: ``"SIGINT"`` or ``"SIGTERM"``.
        step: the step the run was stopped at (0 when it had not logged one).
        ended: the signal came after the runs of that task had ended.
    """

    run_name: str
    signal: str
    step: int
    ended: bool = False


@dataclass
class ExecutedRuns:
    """What :func:`run_tasks` returns.

    Attributes:
        runs: run name -> the run as stored, for every member of every task, in task order.
        seconds: run name -> wall-clock seconds of the executed runs (an ensemble's time is
            shared equally among its members; ``nan`` when unknown).
        interruption: the first interruption (``runs`` then holds the runs read before it),
            or ``None`` when every task ran to its end.
    """

    runs: dict[str, Run] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    interruption: Interruption | None = None


def run_tasks(
    executor: Executor,
    tasks: Sequence[RunTask],
    on_run: Callable[..., None] | None = None,
) -> ExecutedRuns:
    """Execute ``tasks`` on ``executor``; record failures; return every run's stored status.

    Each outcome's runs are read from their stores once: a run that wrote no store is recorded
    as ``failed`` ("the runner wrote no store"). Every member of an ensemble task is reported
    before an interruption is returned. At the first interruption the remaining outcomes are
    not awaited: the executor's iterator is closed, which stops the runs still executing.

    Args:
        executor: where the tasks execute (:func:`make_executor`).
        tasks: the tasks, in the order to report them.
        on_run: called as ``on_run(run_name, status, seconds, action=...)`` for each run as
            its task ends, ``action`` being ``"resumed"`` or ``"started"`` (the task's
            ``resume``), ``status`` ``"unknown"`` where the store records none.
    Returns:
        :class:`ExecutedRuns`. A task the executor never ran (it was stopped) is an
        interruption by the executor's ``stop_signal`` (``SIGINT`` when it has none), at the
        step the run's store was interrupted at, else 0.
    Raises:
        dynascope.store.RunLockedError: a run directory is in use by another process.
    """
    from dynascope.store import RunLockedError, stored_run

    done = ExecutedRuns()
    by_outcome = {(task.name, task.members): task for task in tasks}
    outcomes = executor.map(tasks)
    try:
        for outcome in outcomes:
            if outcome.error and outcome.error.startswith(_LOCKED):
                raise RunLockedError(outcome.error.removeprefix(_LOCKED))
            task = by_outcome[outcome.name, outcome.members]
            done.interruption = _read_outcome(task, outcome, done, on_run)
            if done.interruption is not None:
                return done
    finally:
        outcomes.close()  # an interrupted study stops the runs still executing
    not_run = _members(t for t in tasks if _names(t)[0] not in done.runs)
    first = next(not_run, None)  # the executor was stopped before it ran this task
    if first is not None:
        name, run_dir = first
        run, stop = stored_run(run_dir), getattr(executor, "stop_signal", None)
        if run is not None and run.status == "interrupted":
            done.interruption = _interruption(name, run, stop)
        else:
            done.interruption = Interruption(name, stop or "SIGINT", 0)
    return done


def _read_outcome(
    task: RunTask,
    outcome: RunOutcome,
    done: ExecutedRuns,
    on_run: Callable[..., None] | None,
) -> Interruption | None:
    """Read each member's store into ``done`` and report it; the first interruption, if any."""
    from dynascope.store import load_run, stored_run

    share = outcome.seconds / len(outcome.names)  # an ensemble's time, per member
    action = "resumed" if task.kwargs.get("resume") else "started"
    stopped = None
    for name, run_dir in _members([task]):
        run = stored_run(run_dir)
        if run is None:
            record_failure(run_dir, "the runner wrote no store")
            run = load_run(run_dir)
        done.runs[name], done.seconds[name] = run, share
        if on_run is not None:
            on_run(name, run.status or "unknown", float(share), action=action)
        if run.status == "interrupted":  # from the store: any runner, any return
            stopped = stopped or _interruption(name, run, outcome.signal)
    if stopped is None and outcome.signal is not None:  # a signal after the runs had ended
        stopped = Interruption(outcome.names[-1], outcome.signal, 0, ended=True)
    return stopped


def _names(task: RunTask) -> tuple[str, ...]:
    return task.members or (task.name,)


def _members(tasks: Iterable[RunTask]) -> Iterator[tuple[str, Path]]:
    """``(run name, run directory)`` of every member of ``tasks``, in order."""
    for task in tasks:
        yield from zip(_names(task), task.run_dirs, strict=True)


def _interruption(name: str, run: Run, signal: str | None) -> Interruption:
    """The interruption a run's store records (its last ``interrupted`` event); ``signal``,
    when given, names the signal (the store's event may name another reason)."""
    stops = run.events[run.events["kind"] == "interrupted"]
    detail = stops["detail"].iloc[-1] if len(stops) else ""
    signal = signal or (detail if detail in ("SIGINT", "SIGTERM") else "SIGINT")
    step = int(stops["step"].iloc[-1]) if len(stops) else 0
    return Interruption(name, signal, step)
