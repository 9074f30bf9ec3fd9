"""WandbSink: write a :class:`dynascope.Monitor`'s records to a Weights & Biases run (offline by
default).

Example::

    from dynascope.integrations.wandb import WandbSink

    with ds.RunStore("runs/mine") as store, WandbSink(name="mine") as wandb_sink:
        monitor = ds.Monitor(model, probes, ds.LogSchedule(10_000), sink=[store, wandb_sink])

``mode="offline"`` (the default) writes the run under ``dir/wandb/`` and sends nothing;
``wandb sync DIR/wandb/offline-run-*`` uploads it later, and ``mode="online"`` logs live.
Names are grouped by :func:`dynascope.keys.metric_path` (``attn/L0/H3/qk_effective_rank``,
one W&B panel section per group); one-element values are logged as numbers at their step,
tensors with more elements (spectra) as ``wandb.Histogram``. ``config`` becomes the run's
config. :meth:`set_status` (which the HF and Lightning callbacks call) finishes the W&B run
with exit code 0 for ``finished`` and 1 for ``diverged``/``failed``/``interrupted``;
:meth:`close` finishes it with 0 if it is still open.

Raises:
    ImportError: on construction, if ``wandb`` is not installed (``pip install
        'dynascope[wandb]'``).
"""

from __future__ import annotations

import os
from typing import Any, Literal

from torch import Tensor

from dynascope.integrations._records import grouped_scalars
from dynascope.keys import metric_path

__all__ = ["WandbSink"]

_EXIT = {"finished": 0, "diverged": 1, "failed": 1, "interrupted": 1}


class WandbSink:
    """A sink (``log(step, values)``) that logs to one W&B run.

    Args:
        project: W&B project name.
        name: the run's display name; ``None`` lets W&B choose one.
        config: the run's config.
        dir: where ``wandb/`` is written (``None``: the working directory).
        mode: ``"offline"`` (nothing sent), ``"online"`` or ``"disabled"``.
        **init_kwargs: passed on to ``wandb.init`` (e.g. ``entity``, ``tags``, ``group``).
    Raises:
        ImportError: if ``wandb`` is not installed.
        ValueError: if ``mode`` is not one of the three.
    """

    def __init__(
        self,
        *,
        project: str = "dynascope",
        name: str | None = None,
        config: dict[str, Any] | None = None,
        dir: str | os.PathLike[str] | None = None,
        mode: Literal["offline", "online", "disabled"] = "offline",
        **init_kwargs: Any,
    ) -> None:
        if mode not in ("offline", "online", "disabled"):
            raise ValueError(f"mode must be one of offline, online, disabled (got {mode!r})")
        try:
            import wandb
        except ImportError as err:
            raise ImportError("WandbSink needs wandb: pip install 'dynascope[wandb]'") from err
        self._wandb = wandb
        init_kwargs.setdefault("reinit", "create_new")  # several sinks, several runs
        self.run = wandb.init(
            project=project,
            name=name,
            config=config,
            dir=None if dir is None else os.fspath(dir),
            mode=mode,
            **init_kwargs,
        )
        self._ended = False

    def log(self, step: int, values: dict[str, Tensor | float]) -> None:
        """Log numbers and spectra (as histograms) at ``step`` (grouped names)."""
        data: dict[str, Any] = dict(grouped_scalars(values))
        for key, value in values.items():
            if isinstance(value, Tensor) and value.numel() != 1:
                array = value.detach().double().cpu().reshape(-1).numpy()
                data[metric_path(key)] = self._wandb.Histogram(array)
        if data:
            self.run.log(data, step=step)

    def set_status(self, step: int, status: str) -> None:
        """Finish the run for ``finished`` (exit code 0) or ``diverged``/``failed``/
        ``interrupted`` (1); ``running`` leaves it open."""
        if status in _EXIT and not self._ended:
            self.run.finish(exit_code=_EXIT[status])
            self._ended = True

    def flush(self) -> None:
        """Nothing to do: W&B writes in the background and on :meth:`close`."""

    def close(self) -> None:
        """Finish the run with exit code 0 unless a status already finished it."""
        self.set_status(-1, "finished")

    def __enter__(self) -> WandbSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
