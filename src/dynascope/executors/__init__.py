"""Executors: where a study's runs execute (DESIGN.md, Executors).

Runs of a study are independent; an executor takes the runs still to do
(:class:`RunTask`) and yields a :class:`RunOutcome` as each ends. Every run writes its own run
directory; the study reads the stores afterwards, whatever executed them.

- ``local`` (default): one after another in this process (:class:`LocalExecutor`);
- ``process``: up to ``workers`` runs at once, one fresh process per run
  (:class:`ProcessExecutor`);
- ``ray``: each run a Ray task on a cluster (``address``) or a local Ray
  (:class:`RayExecutor`; needs the ``ray`` extra).

``dynascope study run NAME --executor process --workers 4`` or
``study.run(preset="fast", executor=make_executor("process", workers=4))``.

:func:`run_tasks` is what ``Study.run`` calls: it executes the tasks on an executor, records a
run that failed without recording it (no store) as ``failed``, surfaces a run in use by
another process (``RunLockedError``), reports each run (each member of an ensemble) as it ends,
and returns every run as stored, with the first interruption by a signal
(:class:`Interruption`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

from ._run_tasks import ExecutedRuns as ExecutedRuns
from ._run_tasks import Interruption as Interruption
from ._run_tasks import run_tasks as run_tasks
from ._task import RunOutcome as RunOutcome
from ._task import RunTask as RunTask
from ._task import execute_task as execute_task
from ._task import quiet_interrupts_in_callbacks as quiet_interrupts_in_callbacks
from .local import LocalExecutor as LocalExecutor
from .process import ProcessExecutor as ProcessExecutor

EXECUTORS = ("local", "process", "ray")


class Executor(Protocol):
    """What :func:`run_tasks` (and :meth:`dynascope.studies.Study.run`) needs from an executor.

    An executor that stops starting tasks on a signal says which in ``stop_signal``
    (``"SIGINT"``/``"SIGTERM"``; :class:`ProcessExecutor`).
    """

    name: str

    def map(self, tasks: Sequence[RunTask]) -> Iterator[RunOutcome]: ...


def make_executor(name: str, *, workers: int = 1, address: str | None = None) -> Executor:
    """The executor called ``name``.

    Args:
        name: ``local``, ``process`` or ``ray``.
        workers: runs at once for ``process`` (``>= 1``).
        address: Ray cluster address for ``ray`` (``None``: a local Ray instance).
    Raises:
        ValueError: unknown name, ``workers < 1``, ``workers``/``address`` given to an executor
            that does not take it, or Ray not installed.
    """
    if name not in EXECUTORS:
        raise ValueError(f"executor must be one of {', '.join(EXECUTORS)} (got {name!r})")
    if workers < 1:
        raise ValueError(f"workers must be >= 1 (got {workers})")
    if workers != 1 and name != "process":
        raise ValueError(f"workers: only the process executor takes it (got executor={name!r})")
    if address is not None and name != "ray":
        raise ValueError(f"address: only the ray executor takes it (got executor={name!r})")
    if name == "process":
        return ProcessExecutor(workers)
    if name == "ray":
        from .ray import RayExecutor

        return RayExecutor(address)
    return LocalExecutor()
