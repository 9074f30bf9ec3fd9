"""σReparam analysis: collapse and instability of the baseline (judged apart), σReparam at the
collapse LR, and the unit checks. Thresholds and rules: ``docs/studies/sigma-reparam-entropy.md``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from dynascope.store import Run
from dynascope.studies.base import Analysis, Verdict
from dynascope.studies.verdict import Control, Precondition, judge

from .figures import GLOBAL, METHODS, MIN_HEAD, sweep_figures
from .runs import CONTROL_DIFF_KEY, CONTROL_ERROR_KEY, DIFF_KEY, ERROR_KEY

__all__ = ["METHODS", "analyze"]

# Frozen thresholds (S12's proposals; see "Calibration" in the module docstring).
COLLAPSE_FRACTION = 0.2  # final global entropy < 0.2·log T: collapsed
KEEP_FRACTION = 0.5  # σReparam keeps global entropy > 0.5·log T at every logged step
ACCURACY_MIN = 0.90  # σReparam's validation accuracy at LR*
OSCILLATION_RATIO = 2.0  # tail mean train loss > 2× the minimum: oscillating
TAIL_FRACTION = 0.1  # the tail: the last 10% of the steps
DIVERGED_RATIO = 1e6  # the instability ratio of a diverged run (its own ratio is inf)
U1_ATOL = 1e-6
U2_RTOL = 0.01


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
    u1 = judge(
        claim="u1: σReparam nn.Linear equals the plain Linear at init (γ = σ₀)",
        metric="max |SN(x) − Linear(x)| at init, float32, per seed",
        per_seed=pick("diff"),
        threshold=U1_ATOL,
        direction="<=",
        precondition=ran,
        control=Control("σReparam with γ = 1 (not σ₀), the same difference", pick("diff_control")),
    )
    u2 = judge(
        claim="u2: the running σ tracks ‖W‖₂ under slow drift",
        metric=f"|σ_running / ‖W‖₂ − 1| after {steps} drift steps, per seed",
        per_seed=pick("err"),
        threshold=U2_RTOL,
        direction="<=",
        precondition=ran,
        control=Control(
            "σ from one power iteration started at a fresh random u each step (the persistent u "
            "removed), the same error",
            pick("err_control"),
        ),
        detail=f"largest error over the drift, any seed: {worst:.2e}",
    )
    return [u1, u2]


def _by_lr(rows: list[dict], method: str) -> dict[float, list[dict]]:
    out: dict[float, list[dict]] = {}
    for row in sorted(rows, key=lambda r: (r["lr"], r["seed"])):
        if row["method"] == method:
            out.setdefault(row["lr"], []).append(row)
    return out


def _rule(values: list[float], passes) -> bool:
    """The mean over seeds passes and >= 2/3 of the seeds pass (NaN fails)."""
    if not values or any(math.isnan(v) for v in values):
        return False
    return bool(passes(float(np.mean(values)))) and 3 * sum(map(passes, values)) >= 2 * len(values)


def _analyze_sweep(rows: list[dict]) -> list[Verdict]:
    """e1-collapse, e1-instability, e2-entropy, e2-accuracy; each over the seeds of one
    (variant, LR). LR* = the smallest swept LR above the control LR (the smallest) at which
    the baseline's final entropy collapses by the rule (the mean and 2/3 of the seeds)."""
    baseline, sigma = _by_lr(rows, "baseline"), _by_lr(rows, "sigma")
    if not baseline:
        return []
    collapses = lambda v: v < COLLAPSE_FRACTION  # noqa: E731
    high, low = max(baseline), min(baseline)
    entropies = {lr: [r["final_entropy/logT"] for r in g] for lr, g in baseline.items()}
    collapsed = [lr for lr, v in entropies.items() if lr > low and _rule(v, collapses)]
    lr_star = min(collapsed) if collapsed else None
    at = lr_star if lr_star is not None else high  # where instability and e2 are judged
    note = f"LR* = {lr_star:g}" if lr_star is not None else "no swept LR collapses (no LR*)"
    by_seed = lambda group, key: {r["seed"]: float(r[key]) for r in group}  # noqa: E731
    has_star = Precondition(
        "the baseline collapses at a swept LR above the control LR (LR* exists)",
        met=lr_star is not None,
        measured=lr_star if lr_star is not None else math.nan,
    )
    e1 = judge(
        claim="e1-collapse: the baseline's attention entropy collapses at a high LR (Adam, no "
        "warmup)",
        metric="baseline final global entropy / log T at the largest swept LR, per seed",
        per_seed=by_seed(baseline[high], "final_entropy/logT"),
        threshold=COLLAPSE_FRACTION,
        direction="<=",
        precondition=Precondition(
            "the sweep has a control LR below the high one",
            met=low < high,
            measured=high / low,
        ),
        control=Control(
            f"the baseline at the control LR ({low:g}), the same entropy",
            by_seed(baseline[low], "final_entropy/logT"),
        ),
        detail=note,
    )
    # ratios capped at DIVERGED_RATIO; a non-finite loss (ratio inf) counts it: finite for judge
    ratio = lambda group: {  # noqa: E731
        k: min(v, DIVERGED_RATIO) for k, v in by_seed(group, "loss_tail/min").items()
    }
    e1b = judge(
        claim="e1-instability: at LR* the baseline's loss is unstable (diverges or oscillates)",
        metric="baseline train-loss mean over the last 10% of steps / its minimum at LR*, per "
        f"seed, capped at {DIVERGED_RATIO:g} (a non-finite loss counts {DIVERGED_RATIO:g})",
        per_seed=ratio(baseline[at]),
        threshold=OSCILLATION_RATIO,
        direction=">=",
        precondition=has_star,
        control=Control(
            f"the baseline at the control LR ({low:g}), the same ratio", ratio(baseline[low])
        ),
        detail=f"judged at lr={at:g}; {note}",
    )
    group = sigma.get(at, [])
    e2 = judge(
        claim="e2-entropy: at LR*, σReparam keeps the attention entropy above 0.5·log T",
        metric="σReparam min over logged steps of global entropy / log T at LR*, per seed",
        per_seed=by_seed(group, "min_entropy/logT"),
        threshold=KEEP_FRACTION,
        direction=">=",
        precondition=has_star,
        control=Control(
            f"the baseline at lr={at:g}, its min entropy", by_seed(baseline[at], "min_entropy/logT")
        ),
        detail=f"at lr={at:g}; {note}",
    )
    fit = [r["val.accuracy"] for r in baseline[low]]
    fits = _rule(fit, lambda v: v >= ACCURACY_MIN)
    e2b = judge(
        claim=f"e2-accuracy: at LR*, σReparam trains to validation accuracy >= {ACCURACY_MIN:g}",
        metric="σReparam last validation accuracy at LR*, per seed",
        per_seed=by_seed(group, "val.accuracy"),
        threshold=ACCURACY_MIN,
        direction=">=",
        precondition=Precondition(
            f"LR* exists, and the preset's steps suffice to fit: the baseline at the control LR "
            f"reaches val accuracy >= {ACCURACY_MIN:g} (mean and 2/3 of the seeds)",
            met=lr_star is not None and fits,
            measured=float(np.mean(fit)) if fit else math.nan,
        ),
        control=Control(
            f"the baseline at lr={at:g}, its val accuracy", by_seed(baseline[at], "val.accuracy")
        ),
        detail=f"at lr={at:g}; {note}; the baseline at the control LR: "
        + ", ".join(f"seed {r['seed']}: {r['val.accuracy']:.3g}" for r in baseline[low]),
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
