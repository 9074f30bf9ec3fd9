"""Monitor: run probes on a schedule during training and hand their records to a sink.

Three lines in any training loop::

    monitor = ds.Monitor(model, probes=[ds.probes.QKSpectrum()], schedule=ds.LogSchedule(10_000),
                         sink=ds.RunStore("runs/mine"))
    for step in range(10_000):
        ...; optimizer.step()
        monitor.step(step)

On a step with nothing due, :meth:`Monitor.step` costs one set lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import numpy as np
from torch import Tensor, nn

from dynascope.probes.base import Probe, ProbeContext

__all__ = ["EveryN", "LogSchedule", "Monitor", "Schedule", "Sink"]


class Schedule(Protocol):
    def due(self, step: int) -> bool: ...


class EveryN:
    """Due at step 0 and every ``every`` steps after it (and at ``also`` steps).

    Raises:
        ValueError: if ``every < 1``.
    """

    def __init__(self, every: int, *, also: Iterable[int] = ()) -> None:
        if every < 1:
            raise ValueError(f"schedule.every must be >= 1 (got {every})")
        self.every = every
        self.also = frozenset(also)

    def due(self, step: int) -> bool:
        return step % self.every == 0 or step in self.also

    def __repr__(self) -> str:
        return f"EveryN({self.every})"


class LogSchedule:
    """Due at ``num`` log-spaced steps between ``start`` and ``stop`` (inclusive), deduplicated,
    plus step 0.

    Args:
        stop: last step (inclusive).
        num: number of log-spaced points before deduplication.
        start: first non-zero step (>= 1).
    Raises:
        ValueError: if ``stop < start`` or ``num < 1`` or ``start < 1``.
    """

    def __init__(self, stop: int, num: int = 50, *, start: int = 1) -> None:
        if start < 1 or stop < start or num < 1:
            raise ValueError(
                f"schedule needs 1 <= start <= stop and num >= 1 "
                f"(got start={start}, stop={stop}, num={num})"
            )
        points = np.unique(np.round(np.geomspace(start, stop, num)).astype(np.int64))
        self.steps = frozenset([0, *points.tolist()])

    def due(self, step: int) -> bool:
        return step in self.steps

    def __repr__(self) -> str:
        return f"LogSchedule({len(self.steps)} steps up to {max(self.steps)})"


class Sink(Protocol):
    def log(self, step: int, values: dict[str, Tensor | float]) -> None: ...


class Monitor:
    """Runs ``probes`` on ``model`` at the steps ``schedule`` marks as due; records go to ``sink``.

    Args:
        model: the model the probes read (pass the unwrapped module under DDP).
        probes: probe instances; their keys must not collide (:meth:`step` raises if they do).
        schedule: an :class:`EveryN`, :class:`LogSchedule` or anything with ``due(step)``.
        sink: anything with ``log(step, dict)``, e.g. :class:`dynascope.RunStore` or
            :class:`dynascope.integrations.tensorboard.TensorBoardSink`, or a sequence of them
            (each gets every record).
        loss: the training loss ``loss(model, batch) -> loss | (loss, metrics)`` (the
            engine's ``Parts.loss``), handed to the probes that measure the loss landscape
            (:class:`dynascope.probes.Sharpness`) as ``ProbeContext.loss``; ``None`` if unknown.
    """

    def __init__(
        self,
        model: nn.Module,
        probes: Sequence[Probe],
        schedule: Schedule,
        sink: Sink | Sequence[Sink],
        *,
        loss: Callable[[nn.Module, dict[str, Tensor]], Any] | None = None,
    ) -> None:
        self.model = model
        self.probes = list(probes)
        self.schedule = schedule
        self.sinks: list[Sink] = list(sink) if isinstance(sink, Sequence) else [sink]
        self.loss = loss

    def step(self, step: int, batch: dict[str, Tensor] | None = None) -> bool:
        """Run the due probes for ``step``; returns whether anything ran.

        Raises:
            ValueError: if two probes emit the same key (the message names both probes and the
                key), before anything reaches a sink.
        """
        if not self.probes or not self.schedule.due(step):
            return False
        ctx = ProbeContext(step=step, batch=batch, loss=self.loss)
        record: dict[str, Tensor | float] = {}
        owner: dict[str, int] = {}  # key -> index of the probe that emitted it
        for i, probe in enumerate(self.probes):
            values = probe(self.model, ctx)
            for key in values:
                if key in owner:
                    j = owner[key]
                    raise ValueError(
                        f"probes[{j}] {self.probes[j]!r} and probes[{i}] {probe!r} both emit key "
                        f"{key!r} at step {step}, so one would overwrite the other; keep one of "
                        "them or log the other through its own Monitor and sink"
                    )
                owner[key] = i
            record.update(values)
        for sink in self.sinks:
            sink.log(step, record)
        return True

    def flush(self) -> None:
        """Flush every sink that can (``flush()``), e.g. commit a RunStore's buffered rows."""
        for sink in self.sinks:
            flush = getattr(sink, "flush", None)
            if flush is not None:
                flush()
