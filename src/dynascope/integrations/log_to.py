"""``--log-to``: forward stored runs and a study's verdict to TensorBoard, MLflow and W&B.

``dynascope run CONFIG --log-to mlflow`` and ``dynascope study run NAME --log-to tensorboard
--log-to wandb`` use :class:`RunLogger`; a notebook can too::

    with RunLogger(("mlflow",), "runs/slingshot-fast", study="slingshot", preset="fast") as log:
        for run_dir in sorted(Path("runs/slingshot-fast/runs").iterdir()):
            log.log_run(run_dir)
        log.log_verdict(json.loads(Path("runs/slingshot-fast/verdict.json").read_text()))

Design: each run is forwarded **from its store, in the calling process, once it has ended**
(``Study.run``'s ``on_run`` callback), not by live sinks inside the training loop. A study's
runs execute in-process, in a process pool or on a Ray cluster; live sinks would have to be
rebuilt in every worker (MLflow clients, W&B services and event writers do not pickle), and
W&B and a SQLite MLflow store do not take writes from many processes at once. The store
already holds every metric and the run's final status, so forwarding it afterwards gives the
same history on every executor, keeps training free of logger failures and costs, and logs a
resumed study's kept runs too. The price: the loggers see a run when it ends, not while it
trains (``dynascope show RUN_DIR --follow`` watches a live run).

What each logger receives (names from :func:`dynascope.keys.metric_path`: ``train/loss``,
``attn/L0/H3/qk_effective_rank``; only one-element values: spectra stay in the store):

- **MLflow** (store ``$MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db`` in the working
  directory; experiment ``$MLFLOW_EXPERIMENT_NAME``, else the study's name, else
  ``dynascope``): a study gets a parent run named after its directory (``slingshot-fast``)
  with the preset config as params, tags ``study``, ``preset``, ``seed``, and the verdict;
  each run of the study is nested under it (``mlflow.parentRunId``), named after the run, with
  its config as params, its metrics at their steps, tags ``study``, ``preset``, ``arm``,
  ``seed``, ``status`` and an MLflow status (``FINISHED``, ``FAILED`` for diverged or failed,
  ``KILLED`` for interrupted).
- **W&B** (mode ``$WANDB_MODE``, else ``offline``: nothing is sent unless asked; project
  ``$WANDB_PROJECT``, else ``dynascope``; files under ``$WANDB_DIR``, else the run or study
  directory): one W&B run per run, ``group`` = the study, ``job_type`` = the arm, tags the
  preset; config = the run config; history = the metrics. The verdict goes to a summary run
  of the same group, ``job_type="verdict"``.
- **TensorBoard** (event files under ``DIR/tensorboard/``, DIR the run or study directory;
  ``tensorboard --logdir runs/`` shows every study together): one subdirectory per run with its
  scalars and its config as text; the verdict in ``tensorboard/verdict/``.

The verdict, per claim ``ID`` (the claim's text up to its colon, e.g. ``c1``): metrics
``verdict/ID/measured``, ``verdict/ID/interval_low``, ``verdict/ID/interval_high``,
``verdict/ID/threshold``, ``verdict/ID/held`` (1 held, 0 otherwise), and text (MLflow tags
``verdict.ID.status`` and ``verdict.ID.claim``; W&B summary strings; TensorBoard text): the
status, the claim, its direction and the reason when inconclusive. ``verdict.status`` is the
study's overall status.

The **arm** of a run is its name without the seed token (a ``_``-separated part ``s<N>`` or
``seed<N>``): ``coord_mup_adam_w32_s1`` is arm ``coord_mup_adam_w32``, ``s0_offset`` arm
``offset``. Logging the same study again makes new runs in MLflow and W&B (nothing is
overwritten); TensorBoard appends new event files beside the old ones.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["EXTRAS", "LOG_TARGETS", "RunLogger", "arm_of", "check_log_targets"]

LOG_TARGETS = ("tensorboard", "mlflow", "wandb")
"""The values ``--log-to`` takes."""

EXTRAS = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}
"""Each target's pip extra (``pip install 'dynascope[EXTRA]'``)."""

_MODULES = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}
_WANDB_MODES = ("offline", "online", "disabled")
_SEED_TOKEN = re.compile(r"(?:s|seed)\d+")


