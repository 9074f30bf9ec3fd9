"""All instruments on one step axis: the LLC, per-head ΔW_QK rank and Adam's sharpness.

The run is the ViT of the gradual-rank study (S10, ``dynascope study run gradual-rank``), its
``fast`` preset's config: 2 layers, d_model 32, 2 heads (d_head 16), Adam η = 1e-3 on 8x8
digits (4x4 patches, batch 128), 4,000 steps. It trains once, on the engine, with three
instruments on one log-spaced schedule:

- ``delta_spectrum`` (named in the config, as the study names it): per head, the stable rank of
  ΔW_QK = W_QK(t) − W_QK(0), whose rise S10 reports;
- ``ds.probes.Sharpness`` given the run's Adam: λ_max(P⁻¹H), the preconditioned sharpness that
  Adam keeps below 38/η (Cohen et al. 2022), and the raw λ_max(H) beside GD's 2/η;
- ``ds.probes.LLC``: the local learning coefficient λ̂ by localized SGLD (Lau et al. 2023),
  with the same step size and localization at every reading (``LLC_*`` below).

Both loss-landscape probes take the training loss (mean cross-entropy, nats) on ``--held``
training images drawn once. ``--calibrate`` also runs ``llc_calibrate`` on the final weights
and prints what it chose, or why nothing passed. Writes the run directory (``run/``),
``steps.csv`` (one row per reading) and ``one_step_axis.png`` (three panels, shared x) to
``--out``; docs/instruments.md ("All instruments on one step axis") reads the figure.

Run: ``python examples/one_step_axis.py [--steps 4000] [--points 20] [--out DIR]``
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import torch
from torch import nn
from torch.func import functional_call

import dynascope as ds
from dynascope.config import RunConfig, build_model, build_task, validate_config
from dynascope.train import Engine, Member, SeedStreams, build_registry, loop_of

# The LLC's settings at every reading, in units of nβ = n / log n (n = 256 held images: 46.2).
LLC_STEP = 1 / 64  # ε·nβ
LLC_LOCALIZATION = 1 / 10  # γ / nβ
LLC_CHAINS = 2


def vit_config(steps: int, points: int) -> RunConfig:
    """S10's ``fast`` ViT config with ``steps`` Adam steps and ``points`` log-spaced readings."""
    vit = ds.studies.get("gradual-rank").presets["fast"]().vit
    return validate_config(
        vit.model_dump(mode="json"),
        [
            "name=one_step_axis",
            f"train.steps={steps}",
            f"train.checkpoint_every={steps}",
            f"train.eval_every={max(1, steps // 4)}",
            "train.checkpoint_history=none",
            f"monitor.points={points}",
        ],
    )


def train(config: RunConfig, run_dir: Path, held: dict, llc_draws: int) -> None:
    """Train ``config`` on the engine, with the Sharpness and LLC probes added to its own."""
    n_beta = ds.probes.default_n_beta(len(held["y"]))
    sharpness = ds.probes.Sharpness(batch=held, iters=20)
    llc = ds.probes.LLC(
        batch=held,
        n_beta=n_beta,
        step_size=LLC_STEP / n_beta,
        localization=LLC_LOCALIZATION * n_beta,
        n_chains=LLC_CHAINS,
        n_draws=llc_draws,
    )

    def build(streams: SeedStreams):
        parts = build_registry(config, streams)  # ViT, digits, Adam, delta_spectrum

        def optimizer(model: nn.Module) -> torch.optim.Optimizer:
            adam = parts.optimizer(model)
            sharpness.lr = adam  # its threshold reads this Adam's η, β₁ and second moments
            return adam

        probes = [*parts.probes, sharpness, llc]  # all on the config's log schedule
        return dataclasses.replace(parts, optimizer=optimizer, probes=probes)

    member = Member(run_dir, config.seed, config.model_dump(mode="json"))
    Engine(member, build, loop_of(config)).run()


def calibrate(config: RunConfig, run_dir: Path, held: dict, n_draws: int) -> str:
    """``llc_calibrate`` at the final checkpoint's weights on the held batch, as one line."""
    task = build_task(config.task)
    model = build_model(config.model, task).eval()
    state = torch.load(run_dir / "checkpoints" / f"step_{config.train.steps}.pt", weights_only=True)
    model.load_state_dict(state["model"])
    params = {name: p.detach() for name, p in model.named_parameters()}

    def loss_fn(p: dict, _: object) -> torch.Tensor:
        return task.loss(functional_call(model, p, (held["x"],)), held)

    n_beta = ds.probes.default_n_beta(len(held["y"]))
    try:
        cal = ds.probes.llc_calibrate(loss_fn, params, [None], n_beta=n_beta, n_draws=n_draws)
    except ValueError as err:
        return f"llc_calibrate at step {config.train.steps}: {err}"
    return (
        f"llc_calibrate at step {config.train.steps}: ε·nβ = {cal.step_size * n_beta:.4g}, "
        f"γ/nβ = {cal.localization / n_beta:.4g}, λ̂ = {cal.result.mean:.1f} ± {cal.result.std:.1f}"
    )


