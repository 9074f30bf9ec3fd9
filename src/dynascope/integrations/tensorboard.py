"""TensorBoardSink: write a :class:`dynascope.Monitor`'s records to TensorBoard event files.

Example::

    from dynascope.integrations.tensorboard import TensorBoardSink

    with ds.RunStore("runs/mine") as store, TensorBoardSink("tb/mine") as tb:
        monitor = ds.Monitor(model, probes, ds.LogSchedule(10_000), sink=[store, tb])

Scalars (python numbers, one-element tensors) become scalar series; tensors with more elements
(spectra) become histograms of their values. Tags are grouped with ``/`` by
:func:`dynascope.keys.metric_path` (``L0.H1.qk.effective_rank`` is ``attn/L0/H1/qk_effective_rank``,
so TensorBoard shows one ``attn`` section instead of one flat tag per key); ``grouped=False``
keeps the dotted keys. NaN scalars are written as NaN. Uses
``torch.utils.tensorboard.SummaryWriter``.

Raises:
    ImportError: on construction, if ``tensorboard`` is not installed
        (``pip install 'dynascope[tensorboard]'``).
"""

from __future__ import annotations

import os

from torch import Tensor

from dynascope.keys import metric_path

__all__ = ["TensorBoardSink"]


class TensorBoardSink:
    """A sink (``log(step, values)``) that writes TensorBoard event files under ``log_dir``.

    Args:
        log_dir: the directory TensorBoard reads (created if missing).
        flush_secs: how often the writer flushes to disk, in seconds.
        grouped: tag each value with :func:`dynascope.keys.metric_path` of its key (else the
            key itself).
    """

    def __init__(
        self, log_dir: str | os.PathLike[str], *, flush_secs: int = 30, grouped: bool = True
    ) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise ImportError(
                "TensorBoardSink needs tensorboard: pip install 'dynascope[tensorboard]'"
            ) from err
        self.writer = SummaryWriter(log_dir=os.fspath(log_dir), flush_secs=flush_secs)
        self.grouped = grouped

    def log(self, step: int, values: dict[str, Tensor | float]) -> None:
        """Write one record: scalars as scalars, larger tensors as histograms."""
        for key, value in values.items():
            tag = metric_path(key) if self.grouped else key
            if isinstance(value, Tensor) and value.numel() != 1:
                self.writer.add_histogram(tag, value.detach().cpu().double(), step)
            else:
                scalar = float(value.detach().cpu()) if isinstance(value, Tensor) else float(value)
                self.writer.add_scalar(tag, scalar, step)

    def flush(self) -> None:
        """Write pending events to disk."""
        self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()

    def __enter__(self) -> TensorBoardSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
