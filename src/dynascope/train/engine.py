"""The engine: the one training loop of dynascope, for a lone run or an ensemble of K members.

A caller (the :class:`~dynascope.train.Trainer`, a study's runner, a user) supplies **what**
is trained, through a ``build(streams) -> Parts`` function, and **how long**, through a
:class:`Loop`; the engine owns everything around the step, once:

- seeding from named streams (:mod:`dynascope.train.seeding`): the global RNGs are seeded from
  stream ``init`` before ``build`` runs, batches are drawn from a generator on stream ``data``,
  a custom step gets its own generator on stream ``step``;
- device and dtype (floating batch tensors are cast to the run's dtype and moved), the thread
  policy (:func:`~dynascope.train._runtime.torch_threads`, one thread by default), the heap
  policy (:func:`~dynascope.train._runtime.keep_freed_heap`: freed blocks are reused, not
  returned to the kernel each step);
- the learning-rate schedule (:mod:`dynascope.train.schedule`) applied to every parameter
  group's base rate, gradient clipping, bf16 autocast on CUDA;
- evaluation, probes (a :class:`~dynascope.monitor.Monitor` per member), logging of the mean
  training loss and of the step's own metrics over each ``log_every`` window;
- divergence (a non-finite loss, parameter or ``val.loss``: event ``diverged`` naming the
  tensor, status ``diverged``; in an ensemble only that member stops, frozen, the others go
  on);
- checkpoints of everything that changes (model, optimizer, every RNG, the data and step
  generators, probe state, the custom step's own state, the loss window) and exact resume;
  the latest ones and a history at step 0 and every power of two, under a disk budget
  (:mod:`dynascope.train._checkpoints`);
- the run lock, SIGINT/SIGTERM (the step finishes, a checkpoint is written, status
  ``interrupted``), the progress bar, and data parallelism under ``torchrun`` (lone runs).

Step convention: step 0 is the initialisation (probes and evaluation run on it); step ``t`` is
the state after ``t`` updates. Every row in a store is keyed by that step.

**Steps.** ``Parts.loss(model, batch)`` returns the scalar loss (or ``(loss, metrics)``) and
the engine makes the gradient step (zero_grad, backward, clip, schedule, ``optimizer.step``).
A step that makes its own update (closed-form gradient descent, evolution strategies, a
functional update of a parameter dict) is a ``Parts.step(model, batch, ctx)`` instead
(:class:`StepContext`); it returns the same ``loss`` or ``(loss, metrics)``, and its
``state_dict``/``load_state_dict``, when it has them, travel in the checkpoint.

**Ensembles.** :class:`Engine` with K > 1 members (:class:`Member`: a run directory, a seed,
the config that run's ``config.yaml`` holds, a learning-rate scale) trains K models of the same
architecture as one: their parameters stacked ``[K, ...]`` (``torch.func.stack_module_state``),
the loss vectorized over members (``torch.func.vmap`` over ``functional_call``; dense-layer
models: batched layers, :mod:`~dynascope.train.ensemble`), one optimizer
over the stacked tensors. Every optimizer dynascope uses (SGD with momentum, Adam, AdamW) is
elementwise, so one step on the stack is K independent steps; gradient clipping is per member
(each member's global norm, as ``clip_grad_norm_``), a member's ``lr_scale`` multiplies its
update, and each member draws its own batches from its own seed. Each member keeps its own run
directory, store, checkpoints (its slice of the stack, in a lone run's format: a member's run
resumes alone, too) and probes (run on that member's own module, synchronised from the stack
when due). Members equal K lone runs: to 1e-12 in float64; in float32 to rounding (batched
matrix products sum in another order). Requirements: the loss draws no global random numbers
(no dropout) and updates no buffers (no BatchNorm in training mode).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor, nn

from dynascope.config import ConfigError
from dynascope.monitor import EveryN, Monitor, Schedule
from dynascope.store import RunStore

from ._checkpoints import MIB, is_history_step, kept_steps
from ._ddp import DistContext, ReadOnlyStore
from ._runtime import (
    StopSignals,
    global_rng_state,
    keep_freed_heap,
    progress_bar,
    set_global_rng_state,
    torch_threads,
)
from .ensemble import Stack
from .schedule import LRSchedule
from .seeding import SeedStreams, seed_everything

__all__ = [
    "Engine",
    "Loop",
    "Member",
    "Parts",
    "StepContext",
    "TrainResult",
]

Batch = Mapping[str, Tensor]
StepOutput = Tensor | tuple[Tensor, Mapping[str, Tensor]]


class Loop(BaseModel):
    """How long and how often: the engine's own settings for one run (or ensemble).

    Raises:
        pydantic.ValidationError: for a value outside its range (one line per field).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: int = Field(gt=0, description="optimizer updates")
    log_every: int = Field(10, ge=1, description="steps between train.* rows (and the last)")
    eval_every: int | None = Field(
        None, ge=1, description="steps between evaluations; None: at step 0 and the end only"
    )
    probe_every: int | None = Field(
        None, ge=1, description="steps between probes when no probe schedule is given"
    )
    checkpoint_every: int = Field(1000, ge=1, description="steps between checkpoints")
    keep_checkpoints: int = Field(2, ge=1, description="latest checkpoints kept (for resume)")
    checkpoint_history: Literal["log", "none"] = Field(
        "log", description="log: also keep checkpoints at step 0 and every power of two"
    )
    checkpoint_budget_mb: float | None = Field(
        1024.0, ge=0, description="MiB the history may take per run directory; None: no limit"
    )
    grad_clip: float | None = Field(None, gt=0, description="max global grad norm per member")
    schedule: LRSchedule = LRSchedule()
    threads: int | None = Field(1, ge=1, description="torch intra-op threads; None: leave")
    device: str = Field("cpu", pattern=r"^(cpu|cuda(:\d+)?)$")
    dtype: str = Field("float32", pattern=r"^(float32|float64)$")


