"""σReparam analysis: collapse and instability of the baseline (judged apart), σReparam at the
collapse LR, and the unit checks, each judged through its spec in :mod:`.protocol` (thresholds,
statistics, fit preconditions per arm and seed, ablation controls). Notes:
``docs/studies/sigma-reparam-entropy.md``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from dynascope.store import Run
from dynascope.studies.base import Analysis, Verdict
from dynascope.studies.verdict import Precondition, interval_status, mean_interval

from .figures import GLOBAL, METHODS, MIN_HEAD, sweep_figures
from .protocol import (
    COLLAPSE_FRACTION,
    DIVERGED_RATIO,
    FIT_ACCURACY,
    OSCILLATION_RATIO,
    PROTOCOL,
    TAIL_FRACTION,
)
from .runs import CONTROL_DIFF_KEY, CONTROL_ERROR_KEY, DIFF_KEY, ERROR_KEY

__all__ = ["METHODS", "analyze"]

KEEP_FRACTION = PROTOCOL.claim("e2-entropy").threshold  # for the figures


# -- analysis ---------------------------------------------------------------------------------
def _series(run: Run, key: str):
    return run.scalar(key).dropna()


def _last(run: Run, key: str) -> float:
    series = _series(run, key)
    return float(series.iloc[-1]) if len(series) else float("nan")


def _loss_unstable(run: Run) -> tuple[bool, float]:
    """(unstable, tail mean / minimum of train.loss): diverged, non-finite, or tail > 2× min."""
    loss = run.scalar("train.loss")
    if run.status == "diverged" or (len(loss) and not np.isfinite(loss.to_numpy()).all()):
        return True, float("inf")
    if loss.empty:
        return False, float("nan")
    steps = int(run.config["train"]["steps"])
    tail = loss[loss.index > steps * (1 - TAIL_FRACTION)]
    if tail.empty:
        tail = loss.iloc[-1:]
    ratio = float(tail.mean() / loss.min()) if loss.min() > 0 else float("inf")
    return ratio > OSCILLATION_RATIO, ratio


def _row(run: Run) -> dict:
    unstable, ratio = _loss_unstable(run)
    entropy = _series(run, GLOBAL)
    final = float(entropy.iloc[-1]) if len(entropy) else float("nan")
    diverged_at = None
    if run.status == "diverged":
        events = run.events[run.events["kind"] == "diverged"]
        diverged_at = int(events["step"].iloc[-1]) if len(events) else None
    return {
        "method": "sigma" if run.config["model"].get("sigma_reparam") else "baseline",
        "lr": float(run.config["optimizer"]["lr"]),
        "seed": int(run.config["seed"]),
        "status": run.status,
        "diverged_at": diverged_at,
        "final_entropy/logT": final,
        "min_entropy/logT": float(entropy.min()) if len(entropy) else float("nan"),
        "final_min_head_entropy/logT": _last(run, MIN_HEAD),
        "collapsed_heads": _last(run, "attn.collapsed_heads"),
        "val.accuracy": _last(run, "val.accuracy"),
        "train.loss_final": _last(run, "train.loss"),
        "loss_tail/min": ratio,
        "loss_unstable": unstable,
        "collapsed": bool(final < COLLAPSE_FRACTION),  # entropy only (instability: apart)
        "entropy_nan": bool(run.scalar(GLOBAL).isna().any()),
        "finite": bool(
            run.status != "diverged"
            and np.isfinite(_last(run, "train.loss"))
            and np.isfinite(final)
        ),
    }


def _unit_values(run: Run) -> dict[str, float]:
    """u1's difference at init (step 0) and u2's final σ error, with their controls'."""

    def first(key: str) -> float:
        series = _series(run, key)
        return float(series.iloc[0]) if len(series) else math.nan

    return {
        "diff": first(DIFF_KEY),
        "diff_control": first(CONTROL_DIFF_KEY),
        "err": _last(run, ERROR_KEY),
        "err_control": _last(run, CONTROL_ERROR_KEY),
        "err_worst": float(_series(run, ERROR_KEY).max()),
        "steps": len(_series(run, ERROR_KEY)),
    }


