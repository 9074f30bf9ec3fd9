"""``--log-to tensorboard|mlflow|wandb`` for ``dynascope run`` and ``dynascope study run``.

The option is checked before anything is written (a bad name or a missing library: one line,
exit 2). Runs are forwarded from their stores once they end, in this process, by
:class:`dynascope.integrations.log_to.RunLogger` (its docstring says why, and what each logger
receives). A logger that fails while forwarding stops the command with exit 1; the runs stay in
their stores, and rerunning the study resumes it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any

import typer

from ._common import fail, print_line

LogTo = Annotated[
    list[str] | None,
    typer.Option(
        "--log-to",
        help="also log the runs to tensorboard | mlflow | wandb (repeat for several); "
        "settings from MLFLOW_TRACKING_URI, WANDB_MODE, WANDB_PROJECT, WANDB_DIR",
    ),
]


def log_targets(values: list[str] | None) -> tuple[str, ...]:
    """The checked ``--log-to`` values; exit 2 with one line on a bad name or missing extra."""
    from dynascope.integrations.log_to import check_log_targets

    try:
        return check_log_targets(values)
    except ValueError as err:
        fail(str(err))


def _failed(what: str, err: Exception) -> None:
    fail(f"--log-to: could not log {what} ({type(err).__name__}: {err})", code=1)


def _quiet_mlflow() -> None:
    # MLflow announces at INFO that it creates a new SQLite store's tables; one line per
    # command (ours) is enough
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)


def log_run_dir(targets: tuple[str, ...], run_dir: Path) -> None:
    """Forward one ended run (``dynascope run``/``resume``) and say where it went."""
    if not targets:
        return
    from dynascope.integrations.log_to import RunLogger

    _quiet_mlflow()
    try:
        with RunLogger(targets, run_dir) as logger:
            logger.log_run(run_dir)
    except Exception as err:  # a logger's own error: the run is kept in its store
        _failed(f"run {run_dir}", err)
    print_line(f"logged {run_dir} to {logger.where()}", soft_wrap=True)


class StudyLogging:
    """A study's ``--log-to``: opens the loggers when the study starts, forwards each run as it
    ends, then the verdict; :meth:`close` ends an unfinished study's parent run as killed.

    Args:
        targets: checked ``--log-to`` values (nothing is opened when empty).
        study: the :class:`dynascope.studies.Study`.
        preset, seed, out: as ``study run`` was given them.
    """

    def __init__(
        self, targets: tuple[str, ...], study: Any, preset: str, seed: int, out: Path
    ) -> None:
        self.targets, self.study, self.preset, self.seed, self.out = (
            targets, study, preset, seed, out,
        )  # fmt: skip
        self.logger = None

    def start(self) -> None:
        if not self.targets:
            return
        from dynascope.integrations.log_to import RunLogger

        _quiet_mlflow()
        config = self.study.preset(self.preset).model_dump(mode="json")
        try:
            self.logger = RunLogger(
                self.targets, self.out, study=self.study.name, preset=self.preset,
                seed=self.seed, config=config,
            )  # fmt: skip
        except Exception as err:
            _failed(f"study {self.study.name}", err)

    def run(self, run_name: str) -> None:
        if self.logger is not None:
            try:
                self.logger.log_run(self.out / "runs" / run_name)
            except Exception as err:
                self.close()
                _failed(f"run {run_name}", err)

    def finish(self, outcome: Any) -> None:
        """Log the verdict, end the loggers, and say where the runs went."""
        if self.logger is None:
            return
        logger, self.logger = self.logger, None
        try:
            logger.log_verdict(outcome.to_json())
            logger.close("finished")
        except Exception as err:
            logger.close("failed")
            _failed(f"the verdict of {self.study.name}", err)
        print_line(
            f"logged {len(logger.logged)} runs and the verdict to {logger.where()}",
            soft_wrap=True,
        )

    def close(self) -> None:
        """End an unfinished study's loggers (its MLflow parent run as ``KILLED``)."""
        if self.logger is not None:
            logger, self.logger = self.logger, None
            logger.close("interrupted")