def check_log_targets(names: Iterable[str] | None) -> tuple[str, ...]:
    """The ``--log-to`` values, checked, deduplicated, in the order given.

    Imports each target's library (nothing is written).

    Raises:
        ValueError: a name not in :data:`LOG_TARGETS`; a target whose library is not installed
            (the message names the extra to install); ``$WANDB_MODE`` not one of ``offline``,
            ``online``, ``disabled`` with ``wandb``.
    """
    targets: list[str] = []
    for name in names or ():
        if name not in LOG_TARGETS:
            raise ValueError(f"--log-to must be one of {', '.join(LOG_TARGETS)} (got {name!r})")
        if name not in targets:
            targets.append(name)
    for name in targets:
        try:
            importlib.import_module(_MODULES[name])
        except ImportError:
            raise ValueError(
                f"--log-to {name} needs {_MODULES[name]}: pip install 'dynascope[{EXTRAS[name]}]'"
            ) from None
    mode = os.environ.get("WANDB_MODE")
    if "wandb" in targets and mode is not None and mode not in _WANDB_MODES:
        raise ValueError(
            f"WANDB_MODE must be one of {', '.join(_WANDB_MODES)} for --log-to wandb (got {mode!r})"
        )
    return tuple(targets)


def arm_of(run_name: str) -> str:
    """The run's name without its seed token (module docstring); the name itself if none."""
    parts = [part for part in run_name.split("_") if not _SEED_TOKEN.fullmatch(part)]
    return "_".join(parts) or run_name


def _claim_id(claim: str) -> str:
    return claim.split(":")[0].strip().replace(" ", "_") or "claim"


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


def _verdict_values(verdict: dict[str, Any]) -> tuple[dict[str, float], dict[str, str]]:
    """``verdict.json``'s claims as metrics (finite numbers only) and text."""
    metrics: dict[str, float] = {}
    text = {"verdict.status": str(verdict.get("status"))}
    for claim in verdict.get("claims", []):
        cid = _claim_id(claim["claim"])
        low, high = claim.get("interval") or (None, None)
        numbers = {
            "measured": _number(claim.get("measured")),
            "interval_low": _number(low),
            "interval_high": _number(high),
            "threshold": _number(claim.get("threshold")),
            "held": 1.0 if claim.get("status") == "held" else 0.0,
        }
        for name, value in numbers.items():
            if value is not None and math.isfinite(value):
                metrics[f"verdict/{cid}/{name}"] = value
        text[f"verdict.{cid}.status"] = str(claim.get("status"))
        text[f"verdict.{cid}.claim"] = claim["claim"]
        text[f"verdict.{cid}.direction"] = f"{claim.get('direction')} {claim.get('threshold')}"
        if claim.get("reason"):
            text[f"verdict.{cid}.reason"] = claim["reason"]
    return metrics, text


def _records(scalars) -> list[tuple[int, dict[str, float]]]:
    """A store's ``scalars`` frame as ``(step, {key: value})`` records, by step."""
    return [
        (int(step), dict(zip(rows["key"], rows["value"].astype(float), strict=True)))
        for step, rows in scalars.groupby("step", sort=True)
    ]


