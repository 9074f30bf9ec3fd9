"""Trainer: the training loop of one run, with evaluation, monitoring, checkpoints and resume.

Step convention: step 0 is the initialisation (probes and evaluation run on it); step t is the
state after t optimizer updates. Every row in the store is keyed by that step.

Per step: a batch from the task's training split (drawn from the run's own
``torch.Generator``), the task's loss (+ the explicit L2 penalty when
``optimizer.mode="l2"``), backward, optional gradient clipping, the optimizer and learning-rate
schedule, then ``monitor.step(t, probe_batch)``. ``probe_batch`` is fixed for the whole run
(the first validation batch), so input-dependent probes (attention entropy) compare the same
inputs at every step. Every ``train.log_every`` steps the mean training loss of the
window is logged as ``train.loss`` (and ``train.l2_penalty``, ``train.lr``); every
``train.eval_every`` steps (and at the end) ``val.*`` metrics over ``train.eval_batches`` fixed
batches (the same batches every time: their generator is re-seeded from the run seed).
Checkpoints every ``train.checkpoint_every`` steps and at the end hold the model, optimizer,
schedule, the data generator's state, the RNG states (torch, Python ``random``, numpy) and the
loss accumulator, so :meth:`Trainer.run` on a resumed run reproduces an uninterrupted run's
metrics exactly on CPU with one intra-op thread (``torch.set_num_threads(1)``): same
``(step, key)`` rows, same values. With more threads some CPU kernels were measured not to be
bitwise reproducible run to run (docs/benchmarks.md), so equality is then up to rounding; on
CUDA, see the README's "Runs and resuming" for what is and is not deterministic.

Interruptions: on SIGINT or SIGTERM (when the Trainer runs in the main thread) the current step
finishes, a checkpoint is written, the run is marked ``interrupted`` and :meth:`Trainer.run`
returns with ``signal`` set (the CLI exits 130 or 143). A second signal interrupts at once
(``KeyboardInterrupt``); committed rows and the last checkpoint survive either way, and a
SIGKILL as well.

Devices: ``device`` in the config (``cpu`` or ``cuda``; the CLI's ``--device auto`` picks CUDA
when present). ``bf16=True`` runs the forward pass and loss under bf16 autocast on CUDA; the
weights, optimizer state, probes and evaluation stay in the config's ``dtype`` (float32 or
float64), so instruments never read bf16 values.

Data parallel: launched by ``torchrun --nproc_per_node N``, the Trainer joins the process group
(gloo on CPU, nccl on CUDA; ``dynascope/_ddp.py``), trains through ``DistributedDataParallel``
and gives probes and evaluation the unwrapped model. Rank r draws its batches from its own
generator (seed + r * 1_000_033), so the effective batch is N x ``train.batch_size``; the
logged ``train.loss`` is the mean over all ranks' batches. Only rank 0 writes the store (one
copy of each row) and the checkpoints; every rank loads rank 0's checkpoint on resume, each
taking back its own generator and RNG state. A signal seen by any rank stops all ranks at the
same step.

Divergence: a non-finite training loss (checked at logging steps), parameter (checked before
probes read them and before every checkpoint) or evaluation loss stops the run: an ``events``
row ``diverged`` names the tensor, the status becomes ``diverged``, the store is kept.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import signal
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from dynascope._ddp import DistContext, ReadOnlyStore
from dynascope.config import ConfigError, RunConfig, build_model, build_optimizer, build_task
from dynascope.monitor import EveryN, LogSchedule, Monitor
from dynascope.optim import l2_penalty
from dynascope.probes import make_probe
from dynascope.store import RunStore

__all__ = ["TrainResult", "Trainer", "run_training"]

_VAL_SEED_OFFSET = 1_000_003  # validation batches come from seed + this offset
_RANK_SEED_OFFSET = 1_000_033  # data-parallel rank r draws training batches from seed + r * this


@dataclass(frozen=True)
class TrainResult:
    """Outcome of :meth:`Trainer.run`.

    Attributes:
        status: ``finished``, ``diverged`` or ``interrupted``.
        step: the last step trained (for ``diverged``: where it was detected).
        final: the last evaluation's ``val.*`` metrics (empty if none ran).
        signal: ``"SIGINT"`` or ``"SIGTERM"`` for an interrupted run, else ``None``.
    """

    run_dir: Path
    status: str
    step: int
    final: dict[str, float]
    signal: str | None = None


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _lr_lambda(warmup_steps: int, total_steps: int, schedule: str):
    def factor(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "cosine":
            progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return 1.0

    return factor


class Trainer:
    """Trains one :class:`~dynascope.config.RunConfig` into a run directory.

    Args:
        config: the validated run config.
        run_dir: the run directory (created if missing).
        progress: show a progress bar (rich) on the terminal.
        bf16: forward pass and loss under bf16 autocast (CUDA only; module docstring).
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
        self.run_dir = Path(run_dir)
        if config.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError(
                "device: cuda is not available here (no CUDA build of torch or no GPU); "
                "use device=cpu"
            )
        if bf16 and config.device != "cuda":
            raise ConfigError(f"bf16: autocast needs device=cuda (got device={config.device})")
        self.bf16 = bf16
        self.dist = DistContext.from_env(config.device)
        self.progress = progress and self.dist.is_writer
        cuda_index = self.dist.local_rank if self.dist.enabled else None
        self.device = torch.device(config.device, cuda_index if config.device == "cuda" else None)
        self.dtype = getattr(torch, config.dtype)

        _seed_everything(config.seed)  # every rank: the same initial weights
        self.task = build_task(config.task)
        self.model = build_model(config.model, self.task).to(self.device, self.dtype)
        self.train_model: torch.nn.Module = self.model  # what the loop calls (DDP wraps it)
        if self.dist.enabled:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if config.device == "cuda" else None
            self.train_model = DistributedDataParallel(self.model, device_ids=ids)
        opt = config.optimizer
        self.optimizer, self.groups = build_optimizer(opt, self.model)
        self.uses_l2 = opt.mode == "l2"
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, _lr_lambda(opt.warmup_steps, config.train.steps, opt.lr_schedule)
        )
        data_seed = (config.seed + self.dist.rank * _RANK_SEED_OFFSET) % 2**64
        self.generator = torch.Generator().manual_seed(data_seed)
        # probes run where the store is written (rank 0); their state travels from there
        names = config.monitor.probes if self.dist.is_writer else []
        self.probes = [make_probe(name) for name in names]
        mon = config.monitor
        self.schedule = (
            EveryN(mon.every)
            if mon.schedule == "every"
            else LogSchedule(config.train.steps, mon.points)
        )
        self._loss_sum = torch.zeros((), dtype=torch.float64)
        self._loss_count = 0
        self._step = 0  # the step being trained (for an interrupt's record)

    # -- pieces -----------------------------------------------------------------------------
    def _to_device(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        out = {}
        for key, value in batch.items():
            if value.is_floating_point():
                value = value.to(self.dtype)
            out[key] = value.to(self.device, non_blocking=True)
        return out

    def evaluate(self) -> dict[str, float]:
        """Mean loss and task metrics over ``train.eval_batches`` fixed validation batches."""
        generator = torch.Generator().manual_seed(self.config.seed + _VAL_SEED_OFFSET)
        was_training = self.model.training
        self.model.eval()
        sums: dict[str, Tensor] = {}
        n = self.config.train.eval_batches
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            for _ in range(n):
                batch = self._to_device(
                    self.task.batch("val", self.config.train.batch_size, generator)
                )
                output = self.model(batch["x"])
                values = {"loss": self.task.loss(output, batch), **self.task.metrics(output, batch)}
                for key, value in values.items():
                    sums[key] = sums.get(key, 0.0) + value.detach().double()
        self.model.train(was_training)
        return {f"val.{k}": float(v / n) for k, v in sums.items()}

    def _probe_batch(self) -> dict[str, Tensor]:
        """The first validation batch: the inputs every probe step sees (no RNG consumed)."""
        generator = torch.Generator().manual_seed(self.config.seed + _VAL_SEED_OFFSET)
        return self._to_device(self.task.batch("val", self.config.train.batch_size, generator))

    def _state(self, step: int) -> dict:
        """Everything a resume needs; in DDP a collective (each rank's data and RNG state)."""
        ranks = self.dist.gather(
            {"generator": self.generator.get_state(), "torch_rng": torch.get_rng_state()}
        )
        return {
            "step": step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "generator": self.generator.get_state(),
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
            "numpy_rng": _numpy_rng_state(),
            "probes": [probe.state_dict() for probe in self.probes],
            "loss_sum": self._loss_sum.detach().cpu().clone(),
            "loss_count": self._loss_count,
            **({"ranks": ranks} if self.dist.enabled else {}),
        }

    def _load_state(self, state: dict) -> int:
        try:
            return self._restore(state)
        except (KeyError, RuntimeError, ValueError, TypeError) as err:
            raise ConfigError(
                f"checkpoint: does not fit this run's config (got {type(err).__name__}: "
                f"{str(err).splitlines()[0][:120]}); was config.yaml or the checkpoint replaced?"
            ) from None

    def _restore(self, state: dict) -> int:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        ranks = state.get("ranks") or []
        own = ranks[self.dist.rank] if len(ranks) == self.dist.world_size else state
        self.generator.set_state(own["generator"])
        torch.set_rng_state(own["torch_rng"])
        random.setstate(_as_tuples(state["python_rng"]))
        _set_numpy_rng_state(state["numpy_rng"])
        for probe, probe_state in zip(self.probes, state.get("probes", []), strict=False):
            probe.load_state_dict(probe_state)
        self._loss_sum = state["loss_sum"].clone()
        self._loss_count = int(state["loss_count"])
        return int(state["step"])

    def _checkpoint(self, store: RunStore, step: int) -> None:
        state = self._state(step)  # every rank takes part (DDP gathers each rank's state)
        written = store.checkpoints() and store.checkpoints()[-1][0] == step
        if self.dist.is_writer and not written:  # not twice (an interrupt after a checkpoint)
            store.save_checkpoint(step, state)
            for _, old in store.checkpoints()[: -self.config.train.keep_checkpoints]:
                old.unlink(missing_ok=True)
        self.dist.barrier()  # no rank reads a checkpoint before rank 0 has written it

    # -- the loop ---------------------------------------------------------------------------
    def run(self, *, resume: bool = False) -> TrainResult:
        """Train to ``train.steps`` (continuing from the last checkpoint when ``resume``).

        A fresh run (``resume=False``) into a directory that already holds a run starts it
        over when the configs are equal and is refused when they differ.

        Returns:
            :class:`TrainResult` with status ``finished``, ``diverged`` or ``interrupted``.
        Raises:
            dynascope.config.ConfigError: ``run_dir`` holds a different run (nothing is
                written).
            dynascope.store.RunLockedError: another live process writes to ``run_dir``.
        """
        if not resume:
            self._refuse_different_run()
        writer = self.dist.is_writer
        store_cm = RunStore(self.run_dir, lock=True) if writer else ReadOnlyStore(self.run_dir)
        try:
            with store_cm as store, _StopSignals() as stop:
                try:
                    return self._loop(store, stop, resume)
                except KeyboardInterrupt:  # a second signal: stop now, but say so in the store
                    step = self._step
                    store.event(step, "interrupted", "SIGINT (at once, no checkpoint at this step)")
                    store.set_status(step, "interrupted")
                    raise
        finally:
            self.dist.close()

    def _refuse_different_run(self) -> None:
        existing = self.run_dir / "config.yaml"
        if not existing.is_file():
            return
        import yaml

        if yaml.safe_load(existing.read_text()) != self.config.model_dump(mode="json"):
            raise ConfigError(
                f"run_dir: {str(self.run_dir)!r} already holds a different run; choose another "
                "directory or resume that run"
            )

    def _loop(self, store: RunStore, stop: _StopSignals, resume: bool) -> TrainResult:
        cfg = self.config.train
        start = 0
        if resume and store.checkpoints():
            step, path = store.checkpoints()[-1]
            start = self._load_state(store.load_checkpoint(path))
            store.truncate_after(start)
            store.event(start, "resumed", f"from checkpoint step {start}")
        else:
            store.truncate_after(-1)
            store.write_config(self.config.model_dump(mode="json"))
        store.set_status(start, "running")
        # the unwrapped model; the task's loss for probes of the loss landscape (sharpness)
        monitor = Monitor(self.model, self.probes, self.schedule, store, loss=self.task.loss)
        probe_batch = self._probe_batch()
        self.model.train()
        final: dict[str, float] = {}
        if start == 0:
            monitor.step(0, probe_batch)
            final = self.evaluate()
            store.log(0, final)
        elif start == cfg.steps:  # resuming a finished run: report its final metrics
            final = self.evaluate()
        bar = _progress(self.progress, self.config.name, cfg.steps, start)
        try:
            for step in range(start + 1, cfg.steps + 1):
                self._step = step
                batch = self._to_device(self.task.batch("train", cfg.batch_size, self.generator))
                with self._autocast():
                    output = self.train_model(batch["x"])
                    loss = self.task.loss(output, batch)
                total = loss + l2_penalty(self.groups).to(loss) if self.uses_l2 else loss
                self.optimizer.zero_grad(set_to_none=True)
                total.backward()
                if self.config.optimizer.grad_clip is not None:
                    torch.nn.utils.clip_grad_norm_(
                        self.model.parameters(), self.config.optimizer.grad_clip
                    )
                self.optimizer.step()
                self.scheduler.step()
                # accumulate on the loss's device: no host sync except at logging steps
                self._loss_sum = self._loss_sum.to(loss.device) + loss.detach().double()
                self._loss_count += 1

                if step % cfg.log_every == 0 or step == cfg.steps:
                    total, count = self.dist.all_sum([float(self._loss_sum), self._loss_count])
                    mean_loss = total / count  # over every rank's batches
                    self._loss_sum.zero_()
                    self._loss_count = 0
                    if not math.isfinite(mean_loss):
                        return self._diverged(store, step, "train.loss")
                    row = {"train.loss": mean_loss, "train.lr": self.scheduler.get_last_lr()[0]}
                    if self.uses_l2:
                        row["train.l2_penalty"] = float(l2_penalty(self.groups).detach())
                    store.log(step, row)
                    if bar is not None:
                        bar[0].update(bar[1], completed=step, loss=mean_loss)
                if self.schedule.due(step):  # probes must not read non-finite weights
                    bad = self._non_finite(loss)
                    if bad is not None:
                        return self._diverged(store, step, bad)
                monitor.step(step, probe_batch)
                if step % cfg.eval_every == 0 or step == cfg.steps:
                    final = self.evaluate()
                    if not math.isfinite(final["val.loss"]):
                        return self._diverged(store, step, "val.loss")
                    store.log(step, final)
                stopped = self.dist.any(stop.signal is not None)  # all ranks stop together
                signal_name = stop.signal or "SIGTERM"  # another rank's signal
                if step % cfg.checkpoint_every == 0 or step == cfg.steps or stopped:
                    bad = self._non_finite(loss)  # never checkpoint non-finite weights
                    if bad is not None:
                        return self._diverged(store, step, bad)
                    self._checkpoint(store, step)
                if stopped and step < cfg.steps:
                    store.event(step, "interrupted", signal_name)
                    store.set_status(step, "interrupted")
                    return TrainResult(self.run_dir, "interrupted", step, final, signal_name)
        finally:
            if bar is not None:
                bar[0].stop()
        store.set_status(cfg.steps, "finished")
        return TrainResult(self.run_dir, "finished", cfg.steps, final)

    def _autocast(self) -> contextlib.AbstractContextManager:
        if not self.bf16:
            return contextlib.nullcontext()
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)

    def _non_finite(self, loss: Tensor) -> str | None:
        """Name of the first non-finite tensor among the loss and the parameters, or None."""
        if not torch.isfinite(loss).all():
            return "train.loss"
        for name, param in self.model.named_parameters():
            if not torch.isfinite(param).all():
                return f"parameter {name}"
        return None

    def _diverged(self, store: RunStore, step: int, what: str) -> TrainResult:
        store.event(step, "diverged", f"{what} is not finite")
        store.set_status(step, "diverged")
        return TrainResult(self.run_dir, "diverged", step, {})


