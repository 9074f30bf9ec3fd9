"""Trainer overhead: ``dynascope.train.Trainer`` vs a bare PyTorch loop on the same model.

Run by hand (not part of the test suite)::

    python benchmarks/trainer_overhead.py [--steps N] [--repeats R] [--threads T] [--profile]

Results and how to read them: docs/benchmarks.md.

The model is the recall run of the ``weight-decay-low-rank`` fast preset
(``dynascope.studies.weight_decay_low_rank.study._recall_run(d_model=32, ..., batch_size=128)``): a
2-layer, d_model 32, 2-head attention-only transformer on associative recall, AdamW lr 3e-3
(decoupled decay: 0.01 on non-attention matrices), batch 128, CPU float32. Three variants:

(a) ``trainer``: ``Trainer(config, tmpdir).run()`` with ``monitor.probes=[]``,
    ``eval_every = checkpoint_every = steps`` (evaluation at step 0 and at the end, one
    checkpoint at the end) and the preset's ``log_every=10``. Timed: the ``run()`` call
    (construction excluded), so the step-0/final evaluations (``eval_batches=8`` each), the final
    checkpoint and the store's open/close are included -- a fixed cost printed separately.
(b) ``bare``: the same model (``build_task``/``build_model`` after ``torch.manual_seed(seed)``,
    so the same initial weights), the same batches (``task.batch("train", ...)`` from a
    ``torch.Generator`` seeded like the Trainer's), the same optimizer
    (``dynascope.config.build_optimizer``); per step ``zero_grad``, forward, loss, backward,
    ``step`` -- nothing else. Timed: the loop. Before timing, a 30-step run of (a) and (b) with
    one intra-op thread is checked to end with bitwise-equal parameters (so both loops do the
    same computation; with 2 threads torch's CPU kernels here are not bitwise reproducible even
    bare vs bare, so the check pins 1 thread).
(c) ``trainer+probes``: as (a) with the preset's default monitor (``qk_spectrum``,
    ``ov_spectrum`` on a 25-point log schedule), so the cost of probes is visible.

Repeats are interleaved (a, b, c, a, b, c, ...) so slow drifts of the machine hit every variant
alike; the table reports the median steps/s per variant and the throughput ratios against (b).
Goal: trainer/bare >= 0.95.

Noise: on a busy 2-core machine torch's intra-op pool (2 threads by default there, printed below
as ``torch.get_num_threads()``) can be starved by any other process, which swings a variant's
time far more than the Trainer's overhead does; run it twice and compare, or pass
``--threads 1`` to measure with one intra-op thread.

``--profile`` additionally times the Trainer's per-step extras in isolation (mean over many
calls, microseconds): the loss accumulation ``self._loss_sum += loss.detach().double().cpu()``,
``scheduler.step()``, ``monitor.step(t)`` on a step with nothing due, ``_to_device(batch)``, the
``l2_penalty`` call (only made when ``optimizer.mode="l2"``; not on this preset), the
log-every-10 row (``float``, ``get_last_lr``, ``store.log``) amortised per step, and the
``step % ...`` checks.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time

import torch

from dynascope.config import RunConfig, build_model, build_optimizer, build_task, validate_config
from dynascope.optim import l2_penalty
from dynascope.store import RunStore
from dynascope.studies.weight_decay_low_rank.study import _recall_run
from dynascope.train import Trainer

CPU_SECONDS: list[float] = []  # process CPU time of the last timed call (all threads)


def make_config(steps: int, *, probes: bool) -> RunConfig:
    """The fast preset's recall config, eval/checkpoint only at the end; probes optional."""
    base = _recall_run(d_model=32, steps=steps, batch_size=128)
    overrides = [
        f"train.eval_every={steps}",
        f"train.checkpoint_every={steps}",
    ]
    if not probes:
        overrides.append("monitor.probes=[]")
    return validate_config(base.model_dump(mode="json"), overrides)