class RunLogger:
    """Forwards ended runs (and a study's verdict) from their stores to the chosen loggers.

    Args:
        targets: names from :data:`LOG_TARGETS` (checked by :func:`check_log_targets`).
        root: the run directory (``dynascope run``) or the study directory; TensorBoard files go
            under ``root/tensorboard/``, W&B files under ``$WANDB_DIR`` or ``root``.
        study: the study's name, ``None`` for a single run.
        preset: the study's preset.
        seed: the study's base seed.
        config: the study's preset config, logged as the parent (MLflow) or summary (W&B)
            run's parameters.
    Raises:
        ValueError: as :func:`check_log_targets`.
    """

    def __init__(
        self,
        targets: Sequence[str],
        root: str | os.PathLike[str],
        *,
        study: str | None = None,
        preset: str | None = None,
        seed: int | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        self.targets = check_log_targets(targets)
        self.root = Path(root)
        self.study, self.preset, self.seed = study, preset, seed
        self.config = config or {}
        self.logged: list[str] = []
        self._parent = None  # the study's MLflow parent run
        if "mlflow" in self.targets and study is not None:
            from dynascope.integrations.mlflow import MLflowSink

            self._parent = MLflowSink(
                experiment=self._experiment(),
                run_name=self.root.name,
                config=self.config,
                tags=self._tags(),
            )

    # -- where and under which names --------------------------------------------------------
    def _experiment(self) -> str:
        return os.environ.get("MLFLOW_EXPERIMENT_NAME") or self.study or "dynascope"

    def _tags(self, **more: Any) -> dict[str, str]:
        tags = {"study": self.study, "preset": self.preset, "seed": self.seed, **more}
        return {name: str(value) for name, value in tags.items() if value is not None}

    def _wandb(self, **init: Any):
        from dynascope.integrations.wandb import WandbSink

        return WandbSink(
            project=os.environ.get("WANDB_PROJECT") or "dynascope",
            dir=os.environ.get("WANDB_DIR") or self.root,
            mode=os.environ.get("WANDB_MODE") or "offline",  # type: ignore[arg-type]
            group=self.study,
            tags=[self.preset] if self.preset else None,
            settings={"silent": True},
            **init,
        )

    @property
    def tensorboard_dir(self) -> Path:
        return self.root / "tensorboard"

    # -- what is logged ---------------------------------------------------------------------
    def log_run(self, run_dir: str | os.PathLike[str]) -> None:
        """Forward one ended run: its config, every scalar at its step, its status.

        Raises:
            FileNotFoundError: if ``run_dir`` holds no ``metrics.sqlite``.
        """
        from dynascope.store import load_run

        run = load_run(run_dir)
        records, status = _records(run.scalars), run.status or "unknown"
        last = records[-1][0] if records else 0
        seed = run.config.get("seed", self.seed)
        arm = arm_of(run.name) if self.study is not None else None
        sinks: list[Any] = []
        if "tensorboard" in self.targets:
            from dynascope.integrations.tensorboard import TensorBoardSink

            where = self.tensorboard_dir / run.name if self.study else self.tensorboard_dir
            tensorboard = TensorBoardSink(where)
            config_text = json.dumps(run.config, indent=2, default=str)
            tensorboard.writer.add_text("config", f"```\n{config_text}\n```", 0)
            tensorboard.writer.add_text("status", status, last)
            sinks.append(tensorboard)
        if "mlflow" in self.targets:
            from dynascope.integrations.mlflow import MLflowSink

            tags = self._tags(arm=arm, seed=seed, status=status)
            if self._parent is not None:
                tags["mlflow.parentRunId"] = self._parent.run_id
            sink = MLflowSink(
                experiment=self._experiment(), run_name=run.name, config=run.config, tags=tags
            )
            sink.log_many(records)
            sink.set_status(last, status)
            sink.close()
        if "wandb" in self.targets:
            sinks.append(self._wandb(name=run.name, job_type=arm or "run", config=run.config))
        for sink in sinks:
            for step, values in records:
                sink.log(step, values)
            if hasattr(sink, "set_status"):
                sink.set_status(last, status)
            sink.close()
        self.logged.append(run.name)

    def log_verdict(self, verdict: dict[str, Any]) -> None:
        """Log a study's verdict (``verdict.json`` as a dict) as its summary (module docstring)."""
        metrics, text = _verdict_values(verdict)
        if "tensorboard" in self.targets:
            from dynascope.integrations.tensorboard import TensorBoardSink

            with TensorBoardSink(self.tensorboard_dir / "verdict") as tensorboard:
                tensorboard.writer.add_text("verdict", _markdown(text), 0)
                for name, value in metrics.items():
                    tensorboard.writer.add_scalar(name, value, 0)
        if self._parent is not None:
            self._parent.set_tags(text)
            self._parent.log(0, metrics)
        if "wandb" in self.targets:
            with self._wandb(
                name=f"{self.root.name} verdict", job_type="verdict", config=self.config
            ) as summary:
                summary.run.summary.update({**metrics, **text})

    def close(self, status: str = "finished") -> None:
        """End the study's MLflow parent run with ``status`` (``finished``, ``interrupted``,
        ``failed``) and wait for W&B to write its files (this ends the process's W&B service)."""
        if self._parent is not None:
            self._parent.set_status(-1, status)
        if "wandb" in self.targets:
            import wandb

            wandb.teardown()

    def where(self) -> str:
        """Where the runs went, one phrase per target (for the command's last line)."""
        places = {
            "tensorboard": f"TensorBoard {self.tensorboard_dir}",
            "mlflow": f"MLflow {os.environ.get('MLFLOW_TRACKING_URI') or 'sqlite:///mlflow.db'} "
            f"(experiment {self._experiment()})",
            "wandb": f"W&B {os.environ.get('WANDB_MODE') or 'offline'} "
            f"(project {os.environ.get('WANDB_PROJECT') or 'dynascope'}, "
            f"dir {os.environ.get('WANDB_DIR') or self.root})",
        }
        return ", ".join(places[target] for target in self.targets)

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        self.close("finished" if kind is None else "interrupted")


def _markdown(text: dict[str, str]) -> str:
    return "\n\n".join(f"**{name}**: {value}" for name, value in text.items())
