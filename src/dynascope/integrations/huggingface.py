"""A ``transformers.TrainerCallback`` that runs a :class:`dynascope.Monitor`.

Example::

    from dynascope.integrations.huggingface import MonitorCallback

    monitor = ds.Monitor(model, probes=[ds.probes.QKSpectrum()], schedule=ds.LogSchedule(1000),
                         sink=ds.RunStore("runs/gpt2"))
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    trainer.add_callback(MonitorCallback(monitor, trainer=trainer))

Step convention (the same as :class:`dynascope.train.Trainer`): step 0 is the model before
training (measured in ``on_train_begin``); step t is the state after t optimizer updates,
measured in ``on_optimizer_step``, which ``transformers.Trainer`` calls right after
``optimizer.step()`` and before ``model.zero_grad()``, so gradient probes still see the
gradients of that update (with gradient accumulation: once per update, with the accumulated
gradients).

What reaches the monitor's sinks besides the probes: the trainer's own logs at its logging
steps (``loss`` as ``train.loss``, ``learning_rate`` as ``train.lr``, ``grad_norm`` as
``train.grad_norm``, ``eval_X`` as ``val.X``, without the ``*_runtime`` and ``*_per_second``
timings), and the run status (``running`` when training begins, ``finished`` when it ends) in
sinks that keep one (:class:`dynascope.RunStore`). The sinks are flushed at the end.
``transformers.Trainer`` has no callback event for an exception, so a run that raises stays
``running`` (as a killed one does).

With ``trainer=`` the probe values also go to the trainer's own loggers (``report_to``:
TensorBoard, W&B, MLflow, ...) through their ``on_log``, one call per measured step (the
console printers are skipped, and ``state.log_history`` keeps the trainer's own logs), with
names grouped by :func:`dynascope.keys.metric_path` (``attn/L0/H3/qk_effective_rank``);
only one-element values are forwarded (spectra stay in the RunStore). The callback adds a
forwarding sink to ``monitor.sinks`` for this.

Raises:
    ImportError: on import, if ``transformers`` is not installed (``pip install dynascope[hf]``).
"""

from __future__ import annotations

import copy
from typing import Any

try:
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "dynascope.integrations.huggingface needs transformers: pip install 'dynascope[hf]'"
    ) from err

from dynascope.integrations._records import (
    LastRecord,
    grouped_scalars,
    log_to_sinks,
    set_status,
)
from dynascope.monitor import Monitor

__all__ = ["MonitorCallback", "trainer_metrics"]

_NAMES = {"loss": "train.loss", "learning_rate": "train.lr", "grad_norm": "train.grad_norm"}
_TIMINGS = ("_runtime", "_per_second")


def trainer_metrics(logs: dict[str, Any]) -> dict[str, float]:
    """The metrics of a ``transformers.Trainer`` log, under dynascope's names.

    ``loss`` -> ``train.loss``, ``learning_rate`` -> ``train.lr``, ``grad_norm`` ->
    ``train.grad_norm``, ``eval_X`` -> ``val.X`` (timings ``*_runtime``, ``*_per_second``
    left out); every other entry (``epoch``, the end-of-training summary) is left out.

    Args:
        logs: the dict ``Trainer.log`` hands to ``on_log``.
    Returns:
        name -> float.
    """
    out = {}
    for name, value in logs.items():
        if not isinstance(value, int | float) or isinstance(value, bool):
            continue
        if name in _NAMES:
            out[_NAMES[name]] = float(value)
        elif name.startswith("eval_") and not name.endswith(_TIMINGS):
            out["val." + name.removeprefix("eval_")] = float(value)
    return out


class MonitorCallback(TrainerCallback):
    """Calls ``monitor.step(t)`` at step 0 and after every optimizer update t; records the
    trainer's loss and learning rate and the run status; forwards probe values to ``report_to``.

    Args:
        monitor: a :class:`dynascope.Monitor` over the (unwrapped) model being trained.
        trainer: the ``transformers.Trainer`` whose loggers (``report_to``) also receive the
            probe values; ``None`` keeps them in the monitor's sinks only.
    """

    def __init__(self, monitor: Monitor, *, trainer: Any = None) -> None:
        self.monitor = monitor
        self.trainer = trainer
        self._last = LastRecord()
        monitor.sinks.append(self._last)

    def _forward(self, args: Any, state: Any, control: Any) -> None:
        pending = self._last.take()
        if pending is None or self.trainer is None:
            return
        scalars = grouped_scalars(pending[1])
        if not scalars:
            return
        # Straight to the loggers' on_log (what Trainer.log would call), skipping the console
        # printers (dozens of probe values per step would flood it) and this callback; the
        # trainer's own decision to log its loss at this step (control.should_log) is kept.
        handler = copy.copy(self.trainer.callback_handler)
        handler.callbacks = [
            cb
            for cb in handler.callbacks
            if not isinstance(cb, (PrinterCallback, ProgressCallback, MonitorCallback))
        ]
        should_log = control.should_log
        handler.call_event("on_log", args, state, control, logs=scalars)
        control.should_log = should_log

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        set_status(self.monitor, state.global_step, "running")
        if state.global_step == 0:
            self.monitor.step(0)
            self._forward(args, state, control)

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # global_step is incremented after this callback: this update is number global_step + 1
        self.monitor.step(state.global_step + 1)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # now state.global_step is the update the record belongs to
        self._forward(args, state, control)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any
    ) -> None:
        log_to_sinks(self.monitor, state.global_step, trainer_metrics(logs or {}))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        set_status(self.monitor, state.global_step, "finished")
        self.monitor.flush()
