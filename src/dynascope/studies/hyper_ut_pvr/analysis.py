"""hyper-ut-pvr verdicts u1-u3 on hop-PVR, judged per seed under the verdict contract, and the
paper preset's reported tables (protocol: ``protocol.py``; notes: docs/studies/hyper-ut-pvr.md).

Per seed ``s`` (the runs ``fixed_s{k}``, ``ut_act_s{k}``, ``hyper_ut_s{k}`` and
``ut_act_shuffled_s{k}`` share their seed and inputs):

- u1: ρ_s = Spearman ρ(h, ponder of UT-ACT at h) over the evaluated h. Control (ablation):
  the same ρ of UT-ACT trained on labels shuffled across the training set.
- u2: the worst accuracy over the trained h and both ACT models. Control (ablation): the same
  worst accuracy of the fixed-depth 2-layer baseline.
- u3: z_s = (acc(Hyper-UT, h_max) − acc(UT-ACT, h_max)) / SE at the largest, untrained h,
  SE = sqrt(2·¼ / eval_size) (one binomial standard error of a difference of two accuracies
  at p = ½). Control: the same z at the largest trained h.

Thresholds, directions, statistics and preconditions: :data:`.protocol.PROTOCOL`.
Preconditions: u1 and u3 presuppose that every model they read fits the trained hops in every
seed (worst trained-h accuracy >= u2's bar); u2 that every run it reads finished.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from dynascope.store import Run
from dynascope.studies._run_values import last_or_nan
from dynascope.studies.base import Analysis
from dynascope.studies.verdict import Precondition
from dynascope.tasks.pvr import AGGREGATIONS

from .figures import digits_figure, hops_figure, vector_figure, visual_figure
from .protocol import FIT_ACCURACY, PROTOCOL
from .runs import DIGITS_MODELS, TOKEN_MODELS, HopPVRRun, VectorPVRRun

__all__ = [
    "PAPER_LAYER_SAVING",
    "analyze",
    "digits_rows",
    "gap_standard_error",
    "vector_rows",
    "visual_rows",
]

PAPER_LAYER_SAVING = 0.70  # S8: "on average over 70% fewer layers" than ViT (reference only)
ACT_MODELS = ("ut_act", "hyper_ut")


def gap_standard_error(eval_size: int) -> float:
    """u3's unit: the binomial standard error of a difference of two accuracies, each measured
    on ``eval_size`` examples, at the largest binomial variance (p = ½): ``sqrt(2·¼ / n)``.

    Raises:
        ValueError: if ``eval_size`` < 1.
    """
    if eval_size < 1:
        raise ValueError(f"eval_size must be >= 1 (got {eval_size})")
    return math.sqrt(2 * 0.25 / eval_size)


def _at(run: Run, key: str, step: int | None = None) -> float:
    """Scalar ``key`` at ``step`` (None: the last logged), NaN if absent."""
    if step is None:
        return last_or_nan(run, key)
    try:
        series = run.scalar(key)
        return float(series.loc[step]) if step in series.index else float("nan")
    except KeyError:
        return float("nan")


def _rho(hops: list[int], ponder: list[float]) -> float:
    if any(not math.isfinite(p) for p in ponder) or len(set(ponder)) < 2:
        return float("nan")
    return float(spearmanr(hops, ponder).statistic)


def _seed_rows(runs: dict[str, Run], cfg: HopPVRRun) -> list[dict]:
    """Per seed: the claims' metrics, trained (last step) and untrained (step 0)."""
    rows = []
    k = 0
    se = gap_standard_error(cfg.eval_size)
    while f"ut_act_s{k}" in runs and f"hyper_ut_s{k}" in runs:
        ut, hyper = runs[f"ut_act_s{k}"], runs[f"hyper_ut_s{k}"]
        fixed, shuffled = runs.get(f"fixed_s{k}"), runs.get(f"ut_act_shuffled_s{k}")
        row: dict = {"seed": int(ut.config["seed"])}
        for tag, step in (("", None), ("init.", 0)):
            ponder = [_at(ut, f"eval.h{h}.ponder", step) for h in cfg.eval_hops]
            row[f"{tag}rho_ut"] = _rho(cfg.eval_hops, ponder)
            acc = {
                (m, h): _at(r, f"eval.h{h}.accuracy", step)
                for m, r in (("ut_act", ut), ("hyper_ut", hyper))
                for h in cfg.eval_hops
            }
            row[f"{tag}fit_ut"] = min(acc["ut_act", h] for h in cfg.train_hops)
            row[f"{tag}fit"] = min(acc[m, h] for m in ACT_MODELS for h in cfg.train_hops)
            h_max, h_trained = cfg.eval_hops[-1], max(cfg.train_hops)
            row[f"{tag}fit_hyper"] = min(acc["hyper_ut", h] for h in cfg.train_hops)
            row[f"{tag}gap"] = acc["hyper_ut", h_max] - acc["ut_act", h_max]
            row[f"{tag}gap_trained"] = acc["hyper_ut", h_trained] - acc["ut_act", h_trained]
        row["gap_z"], row["gap_trained_z"] = row["gap"] / se, row["gap_trained"] / se
        ponder = [_at(hyper, f"eval.h{h}.ponder") for h in cfg.eval_hops]
        row["rho_hyper"] = _rho(cfg.eval_hops, ponder)
        ponder = [_at(shuffled, f"eval.h{h}.ponder") if shuffled else math.nan
                  for h in cfg.eval_hops]  # fmt: skip
        row["rho_shuffled"] = _rho(cfg.eval_hops, ponder)
        row["fit_fixed"] = min(
            _at(fixed, f"eval.h{h}.accuracy") if fixed else math.nan for h in cfg.train_hops
        )
        row["finished"] = ut.status == "finished" and hyper.status == "finished"
        row["finished_shuffled"] = shuffled is not None and shuffled.status == "finished"
        row["finished_fixed"] = fixed is not None and fixed.status == "finished"
        rows.append(row)
        k += 1
    return rows


