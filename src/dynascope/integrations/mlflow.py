"""MLflowSink: write a :class:`dynascope.Monitor`'s records to an MLflow run (local by default).

Example::

    from dynascope.integrations.mlflow import MLflowSink

    with ds.RunStore("runs/mine") as store, MLflowSink(run_name="mine") as mlflow_sink:
        monitor = ds.Monitor(model, probes, ds.LogSchedule(10_000), sink=[store, mlflow_sink])

The tracking store is ``tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else a local SQLite file
``sqlite:///mlflow.db`` in the working directory (``mlflow ui --backend-store-uri
sqlite:///mlflow.db`` shows it; nothing is sent anywhere). Metric names are grouped by
:func:`dynascope.keys.metric_path` (``attn/L0/H3/qk_effective_rank``); one-element values are
logged as metrics at their step, and tensors with more elements (spectra) are left out (MLflow
metrics are numbers; keep spectra in a :class:`dynascope.RunStore`). ``config`` is logged as
run parameters, nested fields flattened with dots. :meth:`set_status` (which the HF and
Lightning callbacks call) ends the MLflow run as ``FINISHED``, ``FAILED`` or ``KILLED``;
:meth:`close` ends it as ``FINISHED`` if it is still running.

Needs the extra ``mlflow`` (``mlflow-skinny`` with SQLAlchemy and Alembic for the SQLite store).

Raises:
    ImportError: on construction, if ``mlflow`` is not installed (``pip install
        'dynascope[mlflow]'``).
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from torch import Tensor

from dynascope.integrations._records import grouped_scalars

__all__ = ["MLflowSink"]

_END = {"finished": "FINISHED", "diverged": "FAILED", "failed": "FAILED", "interrupted": "KILLED"}
_BATCH = 1000  # MLflow's limit of metrics per log_batch call


@contextmanager
def _quiet_store() -> Iterator[None]:
    """Silence SQLAlchemy >= 2.1's deprecation of the ``noload`` strategy MLflow's store uses
    (MLflow's doing, not the caller's)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"The ``noload`` loader strategy is deprecated")
        yield


def _flatten(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    flat = {}
    for name, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{name}."))
        else:
            flat[f"{prefix}{name}"] = str(value)
    return flat


class MLflowSink:
    """A sink (``log(step, values)``) that logs metrics to one MLflow run.

    Args:
        tracking_uri: MLflow tracking URI; ``None`` takes ``$MLFLOW_TRACKING_URI`` or
            ``sqlite:///mlflow.db``.
        experiment: experiment name (created if missing).
        run_name: the MLflow run's name; ``None`` lets MLflow choose one.
        config: logged as the run's parameters (flattened with dots, values as strings).
        tags: the run's tags (``{"mlflow.parentRunId": id}`` nests it under another run).
    Raises:
        ImportError: if ``mlflow`` is not installed.
    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        *,
        experiment: str = "dynascope",
        run_name: str | None = None,
        config: dict[str, Any] | None = None,
        tags: dict[str, str] | None = None,
    ) -> None:
        try:
            from mlflow.entities import Metric, Param
            from mlflow.tracking import MlflowClient
        except ImportError as err:
            raise ImportError("MLflowSink needs mlflow: pip install 'dynascope[mlflow]'") from err
        self._Metric = Metric
        self.tracking_uri = (
            tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db"
        )
        with _quiet_store():
            self.client = MlflowClient(tracking_uri=self.tracking_uri)
            found = self.client.get_experiment_by_name(experiment)
            experiment_id = (
                found.experiment_id if found else self.client.create_experiment(experiment)
            )
            self.experiment_id: str = experiment_id
            self.run_id: str = self.client.create_run(
                experiment_id, run_name=run_name, tags=tags
            ).info.run_id
            if config:
                params = [Param(k, v) for k, v in _flatten(config).items()]
                for i in range(0, len(params), 100):  # MLflow's limit of params per call
                    self.client.log_batch(self.run_id, params=params[i : i + 100])
        self._ended = False

    def log(self, step: int, values: dict[str, Tensor | float]) -> None:
        """Log the one-element values as metrics at ``step`` (grouped names)."""
        self.log_many([(step, values)])

    def log_many(self, records: Iterable[tuple[int, dict[str, Tensor | float]]]) -> None:
        """Log several ``(step, values)`` records in batches of 1000 metrics (a stored run's
        history in a few calls rather than one per step)."""
        now = int(time.time() * 1000)
        metrics = [
            self._Metric(k, v, now, step)
            for step, values in records
            for k, v in grouped_scalars(values).items()
        ]
        with _quiet_store():
            for i in range(0, len(metrics), _BATCH):
                self.client.log_batch(self.run_id, metrics=metrics[i : i + _BATCH])

    def set_tags(self, tags: dict[str, str]) -> None:
        """Set the run's tags (values cut to MLflow's limit of 5000 characters)."""
        with _quiet_store():
            for name, value in tags.items():
                self.client.set_tag(self.run_id, name, value[:5000])

    def set_status(self, step: int, status: str) -> None:
        """End the run for ``finished``/``diverged``/``failed``/``interrupted``; ``running``
        leaves it open."""
        if status in _END and not self._ended:
            with _quiet_store():
                self.client.set_terminated(self.run_id, _END[status])
            self._ended = True

    def flush(self) -> None:
        """Nothing to do: every :meth:`log` is written at once."""

    def close(self) -> None:
        """End the run as ``FINISHED`` unless a status already ended it."""
        self.set_status(-1, "finished")

    def __enter__(self) -> MLflowSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
