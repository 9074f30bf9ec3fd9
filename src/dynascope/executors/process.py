"""The process executor: up to N runs at a time, each in its own fresh process.

Glossary:
    workers:  N, the most runs executing at once (``--workers N``).
    child:    the process of one run; it executes exactly one task and exits.

Why one process per run (not a reusable pool): a run that kills its process (a segfault, an
out-of-memory kill, ``os._exit``) must not take other runs with it. ``concurrent.futures``
marks the whole pool broken when one worker dies; here the dead child's run is recorded as
``failed`` (with the exit code or signal) and the other runs go on.

Children start from a ``forkserver`` that has imported torch and dynascope once, so a child
costs a ``fork`` rather than a fresh interpreter, and no child inherits a parent's OpenMP
thread pool (which ``fork`` from a process that already ran parallel torch code can deadlock).

Signals: Ctrl-C reaches every process of the terminal's process group, so each child's engine
checkpoints and records ``interrupted`` (a run still building is stopped and its store marked
``interrupted`` by :func:`~dynascope.executors.execute_task`); a SIGTERM sent to this process
alone is forwarded to the children. After a signal no new run starts; the executor waits for
the running children and the study stops (:class:`~dynascope.studies.base.StudyInterrupted`).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from multiprocessing.connection import Connection, wait

from ._task import RunOutcome, RunTask, execute_task, record_failure, record_interrupted

__all__ = ["ProcessExecutor"]

# torch._dynamo: torch imports it at the first optimizer a process builds (~1-2 s of CPU, no
# thread, no RNG draw); preloaded, every child gets it by the fork instead of importing it again
_PRELOAD = [
    "torch",
    "torch._dynamo",
    "dynascope.store",
    "dynascope.train",
    "dynascope.studies.base",
]


def _child_main(task: RunTask, conn: Connection) -> None:
    """Body of one child: execute the task, send the outcome back."""
    import torch

    from ._task import quiet_interrupts_in_callbacks

    quiet_interrupts_in_callbacks()
    torch.set_num_threads(1)  # N runs share the machine's cores; runners may ask for more
    outcome = execute_task(task)
    conn.send(outcome)
    conn.close()


def _exit_description(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


class ProcessExecutor:
    """Execute tasks in child processes, at most ``workers`` at a time.

    Args:
        workers: the most runs at once (``>= 1``).
    Raises:
        ValueError: if ``workers < 1``.
    """

    name = "process"

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1 (got {workers})")
        self.workers = workers
        self.stop_signal: str | None = None

    def map(self, tasks: Sequence[RunTask]) -> Iterator[RunOutcome]:
        """Run ``tasks`` concurrently; yield each outcome as its child exits.

        A child that dies without reporting is recorded in its run's store as ``failed``.
        Closing the iterator early (the study stops) sends SIGTERM to the running children
        and waits for them.
        """
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)
        pending = list(tasks)[::-1]
        running: dict[int, tuple[mp.process.BaseProcess, Connection, RunTask, float]] = {}
        previous = self._catch_signals()
        try:
            while pending or running:
                while pending and len(running) < self.workers and self.stop_signal is None:
                    task = pending.pop()
                    receive, send = ctx.Pipe(duplex=False)
                    child = ctx.Process(
                        target=_child_main, args=(task, send), name=f"dynascope-{task.name}"
                    )
                    child.start()
                    send.close()
                    running[child.sentinel] = (child, receive, task, time.perf_counter())
                if not running:
                    break  # stopped before the remaining runs started
                for sentinel in wait(list(running), timeout=0.5):
                    child, receive, task, t0 = running.pop(sentinel)
                    yield self._collect(child, receive, task, t0)
        finally:
            for child, _, _, _ in running.values():  # closed early: stop them (once) and wait
                if child.is_alive() and self.stop_signal is None:
                    child.terminate()  # SIGTERM: a Trainer checkpoints and records interrupted
            for child, receive, _, _ in running.values():
                child.join()
                receive.close()
            self._restore_signals(previous)

    def _collect(
        self, child: mp.process.BaseProcess, receive: Connection, task: RunTask, t0: float
    ) -> RunOutcome:
        outcome = None
        try:
            if receive.poll():
                outcome = receive.recv()
        except (EOFError, OSError):
            outcome = None
        finally:
            receive.close()
        child.join()
        if outcome is not None:
            return outcome
        seconds = time.perf_counter() - t0
        if self.stop_signal is not None:  # a runner without signal handling, stopped: resumable
            record_interrupted(task.run_dir, self.stop_signal)
            return RunOutcome(task.name, seconds, signal=self.stop_signal, members=task.members)
        message = f"WorkerDied: the run's process {_exit_description(child.exitcode)}"
        record_failure(task.run_dir, message)
        return RunOutcome(task.name, seconds, message, members=task.members)

    # -- signals -------------------------------------------------------------------------------
    def _catch_signals(self) -> dict[int, object]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, self._on_signal)
        return previous

    def _on_signal(self, signum: int, frame: object) -> None:
        self.stop_signal = self.stop_signal or signal.Signals(signum).name
        if signum == signal.SIGTERM:  # Ctrl-C already reached the children; SIGTERM did not
            for child in mp.active_children():
                if child.name.startswith("dynascope-") and child.pid is not None:
                    os.kill(child.pid, signal.SIGTERM)

    @staticmethod
    def _restore_signals(previous: dict[int, object]) -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
