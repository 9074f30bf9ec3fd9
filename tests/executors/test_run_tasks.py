"""``run_tasks``: what an executor's outcomes mean, read from the run stores.

The executors here are hand-written (:class:`_Scripted` yields the outcomes it is given), so
each case is exactly one situation: a runner that wrote no store, a run in use by another
process, an ensemble with an interrupted member, a signal after the runs ended, and an executor
stopped before it ran every task.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from dynascope.executors import Interruption, RunOutcome, RunTask, run_tasks
from dynascope.store import RunLockedError, RunStore, load_run


class _Scripted:
    """Yields ``outcomes`` in order, whatever the tasks; records whether it was closed."""

    name = "scripted"

    def __init__(self, outcomes: list[RunOutcome], stop_signal: str | None = None) -> None:
        self.outcomes = outcomes
        self.stop_signal = stop_signal
        self.closed = False

    def map(self, tasks: Sequence[RunTask]) -> Iterator[RunOutcome]:
        try:
            yield from self.outcomes
        finally:
            self.closed = True


def _store(run_dir: Path, status: str, step: int = 0, detail: str = "") -> None:
    with RunStore(run_dir) as store:
        store.log(step, {"x": 1.0})
        if status == "interrupted":
            store.event(step, "interrupted", detail)
        store.set_status(step, status)


def _build(config, streams):
    raise AssertionError("a scripted executor runs nothing")


def _task(tmp_path: Path, name: str, *, resume: bool = False) -> RunTask:
    return RunTask(name, _build, None, tmp_path / name, {"resume": resume})


def _ensemble(tmp_path: Path, group: str, members: tuple[str, ...]) -> RunTask:
    dirs = [tmp_path / m for m in members]
    return RunTask(group, _build, [None] * len(members), dirs, {}, members=members)


def test_a_runner_that_wrote_no_store_is_recorded_failed_and_reported(tmp_path):
    tasks = [_task(tmp_path, "a"), _task(tmp_path, "b", resume=True)]
    _store(tmp_path / "b", "finished", step=3)
    calls = []
    executed = run_tasks(
        _Scripted([RunOutcome("a", 2.0), RunOutcome("b", 3.0)]),
        tasks,
        lambda name, status, seconds, action: calls.append((name, status, seconds, action)),
    )
    assert calls == [("a", "failed", 2.0, "started"), ("b", "finished", 3.0, "resumed")]
    assert executed.interruption is None
    assert {n: r.status for n, r in executed.runs.items()} == {"a": "failed", "b": "finished"}
    assert executed.seconds == {"a": 2.0, "b": 3.0}
    errors = load_run(tmp_path / "a").events.query("kind == 'error'")["detail"].tolist()
    assert errors == ["the runner wrote no store"]


def test_a_run_in_use_by_another_process_raises_and_closes_the_executor(tmp_path):
    executor = _Scripted([RunOutcome("a", 0.1, "RunLockedError: run directory 'a' is in use")])
    with pytest.raises(RunLockedError, match=r"^run directory 'a' is in use$"):
        run_tasks(executor, [_task(tmp_path, "a")])
    assert executor.closed
    assert not (tmp_path / "a").exists()  # left to its owner: no failure recorded


def test_every_member_of_an_interrupted_ensemble_is_reported_first(tmp_path):
    _store(tmp_path / "m0", "finished", step=5)
    _store(tmp_path / "m1", "interrupted", step=4, detail="SIGTERM")
    tasks = [_ensemble(tmp_path, "g", ("m0", "m1")), _task(tmp_path, "c")]
    executor = _Scripted([RunOutcome("g", 4.0, members=("m0", "m1")), RunOutcome("c", 1.0)])
    calls = []
    executed = run_tasks(executor, tasks, lambda *args, **kwargs: calls.append(args))
    assert calls == [("m0", "finished", 2.0), ("m1", "interrupted", 2.0)]  # time shared
    assert executed.interruption == Interruption("m1", "SIGTERM", 4)
    assert executor.closed and "c" not in executed.runs  # not awaited


def test_a_signal_after_the_runs_ended_is_an_interruption_that_says_so(tmp_path):
    _store(tmp_path / "a", "finished", step=2)
    executed = run_tasks(_Scripted([RunOutcome("a", 1.0, signal="SIGINT")]), [_task(tmp_path, "a")])
    assert executed.interruption == Interruption("a", "SIGINT", 0, ended=True)
    assert executed.runs["a"].status == "finished"


@pytest.mark.parametrize("stop_signal", [None, "SIGTERM"])
def test_tasks_a_stopped_executor_never_ran_are_an_interruption(tmp_path, stop_signal):
    _store(tmp_path / "a", "finished", step=2)
    _store(tmp_path / "b", "running", step=7)  # killed earlier, to resume: not run now either
    tasks = [_task(tmp_path, "a"), _task(tmp_path, "b", resume=True), _task(tmp_path, "c")]
    executor = _Scripted([RunOutcome("a", 1.0)], stop_signal=stop_signal)
    executed = run_tasks(executor, tasks)
    assert executed.interruption == Interruption("b", stop_signal or "SIGINT", 0)
    assert list(executed.runs) == ["a"]


def test_a_never_run_task_with_an_interrupted_store_gives_its_step(tmp_path):
    _store(tmp_path / "a", "interrupted", step=6, detail="SIGINT")
    executed = run_tasks(_Scripted([], stop_signal="SIGTERM"), [_task(tmp_path, "a", resume=True)])
    assert executed.interruption == Interruption("a", "SIGTERM", 6)