def _analyze_units(units: dict[int, Run]) -> list[Verdict]:
    """u1/u2 over the unit-check seeds (``units``: seed -> run)."""
    values = {seed: _unit_values(run) for seed, run in sorted(units.items())}
    pick = lambda key: {seed: v[key] for seed, v in values.items()}  # noqa: E731
    finished = sum(run.status == "finished" for run in units.values())
    ran = Precondition(
        "every unit-check run finished", met=finished == len(units), measured=finished
    )
    worst = max((v["err_worst"] for v in values.values()), default=math.nan)
    steps = min((v["steps"] for v in values.values()), default=0)
    said = lambda key: ", ".join(f"{v[key]:.2g}" for v in values.values())  # noqa: E731
    u1 = PROTOCOL.claim("u1").judge(
        pick("diff"),
        precondition=ran,
        control=None,
        detail=f"for scale, the same difference with γ = 1 instead of σ₀: {said('diff_control')}",
    )
    u2 = PROTOCOL.claim("u2").judge(
        pick("err"),
        precondition=ran,
        control=None,
        detail=f"{steps} drift steps; largest error over the drift, any seed: {worst:.2e}; for "
        f"scale, σ from one power iteration from a fresh random u each step: "
        f"{said('err_control')}",
    )
    return [u1, u2]


def _by_lr(rows: list[dict], method: str) -> dict[float, list[dict]]:
    out: dict[float, list[dict]] = {}
    for row in sorted(rows, key=lambda r: (r["lr"], r["seed"])):
        if row["method"] == method:
            out.setdefault(row["lr"], []).append(row)
    return out


def _fits(groups: list[list[dict]], key: str, bar: float) -> tuple[bool, float]:
    """(every row of every group has ``key >= bar``, the lowest value); a missing group or a
    NaN fails."""
    values = [r[key] for g in groups for r in g]
    if not values or any(not g for g in groups) or any(math.isnan(v) for v in values):
        return False, math.nan
    return min(values) >= bar, float(min(values))


