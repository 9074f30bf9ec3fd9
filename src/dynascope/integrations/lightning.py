"""A Lightning ``Callback`` that runs a :class:`dynascope.Monitor`.

Example::

    from dynascope.integrations.lightning import MonitorCallback

    monitor = ds.Monitor(module.model, probes=[ds.probes.QKSpectrum()],
                         schedule=ds.EveryN(100), sink=ds.RunStore("runs/mine"))
    lightning.Trainer(max_steps=10_000, callbacks=[MonitorCallback(monitor)]).fit(module, data)

Step convention (as :class:`dynascope.train.Trainer`): step 0 is the model before training
(``on_train_start``); step t = ``trainer.global_step`` after t optimizer updates, measured in
``on_train_batch_end``, after ``optimizer.step()``; Lightning zeroes gradients at the start of
the next batch, so gradient probes see this update's gradients. With gradient accumulation the
monitor runs once per update (when ``global_step`` advances). The batch is handed to the probes
as ``{"x": ...}``: the batch itself if it is a tensor, its first element if it is a tuple or
list, or the dict as it is.

What reaches the monitor's sinks besides the probes: every ``trainer.log_every_n_steps``
updates, the loss ``training_step`` returned for the update's last batch (``train.loss``;
a tensor, or the ``"loss"`` entry of a dict) and the first optimizer's first learning rate
(``train.lr``); and the run status (``running`` at the start, ``finished`` at the end,
``interrupted`` on ``KeyboardInterrupt``, ``failed`` on any other exception) in sinks that
keep one (:class:`dynascope.RunStore`). The sinks are flushed at the end.

The probe values also go to the trainer's own loggers (``trainer.loggers``: TensorBoard, W&B,
MLflow, CSV, ...) through ``logger.log_metrics(values, step)``, with names grouped by
:func:`dynascope.keys.metric_path` (``attn/L0/H3/qk_effective_rank``); only one-element values
are forwarded (spectra stay in the RunStore). The callback adds a forwarding sink to
``monitor.sinks`` for this; ``forward=False`` turns it off.

Raises:
    ImportError: on import, if neither ``lightning`` nor ``pytorch_lightning`` is installed.
"""

from __future__ import annotations

from typing import Any

try:
    from lightning.pytorch import Callback
except ImportError:  # pragma: no cover - the older package name
    try:
        from pytorch_lightning import Callback
    except ImportError as err:
        raise ImportError(
            "dynascope.integrations.lightning needs lightning: pip install 'dynascope[lightning]'"
        ) from err

from torch import Tensor

from dynascope.integrations._records import (
    LastRecord,
    grouped_scalars,
    log_to_sinks,
    set_status,
)
from dynascope.monitor import Monitor

__all__ = ["MonitorCallback"]


def _as_batch(batch: Any) -> dict[str, Tensor] | None:
    if isinstance(batch, dict):
        return batch
    if isinstance(batch, Tensor):
        return {"x": batch}
    if isinstance(batch, tuple | list) and batch and isinstance(batch[0], Tensor):
        return {"x": batch[0]}
    return None


def _loss(outputs: Any) -> float | None:
    if isinstance(outputs, dict):
        outputs = outputs.get("loss")
    if isinstance(outputs, Tensor) and outputs.numel() == 1:
        return float(outputs.detach().double().cpu())
    return None


class MonitorCallback(Callback):
    """Calls ``monitor.step(t)`` at step 0 and after every optimizer update t; records the
    loss, learning rate and run status; forwards probe values to ``trainer.loggers``.

    Args:
        monitor: a :class:`dynascope.Monitor` over the model being trained.
        forward: also send the probe values to the trainer's loggers.
    """

    def __init__(self, monitor: Monitor, *, forward: bool = True) -> None:
        self.monitor = monitor
        self.forward = forward
        self._last = LastRecord()
        monitor.sinks.append(self._last)
        self._last_step = -1

    def _forward(self, trainer: Any) -> None:
        pending = self._last.take()
        if pending is None or not self.forward:
            return
        step, values = pending
        scalars = grouped_scalars(values)
        if scalars:
            for logger in trainer.loggers:
                logger.log_metrics(scalars, step=step)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        set_status(self.monitor, trainer.global_step, "running")
        if trainer.global_step == 0:
            self.monitor.step(0)
            self._forward(trainer)
            self._last_step = 0

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if step == self._last_step:  # an accumulation step: no optimizer update
            return
        self._last_step = step
        self.monitor.step(step, _as_batch(batch))
        self._forward(trainer)
        if step % max(trainer.log_every_n_steps, 1) == 0:
            own = {}
            loss = _loss(outputs)
            if loss is not None:
                own["train.loss"] = loss
            if trainer.optimizers:
                own["train.lr"] = float(trainer.optimizers[0].param_groups[0]["lr"])
            log_to_sinks(self.monitor, step, own)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        set_status(self.monitor, trainer.global_step, "finished")
        self.monitor.flush()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        interrupted = isinstance(exception, KeyboardInterrupt)
        set_status(self.monitor, trainer.global_step, "interrupted" if interrupted else "failed")
        self.monitor.flush()
