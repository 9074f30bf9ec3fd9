"""Trainer: a :class:`~dynascope.config.RunConfig` (model, task, optimizer from the registry)
trained on the engine (:mod:`dynascope.train.engine`), which owns the loop.

Per step: a batch from the task's training split (drawn from the run's ``data`` stream), the
task's loss (+ the explicit L2 penalty when ``optimizer.mode="l2"``, logged as
``train.l2_penalty``), the engine's gradient step (clipping at ``optimizer.grad_clip``, the
schedule of ``optimizer.lr_schedule`` after ``optimizer.warmup_steps``), then the probes of
``monitor.probes`` on their schedule. The probe batch is fixed for the whole run (the first
validation batch), so input-dependent probes (attention entropy) compare the same inputs at
every step. Every ``train.log_every`` steps the mean training loss of the window is logged as
``train.loss`` (and ``train.lr``, the rate of the window's last update); every
``train.eval_every`` steps (and at the end) ``val.*`` metrics over ``train.eval_batches`` fixed
batches (drawn from the run's ``val`` stream, the same batches every time).

Checkpoints every ``train.checkpoint_every`` steps and at the end hold everything that
changes, so :meth:`Trainer.run` on a resumed run reproduces an uninterrupted run's metrics
exactly on CPU (the engine runs on ``train.threads`` intra-op threads, one by default: with more,
some CPU kernels were measured not to be bitwise reproducible run to run, docs/benchmarks.md).
On CUDA, see the README's "Runs and resuming" for what is and is not deterministic.

Interruptions, divergence, devices, bf16 and data parallelism under ``torchrun`` are the
engine's (:mod:`dynascope.train.engine`): SIGINT/SIGTERM finish the step, checkpoint and mark
the run ``interrupted`` (the CLI exits 130 or 143); a non-finite loss, parameter or
``val.loss`` marks it ``diverged`` with an event naming the tensor; under ``torchrun`` rank
``r`` draws batches from stream ``data/rank{r}`` and only rank 0 writes.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import Tensor

from dynascope.config import RunConfig, build_model, build_optimizer, build_task
from dynascope.monitor import EveryN, LogSchedule
from dynascope.optim import l2_penalty
from dynascope.probes import make_probe

from .engine import Engine, Loop, Member, Parts, TrainResult
from .schedule import LRSchedule
from .seeding import SeedStreams

__all__ = ["Trainer", "run_training"]


def loop_of(config: RunConfig) -> Loop:
    """The engine's :class:`Loop` for a run config."""
    opt, train = config.optimizer, config.train
    return Loop(
        steps=train.steps,
        log_every=train.log_every,
        eval_every=train.eval_every,
        checkpoint_every=train.checkpoint_every,
        keep_checkpoints=train.keep_checkpoints,
        grad_clip=opt.grad_clip,
        schedule=LRSchedule(kind=opt.lr_schedule, warmup_steps=opt.warmup_steps),
        threads=train.threads,
        device=config.device,
        dtype=config.dtype,
    )


class Trainer:
    """Trains one :class:`~dynascope.config.RunConfig` into a run directory.

    Args:
        config: the validated run config.
        run_dir: the run directory (created if missing).
        progress: show a progress bar (rich) on the terminal.
        bf16: forward pass and loss under bf16 autocast (CUDA only).
    Raises:
        dynascope.config.ConfigError: if the task rejects its arguments, ``device`` is
            ``cuda`` without CUDA, or ``bf16`` is asked for on the CPU.
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
        self.groups: list[dict] = []
        member = Member(Path(run_dir), config.seed, config.model_dump(mode="json"))
        self.engine = Engine(
            member, self._build, loop_of(config), progress=progress, bf16=bf16, name=config.name
        )
        self.model = self.engine.states[0].parts.model

    @property
    def run_dir(self) -> Path:
        return Path(self.engine.states[0].member.run_dir)

    @run_dir.setter
    def run_dir(self, path: str | os.PathLike[str]) -> None:
        state = self.engine.states[0]
        m = state.member
        state.member = Member(Path(path), m.seed, m.config, m.lr_scale, m.name)

    @property
    def dist(self):
        return self.engine.dist

    def _build(self, streams: SeedStreams) -> Parts:
        config = self.config
        self.streams = streams
        self.task = build_task(config.task)
        model = build_model(config.model, self.task)
        mon = config.monitor
        schedule = (
            EveryN(mon.every)
            if mon.schedule == "every"
            else LogSchedule(config.train.steps, mon.points)
        )
        batch_size = config.train.batch_size
        uses_l2 = config.optimizer.mode == "l2"
        return Parts(
            model=model,
            data=lambda g: self.task.batch("train", batch_size, g),
            loss=lambda m, batch: self.task.loss(m(batch["x"]), batch),
            optimizer=self._optimizer,
            evaluate=self._val_metrics,
            probes=[make_probe(name) for name in mon.probes] if self.engine_is_writer() else [],
            probe_schedule=schedule,
            probe_batch=self._probe_batch(),
            extra_loss=("l2_penalty", lambda: l2_penalty(self.groups)) if uses_l2 else None,
        )

    def engine_is_writer(self) -> bool:
        return os.environ.get("RANK", "0") == "0"

    def _optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        optimizer, self.groups = build_optimizer(self.config.optimizer, model)
        return optimizer

    def _val_batches(self):
        generator = self.streams.generator("val")
        for _ in range(self.config.train.eval_batches):
            yield self.task.batch("val", self.config.train.batch_size, generator)

    def _probe_batch(self) -> dict[str, Tensor]:
        """The first validation batch: the inputs every probe step sees."""
        return next(self._val_batches())

    def _val_metrics(self, model: torch.nn.Module) -> dict[str, float]:
        sums: dict[str, Tensor] = {}
        n = self.config.train.eval_batches
        for batch in self._val_batches():
            batch = self.engine._to_device(batch)
            output = model(batch["x"])
            values = {"loss": self.task.loss(output, batch), **self.task.metrics(output, batch)}
            for key, value in values.items():
                sums[key] = sums.get(key, 0.0) + value.detach().double()
        return {f"val.{k}": float(v / n) for k, v in sums.items()}

    def evaluate(self) -> dict[str, float]:
        """Mean loss and task metrics over ``train.eval_batches`` fixed validation batches."""
        return self.engine._evaluation(self.engine.states[0])

    def run(self, *, resume: bool = False) -> TrainResult:
        """Train to ``train.steps`` (continuing from the last checkpoint when ``resume``).

        A fresh run (``resume=False``) into a directory that already holds a run starts it
        over when the configs are equal and is refused when they differ.

        Returns:
            :class:`~dynascope.train.engine.TrainResult` with status ``finished``,
            ``diverged`` or ``interrupted``.
        Raises:
            dynascope.config.ConfigError: ``run_dir`` holds a different run (nothing is
                written).
            dynascope.store.RunLockedError: another live process writes to ``run_dir``.
        """
        return self.engine.run(resume=resume)[0]


def run_training(
    config: RunConfig,
    run_dir: str | os.PathLike[str],
    *,
    progress: bool = False,
    resume: bool = False,
    bf16: bool = False,
) -> TrainResult:
    """Build a :class:`Trainer` for ``config`` and run it in ``run_dir``."""
    return Trainer(config, run_dir, progress=progress, bf16=bf16).run(resume=resume)