def time_trainer(config: RunConfig) -> tuple[float, Trainer]:
    with tempfile.TemporaryDirectory(prefix="dynascope-bench-") as tmp:
        trainer = Trainer(config, tmp)
        c0, t0 = time.process_time(), time.perf_counter()
        result = trainer.run()
        elapsed = time.perf_counter() - t0
        CPU_SECONDS.append(time.process_time() - c0)
    assert result.status == "finished", result
    return elapsed, trainer


def build_bare(config: RunConfig):
    torch.manual_seed(config.seed)
    task = build_task(config.task)
    model = build_model(config.model, task).to(torch.device(config.device), torch.float32)
    optimizer, _ = build_optimizer(config.optimizer, model)
    generator = torch.Generator().manual_seed(config.seed)
    return task, model, optimizer, generator


def time_bare(config: RunConfig) -> tuple[float, torch.nn.Module]:
    task, model, optimizer, generator = build_bare(config)
    steps, batch_size = config.train.steps, config.train.batch_size
    model.train()
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(steps):
        batch = task.batch("train", batch_size, generator)
        output = model(batch["x"])
        loss = task.loss(output, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    elapsed = time.perf_counter() - t0
    CPU_SECONDS.append(time.process_time() - c0)
    return elapsed, model


def same_parameters(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def fixed_cost(config: RunConfig) -> float:
    """Seconds of run() not spent in training steps: step-0 and final eval, checkpoint, store."""
    with tempfile.TemporaryDirectory(prefix="dynascope-bench-") as tmp:
        trainer = Trainer(config, tmp)
        t0 = time.perf_counter()
        trainer.evaluate()
        trainer.evaluate()
        with RunStore(trainer.run_dir) as store:
            store.write_config(config.model_dump(mode="json"))
            trainer._checkpoint(store, config.train.steps)
        return time.perf_counter() - t0


# -- profile ------------------------------------------------------------------------------------
def _mean_us(fn, n: int) -> float:
    import warnings

    warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler")
    for _ in range(min(50, n)):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def profile(steps: int) -> list[tuple[str, float, str]]:
    """Microseconds per call of each per-step extra the Trainer does beyond the bare loop."""
    config = make_config(steps, probes=False)
    rows: list[tuple[str, float, str]] = []
    with tempfile.TemporaryDirectory(prefix="dynascope-bench-") as tmp:
        trainer = Trainer(config, tmp)
        from dynascope.monitor import Monitor

        batch = trainer.task.batch("train", config.train.batch_size, trainer.generator)
        output = trainer.model(batch["x"])
        loss = trainer.task.loss(output, batch)

        def accumulate():
            trainer._loss_sum += loss.detach().double().cpu()

        rows.append(
            ("loss.detach().double().cpu() accumulate", _mean_us(accumulate, 20000), "every step")
        )
        acc = torch.zeros((), dtype=torch.float64)

        def accumulate_f64_item():
            nonlocal acc
            acc += loss.detach()  # float32 -> float64 in-place, no .double()/.cpu() copies

        rows.append(
            ("  alt: acc64 += loss.detach()", _mean_us(accumulate_f64_item, 20000), "proposed")
        )
        rows.append(("scheduler.step()", _mean_us(trainer.scheduler.step, 20000), "every step"))
        with RunStore(trainer.run_dir) as store:
            monitor = Monitor(trainer.model, trainer.probes, trainer.schedule, store)
            rows.append(
                (
                    "monitor.step(t), nothing due",
                    _mean_us(lambda: monitor.step(7), 50000),
                    "every step",
                )
            )
            mon_c = make_config(steps, probes=True)
            trainer_c = Trainer(mon_c, tmp + "/c")
            monitor_c = Monitor(trainer_c.model, trainer_c.probes, trainer_c.schedule, store)
            not_due = next(s for s in range(1, steps) if not trainer_c.schedule.due(s))
            rows.append(
                (
                    "monitor.step(t), probes set, not due",
                    _mean_us(lambda: monitor_c.step(not_due), 50000),
                    "every step (c)",
                )
            )
            due = sorted(trainer_c.schedule.steps)
            rows.append(
                (
                    "monitor.step(t), qk+ov probes due",
                    _mean_us(lambda: monitor_c.step(due[-1]), 200),
                    f"{len(due)} of {steps + 1} steps (c)",
                )
            )
            raw = trainer.task.batch("train", config.train.batch_size, trainer.generator)
            rows.append(
                (
                    "_to_device(batch) (cpu, float32)",
                    _mean_us(lambda: trainer._to_device(raw), 20000),
                    "every step",
                )
            )
            rows.append(
                (
                    "l2_penalty(groups)",
                    _mean_us(lambda: l2_penalty(trainer.groups), 5000),
                    "only if optimizer.mode='l2' (not here)",
                )
            )
            cfg = config.train

            def checks():
                s = 123
                _ = s % cfg.log_every == 0 or s == cfg.steps
                _ = s % cfg.eval_every == 0 or s == cfg.steps
                _ = s % cfg.checkpoint_every == 0 or s == cfg.steps
                _ = trainer.config.optimizer.grad_clip is not None
                _ = trainer.uses_l2

            rows.append(
                ("step % ... checks, attribute lookups", _mean_us(checks, 50000), "every step")
            )

            def log_row():
                mean_loss = float(trainer._loss_sum) / 10
                trainer._loss_sum.zero_()
                row = {"train.loss": mean_loss, "train.lr": trainer.scheduler.get_last_lr()[0]}
                store.log(1, row)

            per = _mean_us(log_row, 5000)
            rows.append(
                (
                    f"log row every {cfg.log_every} (amortised)",
                    per / cfg.log_every,
                    f"{per:.1f} us per logging step",
                )
            )
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
    same = same_parameters(time_trainer(check)[1].model, time_bare(check)[1])
    torch.set_num_threads(threads)
    print(f"(a) and (b) end with bitwise-equal parameters after 30 steps (1 thread): {same}")
    warm = make_config(20, probes=True)
    time_trainer(warm)
    time_bare(warm)

    times: dict[str, list[float]] = {"a": [], "b": [], "c": []}
    cpu: dict[str, list[float]] = {"a": [], "b": [], "c": []}
    for r in range(args.repeats):
        ta, _ = time_trainer(cfg_a)
        tb, _ = time_bare(cfg_a)
        tc, _ = time_trainer(cfg_c)
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
        "a": "(a) Trainer, no probes",
        "b": "(b) bare PyTorch loop",
        "c": "(c) Trainer, qk+ov probes (25-pt log)",
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
    print(f"trainer/bare throughput: {ratio:.3f} (goal >= 0.95: {verdict})")
    print(f"probes/bare throughput:  {sps['c'] / sps['b']:.3f}")
    cmed = {k: statistics.median(v) for k, v in cpu.items()}
    print(
        f"CPU-time ratio trainer/bare (median process CPU s, b/a): {cmed['b'] / cmed['a']:.3f}; "
        f"probes/bare: {cmed['b'] / cmed['c']:.3f} (robust to other processes with --threads 1; "
        "with 2 threads a starved pool's spin-waits inflate it)"
    )
    best_ratio = spread["a"][1] / spread["b"][1]
    print(
        f"best-of-{args.repeats} trainer/bare: {best_ratio:.3f} (contention only ever slows a "
        "repeat, so on a shared machine the best repeat is the less noisy estimate)"
    )
    print(
        f"fixed cost inside run() (2 evals x {cfg_a.train.eval_batches} batches + checkpoint): "
        f"{fixed * 1e3:.1f} ms = {fixed / med['a'] * 100:.1f}% of (a)'s median time; "
        f"trainer/bare without it: {med['b'] / (med['a'] - fixed):.3f}"
    )

    if args.profile or ratio < 0.95:
        print()
        print("per-step extras of the Trainer (us per call, mean):")
        bare_us = med["b"] / args.steps * 1e6
        for name, us, note in profile(args.steps):
            print(f"  {name:45s} {us:9.2f} us  ({us / bare_us * 100:5.2f}% of a bare step)  {note}")
        print(f"  {'bare step (median of b)':45s} {bare_us:9.2f} us")


if __name__ == "__main__":
    main()