@dataclass
class StepContext:
    """What a custom step gets besides the model and batch.

    Attributes:
        step: the step being made (1-based: the state after it is step ``step``).
        lr_factor: the schedule's factor for this update (multiply your base rate by it).
        generator: the run's ``step`` stream generator (checkpointed with the run).
        optimizer: the optimizer from ``Parts.optimizer`` (``None`` if there is none).
    """

    step: int
    lr_factor: float
    generator: torch.Generator
    optimizer: torch.optim.Optimizer | None


class CustomStep(Protocol):
    """A step that makes its own update; optional ``state_dict``/``load_state_dict``."""

    def __call__(self, model: nn.Module, batch: Batch, ctx: StepContext) -> StepOutput: ...


@dataclass
class Parts:
    """What one member trains, built by ``build(streams)`` after the engine seeded ``init``.

    Attributes:
        model: the module trained (moved to the run's device and dtype by the engine).
        data: ``data(generator) -> batch`` drawn each step from the ``data`` stream, or a fixed
            batch (a mapping of tensors: full-batch training).
        loss: ``loss(model, batch) -> loss | (loss, metrics)``; the engine makes the
            gradient step. Exactly one of ``loss`` and ``step``.
        step: a :class:`CustomStep` that updates the model itself.
        optimizer: ``optimizer(model) -> torch.optim.Optimizer`` (required with ``loss``).
            Each group's ``lr`` at build time is its base rate for the schedule.
        evaluate: ``evaluate(model) -> {key: value}`` at step 0, every ``eval_every`` steps and
            the end, in eval mode under ``no_grad`` (the mode is restored). A ``val.loss`` key
            that is not finite stops the run as diverged.
        probes: callables ``probe(model, ctx) -> {key: value}`` (a
            :class:`~dynascope.probes.Probe`, or a plain function) run by a Monitor, each
            alone or as ``(probe, schedule)`` with a schedule of its own.
        probe_schedule: when probes without their own schedule run (default: every
            ``loop.probe_every`` steps, or at step 0 and the end).
        probe_batch: the batch every probe step sees (``ctx.batch``).
        extra_loss: added to the loss before backward and not logged in ``train.loss``
            (an explicit L2 penalty); logged as ``train.<name>`` at log steps.
        log: ``log(model, step) -> {key: value}`` extra rows at log steps (lone runs).
    """

    model: nn.Module
    data: Callable[[torch.Generator], Batch] | Batch
    loss: Callable[[nn.Module, Batch], StepOutput] | None = None
    step: CustomStep | None = None
    optimizer: Callable[[nn.Module], torch.optim.Optimizer] | None = None
    evaluate: Callable[[nn.Module], Mapping[str, Any]] | None = None
    probes: Sequence[Callable[..., Mapping[str, Any]]] = ()
    probe_schedule: Schedule | None = None
    probe_batch: Batch | None = None
    extra_loss: tuple[str, Callable[[], Tensor]] | None = None
    log: Callable[[nn.Module, int], Mapping[str, Any]] | None = None


