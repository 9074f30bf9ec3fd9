"""A study while it runs: the table of ``dynascope show STUDY_DIR [--follow]`` and the progress
bar of ``dynascope study run`` on a terminal, both read from the study directory
(:mod:`dynascope.studies.progress`), so they work alike for every executor.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from rich.table import Table

from ._common import console, db_errors, fail, print_line, print_table

PLAIN_SUMMARY_S = 30.0
"""Seconds between summary lines of ``show --follow`` when stdout is not a terminal."""

_STYLE = {
    "running": "cyan",
    "done": "green",
    "diverged": "yellow",
    "failed": "red",
    "interrupted": "yellow",
    "pending": "dim",
}


def format_eta(seconds: float | None) -> str:
    """``0:01:05`` (hours:minutes:seconds); ``—`` when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "—"
    whole = int(round(seconds))
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def summary(progress) -> str:
    """One line: the runs by state, the steps and the ETA, or how the study ended."""
    states = ("running", "done", "diverged", "failed", "interrupted", "pending")
    counts = ", ".join(f"{n} {s}" for s in states if (n := progress.count(s)))
    done, total = progress.steps
    if progress.verdict is not None:
        end = f"verdict: {progress.verdict}"
    elif progress.active:
        end = f"ETA {format_eta(progress.eta_s)}"
    else:
        end = "not running"
    return f"{counts or 'no runs'}; {done}/{total} steps; {end}"


def study_table(progress) -> Table:
    """The runs of a :class:`~dynascope.studies.progress.StudyProgress` as a table: run, state,
    step of total, last training loss, ETA; the title sums them up."""
    table = Table(title=f"{progress.study} ({progress.preset}): {summary(progress)}")
    table.add_column("run")
    table.add_column("state")
    table.add_column("step", justify="right")
    table.add_column("loss", justify="right")
    table.add_column("ETA", justify="right")
    for run in progress.runs:
        table.add_row(
            run.name,
            f"[{_STYLE[run.state]}]{run.state}[/]",
            _step_text(run).removeprefix("step "),
            "" if run.loss is None else f"{run.loss:.4g}",
            format_eta(run.eta_s) if run.state == "running" else "",
        )
    return table


def _step_text(run) -> str:
    step = "—" if run.step is None else str(run.step)
    return f"step {step}/{'?' if run.total is None else run.total}"


def _loss_text(run) -> str:
    return "" if run.loss is None else f", loss {run.loss:.4g}"


def show_study(directory: Path, follow: bool, interval: float, timeout: float | None) -> None:
    """``dynascope show STUDY_DIR [--follow]`` (see ``show``'s help)."""
    from dynascope.studies.progress import StudyWatcher

    try:
        watcher = StudyWatcher(directory)
    except ValueError as err:
        fail(str(err))
    progress = _read(watcher)
    if not follow:
        print_table(study_table(progress))
        return
    deadline = None if timeout is None else time.monotonic() + timeout
    view = _LiveView() if console.is_terminal else _PlainView()
    was_idle = False
    with contextlib.suppress(KeyboardInterrupt), view:
        while True:
            view.show(progress)
            idle = not progress.active
            if idle and (was_idle or progress.verdict is not None):
                break  # two reads apart: a study starting between them holds its lock by then
            if deadline is not None and time.monotonic() + interval > deadline:
                break
            was_idle = idle
            time.sleep(interval)
            progress = _read(watcher)
    view.close(progress)


def _read(watcher):
    try:
        return watcher.read()
    except ValueError as err:
        fail(str(err))
    except db_errors() as err:
        fail(f"STUDY_DIR: a run's store is not readable ({err})")


class _LiveView:
    """The table redrawn in place (rich.live); its last drawing stays on the screen."""

    def __enter__(self):
        from rich.live import Live

        self.live = Live(console=console, auto_refresh=False)
        self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.live.__exit__(*exc)

    def show(self, progress) -> None:
        self.live.update(study_table(progress), refresh=True)

    def close(self, progress) -> None:
        pass


class _PlainView:
    """Plain lines for a pipe or a file: one per run that changes state, a summary every
    :data:`PLAIN_SUMMARY_S` seconds, and the table at the end."""

    def __init__(self) -> None:
        self.states: dict[str, str] | None = None
        self.summary_at = -math.inf

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def show(self, progress) -> None:
        if self.states is not None:
            for run in progress.runs:
                if self.states.get(run.name) != run.state:
                    print_line(f"run {run.name}: {run.state} ({_step_text(run)}{_loss_text(run)})")
        self.states = {run.name: run.state for run in progress.runs}
        if time.monotonic() - self.summary_at >= PLAIN_SUMMARY_S:
            self.summary_at = time.monotonic()
            print_line(f"{progress.study} ({progress.preset}): {summary(progress)}")

    def close(self, progress) -> None:
        print_table(study_table(progress))


@contextlib.contextmanager
def study_progress_bar(out: Path, period_s: float = 1.0) -> Iterator[None]:
    """A progress bar of the study in ``out`` (which must hold ``study.json``): the runs ended
    and the steps done over all runs, with the ETA, and a bar for each running run with its
    last loss; redrawn from the stores every ``period_s`` seconds by a thread, removed when
    the block ends. For a terminal: the caller checks ``console.is_terminal``."""
    from rich.progress import BarColumn, Progress, TextColumn

    from dynascope.studies.progress import StudyWatcher

    watcher = StudyWatcher(out)
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[detail]}"),
        console=console,
        transient=True,
    )
    overall = bar.add_task("study", total=None, detail="")
    tasks: dict[str, int] = {}
    stop = threading.Event()

    def update() -> None:
        progress = watcher.read()
        done, total = progress.steps
        ended = len(progress.runs) - progress.count("running", "pending")
        bar.update(
            overall,
            description=f"runs {ended}/{len(progress.runs)}",
            completed=done,
            total=total or None,
            detail=f"steps, ETA {format_eta(progress.eta_s)}",
        )
        running = {run.name: run for run in progress.runs if run.state == "running"}
        for name in set(tasks) - set(running):
            bar.remove_task(tasks.pop(name))
        for name, run in running.items():
            if name not in tasks:
                tasks[name] = bar.add_task(f"  {name}", total=run.total, detail="")
            loss = "-" if run.loss is None else f"{run.loss:.4g}"
            detail = f"loss {loss}, ETA {format_eta(run.eta_s)}"
            bar.update(tasks[name], completed=run.step or 0, detail=detail)

    def poll() -> None:
        while not stop.wait(period_s):
            with contextlib.suppress(ValueError, OSError, *db_errors()):  # the next read may do
                update()

    update()
    thread = threading.Thread(target=poll, name="study-progress", daemon=True)
    with bar:
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
