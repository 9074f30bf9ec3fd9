"""A registry :class:`~dynascope.config.RunConfig` (model, task, optimizer and probes named in
:mod:`dynascope.config`) as the engine's :class:`~dynascope.train.engine.Parts`.

Per step: a batch from the task's training split (drawn from the run's ``data`` stream), the
task's loss (+ the explicit L2 penalty when ``optimizer.mode="l2"``, logged as
``train.l2_penalty``), the engine's gradient step (clipping at ``optimizer.grad_clip``, the
schedule of ``optimizer.lr_schedule`` after ``optimizer.warmup_steps``), then the probes of
``monitor.probes`` on their schedule. The probe batch is fixed for the whole run (the first
validation batch), so input-dependent probes (attention entropy) compare the same inputs at
every step. Every ``train.log_every`` steps the mean training loss of the window is logged as
``train.loss`` (and ``train.lr``); every ``train.eval_every`` steps (and at the end) ``val.*``
metrics over ``train.eval_batches`` fixed batches (drawn from the run's ``val`` stream, the
same batches every time).

A registry run trains like any other run: ``run_members(build_registry, config, run_dir)``
(:mod:`dynascope.train.runs`), seeded by ``config.seed`` on the loop :func:`loop_of` gives.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor, nn

from dynascope.config import RunConfig, build_model, build_optimizer, build_task
from dynascope.monitor import EveryN, LogSchedule
from dynascope.optim import l2_penalty
from dynascope.probes import make_probe

from .engine import Loop, Parts
from .schedule import LRSchedule
from .seeding import SeedStreams

__all__ = ["build_registry", "loop_of"]


def loop_of(config: RunConfig) -> Loop:
    """The engine's :class:`~dynascope.train.engine.Loop` for a registry run config."""
    opt, train = config.optimizer, config.train
    return Loop(
        steps=train.steps,
        log_every=train.log_every,
        eval_every=train.eval_every,
        checkpoint_every=train.checkpoint_every,
        keep_checkpoints=train.keep_checkpoints,
        checkpoint_history=train.checkpoint_history,
        checkpoint_budget_mb=train.checkpoint_budget_mb,
        grad_clip=opt.grad_clip,
        schedule=LRSchedule(kind=opt.lr_schedule, warmup_steps=opt.warmup_steps),
        threads=train.threads,
        device=config.device,
        dtype=config.dtype,
    )


def build_registry(config: RunConfig, streams: SeedStreams) -> Parts:
    """Model, task, optimizer groups and probes of a registry run config (module docstring).

    Under ``torchrun`` only rank 0 (the writer) runs probes.

    Args:
        config: the validated run config.
        streams: the run's seed streams (``val``: the fixed validation batches).
    Returns:
        The run's :class:`~dynascope.train.engine.Parts`.
    Raises:
        dynascope.config.ConfigError: if the task rejects its arguments.
    """
    task = build_task(config.task)
    model = build_model(config.model, task)
    size, mon = config.train.batch_size, config.monitor
    val = streams.generator("val")
    val_batches = [task.batch("val", size, val) for _ in range(config.train.eval_batches)]
    groups: list[dict] = []

    def optimizer(m: nn.Module) -> torch.optim.Optimizer:
        built, groups[:] = build_optimizer(config.optimizer, m)
        return built

    def evaluate(m: nn.Module) -> dict[str, float]:
        sums: dict[str, Tensor] = {}
        p = next(m.parameters())
        for batch in val_batches:
            batch = {
                k: v.to(p.device, p.dtype) if v.is_floating_point() else v.to(p.device)
                for k, v in batch.items()
            }
            output = m(batch["x"])
            values = {"loss": task.loss(output, batch), **task.metrics(output, batch)}
            for key, value in values.items():
                sums[key] = sums.get(key, 0.0) + value.detach().double()
        return {f"val.{k}": float(v / len(val_batches)) for k, v in sums.items()}

    steps = config.train.steps
    schedule = EveryN(mon.every) if mon.schedule == "every" else LogSchedule(steps, mon.points)
    is_writer = os.environ.get("RANK", "0") == "0"
    uses_l2 = config.optimizer.mode == "l2"
    return Parts(
        model=model,
        data=lambda g: task.batch("train", size, g),
        loss=lambda m, batch: task.loss(m(batch["x"]), batch),
        optimizer=optimizer,
        evaluate=evaluate,
        probes=[make_probe(name) for name in mon.probes] if is_writer else [],
        probe_schedule=schedule,
        probe_batch=val_batches[0] if val_batches else None,
        extra_loss=("l2_penalty", lambda: l2_penalty(groups)) if uses_l2 else None,
    )