@dataclass(frozen=True)
class Member:
    """One member of a run: where it writes, its seed, its ``config.yaml`` and its LR scale."""

    run_dir: Path
    seed: int
    config: dict[str, Any]
    lr_scale: float = 1.0
    name: str = ""


@dataclass(frozen=True)
class TrainResult:
    """Outcome of one member's run.

    Attributes:
        run_dir: the member's run directory.
        status: ``finished``, ``diverged`` or ``interrupted``.
        step: the last step trained (for ``diverged``: where it was detected).
        final: the last evaluation's metrics (empty if none ran).
        signal: ``"SIGINT"`` or ``"SIGTERM"`` for an interrupted run, else ``None``.
    """

    run_dir: Path
    status: str
    step: int
    final: dict[str, float]
    signal: str | None = None


@dataclass
class _MemberState:
    member: Member
    parts: Parts
    store: Any = None
    monitor: _Monitors | None = None
    data_gen: torch.Generator | None = None
    step_gen: torch.Generator | None = None
    loss_sum: Tensor = field(default_factory=lambda: torch.zeros((), dtype=torch.float64))
    loss_count: int = 0
    metric_sums: dict[str, Tensor] = field(default_factory=dict)
    status: str = "running"
    stopped_at: int = 0
    final: dict[str, float] = field(default_factory=dict)


