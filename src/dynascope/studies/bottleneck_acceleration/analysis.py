"""Verdicts of ``bottleneck-acceleration`` on the verdict contract (claims, metrics, thresholds
and how they were fixed: docs/studies/bottleneck-acceleration.md)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from dynascope.store import Run
from dynascope.studies._run_values import last_or_nan
from dynascope.studies.base import Analysis
from dynascope.studies.verdict import Control, Precondition, Verdict, judge

from .figures import figures
from .runs import BottleneckRun

__all__ = [
    "B1_RATIO",
    "B2_SPREAD",
    "B3_LAZY",
    "B3_SLOPE",
    "add_lazy_ratios",
    "analyze",
    "measure_run",
    "verdicts_from_rows",
]

B1_RATIO = 0.5  # S16: the bottleneck needs at most half the steps
B1_EDGE = 2.0  # GD stability: (lr/N) lambda_max(Theta_t) < 2 along every bottleneck run
B2_SPREAD = 1.5  # S16: codes move Theta(1): max / min over widths
B2_FLOOR = 0.1  # and every width moves by >= 0.1 (else the spread is inf)
B3_SLOPE = -0.4  # S16: all-wide movement ~ n^-1/2 (theory -0.5)
B3_LAZY = 2.0  # precondition: the widest all-wide net's MSE within this factor of its limit's
VERDICT_D = 4
NAN = float("nan")


def _first_at_or_below(run: Run, target: float) -> float:
    """First logged step whose ``train.mse`` is <= target (NaN: never, or nothing logged)."""
    try:
        mse = run.scalar("train.mse")
    except KeyError:
        return NAN
    hit = mse.index[mse.values <= target]
    return float(hit[0]) if len(hit) else NAN


def measure_run(name: str, run: Run) -> dict[str, Any]:
    """One row per run: steps to the target (``steps_or_budget``: never or diverged = the
    budget + 1, a lower bound), movement, eNTK change, stability."""
    cfg = BottleneckRun.model_validate(run.config)
    reached = _first_at_or_below(run, cfg.mse_target) if run.status == "finished" else NAN
    budget = float(cfg.loop.steps + 1)
    return {
        "run": name, "net": cfg.net, "n": cfg.width, "d": cfg.bottleneck, "seed": cfg.seed,
        "status": run.status, "steps_to_target": reached,
        "steps_or_budget": budget if math.isnan(reached) else reached,
        "final mse": last_or_nan(run, "train.mse"),
        "movement": last_or_nan(run, "movement") if run.status == "finished" else NAN,
        "ntk change": last_or_nan(run, "ntk.relative_change"),
        "(lr/N) λ_max(Θ0)": last_or_nan(run, "stability.eta_lambda_over_N"),
        "max (lr/N) λ_max(Θt)": _max_or_nan(run, "stability.sharpness"),
        "MSE / limit's": NAN,  # all-wide nets: set by analyze (laziness, b3's precondition)
    }  # fmt: skip


def _max_or_nan(run: Run, key: str) -> float:
    """Largest logged value of ``key`` (NaN: not logged)."""
    try:
        values = run.scalar(key).to_numpy()
    except KeyError:
        return NAN
    return float(np.nanmax(values)) if len(values) else NAN


def _mse_at(run: Run, step: int) -> float:
    """``train.mse`` at ``step`` (NaN where not logged)."""
    try:
        mse = run.scalar("train.mse")
    except KeyError:
        return NAN
    return float(mse.loc[step]) if step in mse.index else NAN


def add_lazy_ratios(rows: list[dict], runs: dict[str, Run]) -> None:
    """Each all-wide row's ``MSE / limit's``: its train MSE at its last step over the analytic-NTK
    kernel GD's (same seed) at that step; ~1 for a lazy net, < 1 for one that learns features
    and trains faster than its infinite-width limit."""
    kernels = {r["seed"]: runs[r["run"]] for r in rows if r["net"] == "kernel"}
    for r in rows:
        if r["net"] == "wide" and r["seed"] in kernels and r["status"] == "finished":
            steps = BottleneckRun.model_validate(runs[r["run"]].config).loop.steps
            r["MSE / limit's"] = _mse_at(runs[r["run"]], steps) / _mse_at(kernels[r["seed"]], steps)


def _select(rows: list[dict], net: str) -> dict[int, dict[int, dict]]:
    """seed -> width -> row (bottleneck arms at d = VERDICT_D)."""
    out: dict[int, dict[int, dict]] = {}
    for r in rows:
        if r["net"] == net and (net in ("wide", "kernel") or r["d"] == VERDICT_D):
            out.setdefault(r["seed"], {})[r["n"]] = r
    return out


def _slope(by_n: dict[int, dict], key: str) -> float:
    ns = sorted(by_n)
    vals = [by_n[n][key] for n in ns]
    if len(ns) < 2 or not all(v > 0 for v in vals):
        return NAN
    return float(np.polyfit(np.log(ns), np.log(vals), 1)[0])


def _spread(by_n: dict[int, dict]) -> float:
    vals = [r["movement"] for r in by_n.values()]
    if not vals or not all(np.isfinite(vals)):
        return NAN
    return max(vals) / min(vals) if min(vals) >= B2_FLOOR else math.inf


def verdicts_from_rows(rows: list[dict]) -> list[Verdict]:
    """b1-b3 from the measured rows."""
    kernel = {s: next(iter(v.values())) for s, v in _select(rows, "kernel").items()}
    bott, lazy, wide = (_select(rows, k) for k in ("bottleneck", "bottleneck_lazy", "wide"))
    seeds = sorted(set(kernel) | set(bott) | set(wide))

    def ratio(arm: dict[int, dict[int, dict]], s: int) -> float:
        k = kernel.get(s)
        if k is None or math.isnan(k["steps_to_target"]) or not arm.get(s):
            return NAN
        return max(r["steps_or_budget"] for r in arm[s].values()) / k["steps_to_target"]

    k_reached = [not math.isnan(k["steps_to_target"]) for k in kernel.values()]
    stab = [r["(lr/N) λ_max(Θ0)"] for r in rows]
    edge = [r.get("max (lr/N) λ_max(Θt)", NAN) for s in bott.values() for r in s.values()]
    edge_max = float(np.nanmax(edge)) if np.isfinite(edge).any() else NAN
    finished = all(r["status"] == "finished" for r in rows if r["net"] != "wide")
    b1_pre = Precondition(
        "the analytic-NTK kernel GD reaches the target in every seed, GD is stable at init "
        f"((lr/N) λ_max(Θ0) < 2; max {np.nanmax(stab):.3g}) and along every bottleneck run, "
        f"off the edge of stability ((lr/N) λ_max(Θt) < {B1_EDGE:g} at every logged step; "
        f"max {edge_max:.3g}), and every bottleneck and kernel run finished",
        bool(k_reached and all(k_reached) and np.nanmax(stab) < 2 and finished
             and not edge_max >= B1_EDGE),
        float(np.mean([k["steps_to_target"] for k in kernel.values()])) if kernel else NAN,
    )  # fmt: skip
    move_pre = Precondition(
        "every net run finished (movement is read at the end)",
        all(r["status"] == "finished" for r in rows if r["net"] in ("wide", "bottleneck")),
    )
    near = [wide[s][max(wide[s])]["MSE / limit's"] for s in seeds if wide.get(s)]
    worst_lazy = max((abs(math.log(v)) if v > 0 else math.inf for v in near), default=NAN)
    b3_pre = Precondition(
        f"{move_pre.text}, and the all-wide nets are near their lazy infinite-width limit, where "
        f"the n^-1/2 law applies: at the widest all-wide width, train MSE at the last step "
        f"within a factor {B3_LAZY:g} of the analytic-NTK kernel GD's at that step in every seed "
        "(MSE / the limit's per seed: " + ", ".join(f"{v:.3g}" for v in near)
        + "; measured: the factor furthest from 1)",
        bool(move_pre.met and near and len(near) == len(seeds)
             and worst_lazy <= math.log(B3_LAZY) + 1e-12),
        float(math.exp(worst_lazy)) if near else NAN,
    )  # fmt: skip
    steps_note = "; ".join(
        f"seed {s}: kernel GD {kernel[s]['steps_to_target']:g}, bottleneck "
        + ", ".join(f"n={n}: {r['steps_or_budget']:g}" for n, r in sorted(bott.get(s, {}).items()))
        for s in seeds
        if s in kernel
    )
    return [
        judge(
            claim=f"b1: the bottleneck net (d={VERDICT_D}) reaches train MSE <= 1e-3 in at most "
            "half the steps of the all-wide net's infinite-width limit (kernel GD), each at the "
            "same step in units of its own kernel at init (lr = c N / λ_max(Θ0))",
            metric="max over n of steps(bottleneck) / steps(analytic-NTK kernel GD); never = "
            "the budget + 1",
            per_seed={s: ratio(bott, s) for s in seeds},
            threshold=B1_RATIO,
            direction="<=",
            precondition=b1_pre,
            control=Control(
                "the same ratio for the bottleneck net's own lazy twin (kernel GD with its eNTK "
                "at init): kernel scale without feature learning",
                per_seed={s: ratio(lazy, s) for s in seeds},
            ),
            detail=steps_note,
        ),
        judge(
            claim="b2: the bottleneck codes move by Θ(1) at every width",
            metric="max over n / min over n of ||Z_T - Z_0||_F / ||Z_0||_F (inf if any < 0.1)",
            per_seed={s: _spread(bott.get(s, {})) for s in seeds},
            threshold=B2_SPREAD,
            direction="<=",
            precondition=move_pre,
            control=Control(
                "the same spread of the all-wide net's middle layer H (freezes with width)",
                per_seed={s: _spread(wide.get(s, {})) for s in seeds},
            ),
        ),
        judge(
            claim="b3: the all-wide net's middle-layer features freeze as width^-1/2",
            metric="least-squares slope of log ||H_T - H_0||_F / ||H_0||_F vs log n",
            per_seed={s: _slope(wide.get(s, {}), "movement") for s in seeds},
            threshold=B3_SLOPE,
            direction="<=",
            precondition=b3_pre,
            control=Control(
                "the same slope for the bottleneck codes Z",
                per_seed={s: _slope(bott.get(s, {}), "movement") for s in seeds},
            ),
        ),
    ]


def analyze(runs: dict[str, Run], out: Path) -> Analysis:
    """Verdicts b1-b3; loss curves and movement-vs-width figures."""
    rows = [measure_run(name, run) for name, run in sorted(runs.items())]
    add_lazy_ratios(rows, runs)
    rows.sort(key=lambda r: (r["net"], r["d"], r["n"], r["seed"]))
    return Analysis(verdicts_from_rows(rows), figures(rows, runs, out), {"runs": rows})