def _fit_precondition(rows: list[dict], keys: tuple[str, ...], who: str, extra: str = "",
                      also: bool = True) -> Precondition:  # fmt: skip
    """Every seed of every arm in ``keys`` fits: worst trained-h accuracy >= FIT_ACCURACY."""
    values = [r[key] for r in rows for key in keys]
    met = bool(values) and all(math.isfinite(v) and v >= FIT_ACCURACY for v in values) and also
    return Precondition(
        f"{who} fit the trained hops in every seed: worst trained-h accuracy >= "
        f"{FIT_ACCURACY:g} per arm and seed{extra} (measured: the worst)",
        met=met,
        measured=float(np.nanmin(values)) if values and not np.all(np.isnan(values)) else math.nan,
    )


def _verdicts(rows: list[dict], cfg: HopPVRRun) -> list:
    per = lambda key: {r["seed"]: r[key] for r in rows}  # noqa: E731
    h_max, h_trained = cfg.eval_hops[-1], max(cfg.train_hops)
    se = gap_standard_error(cfg.eval_size)
    finished = all(r["finished"] for r in rows)
    shuffled_ok = bool(rows) and all(r["finished_shuffled"] for r in rows)
    fixed_ok = bool(rows) and all(r["finished_fixed"] for r in rows)
    u1 = PROTOCOL.claim("u1").judge(
        per("rho_ut"),
        precondition=_fit_precondition(rows, ("fit_ut",), "UT-ACT",
                                       "; the shuffled-label UT-ACT finished", shuffled_ok),
        control=per("rho_shuffled"),
        detail="Hyper-UT's ρ per seed (reported): "
        + ", ".join(f"{r['rho_hyper']:.3g}" for r in rows),
    )  # fmt: skip
    u2 = PROTOCOL.claim("u2").judge(
        per("fit"),
        precondition=Precondition(
            "every ACT run and the fixed-depth baseline finished (none diverged)",
            met=bool(rows) and finished and fixed_ok,
        ),
        control=per("fit_fixed"),
        detail="fixed-depth 2-layer baseline's worst trained-h accuracy per seed: "
        + ", ".join(f"{r['fit_fixed']:.3g}" for r in rows),
    )
    u3 = PROTOCOL.claim("u3").judge(
        per("gap_z"),
        precondition=_fit_precondition(rows, ("fit_ut", "fit_hyper"), "UT-ACT and Hyper-UT"),
        control=per("gap_trained_z"),
        detail=f"h_max = {h_max} (untrained), control at h = {h_trained}; SE = sqrt(0.5 / "
        f"{cfg.eval_size}) = {se:.4f}; gaps in accuracy per seed: "
        + ", ".join(f"{r['gap']:.3g}" for r in rows),
    )
    return [u1, u2, u3]


def _hop_rows(by_model: dict[str, list[Run]], cfg: HopPVRRun) -> list[dict]:
    """Seed means per h: accuracy per model, ponder, fraction at T and halting at step 1."""

    def mean(model: str, h: int, stat: str) -> float:
        values = [last_or_nan(r, f"eval.h{h}.{stat}") for r in by_model.get(model, [])]
        return float(np.mean(values)) if values else float("nan")

    rows = []
    for h in cfg.eval_hops:
        row = {"h": h, "trained": h in cfg.train_hops, "majority": mean("fixed", h, "majority")}
        for model in TOKEN_MODELS:
            row[f"{model}.accuracy"] = mean(model, h, "accuracy")
        for model in ACT_MODELS:
            row[f"{model}.ponder"] = mean(model, h, "ponder")
            row[f"{model}.at_max"] = mean(model, h, "at_max")
            row[f"{model}.halt_at_1"] = mean(model, h, "halt_at_1")
        row["hyper_ut.mix_entropy"] = mean("hyper_ut", h, "mix_entropy")
        rows.append(row)
    return rows


