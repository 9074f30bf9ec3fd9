"""Ensembles on the engine: K = 8 members as one stacked run against 8 lone runs, side by side.

Two workloads, each trained for the same number of steps (a) as 8 lone runs one after
another and (b) as one K = 8 ensemble (parameters stacked, loss vectorized with vmap, the FCN's
layers batched as ``baddbmm`` on the stack, one stacked Adam):

- FCN: the slingshot FCN 64-64-64-10 (ReLU), full batch on 200 digits, Adam 1e-3;
- transformer: the randomized-algorithms recall transformer at its fast size (2 layers,
  d_model 32, one linear-attention head of d_head 4, no MLP, no LayerNorm; recall N = 12 keys,
  b = 4 value bits), batch 128, Adam 1e-3.

Each run writes its own run directory (store, checkpoints at the end), as a study's would.
Times are wall-clock seconds on one intra-op thread (the engine's policy). The last line is

    ensemble cost per member / lone run: FCN X, transformer Y

with X = ensemble time / (8 x mean lone-run time). Goals (issue 17) on 2 cores: X <= 0.3,
Y <= 0.7. The table also gives the same ratio in process CPU time (user + sys), which a
machine shared with other jobs inflates far less than wall time.
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


def _time(build, steps: int, root: Path, tag: str) -> tuple[float, float, float, float]:
    """(lone wall s, ensemble wall s, lone CPU s, ensemble CPU s); lone: the mean of K."""
    loop = Loop(steps=steps, log_every=50, checkpoint_every=steps)
    start, cpu = time.perf_counter(), time.process_time()
    for k in range(K):
        Engine(Member(root / f"{tag}_lone{k}", k, {"seed": k}), build, loop).run()
    lone = (time.perf_counter() - start) / K
    lone_cpu = (time.process_time() - cpu) / K
    members = [Member(root / f"{tag}_ens{k}", k, {"seed": k}) for k in range(K)]
    start, cpu = time.perf_counter(), time.process_time()
    Engine(members, build, loop).run()
    return lone, time.perf_counter() - start, lone_cpu, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps-fcn", type=int, default=2000)
    parser.add_argument("--steps-transformer", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rows = {
            "FCN": _time(build_fcn, args.steps_fcn, root, "fcn"),
            "transformer": _time(build_recall, args.steps_transformer, root, "tr"),
        }
    print(
        f"{'workload':<12} {'lone run s':>10} {'8 lone s':>9} {'ensemble s':>10} {'ratio':>6}"
        f" {'lone CPU s':>10} {'ens CPU s':>9} {'CPU ratio':>9}"
    )
    ratios, cpu_ratios = {}, {}
    for name, (lone, ensemble, lone_cpu, ensemble_cpu) in rows.items():
        ratios[name] = ensemble / (K * lone)
        cpu_ratios[name] = ensemble_cpu / (K * lone_cpu)
        print(
            f"{name:<12} {lone:10.2f} {K * lone:9.2f} {ensemble:10.2f} {ratios[name]:6.3f}"
            f" {lone_cpu:10.2f} {ensemble_cpu:9.2f} {cpu_ratios[name]:9.3f}"
        )
    print(
        "CPU time (user+sys of this process) per member / lone run: "
        f"FCN {cpu_ratios['FCN']:.2f}, transformer {cpu_ratios['transformer']:.2f}"
    )
    print(
        "ensemble cost per member / lone run: "
        f"FCN {ratios['FCN']:.2f}, transformer {ratios['transformer']:.2f}"
    )


if __name__ == "__main__":
    main()