def table(run_dir: Path) -> pd.DataFrame:
    """One row per reading: LLC, per-head srank(ΔW_QK), sharpness, thresholds, held loss."""
    wide = ds.load_run(run_dir).scalars.pivot_table(index="step", columns="key", values="value")
    heads = sorted(k for k in wide.columns if k.startswith("L") and k.endswith(".dqk.stable_rank"))
    keep = [
        "llc.mean",
        "llc.std",
        *heads,
        "sharpness.lambda_max",
        "sharpness.two_over_lr",
        "sharpness.preconditioned_lambda_max",
        "sharpness.preconditioned_threshold",
        "sharpness.loss",
    ]
    return wide[[k for k in keep if k in wide.columns]].dropna(subset=["llc.mean"])


def plot(rows: pd.DataFrame, path: Path) -> None:
    """Three panels on one log step axis (step 0 cannot sit on it and is left off)."""
    rows = rows[rows.index > 0]
    steps = rows.index.to_numpy()
    fig, (top, mid, bottom) = plt.subplots(3, 1, sharex=True, figsize=(7, 8), layout="constrained")
    top.set_title("S10's ViT on digits, Adam η = 1e-3: one run, three instruments")
    mean, std = rows["llc.mean"], rows["llc.std"]
    top.plot(steps, mean, "o-", ms=3, color="C0")
    top.fill_between(steps, mean - std, mean + std, color="C0", alpha=0.25, lw=0)
    top.axhline(0, color="grey", lw=0.8)
    top.set_ylabel("LLC λ̂ (mean ± std\nover chains)")

    for i, key in enumerate(k for k in rows.columns if k.endswith(".dqk.stable_rank")):
        mid.plot(steps, rows[key], "o-", ms=3, color=f"C{i}", label=key.split(".dqk")[0])
    mid.set_ylabel("stable rank of ΔW_QK\n(per head)")
    mid.legend(title="layer.head", ncols=2, fontsize="small")

    raw = rows["sharpness.lambda_max"]
    bottom.plot(steps, raw, "o-", ms=3, color="C3", label="λ_max(H), nats/param²")
    bottom.axhline(rows["sharpness.two_over_lr"].iloc[-1], color="C3", ls=":", label="2/η (GD)")
    if "sharpness.preconditioned_lambda_max" in rows:
        pre = rows["sharpness.preconditioned_lambda_max"]
        bottom.plot(steps, pre, "o-", ms=3, color="C4", label="λ_max(P⁻¹H), 1/param")
        edge = rows["sharpness.preconditioned_threshold"].dropna().iloc[-1]
        bottom.axhline(edge, color="C4", ls="--", label="38/η (Adam, β₁ = 0.9)")
    bottom.set_yscale("log")
    bottom.set_ylabel("sharpness")
    bottom.set_xscale("log")
    bottom.set_xlabel("step (Adam updates, log scale)")
    bottom.legend(fontsize="small", ncols=2, loc="lower left")
    for ax in (top, mid, bottom):
        ax.grid(alpha=0.3)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4000, help="Adam steps (S10 fast: 4000)")
    parser.add_argument("--points", type=int, default=20, help="log-spaced readings")
    parser.add_argument("--held", type=int, default=256, help="training images the probes hold")
    parser.add_argument("--llc-draws", type=int, default=120, help="SGLD draws per chain")
    parser.add_argument("--calibrate", action="store_true", help="llc_calibrate at the end")
    parser.add_argument("--out", default="runs/examples/one_step_axis")
    args = parser.parse_args()
    out = Path(args.out)

    torch.set_num_threads(1)
    config = vit_config(args.steps, args.points)
    task = build_task(config.task)
    held = task.batch("train", args.held, torch.Generator().manual_seed(0))
    train(config, out / "run", held, args.llc_draws)
    rows = table(out / "run")
    rows.to_csv(out / "steps.csv")
    plot(rows, out / "one_step_axis.png")
    print(rows.to_string(float_format=lambda v: f"{v:.4g}"))
    if args.calibrate:
        print(calibrate(config, out / "run", held, args.llc_draws))
    print(f"figure written to {out / 'one_step_axis.png'}")


if __name__ == "__main__":
    main()