def analyze(runs: dict[str, Run], figures: Path) -> Analysis:
    """Verdicts u1-u3 (per seed, with controls); the hop table and figure; the paper preset's
    vector-PVR, digits and visual-PVR tables (reported, not judged) when their runs exist."""
    vector = {n: r for n, r in runs.items() if n.startswith("vec_")}
    digits = {n: r for n, r in runs.items() if n.startswith("digits_")}
    visual = {n: r for n, r in runs.items() if n.startswith("vpvr_")}
    hop = {n: r for n, r in runs.items() if not n.startswith(("vec_", "digits_", "vpvr_"))}
    by_model: dict[str, list[Run]] = {}
    for name, run in sorted(hop.items()):
        by_model.setdefault(name.rsplit("_s", 1)[0], []).append(run)
    cfg = HopPVRRun.model_validate(next(iter(hop.values())).config)
    seed_rows = _seed_rows(hop, cfg)
    rows = _hop_rows(by_model, cfg)
    tables = {"per hop count": rows, "per seed": seed_rows}
    paths = [hops_figure(by_model, rows, figures)]
    if vector:
        tables["vector PVR per m and aggregation (seed means)"] = vector_table = vector_rows(vector)
        paths.append(vector_figure(vector_table, figures))
    if digits:
        tables["digits: ViT vs adaptive depth (seed means)"] = digits_table = digits_rows(digits)
        paths.append(digits_figure(digits_table, figures))
    if visual:
        tables["visual PVR on digit tiles (seed means)"] = visual_table = visual_rows(visual)
        paths.append(visual_figure(visual_table, figures))
    return Analysis(_verdicts(seed_rows, cfg), paths, tables)


# -- the paper preset's reported tables -----------------------------------------------------------
def _mean(runs: list[Run], key: str) -> float:
    return float(np.mean([last_or_nan(r, key) for r in runs])) if runs else float("nan")


def vector_rows(runs: dict[str, Run]) -> list[dict]:
    """One row per (m, agg): seed-mean standard and adversarial accuracy per model."""
    groups: dict[tuple[int, str], dict[str, list[Run]]] = {}
    for run in runs.values():
        cfg = VectorPVRRun.model_validate(run.config)
        groups.setdefault((cfg.complexity, cfg.agg), {}).setdefault(cfg.model, []).append(run)
    rows = []
    order = lambda kv: (kv[0][0], AGGREGATIONS.index(kv[0][1]))  # noqa: E731
    for (m, agg), by_model in sorted(groups.items(), key=order):
        first = next(iter(by_model.values()))[0]
        row = {"m": m, "agg": agg, "holdout": first.config["holdout"]}
        row["majority"] = last_or_nan(first, "eval.standard.majority")
        for model in TOKEN_MODELS:
            group = by_model.get(model, [])
            row[f"{model}.standard"] = _mean(group, "eval.standard.accuracy")
            row[f"{model}.adversarial"] = _mean(group, "eval.adversarial.accuracy")
        for model in ACT_MODELS:
            row[f"{model}.ponder"] = _mean(by_model.get(model, []), "eval.standard.ponder")
        rows.append(row)
    return rows


def digits_rows(runs: dict[str, Run]) -> list[dict]:
    """One row per model: seed-mean accuracy, mean layers, and the comparison with the ViT.

    The saving uses S8's ponder ``n + rem``, which counts a halt at step 1 as 2 (rem = 1);
    ``saving by n alone`` counts only the weighted block applications (NaN for the ViT).
    """
    by_model: dict[str, list[Run]] = {}
    for run in runs.values():
        by_model.setdefault(run.config["model"], []).append(run)
    vit_acc = _mean(by_model.get("vit", []), "eval.accuracy")
    vit_layers = _mean(by_model.get("vit", []), "eval.layers")
    rows = []
    for model in DIGITS_MODELS:
        group = by_model.get(model, [])
        if not group:
            continue
        acc, layers = _mean(group, "eval.accuracy"), _mean(group, "eval.layers")
        rows.append({
            "model": model, "seeds": len(group), "accuracy": acc, "accuracy − ViT": acc - vit_acc,
            "mean layers": layers, "mean steps n": _mean(group, "eval.steps"),
            "at T": _mean(group, "eval.at_max"), "layer saving vs ViT": 1.0 - layers / vit_layers,
            "saving by n alone": 1.0 - _mean(group, "eval.steps") / vit_layers,
            "paper's saving": PAPER_LAYER_SAVING if model == "hyper_ut" else float("nan"),
        })  # fmt: skip
    return rows


def visual_rows(runs: dict[str, Run]) -> list[dict]:
    """One row per m: seed-mean accuracy and mean layers per model, and the majority class."""
    groups: dict[int, dict[str, list[Run]]] = {}
    for run in runs.values():
        groups.setdefault(run.config["complexity"], {}).setdefault(run.config["model"], [])
        groups[run.config["complexity"]][run.config["model"]].append(run)
    rows = []
    for m, by_model in sorted(groups.items()):
        first = next(iter(by_model.values()))[0]
        row = {"m": m, "agg": first.config["agg"], "majority": last_or_nan(first, "eval.majority")}
        for model in DIGITS_MODELS:
            row[f"{model}.accuracy"] = _mean(by_model.get(model, []), "eval.accuracy")
            row[f"{model}.layers"] = _mean(by_model.get(model, []), "eval.layers")
        rows.append(row)
    return rows
