"""Engine overhead: a registry run through ``run_members`` vs a bare PyTorch loop on the same model.

Run by hand (not part of the test suite)::

    python benchmarks/trainer_overhead.py [--steps N] [--repeats R] [--threads T] [--profile]

Results and how to read them: docs/benchmarks.md.

The model is the recall run of the ``weight-decay-low-rank`` fast preset
(``dynascope.studies.weight_decay_low_rank.study._recall_run(d_model=32, ..., batch_size=128)``): a
2-layer, d_model 32, 2-head attention-only transformer on associative recall, AdamW lr 3e-3
(decoupled decay: 0.01 on non-attention matrices), batch 128, CPU float32. Three variants:

(a) ``engine``: ``run_members(build_registry, config, tmpdir)`` (what ``Trainer.run()`` and
    ``dynascope run`` call) with ``monitor.probes=[]``, ``eval_every = checkpoint_every = steps``
    (evaluation at step 0 and at the end, one checkpoint at the end), the preset's
    ``log_every=10`` and ``train.threads`` set to the benchmark's thread count. Timed: the
    whole call, so building the parts (task, model, ``eval_batches=8`` validation batches,
    optimizer), the step-0/final evaluations, the final checkpoint and the store's open/close
    are included -- a fixed cost printed separately.
(b) ``bare``: the same parts as the engine builds them (global RNGs seeded from the run's
    ``init`` stream, then ``build_registry(config, SeedStreams(seed))``: the same initial
    weights), the same batches (``parts.data`` on a ``torch.Generator`` seeded from the ``data``
    stream, as the engine's), the same optimizer (``parts.optimizer``); per step ``zero_grad``,
    forward and loss (``parts.loss``: ``task.loss(model(x), batch)``), backward, ``step`` --
    nothing else. Timed: the loop. Before timing, a 30-step run of (a) and (b) with one
    intra-op thread is checked to end with bitwise-equal parameters (the final checkpoint of
    (a) against (b)'s model, so both loops do the same computation; with 2 threads torch's CPU
    kernels here are not bitwise reproducible even bare vs bare, so the check pins 1 thread).
(c) ``engine+probes``: as (a) with the preset's default monitor (``qk_spectrum``,
    ``ov_spectrum`` on a 25-point log schedule), so the cost of probes is visible.

Repeats are interleaved (a, b, c, a, b, c, ...) so slow drifts of the machine hit every variant
alike; the table reports the median steps/s per variant and the throughput ratios against (b).
Goal: engine/bare >= 0.95.

Noise: on a busy 2-core machine torch's intra-op pool (2 threads by default there, printed below
as ``torch.get_num_threads()``) can be starved by any other process, which swings a variant's
time far more than the engine's overhead does; run it twice and compare, or pass
``--threads 1`` to measure with one intra-op thread.

``--profile`` additionally times the engine's per-step extras in isolation (mean over many
calls, microseconds), each written as the expression :mod:`dynascope.train.engine` runs (its
internals are private): the loss accumulation ``loss_sum.to(device) + loss.detach().double()``,
the learning-rate schedule (``schedule.factor`` and setting each group's ``lr``),
``monitor.due(t)`` and ``monitor.step(t)`` on a step with nothing due, moving the batch to the
device and dtype, the ``l2_penalty`` call (only made when ``optimizer.mode="l2"``; not on this
preset), the log-every-10 row (``float``, the rate, ``store.log``) amortised per step, and the
``step % ...`` checks.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from dynascope.config import RunConfig, build_optimizer, validate_config
from dynascope.monitor import Monitor
from dynascope.optim import l2_penalty
from dynascope.store import RunStore
from dynascope.studies.weight_decay_low_rank.study import _recall_run
from dynascope.train import Parts, SeedStreams, build_registry, loop_of, run_members
from dynascope.train.seeding import seed_everything

CPU_SECONDS: list[float] = []  # process CPU time of the last timed call (all threads)


def make_config(steps: int, *, probes: bool) -> RunConfig:
    """The fast preset's recall config, eval/checkpoint only at the end; probes optional; the
    engine on the intra-op threads torch has now (as the bare loop)."""
    base = _recall_run(d_model=32, steps=steps, batch_size=128)
    overrides = [
        f"train.eval_every={steps}",
        f"train.checkpoint_every={steps}",
        f"train.threads={torch.get_num_threads()}",
    ]
    if not probes:
        overrides.append("monitor.probes=[]")
    return validate_config(base.model_dump(mode="json"), overrides)


def build_parts(config: RunConfig) -> tuple[Parts, SeedStreams]:
    """The run's parts as the engine builds them (global RNGs seeded from stream ``init``)."""
    streams = SeedStreams(config.seed)
    seed_everything(streams("init"))
    parts = build_registry(config, streams)
    parts.model.to(torch.device(config.device), getattr(torch, config.dtype))
    return parts, streams


