"""A ``transformers.TrainerCallback`` that runs a :class:`dynascope.Monitor`.

Example::

    from dynascope.integrations.huggingface import MonitorCallback

    monitor = ds.Monitor(model, probes=[ds.probes.QKSpectrum()], schedule=ds.LogSchedule(1000),
                         sink=ds.RunStore("runs/gpt2"))
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data,
                                   callbacks=[MonitorCallback(monitor)])

Step convention (the same as :class:`dynascope.train.Trainer`): step 0 is the model before
training (measured in ``on_train_begin``); step t is the state after t optimizer updates,
measured in ``on_optimizer_step``, which ``transformers.Trainer`` calls right after
``optimizer.step()`` and before ``model.zero_grad()``, so gradient probes still see the
gradients of that update (with gradient accumulation: once per update, with the accumulated
gradients). The sink is flushed at the end of training when it has a ``flush`` method.

Raises:
    ImportError: on import, if ``transformers`` is not installed (``pip install dynascope[hf]``).
"""

from __future__ import annotations

from typing import Any

try:
    from transformers import TrainerCallback
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "dynascope.integrations.huggingface needs transformers: pip install 'dynascope[hf]'"
    ) from err

from dynascope.monitor import Monitor

__all__ = ["MonitorCallback"]


class MonitorCallback(TrainerCallback):
    """Calls ``monitor.step(t)`` at step 0 and after every optimizer update t.

    Args:
        monitor: a :class:`dynascope.Monitor` over the (unwrapped) model being trained.
    """

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == 0:
            self.monitor.step(0)

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # global_step is incremented after this callback: this update is number global_step + 1
        self.monitor.step(state.global_step + 1)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.monitor.flush()