class Engine:
    """Trains one run, or an ensemble of runs, on the loop (module docstring).

    Args:
        members: one :class:`Member` (a lone run) or K of them (an ensemble).
        build: ``build(streams) -> Parts``, called once per member, in the order of
            ``members``, with that member's :class:`~dynascope.train.seeding.SeedStreams` after
            the global RNGs were seeded from its ``init`` stream.
        loop: steps, schedules, clipping, threads, device and dtype.
        progress: show a progress bar on the terminal.
        bf16: loss under bf16 autocast (CUDA only); weights, probes and evaluation stay in
            ``loop.dtype``.
        name: the progress bar's label.
    Raises:
        dynascope.config.ConfigError: ``cuda`` without CUDA, bf16 on the CPU, a ``Parts``
            without exactly one of ``loss``/``step`` (or ``loss`` without ``optimizer``), an
            ensemble of a custom step or under ``torchrun``, members whose models differ in
            parameter names or shapes, or two members sharing a run directory.
    """

    def __init__(
        self,
        members: Member | Sequence[Member],
        build: Callable[[SeedStreams], Parts],
        loop: Loop,
        *,
        progress: bool = False,
        bf16: bool = False,
        name: str = "run",
    ) -> None:
        members = [members] if isinstance(members, Member) else list(members)
        if not members:
            raise ConfigError("members: at least one member is needed (got none)")
        dirs = [Path(m.run_dir).resolve() for m in members]
        if len(set(dirs)) != len(dirs):
            raise ConfigError("members: two members share a run directory")
        if loop.device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(
                "device: cuda is not available here (no CUDA build of torch or no GPU); "
                "use device=cpu"
            )
        if bf16 and not loop.device.startswith("cuda"):
            raise ConfigError(f"bf16: autocast needs device=cuda (got device={loop.device})")
        self.loop = loop
        self.bf16 = bf16
        self.name = name
        self.dtype = getattr(torch, loop.dtype)
        self.dist = DistContext.from_env(loop.device.split(":")[0])
        if self.dist.enabled and len(members) > 1:
            raise ConfigError("members: ensembles do not run under torchrun (one member only)")
        self.progress = progress and self.dist.is_writer
        index = self.dist.local_rank if self.dist.enabled and loop.device == "cuda" else None
        self.device = (
            torch.device(loop.device, index) if index is not None else torch.device(loop.device)
        )
        keep_freed_heap()
        with torch_threads(loop.threads):
            self.states = [self._build_member(m, build) for m in members]
        self._check_parts()
        self.ensemble = len(self.states) > 1
        first = self.states[0].parts
        self.optimizer: torch.optim.Optimizer | None = None
        self.stack: Stack | None = None
        if self.ensemble:
            self.stack = Stack(
                [s.parts.model for s in self.states],
                [s.parts.optimizer for s in self.states],  # type: ignore[misc]
                [s.member.lr_scale for s in self.states],
            )
            self.optimizer = self.stack.optimizer
        elif first.optimizer is not None:
            self.optimizer = first.optimizer(first.model)
        self.base_lrs = [g["lr"] for g in self.optimizer.param_groups] if self.optimizer else []
        self.train_model: nn.Module = first.model
        if self.dist.enabled:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            self.train_model = DistributedDataParallel(first.model, device_ids=ids)
        self._step = 0

    # -- construction -----------------------------------------------------------------------
    def _build_member(self, member: Member, build: Callable[[SeedStreams], Parts]) -> _MemberState:
        streams = SeedStreams(member.seed)
        seed_everything(streams("init"))  # every rank: the same initial weights
        parts = build(streams)
        parts.model.to(self.device, self.dtype)
        state = _MemberState(member, parts)
        data_seed = (
            streams("data") if self.dist.rank == 0 else streams(f"data/rank{self.dist.rank}")
        )
        state.data_gen = torch.Generator().manual_seed(data_seed)
        state.step_gen = streams.generator("step")
        return state

    def _check_parts(self) -> None:
        for s in self.states:
            p = s.parts
            if (p.loss is None) == (p.step is None):
                raise ConfigError("parts: give exactly one of loss= and step=")
            if p.loss is not None and p.optimizer is None:
                raise ConfigError("parts: loss= needs optimizer= (the engine makes the step)")
        if len(self.states) > 1 and self.states[0].parts.step is not None:
            raise ConfigError("members: an ensemble trains a loss= step, not a custom step=")
        if len(self.states) > 1 and self.states[0].parts.extra_loss is not None:
            raise ConfigError("members: an ensemble takes no extra_loss= (an explicit penalty)")

    # -- the run ----------------------------------------------------------------------------
    def run(self, *, resume: bool = False) -> list[TrainResult]:
        """Train every member to ``loop.steps`` (continuing from checkpoints when ``resume``).

        A fresh run into a directory that already holds a run starts it over when the configs
        are equal and is refused when they differ.

        Returns:
            One :class:`TrainResult` per member, in order.
        Raises:
            dynascope.config.ConfigError: a run directory holds a different run (nothing is
                written), or a checkpoint does not fit the run.
            dynascope.store.RunLockedError: another live process writes to a run directory.
        """
        if not resume:
            for s in self.states:
                _refuse_different_run(s.member)
        try:
            with contextlib.ExitStack() as stack, torch_threads(self.loop.threads):
                for s in self.states:
                    if self.dist.is_writer:
                        s.store = stack.enter_context(RunStore(s.member.run_dir, lock=True))
                    else:
                        s.store = stack.enter_context(ReadOnlyStore(s.member.run_dir))
                stop = stack.enter_context(StopSignals())
                try:
                    return self._loop(stop, resume)
                except KeyboardInterrupt:  # a second signal: stop now, but say so
                    for s in self._active():
                        s.store.event(self._step, "interrupted", "SIGINT (at once, no checkpoint)")
                        s.store.set_status(self._step, "interrupted")
                    raise
        finally:
            self.dist.close()

    def _active(self) -> list[_MemberState]:
        return [s for s in self.states if s.status == "running"]

    def _start(self, resume: bool) -> int:
        """Load the last common checkpoint (``resume``) or start fresh; returns the step."""
        start = 0
        steps = [{step for step, _ in s.store.checkpoints() if step > 0} for s in self.states]
        common = set.intersection(*steps) if resume else set()  # step 0: a fresh start
        if common:
            start = max(common)
            states = [
                s.store.load_checkpoint(dict(s.store.checkpoints())[start]) for s in self.states
            ]
            try:
                self._restore(states)
            except (KeyError, RuntimeError, ValueError, TypeError, IndexError) as err:
                raise ConfigError(
                    f"checkpoint: does not fit this run's config (got {type(err).__name__}: "
                    f"{str(err).splitlines()[0][:120]}); was config.yaml or the checkpoint "
                    "replaced?"
                ) from None
        for s in self.states:
            if start:
                s.store.truncate_after(start)
                s.store.event(start, "resumed", f"from checkpoint step {start}")
            else:
                s.store.truncate_after(-1)
                s.store.write_config(s.member.config)
                if self.dist.is_writer:  # a run started over: its old checkpoints go too
                    for _, old in s.store.checkpoints():
                        old.unlink(missing_ok=True)
            s.store.set_status(start, "running")
        return start

    def _loop(self, stop: StopSignals, resume: bool) -> list[TrainResult]:
        loop = self.loop
        start = self._start(resume)
        for s in self.states:
            default = s.parts.probe_schedule or (
                EveryN(loop.probe_every, also=[loop.steps])
                if loop.probe_every
                else EveryN(loop.steps, also=[0])
            )
            s.monitor = _Monitors(s.parts.model, s.parts.probes, default, s.store, s.parts.loss)
            s.parts.model.train()
        probe_batches = [self._to_device(s.parts.probe_batch) for s in self.states]
        fixed = [
            self._to_device(s.parts.data) if isinstance(s.parts.data, Mapping) else None
            for s in self.states
        ]
        if start == 0:
            self._sync()
            for s, batch in zip(self.states, probe_batches, strict=True):
                s.monitor.step(0, batch)
                self._evaluate(s, 0)
            if loop.checkpoint_history == "log":
                self._checkpoint(0, history=True)
        elif start == loop.steps:
            self._sync()
            for s in self.states:
                s.final = self._evaluation(s)
        bar = progress_bar(self.progress, self.name, loop.steps, start)
        try:
            for step in range(start + 1, loop.steps + 1):
                self._step = step
                active = self._active()
                if not active:
                    break
                batches = [
                    fixed[i] if fixed[i] is not None else self._to_device(s.parts.data(s.data_gen))
                    for i, s in enumerate(self.states)
                ]
                losses, metrics = self._update(step, batches)
                for i, s in enumerate(self.states):
                    if s.status != "running":
                        continue
                    s.loss_sum = s.loss_sum.to(losses.device) + losses[i].detach().double()
                    s.loss_count += 1
                    for key, value in metrics.items():
                        s.metric_sums[key] = (
                            s.metric_sums.get(key, 0.0) + value[i].detach().double()
                        )
                if step % loop.log_every == 0 or step == loop.steps:
                    self._log(step, bar)
                due = [
                    i
                    for i, s in enumerate(self.states)
                    if s.status == "running" and s.monitor.due(step)
                ]
                if due:  # probes must not read non-finite weights
                    self._sync()
                    for i in due:
                        finite = bool(torch.isfinite(losses[i]))
                        bad = "train.loss" if not finite else self._non_finite(self.states[i])
                        if bad is not None:
                            self._diverged(self.states[i], step, bad)
                for i, s in enumerate(self.states):
                    if s.status == "running":
                        s.monitor.step(step, probe_batches[i])
                if loop.eval_every and step % loop.eval_every == 0 or step == loop.steps:
                    self._sync()
                    for s in self._active():
                        self._evaluate(s, step)
                stopped = self.dist.any(stop.signal is not None)
                signal_name = stop.signal or "SIGTERM"  # another rank's signal
                if step % loop.checkpoint_every == 0 or step == loop.steps or stopped:
                    self._checkpoint(step)
                elif loop.checkpoint_history == "log" and is_history_step(step):
                    self._checkpoint(step, history=True)
                if stopped and step < loop.steps:
                    for s in self._active():
                        s.store.event(step, "interrupted", signal_name)
                        s.store.set_status(step, "interrupted")
                        s.status, s.stopped_at = "interrupted", step
                    return self._results(signal_name)
        finally:
            if bar is not None:
                bar[0].stop()
        for s in self._active():
            s.store.set_status(loop.steps, "finished")
            s.status, s.stopped_at = "finished", loop.steps
        return self._results(None)

    def _results(self, signal_name: str | None) -> list[TrainResult]:
        return [
            TrainResult(
                Path(s.member.run_dir),
                s.status,
                s.stopped_at,
                s.final,
                signal_name if s.status == "interrupted" else None,
            )
            for s in self.states
        ]

    # -- one update ---------------------------------------------------------------------------
    def _update(self, step: int, batches: list[Batch]) -> tuple[Tensor, dict[str, Tensor]]:
        """One step for every member; returns the losses ``[K]`` and metrics ``{key: [K]}``."""
        factor = self.loop.schedule.factor(step - 1, self.loop.steps)
        if self.optimizer is not None:  # an ensemble's lr scales act on its update (Stack)
            scale = 1.0 if self.stack is not None else self.states[0].member.lr_scale
            for group, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
                group["lr"] = base * factor * scale
        first = self.states[0]
        if first.parts.step is not None:
            ctx = StepContext(step, factor, first.step_gen, self.optimizer)
            loss, metrics = _one_member(first.parts.step(self.train_model, batches[0], ctx))
            return loss.detach(), {k: v.detach() for k, v in metrics.items()}
        with self._autocast():
            if self.stack is not None:
                loss, metrics = self.stack.losses(first.parts.loss, batches)
            else:
                loss, metrics = _one_member(first.parts.loss(self.train_model, batches[0]))
        total = loss.sum()
        if first.parts.extra_loss is not None:
            total = total + first.parts.extra_loss[1]().to(total)
        self.optimizer.zero_grad(set_to_none=True)
        total.backward()
        if self.stack is not None:
            frozen = [i for i, s in enumerate(self.states) if s.status != "running"]
            self.stack.step(self.loop.grad_clip, frozen)
        else:
            if self.loop.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(first.parts.model.parameters(), self.loop.grad_clip)
            self.optimizer.step()
        return loss.detach(), {k: v.detach() for k, v in metrics.items()}

    def _autocast(self) -> contextlib.AbstractContextManager:
        if not self.bf16:
            return contextlib.nullcontext()
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)

    # -- logging, evaluation, divergence ----------------------------------------------------
    def _log(self, step: int, bar: Any) -> None:
        for i, s in enumerate(self.states):
            if s.status != "running":
                continue
            keys = sorted(s.metric_sums)
            sums = self.dist.all_sum(
                [float(s.loss_sum), s.loss_count, *(float(s.metric_sums[k]) for k in keys)]
            )
            mean_loss = sums[0] / sums[1]  # over every rank's batches
            s.loss_sum = torch.zeros((), dtype=torch.float64)
            s.loss_count, s.metric_sums = 0, {}
            if not math.isfinite(mean_loss):
                self._diverged(s, step, "train.loss")
                continue
            row: dict[str, Any] = {"train.loss": mean_loss}
            if self.optimizer is not None:
                row["train.lr"] = (
                    self.base_lrs[0]
                    * self.loop.schedule.factor(step - 1, self.loop.steps)
                    * (self.stack.member_scales[i] if self.stack is not None else s.member.lr_scale)
                )
            for k, total in zip(keys, sums[2:], strict=True):
                row[f"train.{k}"] = total / sums[1]
            if s.parts.extra_loss is not None:
                name, fn = s.parts.extra_loss
                row[f"train.{name}"] = float(fn().detach())
            if s.parts.log is not None:
                row.update(s.parts.log(s.parts.model, step))
            s.store.log(step, row)
            if bar is not None and i == 0:
                bar[0].update(bar[1], completed=step, loss=f"{mean_loss:.4f}")

    def _evaluation(self, s: _MemberState) -> dict[str, float]:
        if s.parts.evaluate is None:
            return {}
        model = s.parts.model
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                values = dict(s.parts.evaluate(model))
        finally:
            model.train(was_training)
        return {k: float(v) for k, v in values.items()}

    def _evaluate(self, s: _MemberState, step: int) -> None:
        if s.parts.evaluate is None:
            return
        s.final = self._evaluation(s)
        if not math.isfinite(s.final.get("val.loss", 0.0)):
            self._diverged(s, step, "val.loss")
            return
        s.store.log(step, s.final)

    def _non_finite(self, s: _MemberState) -> str | None:
        """Name of the first non-finite parameter of member ``s``, or None."""
        for name, param in s.parts.model.named_parameters():
            if not torch.isfinite(param).all():
                return f"parameter {name}"
        return None

    def _diverged(self, s: _MemberState, step: int, what: str) -> None:
        if s.status != "running":
            return
        s.store.event(step, "diverged", f"{what} is not finite")
        s.store.set_status(step, "diverged")
        s.status, s.stopped_at, s.final = "diverged", step, {}

    def _sync(self) -> None:
        """Copy the stack into each member's own module (ensembles; a no-op otherwise)."""
        if self.stack is not None:
            self.stack.unstack()

    # -- checkpoints --------------------------------------------------------------------------
    def _checkpoint(self, step: int, *, history: bool = False) -> None:
        """Write every running member's checkpoint at ``step``, then prune (:mod:`._checkpoints`).

        A history-only checkpoint (``history``) changes nothing in the run: a member whose
        weights are not finite is skipped, not stopped (that is left to the steps that look).
        """
        self._sync()
        bad = {i: self._non_finite(s) for i, s in enumerate(self.states) if s.status == "running"}
        if not history:
            for i, what in bad.items():  # never checkpoint non-finite weights
                if what is not None:
                    self._diverged(self.states[i], step, what)
        rng = global_rng_state()
        for i, s in enumerate(self.states):
            if s.status != "running":
                continue
            ranks = self.dist.gather(
                {"generator": s.data_gen.get_state(), "torch_rng": torch.get_rng_state()}
            )
            state = {
                "step": step,
                "model": s.parts.model.state_dict(),
                "optimizer": self._optimizer_state(i),
                "generator": s.data_gen.get_state(),
                "step_generator": s.step_gen.get_state(),
                **rng,
                "probes": [_state_dict(p) for p in _probe_fns(s.parts.probes)],
                "step_state": _state_dict(s.parts.step),
                "loss_sum": s.loss_sum.detach().cpu().clone(),
                "loss_count": s.loss_count,
                "metric_sums": {k: v.detach().cpu().clone() for k, v in s.metric_sums.items()},
                **({"ranks": ranks} if self.dist.enabled else {}),
            }
            written = s.store.checkpoints() and s.store.checkpoints()[-1][0] == step
            if self.dist.is_writer and not written and bad[i] is None:
                s.store.save_checkpoint(step, state)
                self._prune(s, step)
        self.dist.barrier()  # no rank reads a checkpoint before rank 0 has written it

    def _prune(self, s: _MemberState, step: int) -> None:
        """Remove the checkpoints that are neither among the latest nor kept history."""
        loop = self.loop
        found = {at: path for at, path in s.store.checkpoints()}
        budget = loop.checkpoint_budget_mb
        kept = kept_steps(
            [(at, path.stat().st_size) for at, path in found.items()],
            keep_last=loop.keep_checkpoints,
            history=loop.checkpoint_history == "log",
            budget_bytes=None if budget is None else budget * MIB,
        )
        for at, path in found.items():
            if at in kept:
                continue
            path.unlink(missing_ok=True)
            if loop.checkpoint_history == "log" and is_history_step(at):
                s.store.event(
                    step,
                    "checkpoint_budget",
                    f"removed history checkpoint {path.name}: the history would exceed "
                    f"checkpoint_budget_mb={budget:g}",
                )

    def _optimizer_state(self, i: int) -> dict | None:
        if self.optimizer is None:
            return None
        if self.stack is not None:
            return self.stack.member_optimizer_state(i)
        return self.optimizer.state_dict()

    def _restore(self, states: list[dict]) -> None:
        for s, state in zip(self.states, states, strict=True):
            s.parts.model.load_state_dict(state["model"])
            ranks = state.get("ranks") or []
            own = ranks[self.dist.rank] if len(ranks) == self.dist.world_size else state
            s.data_gen.set_state(own["generator"])
            s.step_gen.set_state(state["step_generator"])
            probes = _probe_fns(s.parts.probes)
            for probe, probe_state in zip(probes, state.get("probes", []), strict=False):
                if probe_state is not None:
                    probe.load_state_dict(probe_state)
            if state.get("step_state") is not None:
                s.parts.step.load_state_dict(state["step_state"])
            s.loss_sum = state["loss_sum"].clone()
            s.loss_count = int(state["loss_count"])
            s.metric_sums = {k: v.clone() for k, v in state.get("metric_sums", {}).items()}
        set_global_rng_state(states[0])
        ranks = states[0].get("ranks") or []
        if len(ranks) == self.dist.world_size > 1:  # each rank takes back its own torch RNG
            torch.set_rng_state(ranks[self.dist.rank]["torch_rng"])
        if self.stack is not None:
            self.stack.restack()
            self.stack.load_member_optimizer_states([st["optimizer"] for st in states])
        elif self.optimizer is not None:
            self.optimizer.load_state_dict(states[0]["optimizer"])

    def _to_device(self, batch: Batch | None) -> dict[str, Tensor] | None:
        if batch is None:
            return None
        out = {}
        for key, value in batch.items():
            if value.is_floating_point():
                value = value.to(self.dtype)
            out[key] = value.to(self.device, non_blocking=True)
        return out


