"""The in-process executor: runs one after another in the calling process (the default).

Signals behave as for ``dynascope run``: the engine catches SIGINT/SIGTERM, checkpoints and
returns ``interrupted``; a run stopped before it trains (while building) is stopped where it is
and its store marked ``interrupted`` (:func:`~dynascope.executors.execute_task`); the study
stops there.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from ._task import RunOutcome, RunTask, execute_task

__all__ = ["LocalExecutor"]


class LocalExecutor:
    """Execute tasks sequentially in this process, yielding each outcome as it ends."""

    name = "local"

    def map(self, tasks: Sequence[RunTask]) -> Iterator[RunOutcome]:
        """Run ``tasks`` in order; see :func:`~dynascope.executors.execute_task`."""
        for task in tasks:
            yield execute_task(task)
