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
from dynascope.studies.verdict import Precondition, Verdict

from .figures import figures
from .protocol import B1_EDGE, B2_FLOOR, B3_LAZY, FIT_MSE, PROTOCOL, VERDICT_D
from .runs import BottleneckRun

__all__ = ["add_lazy_ratios", "analyze", "measure_run", "verdicts_from_rows"]

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
    budget + 1, a lower bound; the lazy twin's are exact, from its kernel's eigenbasis, so
    never censored), movement, eNTK change, stability."""
    cfg = BottleneckRun.model_validate(run.config)
    reached = _first_at_or_below(run, cfg.mse_target) if run.status == "finished" else NAN
    budget = float(cfg.loop.steps + 1)
    if cfg.net == "bottleneck_lazy" and run.status == "finished":
        reached = budget = last_or_nan(run, "kgd.steps_to_target")  # inf: never
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


def _fit(rows: list[dict], nets: tuple[str, ...]) -> Precondition:
    """Every run of ``nets`` finished with train MSE <= FIT_MSE (it trained); measured: the
    worst final MSE."""
    mine = [r for r in rows if r["net"] in nets]
    worst = max((r["final mse"] for r in mine), default=NAN)
    ok = bool(mine) and all(r["status"] == "finished" for r in mine)
    return Precondition(
        f"every {'/'.join(nets)} run finished with final train MSE <= {FIT_MSE:g} (it "
        f"trained; worst {worst:.3g})",
        ok and bool(worst <= FIT_MSE),
        worst,
    )


def _both(*pres: Precondition) -> Precondition:
    return Precondition("; ".join(p.text for p in pres), all(p.met for p in pres), pres[0].measured)


def verdicts_from_rows(rows: list[dict]) -> list[Verdict]:
    """b1-b3 from the measured rows (thresholds, statistics, controls: ``PROTOCOL``)."""
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
    censored = [f"{s}/n={n}" for s in seeds for n, r in sorted(bott.get(s, {}).items())
                if math.isnan(r["steps_to_target"])]  # fmt: skip
    b1_pre = _both(
        Precondition(
            "the analytic-NTK kernel GD reaches the target in every seed, GD is stable at init "
            f"((lr/N) λ_max(Θ0) < 2; max {np.nanmax(stab):.3g}) and along every bottleneck "
            f"run, off the edge of stability ((lr/N) λ_max(Θt) < {B1_EDGE:g} at every logged "
            f"step; max {edge_max:.3g}), and every bottleneck and kernel run finished",
            bool(k_reached and all(k_reached) and np.nanmax(stab) < 2 and finished
                 and not edge_max >= B1_EDGE),
            float(np.mean([k["steps_to_target"] for k in kernel.values()])) if kernel else NAN,
        ),
        _fit(rows, ("bottleneck",)),
    )  # fmt: skip
    move_pre = _fit(rows, ("bottleneck", "wide"))
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
        + ", lazy twin (exact) "
        + ", ".join(f"n={n}: {r['steps_or_budget']:g}" for n, r in sorted(lazy.get(s, {}).items()))
        for s in seeds
        if s in kernel
    )
    steps_note += (
        f". Censored bottleneck runs (never within the budget; their ratio is a lower bound): "
        f"{', '.join(censored) or 'none'}"
    )
    return [
        PROTOCOL.claim("b1").judge(
            {s: ratio(bott, s) for s in seeds},
            precondition=b1_pre,
            control={s: ratio(lazy, s) for s in seeds},
            detail=steps_note,
        ),
        PROTOCOL.claim("b2").judge(
            {s: _spread(bott.get(s, {})) for s in seeds},
            precondition=move_pre,
            control={s: _spread(wide.get(s, {})) for s in seeds},
        ),
        PROTOCOL.claim("b3").judge(
            {s: _slope(wide.get(s, {}), "movement") for s in seeds},
            precondition=b3_pre,
            control={s: _slope(bott.get(s, {}), "movement") for s in seeds},
        ),
    ]


def analyze(runs: dict[str, Run], out: Path) -> Analysis:
    """Verdicts b1-b3; loss curves and movement-vs-width figures."""
    rows = [measure_run(name, run) for name, run in sorted(runs.items())]
    add_lazy_ratios(rows, runs)
    rows.sort(key=lambda r: (r["net"], r["d"], r["n"], r["seed"]))
    return Analysis(verdicts_from_rows(rows), figures(rows, runs, out), {"runs": rows})
