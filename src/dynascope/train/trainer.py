"""Trainer: a registry :class:`~dynascope.config.RunConfig` trained into a run directory, a thin
call of :func:`~dynascope.train.runs.run_members` with
:func:`~dynascope.train.registry.build_registry` (what it trains: :mod:`.registry`).

Checkpoints every ``train.checkpoint_every`` steps and at the end hold everything that
changes, so a resumed run reproduces an uninterrupted run's metrics exactly on CPU (the engine
runs on ``train.threads`` intra-op threads, one by default: with more, some CPU kernels were
measured not to be bitwise reproducible run to run, docs/benchmarks.md). On CUDA, see the
README's "Runs and resuming" for what is and is not deterministic.

Interruptions, divergence, devices, bf16 and data parallelism under ``torchrun`` are the
engine's (:mod:`dynascope.train.engine`): SIGINT/SIGTERM finish the step, checkpoint and mark
the run ``interrupted`` (the CLI exits 130 or 143); a non-finite loss, parameter or
``val.loss`` marks it ``diverged`` with an event naming the tensor; under ``torchrun`` rank
``r`` draws batches from stream ``data/rank{r}`` and only rank 0 writes.
"""

from __future__ import annotations

import os
from pathlib import Path

from dynascope.config import RunConfig

from .engine import TrainResult
from .registry import build_registry
from .runs import run_members

__all__ = ["Trainer", "run_training"]


class Trainer:
    """Trains one :class:`~dynascope.config.RunConfig` into a run directory.

    Args:
        config: the validated run config.
        run_dir: the run directory (created if missing).
        progress: show a progress bar (rich) on the terminal.
        bf16: forward pass and loss under bf16 autocast (CUDA only).
    """

    def __init__(
        self,
        config: RunConfig,
        run_dir: str | os.PathLike[str],
        *,
        progress: bool = False,
        bf16: bool = False,
    ) -> None:
        self.config = config
        self.run_dir = Path(run_dir)
        self.progress = progress
        self.bf16 = bf16

    def run(self, *, resume: bool = False) -> TrainResult:
        """Train to ``train.steps`` (continuing from the last checkpoint when ``resume``).

        A fresh run (``resume=False``) into a directory that already holds a run starts it
        over when the configs are equal and is refused when they differ.

        Returns:
            :class:`~dynascope.train.engine.TrainResult` with status ``finished``,
            ``diverged`` or ``interrupted``.
        Raises:
            dynascope.config.ConfigError: ``device`` is ``cuda`` without CUDA, ``bf16`` on the
                CPU, the task rejects its arguments, or ``run_dir`` holds a different run
                (nothing is written).
            dynascope.store.RunLockedError: another live process writes to ``run_dir``.
        """
        return run_members(  # type: ignore[return-value]
            build_registry,
            self.config,
            self.run_dir,
            resume=resume,
            progress=self.progress,
            bf16=self.bf16,
        )


def run_training(
    config: RunConfig,
    run_dir: str | os.PathLike[str],
    *,
    progress: bool = False,
    resume: bool = False,
    bf16: bool = False,
) -> TrainResult:
    """Train ``config`` in ``run_dir`` (:class:`Trainer`)."""
    return Trainer(config, run_dir, progress=progress, bf16=bf16).run(resume=resume)
