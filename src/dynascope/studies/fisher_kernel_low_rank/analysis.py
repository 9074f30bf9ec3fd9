"""Verdicts of ``fisher-kernel-low-rank`` on the verdict contract: each claim judged through its
spec in :mod:`.protocol` (thresholds, directions, preconditions, controls), f1 and f3 against the
shuffled-label arm (notes: docs/studies/fisher-kernel-low-rank.md)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from dynascope.store import Run
from dynascope.studies.base import Analysis
from dynascope.studies.verdict import Precondition, Verdict

from .figures import figures
from .protocol import FIT_ACCURACY, FIT_LOSS, PROTOCOL
from .runs import FEW_EXAMPLES, FisherKernelRun

__all__ = ["analyze", "measure_run", "verdicts_from_rows"]

VERDICT_K = 32
NAN = float("nan")
_KEYS = ("f1.energy_fraction", "f2.captured_energy", "control.random_energy",
         "probe.nfk.accuracy", "probe.nfk_shuffled.accuracy", "probe.penultimate.accuracy",
         "test.accuracy", "fisher.share_rare", "fisher.share_few_examples",
         "f1.energy_fraction_identity", "nystrom.max_error", "train.loss")  # fmt: skip


def _at(run: Run, key: str, first: bool) -> float:
    try:
        series = run.scalar(key)
    except KeyError:
        return NAN
    if series.empty:
        return NAN
    return float(series.iloc[0] if first else series.iloc[-1])


def measure_run(name: str, run: Run) -> dict:
    """The end-of-training values, and ``init.*`` = the same at step 0 (untrained)."""
    cfg = FisherKernelRun.model_validate(run.config)
    row = {"run": name, "model": cfg.model, "k": cfg.k, "seed": cfg.seed, "status": run.status,
           "shuffled": cfg.shuffle_labels}  # fmt: skip
    done = run.status == "finished"
    for key in _KEYS:
        row[key] = _at(run, key, first=False) if done else NAN
        row["init." + key] = _at(run, key, first=True)
    row["probe gap"] = row["probe.nfk.accuracy"] - row["probe.penultimate.accuracy"]
    row["shuffled gap"] = row["probe.nfk_shuffled.accuracy"] - row["probe.penultimate.accuracy"]
    return row


def _fit(rows: list[dict], key: str, bar: float, direction: str) -> tuple[bool, float]:
    """(every row finished and passes ``key`` against ``bar``, the worst value); (False, NaN)
    with no rows."""
    values = [r.get(key, NAN) for r in rows]
    if not rows or any(math.isnan(v) for v in values):
        return False, NAN
    worst = min(values) if direction == ">=" else max(values)
    passes = worst >= bar if direction == ">=" else worst <= bar
    return bool(passes and all(r["status"] == "finished" for r in rows)), float(worst)


def verdicts_from_rows(rows: list[dict]) -> list[Verdict]:
    """f1-f3 over seeds, read on the MLP k = 32 runs (or every run's k when there are none):
    the task arm (true labels) and, for f1/f3's controls, the shuffled-label arm.

    Args:
        rows: :func:`measure_run` rows (``shuffled`` marks the ablation arm).
    Returns:
        The verdicts f1, f2 (identity), f3, judged by :data:`.protocol.PROTOCOL`.
    """
    chosen = [r for r in rows if r["k"] == VERDICT_K and r["model"] == "mlp"] or rows
    task = [r for r in chosen if not r.get("shuffled", False)]
    ablation = [r for r in chosen if r.get("shuffled", False)]
    by_seed = {r["seed"]: r for r in task}
    ablated = {r["seed"]: r for r in ablation}

    def per(arm: dict[int, dict], key: str) -> dict[int, float]:
        return {s: r.get(key, NAN) for s, r in sorted(arm.items())}

    task_ok, worst_acc = _fit(task, "test.accuracy", FIT_ACCURACY, ">=")
    shuffled_ok, worst_loss = _fit(ablation, "train.loss", FIT_LOSS, "<=")
    trained = Precondition(
        f"every task-arm seed finished and learnt the task (test accuracy >= {FIT_ACCURACY:g}; "
        "measured: the lowest)",
        task_ok,
        worst_acc,
    )
    both = Precondition(
        f"every task-arm seed finished with test accuracy >= {FIT_ACCURACY:g} (lowest "
        f"{worst_acc:.3g}) and every shuffled-label seed finished with final training loss <= "
        f"{FIT_LOSS:.3f} nats (measured: the highest)",
        task_ok and shuffled_ok,
        worst_loss if task_ok else worst_acc,
    )
    k = task[0]["k"] if task else VERDICT_K

    def mean(key: str) -> float:
        values = [r.get(key, NAN) for r in task]
        return float(np.nanmean(values)) if not np.isnan(values).all() else NAN

    identity = ", ".join(f"{r.get('f1.energy_fraction_identity', NAN):.3f}" for r in task)
    init = ", ".join(f"{r.get('init.f1.energy_fraction', NAN):.3f}" for r in task)
    random = ", ".join(f"{r.get('control.random_energy', NAN):.3f}" for r in task)
    # f3's control: the shuffled-label classifier's NFK probe against the task arm's yardstick
    yardstick = per(by_seed, "probe.penultimate.accuracy")
    control_gap = {
        s: r.get("probe.nfk.accuracy", NAN) - yardstick.get(s, NAN) for s, r in ablated.items()
    }
    return [
        PROTOCOL.claim("f1").judge(
            per(by_seed, "f1.energy_fraction"),
            precondition=both,
            control=per(ablated, "f1.energy_fraction"),
            detail=f"k = {k}; diagnostics, not gated (seed means): share of parameters with "
            f"D_jj < 1e-3 mean(D) {mean('fisher.share_rare'):.3f}; share whose score is "
            f"non-zero on 1..{FEW_EXAMPLES} of the scored examples "
            f"{mean('fisher.share_few_examples'):.3f}; the same top-k fraction without the "
            f"Fisher whitening (D = I) per seed: {identity}; at step 0 (untrained): {init}",
        ),
        PROTOCOL.claim("f2").judge(
            per(by_seed, "f2.captured_energy"),
            precondition=trained,
            control=None,
            detail=f"k = {k}; for scale, k random orthonormal directions capture: {random}",
        ),
        PROTOCOL.claim("f3").judge(
            per(by_seed, "probe gap"),
            precondition=both,
            control=control_gap,
            detail=f"k = {k}; NFK probe on shuffled-probe labels (diagnostic) per seed: "
            + ", ".join(f"{r.get('shuffled gap', NAN):+.3f}" for r in task),
        ),
    ]


def analyze(runs: dict[str, Run], out: Path) -> Analysis:
    """Verdicts f1-f3; eigenvalue-decay and fidelity figures."""
    rows = [measure_run(name, run) for name, run in sorted(runs.items())]
    rows.sort(key=lambda r: (r["model"], r["k"], r["seed"]))
    rows = [{k: (v if not (isinstance(v, float) and math.isnan(v)) else NAN) for k, v in r.items()}
            for r in rows]  # fmt: skip
    return Analysis(verdicts_from_rows(rows), figures(rows, runs, out),
                    {"runs: NFK spectrum and probes": rows})  # fmt: skip
