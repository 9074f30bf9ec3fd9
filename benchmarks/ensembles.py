"""Ensembles on the engine: K = 8 members as one stacked run against 8 lone runs, side by side.

Two workloads, each trained for the same number of steps (a) as 8 lone runs one after
another and (b) as one K = 8 ensemble (parameters stacked, loss vectorized with vmap, the FCN's
layers batched as ``baddbmm`` on the stack, one stacked Adam):

- FCN: the slingshot FCN 64-64-64-10 (ReLU), full batch on 200 digits, Adam 1e-3;
- transformer: the randomized-algorithms recall transformer at its fast size (2 layers,
  d_model 32, one linear-attention head of d_head 4, no MLP, no LayerNorm; recall N = 12 keys,
  b = 4 value bits), batch 128, Adam 1e-3.

Each run writes its own run directory (store, checkpoints at the end), as a study's would.
Times are wall-clock seconds; lone runs and the first ensemble use one intra-op thread (the
engine's policy), the second ensemble two (``Loop(threads=2)``: both cores of a 2-core
machine). A short warm-up run first pays the imports (torch.func, scipy) that the first
engine run of a process triggers, so that they do not land in lone run 0. The last line is

    ensemble cost per member / lone run: FCN X, transformer Y

with X = ensemble time (one thread) / (8 x mean lone-run time). Goals (issue 17) on 2 cores:
X <= 0.3, Y <= 0.7. The table also gives the ratio with the ensemble on two threads, and in
process CPU time (user + sys), which a machine shared with other jobs inflates far less.
Usage: ``python benchmarks/ensembles.py [--steps-fcn N] [--steps-transformer N]``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from dynascope.nn import Transformer
from dynascope.nn.fcn import FCN
from dynascope.tasks import Digits
from dynascope.tasks.seeded_recall import SeededRecall
from dynascope.train import Engine, Loop, Member, Parts, SeedStreams

K = 8


def build_fcn(streams: SeedStreams) -> Parts:
    task = Digits(patch_size=8, n_train=200)
    batch = task.batch("train", 200, streams.generator("subset"))
    model = FCN(64, hidden=(64, 64), d_out=10)
    return Parts(
        model=model,
        data={"x": batch["x"], "y": batch["y"]},
        loss=lambda m, b: F.cross_entropy(m(b["x"]), b["y"]),
        optimizer=lambda m: torch.optim.Adam(m.parameters(), lr=1e-3),
    )


def build_recall(streams: SeedStreams) -> Parts:
    task = SeededRecall(n_keys=12, n_value_bits=4)
    model = Transformer(
        n_layers=2,
        d_model=32,
        n_heads=1,
        d_head=4,
        d_mlp=0,
        d_in=task.d_in,
        d_out=task.d_out,
        n_ctx=task.n_ctx,
        positional="none",
        attention="linear",
        is_causal=True,
        use_ln=False,
    )

    def loss(m, b):
        logits = m(b["x"])[:, -1]  # [batch, b]
        return F.binary_cross_entropy_with_logits(logits, b["y"], reduction="none").sum(-1).mean()

    return Parts(
        model=model,
        data=lambda g: task.batch(128, g),
        loss=loss,
        optimizer=lambda m: torch.optim.Adam(m.parameters(), lr=1e-3),
    )


def _time(build, steps: int, root: Path, tag: str) -> dict[str, float]:
    """Wall and CPU seconds: ``lone`` (the mean of K lone runs), ``ensemble`` (one thread),
    ``ensemble2`` (two threads)."""
    times = {}
    start, cpu = time.perf_counter(), time.process_time()
    for k in range(K):
        loop = Loop(steps=steps, log_every=50, checkpoint_every=steps)
        Engine(Member(root / f"{tag}_lone{k}", k, {"seed": k}), build, loop).run()
    times["lone"] = (time.perf_counter() - start) / K
    times["lone_cpu"] = (time.process_time() - cpu) / K
    for key, threads in (("ensemble", 1), ("ensemble2", 2)):
        loop = Loop(steps=steps, log_every=50, checkpoint_every=steps, threads=threads)
        members = [Member(root / f"{tag}_{key}_{k}", k, {"seed": k}) for k in range(K)]
        start, cpu = time.perf_counter(), time.process_time()
        Engine(members, build, loop).run()
        times[key] = time.perf_counter() - start
        times[f"{key}_cpu"] = time.process_time() - cpu
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps-fcn", type=int, default=2000)
    parser.add_argument("--steps-transformer", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        warm = [Member(root / f"warm{k}", k, {"seed": k}) for k in range(2)]
        Engine(warm, build_fcn, Loop(steps=5, checkpoint_every=5)).run()  # imports
        rows = {
            "FCN": _time(build_fcn, args.steps_fcn, root, "fcn"),
            "transformer": _time(build_recall, args.steps_transformer, root, "tr"),
        }
    print(
        f"{'workload':<12} {'lone run s':>10} {'8 lone s':>9} {'ensemble s':>10} {'ratio':>6}"
        f" {'2 threads s':>11} {'ratio':>6} {'lone CPU s':>10} {'ens CPU s':>9} {'CPU ratio':>9}"
    )
    ratios, ratios2, cpu_ratios = {}, {}, {}
    for name, t in rows.items():
        ratios[name] = t["ensemble"] / (K * t["lone"])
        ratios2[name] = t["ensemble2"] / (K * t["lone"])
        cpu_ratios[name] = t["ensemble_cpu"] / (K * t["lone_cpu"])
        print(
            f"{name:<12} {t['lone']:10.2f} {K * t['lone']:9.2f} {t['ensemble']:10.2f}"
            f" {ratios[name]:6.3f} {t['ensemble2']:11.2f} {ratios2[name]:6.3f}"
            f" {t['lone_cpu']:10.2f} {t['ensemble_cpu']:9.2f} {cpu_ratios[name]:9.3f}"
        )
    print(
        "CPU time (user+sys of this process) per member / lone run: "
        f"FCN {cpu_ratios['FCN']:.2f}, transformer {cpu_ratios['transformer']:.2f}"
    )
    print(
        "the ensemble on two threads, per member / lone run: "
        f"FCN {ratios2['FCN']:.2f}, transformer {ratios2['transformer']:.2f}"
    )
    print(
        "ensemble cost per member / lone run: "
        f"FCN {ratios['FCN']:.2f}, transformer {ratios['transformer']:.2f}"
    )


if __name__ == "__main__":
    main()