def time_engine(config: RunConfig) -> tuple[float, dict[str, torch.Tensor]]:
    """Seconds of ``run_members`` and the parameters of its final checkpoint."""
    with tempfile.TemporaryDirectory(prefix="dynascope-bench-") as tmp:
        c0, t0 = time.process_time(), time.perf_counter()
        result = run_members(build_registry, config, tmp)
        elapsed = time.perf_counter() - t0
        CPU_SECONDS.append(time.process_time() - c0)
        last = Path(tmp) / "checkpoints" / f"step_{config.train.steps}.pt"
        state = torch.load(last, weights_only=True)["model"]
    assert result.status == "finished", result
    return elapsed, state


def time_bare(config: RunConfig) -> tuple[float, dict[str, torch.Tensor]]:
    parts, streams = build_parts(config)
    model, optimizer = parts.model, parts.optimizer(parts.model)
    generator = torch.Generator().manual_seed(streams("data"))
    model.train()
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(config.train.steps):
        batch = parts.data(generator)
        loss = parts.loss(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    elapsed = time.perf_counter() - t0
    CPU_SECONDS.append(time.process_time() - c0)
    return elapsed, model.state_dict()


def same_parameters(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def fixed_cost(config: RunConfig) -> float:
    """Seconds of (a) not spent in training steps: building the parts, the step-0 and final
    evaluations, the checkpoint (model and optimizer) and the store."""
    with tempfile.TemporaryDirectory(prefix="dynascope-bench-") as tmp:
        t0 = time.perf_counter()
        parts, _ = build_parts(config)
        optimizer = parts.optimizer(parts.model)
        with torch.no_grad():
            parts.evaluate(parts.model.eval())
            parts.evaluate(parts.model)
        with RunStore(tmp) as store:
            store.write_config(config.model_dump(mode="json"))
            state = {"model": parts.model.state_dict(), "optimizer": optimizer.state_dict()}
            store.save_checkpoint(config.train.steps, state)
        return time.perf_counter() - t0


# -- profile ------------------------------------------------------------------------------------
def _mean_us(fn, n: int) -> float:
    for _ in range(min(50, n)):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def profile(steps: int) -> list[tuple[str, float, str]]:
    """Microseconds per call of each per-step extra the engine does beyond the bare loop."""
    config = make_config(steps, probes=False)
    loop = loop_of(config)
    parts, streams = build_parts(config)
    optimizer = parts.optimizer(parts.model)
    base_lrs = [g["lr"] for g in optimizer.param_groups]
    raw = parts.data(torch.Generator().manual_seed(streams("data")))
    loss = parts.loss(parts.model, raw).detach().reshape(1)
    device, dtype = torch.device(config.device), getattr(torch, config.dtype)
    rows: list[tuple[str, float, str]] = []

    def add(name: str, fn, n: int, note: str = "every step") -> None:
        rows.append((name, _mean_us(fn, n), note))

    loss_sum = torch.zeros((), dtype=torch.float64)

    def accumulate():
        nonlocal loss_sum
        loss_sum = loss_sum.to(loss.device) + loss[0].detach().double()

    add("loss_sum + loss.detach().double() accumulate", accumulate, 20000)

    def schedule():
        factor = loop.schedule.factor(122, loop.steps)
        for group, base in zip(optimizer.param_groups, base_lrs, strict=True):
            group["lr"] = base * factor

    add("schedule factor, set each group's lr", schedule, 20000)

    def to_device():
        return {
            k: (v.to(dtype) if v.is_floating_point() else v).to(device, non_blocking=True)
            for k, v in raw.items()
        }

    add(f"batch to device ({config.device}, {config.dtype})", to_device, 20000)
    with tempfile.TemporaryDirectory(prefix="dynascope-bench-") as tmp, RunStore(tmp) as store:
        monitor = Monitor(parts.model, parts.probes, parts.probe_schedule, store)

        def nothing_due():
            _ = monitor.probes and monitor.schedule.due(7)  # the engine's check, then the step
            monitor.step(7)

        add("monitor.due(t) + step(t), nothing due", nothing_due, 50000)
        parts_c, _ = build_parts(make_config(steps, probes=True))
        schedule_c = parts_c.probe_schedule
        monitor_c = Monitor(parts_c.model, parts_c.probes, schedule_c, store)
        not_due = next(s for s in range(1, steps) if not schedule_c.due(s))
        add(
            "monitor.step(t), probes set, not due",
            lambda: monitor_c.step(not_due),
            50000,
            "every step (c)",
        )
        due = sorted(schedule_c.steps)
        note = f"{len(due)} of {steps + 1} steps (c)"
        add("monitor.step(t), qk+ov probes due", lambda: monitor_c.step(due[-1]), 200, note)
        l2 = config.optimizer.model_copy(update={"mode": "l2"})
        groups = build_optimizer(l2, parts.model)[1]
        add("l2_penalty(groups)", lambda: l2_penalty(groups), 5000, "only if mode='l2' (not here)")

        def checks():
            s = 123
            _ = s % loop.log_every == 0 or s == loop.steps
            _ = loop.eval_every and s % loop.eval_every == 0 or s == loop.steps
            _ = s % loop.checkpoint_every == 0 or s == loop.steps
            _ = loop.grad_clip is not None
            _ = parts.extra_loss is not None

        add("step % ... checks, attribute lookups", checks, 50000)

        def log_row():
            nonlocal loss_sum
            mean_loss = float(loss_sum) / 10
            loss_sum = torch.zeros((), dtype=torch.float64)
            lr = base_lrs[0] * loop.schedule.factor(0, loop.steps)
            store.log(1, {"train.loss": mean_loss, "train.lr": lr})

        per = _mean_us(log_row, 5000)
        note = f"{per:.1f} us per logging step"
        rows.append((f"log row every {loop.log_every} (amortised)", per / loop.log_every, note))
    return rows


# -- main ---------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--profile", action="store_true", help="time the per-step extras")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    print(
        f"torch {torch.__version__}, python {platform.python_version()}, "
        f"nproc {os.cpu_count()}, torch.get_num_threads() = {torch.get_num_threads()}, "
        f"loadavg {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(f"steps {args.steps}, repeats {args.repeats} (interleaved a, b, c)")
    cfg_a = make_config(args.steps, probes=False)
    cfg_c = make_config(args.steps, probes=True)

    # like-for-like check (1 thread: deterministic) and warm-up, not timed
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    check = make_config(30, probes=False)
    same = same_parameters(time_engine(check)[1], time_bare(check)[1])
    torch.set_num_threads(threads)
    print(f"(a) and (b) end with bitwise-equal parameters after 30 steps (1 thread): {same}")
    warm = make_config(20, probes=True)
    time_engine(warm)
    time_bare(warm)

    times: dict[str, list[float]] = {"a": [], "b": [], "c": []}
    cpu: dict[str, list[float]] = {"a": [], "b": [], "c": []}
    for r in range(args.repeats):
        ta, _ = time_engine(cfg_a)
        tb, _ = time_bare(cfg_a)
        tc, _ = time_engine(cfg_c)
        cpu["a"].append(CPU_SECONDS[-3])
        cpu["b"].append(CPU_SECONDS[-2])
        cpu["c"].append(CPU_SECONDS[-1])
        times["a"].append(ta)
        times["b"].append(tb)
        times["c"].append(tc)
        print(
            f"  repeat {r + 1}: a {args.steps / ta:7.1f}  b {args.steps / tb:7.1f}  "
            f"c {args.steps / tc:7.1f} steps/s   (CPU s/wall s: a {cpu['a'][-1] / ta:.2f} "
            f"b {cpu['b'][-1] / tb:.2f} c {cpu['c'][-1] / tc:.2f})"
        )
    fixed = fixed_cost(cfg_a)

    names = {
        "a": "(a) engine, no probes",
        "b": "(b) bare PyTorch loop",
        "c": "(c) engine, qk+ov probes (25-pt log)",
    }
    med = {k: statistics.median(v) for k, v in times.items()}
    sps = {k: args.steps / med[k] for k in med}
    spread = {k: (args.steps / max(v), args.steps / min(v)) for k, v in times.items()}
    print()
    print(
        "| variant | median steps/s | min-max steps/s | ms/step (median) | vs bare (median) "
        "| vs bare (best) |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for k in ("a", "b", "c"):
        lo, hi = spread[k]
        print(
            f"| {names[k]} | {sps[k]:.1f} | {lo:.1f}-{hi:.1f} | {1e3 / sps[k]:.3f} | "
            f"{sps[k] / sps['b']:.3f} | {spread[k][1] / spread['b'][1]:.3f} |"
        )
    ratio = sps["a"] / sps["b"]
    print()
    verdict = "met" if ratio >= 0.95 else "NOT met"
    print(f"engine/bare throughput: {ratio:.3f} (goal >= 0.95: {verdict})")
    print(f"probes/bare throughput:  {sps['c'] / sps['b']:.3f}")
    cmed = {k: statistics.median(v) for k, v in cpu.items()}
    print(
        f"CPU-time ratio engine/bare (median process CPU s, b/a): {cmed['b'] / cmed['a']:.3f}; "
        f"probes/bare: {cmed['b'] / cmed['c']:.3f} (robust to other processes with --threads 1; "
        "with 2 threads a starved pool's spin-waits inflate it)"
    )
    best_ratio = spread["a"][1] / spread["b"][1]
    print(
        f"best-of-{args.repeats} engine/bare: {best_ratio:.3f} (contention only ever slows a "
        "repeat, so on a shared machine the best repeat is the less noisy estimate)"
    )
    print(
        f"fixed cost inside (a) (build, 2 evals x {cfg_a.train.eval_batches} batches, checkpoint): "
        f"{fixed * 1e3:.1f} ms = {fixed / med['a'] * 100:.1f}% of (a)'s median time; "
        f"engine/bare without it: {med['b'] / (med['a'] - fixed):.3f}"
    )

    if args.profile or ratio < 0.95:
        print()
        print("per-step extras of the engine (us per call, mean):")
        bare_us = med["b"] / args.steps * 1e6
        for name, us, note in profile(args.steps):
            print(f"  {name:45s} {us:9.2f} us  ({us / bare_us * 100:5.2f}% of a bare step)  {note}")
        print(f"  {'bare step (median of b)':45s} {bare_us:9.2f} us")


if __name__ == "__main__":
    main()
