"""What the callbacks and sinks share: grouped scalar records, the trainer's own metrics, status.

Glossary:
    record:   ``{key: value}`` as a :class:`dynascope.Monitor` hands it to its sinks.
    scalars:  a record's one-element values as python floats under grouped names
              (:func:`dynascope.keys.metric_path`); spectra (tensors of several elements) are
              left out, since the trainers' loggers take numbers only.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from dynascope.keys import metric_path
from dynascope.monitor import Monitor

__all__ = ["LastRecord", "grouped_scalars", "log_to_sinks", "set_status"]


def grouped_scalars(values: dict[str, Tensor | float]) -> dict[str, float]:
    """The one-element values of ``values`` as floats, keyed by :func:`metric_path`."""
    out = {}
    for key, value in values.items():
        if isinstance(value, Tensor):
            if value.numel() != 1:
                continue
            value = value.detach().double().cpu().item()
        out[metric_path(key)] = float(value)
    return out


class LastRecord:
    """A sink that keeps the monitor's latest record until :meth:`take` hands it over."""

    def __init__(self) -> None:
        self.pending: tuple[int, dict[str, Tensor | float]] | None = None

    def log(self, step: int, values: dict[str, Tensor | float]) -> None:
        self.pending = (step, dict(values))

    def take(self) -> tuple[int, dict[str, Tensor | float]] | None:
        pending, self.pending = self.pending, None
        return pending


def log_to_sinks(monitor: Monitor, step: int, values: dict[str, float]) -> None:
    """Log ``values`` (the trainer's own metrics) to the monitor's sinks, not to forwarders."""
    if values:
        for sink in monitor.sinks:
            if not isinstance(sink, LastRecord):
                sink.log(step, values)


def set_status(monitor: Monitor, step: int, status: str) -> None:
    """Record ``status`` in every sink that keeps one (a :class:`dynascope.RunStore`)."""
    for sink in monitor.sinks:
        setter: Any = getattr(sink, "set_status", None)
        if setter is not None:
            setter(step, status)