class _StopSignals:
    """Within ``with``: the first SIGINT/SIGTERM only sets :attr:`signal`; a second one
    interrupts at once (``KeyboardInterrupt``). Outside the main thread it does nothing."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: object) -> None:
        if self.signal is not None:
            raise KeyboardInterrupt
        self.signal = signal.Signals(signum).name

    def __enter__(self) -> _StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def _numpy_rng_state() -> dict:
    """numpy's global MT19937 state as plain data (loadable with ``weights_only=True``)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "name": name,
        "keys": torch.from_numpy(keys.astype(np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }


def _set_numpy_rng_state(state: dict) -> None:
    keys = state["keys"].numpy().astype(np.uint32)
    np.random.set_state(
        (state["name"], keys, state["pos"], state["has_gauss"], state["cached_gaussian"])
    )


def _as_tuples(value):
    """``random.setstate`` wants tuples; a checkpoint may hand back lists."""
    if isinstance(value, list | tuple):
        return tuple(_as_tuples(v) for v in value)
    return value


def _progress(enabled: bool, name: str, total: int, start: int):
    if not enabled:
        return None
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("loss {task.fields[loss]:.4f}"),
        TimeRemainingColumn(),
        transient=True,
    )
    task_id = progress.add_task(name, total=total, completed=start, loss=float("nan"))
    progress.start()
    return progress, task_id


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
