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


class MonitorCallback(Callback):
    """Calls ``monitor.step(t)`` at step 0 and after every optimizer update t.

    Args:
        monitor: a :class:`dynascope.Monitor` over the model being trained.
    """

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor
        self._last_step = -1

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if trainer.global_step == 0:
            self.monitor.step(0)
            self._last_step = 0

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if step != self._last_step:  # an optimizer update happened (not an accumulation step)
            self._last_step = step
            self.monitor.step(step, _as_batch(batch))

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.monitor.flush()
