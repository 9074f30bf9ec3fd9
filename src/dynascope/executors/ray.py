"""The Ray executor: each run is a Ray task on an existing cluster, or on a local Ray instance.

Glossary:
    address:  a Ray cluster's address (``ray://host:10001`` or ``host:6379``); ``None`` starts
              Ray locally on this machine (``ray.init()``), which is what tests use.
    request:  each task asks Ray for 1 CPU, plus 1 GPU when the run's device is CUDA; Ray
              places as many runs at once as the cluster's free resources allow.

Results land in the run directories under the study directory: on a multi-machine cluster that
directory must be on a file system every node mounts at the same path (the run writes its own
store, the driver only reads them). The nodes need dynascope installed (the build is pickled
by reference). A run that raises is recorded as ``failed`` by its task; a task whose worker
process dies is recorded as ``failed`` by the driver; the other runs go on.

Ray is an optional dependency: ``pip install "dynascope[ray]"``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

from ._task import RunOutcome, RunTask, execute_task, record_failure

__all__ = ["RayExecutor"]


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ValueError(
            "--executor: ray is not installed (install it with pip install 'dynascope[ray]')"
        ) from None
    return ray


class RayExecutor:
    """Execute tasks as Ray tasks (1 CPU each, plus 1 GPU for CUDA runs).

    Args:
        address: the cluster to join; ``None`` uses the Ray instance this process already
            joined, or starts a local one (stopped again when :meth:`map` ends, or when the
            ``with`` block of this executor ends).
    Raises:
        ValueError: if Ray is not installed.
    """

    name = "ray"

    def __init__(self, address: str | None = None) -> None:
        self.ray = _import_ray()
        self.address = address

    def map(self, tasks: Sequence[RunTask]) -> Iterator[RunOutcome]:
        """Submit every task; yield outcomes as they finish.

        Raises:
            ConnectionError: if Ray cannot reach the cluster at ``address``.
        """
        ray = self.ray
        started_here = self._init()
        remote = ray.remote(execute_task)
        refs: dict[Any, tuple[RunTask, float]] = {}
        try:
            for task in tasks:
                ref = remote.options(
                    num_cpus=1, num_gpus=1 if task.uses_cuda else 0, max_retries=0
                ).remote(task)
                refs[ref] = (task, time.perf_counter())
            while refs:
                done, _ = ray.wait(list(refs), num_returns=1)
                for ref in done:
                    task, t0 = refs.pop(ref)
                    yield self._collect(ref, task, t0)
        finally:
            for ref in refs:  # closed early: cancel what has not finished
                ray.cancel(ref)
            if started_here:
                ray.shutdown()

    def _init(self) -> bool:
        """Join (or start) Ray unless this process already has; return whether it did."""
        if self.ray.is_initialized():
            return False
        self.ray.init(
            address=self.address,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
        return True

    def __enter__(self) -> RayExecutor:
        """Hold one Ray session over several studies (``study run --all``)."""
        self._owns_session = self._init()
        return self

    def __exit__(self, *exc: object) -> None:
        if getattr(self, "_owns_session", False):
            self.ray.shutdown()
            self._owns_session = False

    def _collect(self, ref: Any, task: RunTask, t0: float) -> RunOutcome:
        try:
            return self.ray.get(ref)
        except self.ray.exceptions.RayError as err:  # the worker died: recorded here
            message = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
            record_failure(task.run_dir, message)
            return RunOutcome(task.name, time.perf_counter() - t0, message, members=task.members)