def _analyze_sweep(rows: list[dict]) -> list[Verdict]:
    """e1-collapse, e1-instability, e2-entropy, e2-accuracy; each over the seeds of one
    (variant, LR), judged through :data:`.protocol.PROTOCOL`. LR* = the smallest swept LR above
    the control LR (the smallest) whose baseline final entropy has its 95 % interval
    <= COLLAPSE_FRACTION (sec. 3 of arXiv 2303.06296: the collapse LR)."""
    baseline, sigma = _by_lr(rows, "baseline"), _by_lr(rows, "sigma")
    if not baseline:
        return []
    high, low = max(baseline), min(baseline)
    entropies = {lr: [r["final_entropy/logT"] for r in g] for lr, g in baseline.items()}
    collapsed = [
        lr
        for lr, v in entropies.items()
        if lr > low
        and interval_status(mean_interval(v), COLLAPSE_FRACTION, "<=") == "held"
        and not any(math.isnan(x) for x in v)
    ]
    lr_star = min(collapsed) if collapsed else None
    at = lr_star if lr_star is not None else high  # where instability and e2 are judged
    note = f"LR* = {lr_star:g}" if lr_star is not None else "no swept LR collapses (no LR*)"
    by_seed = lambda group, key: {r["seed"]: float(r[key]) for r in group}  # noqa: E731
    star = (lr_star is not None, lr_star if lr_star is not None else math.nan)
    star_text = (
        "LR* exists: a swept LR above the control LR where the baseline's final entropy "
        f"interval lies <= {COLLAPSE_FRACTION:g}·log T"
    )
    control_fits, control_worst = _fits([baseline[low]], "val.accuracy", FIT_ACCURACY)
    control_text = (
        f"the baseline at the control LR ({low:g}) reaches val accuracy >= {FIT_ACCURACY:g} in "
        f"every seed (lowest {control_worst:.3g})"
    )

    def finite(lr: float) -> bool:
        """Every seed of the baseline at ``lr`` ran, with a finite final loss and entropy."""
        return bool(baseline.get(lr)) and all(r["finite"] for r in baseline[lr])

    group = sigma.get(at, [])
    sigma_fits, sigma_worst = _fits([group], "val.accuracy", FIT_ACCURACY)

    def pre(*parts: tuple[str, bool, float]) -> Precondition:
        """All parts met; each unmet part's text ends in ``[NOT MET]``; measured: the first
        unmet part's value (NaN if none has one)."""
        unmet = [p for p in parts if not p[1]]
        return Precondition(
            "; ".join(p[0] + ("" if p[1] else " [NOT MET]") for p in parts),
            met=not unmet,
            measured=unmet[0][2] if unmet else parts[0][2],
        )

    e1 = PROTOCOL.claim("e1-collapse").judge(
        by_seed(baseline[high], "final_entropy/logT"),
        precondition=pre(
            (control_text, control_fits, control_worst),
            (
                f"every seed of the baseline at lr={high:g} has a finite final loss and entropy",
                finite(high),
                math.nan,
            ),
            ("the sweep has a control LR below the high one", low < high, high / low),
        ),
        control=by_seed(baseline[low], "final_entropy/logT"),
        detail=f"control: the baseline at lr={low:g}; {note}",
    )
    # ratios capped at DIVERGED_RATIO; a non-finite loss (ratio inf) counts it: finite for judge
    ratio = lambda group: {  # noqa: E731
        k: min(v, DIVERGED_RATIO) for k, v in by_seed(group, "loss_tail/min").items()
    }
    e1b = PROTOCOL.claim("e1-instability").judge(
        ratio(baseline[at]),
        precondition=pre((star_text, *star), (control_text, control_fits, control_worst)),
        control=ratio(baseline[low]),
        detail=f"judged at lr={at:g}, control the baseline at lr={low:g}; {note}; tail: the "
        f"last {TAIL_FRACTION:.0%} of steps, unstable above {OSCILLATION_RATIO:g}x",
    )
    e2 = PROTOCOL.claim("e2-entropy").judge(
        by_seed(group, "min_entropy/logT"),
        precondition=pre(
            (star_text, *star),
            (
                f"σReparam at lr={at:g} trains: val accuracy >= {FIT_ACCURACY:g} in every seed "
                f"(lowest {sigma_worst:.3g})",
                sigma_fits,
                sigma_worst,
            ),
            (control_text, control_fits, control_worst),
        ),
        control=by_seed(baseline[at], "min_entropy/logT"),
        detail=f"at lr={at:g}, control the baseline there; {note}; σReparam val accuracy: "
        + ", ".join(f"seed {r['seed']}: {r['val.accuracy']:.3g}" for r in group),
    )
    e2b = PROTOCOL.claim("e2-accuracy").judge(
        by_seed(group, "val.accuracy"),
        precondition=pre((star_text, *star), (control_text, control_fits, control_worst)),
        control=by_seed(baseline[at], "val.accuracy"),
        detail=f"at lr={at:g}, control the baseline there; {note}; the baseline at the control "
        "LR: " + ", ".join(f"seed {r['seed']}: {r['val.accuracy']:.3g}" for r in baseline[low]),
    )
    return [e1, e1b, e2, e2b]


def analyze(runs: dict[str, Run], figures: Path) -> Analysis:
    """Verdicts e1-collapse, e1-instability, e2-entropy, e2-accuracy, u1, u2; figures."""
    verdicts: list[Verdict] = []
    is_unit = lambda name: name.startswith("u_unit_checks")  # noqa: E731
    units = {int(run.config["seed"]): run for name, run in runs.items() if is_unit(name)}
    train_runs = [run for name, run in sorted(runs.items()) if not is_unit(name)]
    rows = [_row(run) for run in train_runs]
    verdicts += _analyze_sweep(rows)
    if units:
        verdicts += _analyze_units(units)
    order = sorted(range(len(rows)), key=lambda i: (rows[i]["lr"], rows[i]["method"]))
    rows = [rows[i] for i in order]
    train_runs = [train_runs[i] for i in order]
    figs = (
        sweep_figures(train_runs, rows, figures, COLLAPSE_FRACTION, KEEP_FRACTION) if rows else []
    )
    return Analysis(verdicts, figs, {"runs: entropy, loss and accuracy per variant and LR": rows})