def _split(output: StepOutput) -> tuple[Tensor, Mapping[str, Tensor]]:
    if isinstance(output, tuple):
        loss, metrics = output
        return loss, metrics
    return output, {}


class _Monitors:
    """One :class:`~dynascope.monitor.Monitor` per schedule among a member's probes."""

    def __init__(
        self,
        model: nn.Module,
        probes: Sequence[Any],
        default: Schedule,
        sink: Any,
        loss: Callable[[nn.Module, Batch], StepOutput] | None = None,
    ):
        by_schedule: dict[int, tuple[Schedule, list]] = {}
        for entry in probes:
            probe, schedule = entry if isinstance(entry, tuple) else (entry, default)
            by_schedule.setdefault(id(schedule), (schedule, []))[1].append(probe)
        # the training loss reaches the probes of the loss landscape (sharpness) via ctx.loss
        self.monitors = [
            Monitor(model, p, sched, sink, loss=loss) for sched, p in by_schedule.values()
        ]

    def due(self, step: int) -> bool:
        return any(m.probes and m.schedule.due(step) for m in self.monitors)

    def step(self, step: int, batch: Batch | None) -> None:
        for monitor in self.monitors:
            monitor.step(step, batch)


def _probe_fns(probes: Sequence[Any]) -> list[Any]:
    """The probe callables of ``Parts.probes`` (entries are a probe or ``(probe, schedule)``)."""
    return [entry[0] if isinstance(entry, tuple) else entry for entry in probes]


def _one_member(output: StepOutput) -> tuple[Tensor, dict[str, Tensor]]:
    """A lone run's step output as an ensemble of one: ``([1], {key: [1]})``."""
    loss, metrics = _split(output)
    return loss.reshape(1), {k: torch.as_tensor(v).reshape(1) for k, v in metrics.items()}


def _state_dict(obj: Any) -> Any:
    fn = getattr(obj, "state_dict", None)
    return fn() if callable(fn) else None


def _refuse_different_run(member: Member) -> None:
    existing = Path(member.run_dir) / "config.yaml"
    if not existing.is_file():
        return
    import yaml

    if yaml.safe_load(existing.read_text()) != _plain(member.config):
        raise ConfigError(
            f"run_dir: {str(member.run_dir)!r} already holds a different run; choose another "
            "directory or resume that run"
        )


def _plain(config: dict[str, Any]) -> Any:
    """``config`` as ``config.yaml`` reads back (tuples become lists)."""
    import yaml

    return yaml.safe_load(yaml.safe_dump(config, sort_keys=False))
