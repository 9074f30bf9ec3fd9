"""gated-rnn-attention verdicts g1, g1-f32, g2, g3, g4-lsa, g4-gd on the verdict contract, each
judged per seed (docs/studies/gated-rnn-attention.md)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from dynascope.store import Run
from dynascope.studies.base import Analysis, Verdict
from dynascope.studies.verdict import Control, Precondition, judge

from .figures import draw_figures, last, mean, tensor

__all__ = ["analyze", "ratio_standard_error"]

# Frozen thresholds (notes page).
G1_F64_ABS = 1e-6
G1_F32_REL = 1e-5
G2_NMSE = 1e-2
G2_SLOPE = -0.5  # g2-falls: nmse falls at least like d_hidden^-0.5
G3_NMSE_CHANGE = G2_NMSE  # pruning may cost at most what g2 calls a small nmse
G4_RATIO = 1.05
G4_REFERENCE_FIT = 0.5  # precondition: a reference's MSE <= this x the zero predictor's

_NAME = re.compile(r"^(?P<part>a_construction|b_teacher_h(?P<hidden>\d+)|c_icl_(?P<model>\w+?))"
                   r"_s(?P<i>\d+)$")  # fmt: skip


def _first(run: Run | None, key: str) -> float:
    """``key`` at step 0 (the untrained model), NaN where missing."""
    if run is None or run.status != "finished":
        return math.nan
    series = run.scalar(key)
    return float(series.loc[0]) if 0 in series.index else math.nan


def _ratio(a: float, b: float) -> float:
    return a / b if b and math.isfinite(b) else math.nan


def _slope(sizes: list[int], values: list[float]) -> float:
    """Least-squares slope of log(value) vs log(size); NaN unless every value is finite > 0."""
    v = np.asarray(values, dtype=float)
    if len(v) < 2 or not np.all(np.isfinite(v) & (v > 0)):
        return math.nan
    return float(np.polyfit(np.log(np.asarray(sizes, dtype=float)), np.log(v), 1)[0])


def _finished(runs: list[Run]) -> bool:
    return bool(runs) and all(r.status == "finished" for r in runs)


# -- (a) ------------------------------------------------------------------------------------------
def _construction(runs: dict[int, Run]) -> tuple[list[Verdict], list[dict]]:
    rows, per_seed = [], {}
    for seed, run in sorted(runs.items()):
        cases = run.config["cases"]
        worst = {"f64": -math.inf, "f32": -math.inf, "c64": -math.inf, "c32": -math.inf}
        for i, (d_model, n_heads, d_head, n_ctx) in enumerate(cases):
            row = {"seed": seed, "d_model": d_model, "n_heads": n_heads, "d_head": d_head,
                   "n_ctx": n_ctx, "neurons": last(run, f"case{i}.neurons")}  # fmt: skip
            for dtype in ("float32", "float64"):
                lsa = last(run, f"case{i}.{dtype}.max_abs_lsa")
                row[f"{dtype}.max_abs_err"] = last(run, f"case{i}.{dtype}.max_abs_err")
                row[f"{dtype}.rel_err"] = _ratio(row[f"{dtype}.max_abs_err"], lsa)
                row[f"{dtype}.scan_gap"] = last(run, f"case{i}.{dtype}.scan_gap")
                row[f"{dtype}.control_abs_err"] = last(run, f"case{i}.{dtype}.control_abs_err")
                row[f"{dtype}.control_rel_err"] = _ratio(row[f"{dtype}.control_abs_err"], lsa)
            worst["f64"] = max(worst["f64"], row["float64.max_abs_err"])
            worst["f32"] = max(worst["f32"], row["float32.rel_err"])
            worst["c64"] = max(worst["c64"], row["float64.control_abs_err"])
            worst["c32"] = max(worst["c32"], row["float32.control_rel_err"])
            rows.append(row)
        per_seed[seed] = {k: (v if math.isfinite(v) else math.nan) for k, v in worst.items()}
    precondition = Precondition(
        f"every construction run finished ({len(runs)} seeds)", met=_finished(list(runs.values()))
    )
    control_text = "the same construction with λ = 1 − 1e-3 (a leaky accumulator)"
    gap = max((r["float64.scan_gap"] for r in rows), default=math.nan)
    verdicts = [
        judge(
            claim="g1: the construction equals causal linear self-attention (float64)",
            metric="per seed, max over cases of max|GRNN(x) − LSA(x)|, float64",
            per_seed={s: v["f64"] for s, v in per_seed.items()},
            threshold=G1_F64_ABS, direction="<=", precondition=precondition,
            control=Control(control_text, per_seed={s: v["c64"] for s, v in per_seed.items()}),
            detail=f"max |parallel scan − loop| {gap:.3g} (float64)",
        ),
        judge(
            claim="g1-f32: the construction equals causal linear self-attention (float32)",
            metric="per seed, max over cases of max|GRNN(x) − LSA(x)| / max|LSA(x)|, float32",
            per_seed={s: v["f32"] for s, v in per_seed.items()},
            threshold=G1_F32_REL, direction="<=", precondition=precondition,
            control=Control(control_text, per_seed={s: v["c32"] for s, v in per_seed.items()}),
            detail="relative to max|LSA|: float32 rounding grows with the output's magnitude",
        ),
    ]  # fmt: skip
    return verdicts, rows


# -- (b) ------------------------------------------------------------------------------------------
def _teacher(teacher: dict[int, dict[int, Run]], n_c: int) -> tuple[list[Verdict], list[dict]]:
    rows = []
    for hidden in sorted(teacher):
        runs = list(teacher[hidden].values())
        row = {"d_hidden": hidden, "multiple": hidden / n_c, "seeds": len(runs)}
        for key in (
            "eval.nmse",
            "eval.nmse_pruned",
            "eval.nmse_pruned_near1",
            "pruned.count",
            "pruned_near1.count",
            "lambda.near_0",
            "lambda.near_1",
            "lambda.mid",
        ):
            row[key] = mean([last(r, key) for r in runs])  # fmt: skip
        row["eval.nmse_untrained"] = mean([_first(r, "eval.nmse") for r in runs])
        rows.append(row)
    sizes = sorted(teacher)
    top = sizes[-1] if sizes else None
    runs_top = teacher.get(top, {})
    seeds = sorted(runs_top)
    g2, g2_control, g3, g3_control, slopes, slopes_control = {}, {}, {}, {}, {}, {}
    for s in seeds:
        run = runs_top[s]
        g2[s], g2_control[s] = last(run, "eval.nmse"), _first(run, "eval.nmse")
        trained = [last(teacher[h].get(s), "eval.nmse") for h in sizes]
        untrained = [_first(teacher[h].get(s), "eval.nmse") for h in sizes]
        slopes[s], slopes_control[s] = _slope(sizes, trained), _slope(sizes, untrained)
        g3[s] = last(run, "eval.nmse_pruned") - last(run, "eval.nmse")
        g3_control[s] = last(run, "eval.nmse_pruned_near1") - last(run, "eval.nmse")
    all_runs = [r for by_seed in teacher.values() for r in by_seed.values()]
    finished = _finished(all_runs)
    fit = mean([last(runs_top.get(s), "eval.nmse") for s in seeds])
    verdicts = [
        judge(
            claim="g2: the teacher–student loss is small at 2× the construction",
            metric="per seed, nmse of the largest student on fresh sequences",
            per_seed=g2, threshold=G2_NMSE, direction="<=",
            precondition=Precondition(f"every student run finished ({len(all_runs)})",
                                      met=finished),
            control=Control("the same student untrained (step 0)", per_seed=g2_control),
        ),
        judge(
            claim="g2-falls: the teacher–student loss falls with hidden size",
            metric=f"per seed, least-squares slope of log nmse vs log d_hidden, d_hidden {sizes}",
            per_seed=slopes, threshold=G2_SLOPE, direction="<=",
            precondition=Precondition(
                f"every student run finished and the sizes span >= 4x (here "
                f"{sizes[-1] / sizes[0]:g}x)" if sizes else "student runs exist",
                met=finished and len(sizes) >= 2 and sizes[-1] >= 4 * sizes[0]),
            control=Control("the same students untrained (step 0)", per_seed=slopes_control),
        ),
        judge(
            claim="g3: pruning the mid-range-λ neurons of the 2× student barely changes its loss",
            metric="per seed, nmse after pruning 0.05 ≤ |λ| ≤ 0.95 − nmse before (absolute)",
            per_seed=g3, threshold=G3_NMSE_CHANGE, direction="<=",
            precondition=Precondition(
                f"every student run finished and the largest student fits its teacher "
                f"(mean nmse <= {G2_NMSE:g})", met=finished and fit <= G2_NMSE, measured=fit),
            control=Control("pruning its |λ| > 0.95 neurons instead (the accumulators the "
                            "construction uses)", per_seed=g3_control),
            detail=f"pruned {mean([last(runs_top.get(s), 'pruned.count') for s in seeds]):.3g} "
            f"of {top} neurons on average",
        ),
    ]  # fmt: skip
    return verdicts, rows


# -- (c) ------------------------------------------------------------------------------------------
def _gap(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean((a - b) ** 2) / np.mean(b**2))


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = np.linalg.norm(a, axis=-1), np.linalg.norm(b, axis=-1)
    return float(np.mean((a * b).sum(-1) / np.maximum(na * nb, 1e-12)))


def ratio_standard_error(pred: np.ndarray, ref: np.ndarray, y: np.ndarray) -> float:
    """Standard error, over the eval sequences, of ``mean((pred − y)²) / mean((ref − y)²)``
    (delta method on the paired per-sequence squared errors; one seed's trained models fixed).

    Args:
        pred, ref, y: ``[n_eval]`` predictions of the model and the reference, and the targets.
    Returns:
        ``sqrt(var(a / b̄ − R b / b̄) / n)`` with ``a``, ``b`` the squared errors and ``R =
        ā / b̄``; NaN for fewer than two sequences.
    References:
        The delta method for a ratio of means, e.g. Wasserman, "All of Statistics" (2004),
        Theorem 5.15.
    """
    a, b = (pred - y) ** 2, (ref - y) ** 2
    if len(a) < 2:
        return math.nan
    ratio = a.mean() / b.mean()
    return float(np.sqrt(np.var(a / b.mean() - ratio * b / b.mean(), ddof=1) / len(a)))


def _icl(by_seed: dict[int, dict[str, Run]]) -> tuple[list[Verdict], list[dict]]:
    models = sorted({m for runs in by_seed.values() for m in runs})
    seeds = sorted(by_seed)
    rows = []
    for model in models:
        row: dict = {
            "model": model,
            "eval.mse": mean([last(by_seed[s].get(model), "eval.mse") for s in seeds]),
        }
        for ref in ("lsa", "gd"):
            gaps, coss = [], []
            for s in seeds:
                runs = by_seed[s]
                p, q = tensor(runs.get(model), "eval.pred"), tensor(runs.get(ref), "eval.pred")
                g, h = tensor(runs.get(model), "eval.grad"), tensor(runs.get(ref), "eval.grad")
                gaps.append(_gap(p, q) if p is not None and q is not None else math.nan)
                coss.append(_cos(g, h) if g is not None and h is not None else math.nan)
            row[f"gap_vs_{ref}"], row[f"grad_cos_vs_{ref}"] = mean(gaps), mean(coss)
        if model == "grnn":
            for key in ("eval.mse_pruned", "lambda.near_0", "lambda.near_1", "lambda.mid"):
                row[key] = mean([last(by_seed[s].get(model), key) for s in seeds])
            r2 = [tensor(by_seed[s].get(model), "probe.r2") for s in seeds]
            row["probe.r2_mean"] = mean([float(np.mean(v)) if v is not None else math.nan
                                         for v in r2])  # fmt: skip
        if model == "gd":
            row["gd.eta"] = mean([last(by_seed[s].get(model), "gd.eta") for s in seeds])
        rows.append(row)  # fmt: skip
    all_runs = [r for runs in by_seed.values() for r in runs.values()]
    verdicts = []
    for ref, name in (("lsa", "trained linear attention"), ("gd", "one GD step with η*")):
        per_seed, control, fits, errors = {}, {}, [], []
        for s in seeds:
            grnn, other = by_seed[s].get("grnn"), by_seed[s].get(ref)
            per_seed[s] = _ratio(last(grnn, "eval.mse"), last(other, "eval.mse"))
            p, q, y = (tensor(r, k) for r, k in ((grnn, "eval.pred"), (other, "eval.pred"),
                                                  (grnn, "eval.y")))  # fmt: skip
            ok = p is not None and q is not None and y is not None
            errors.append(ratio_standard_error(p, q, y) if ok else math.nan)
            control[s] = _ratio(_first(grnn, "eval.mse"), last(other, "eval.mse"))
            fits.append(_ratio(last(other, "eval.mse"), last(other, "eval.y_power")))
        worst_fit = max(fits) if fits and all(map(math.isfinite, fits)) else math.nan
        verdicts.append(judge(
            claim=f"g4-{ref}: the trained gated RNN does in-context regression as well as {name}",
            metric=f"per seed, MSE_GRNN / MSE_{ref.upper()} on the seed's fresh sequences",
            per_seed=per_seed, threshold=G4_RATIO, direction="<=",
            precondition=Precondition(
                f"every ICL run finished and the reference fits: MSE_{ref.upper()} <= "
                f"{G4_REFERENCE_FIT:g} × the zero predictor's MSE in every seed (worst measured)",
                met=_finished(all_runs) and worst_fit <= G4_REFERENCE_FIT, measured=worst_fit),
            control=Control("the gated RNN untrained (step 0)", per_seed=control),
            detail="standard error of each seed's ratio over its eval sequences (delta method): "
            + ", ".join(f"{e:.2g}" for e in errors) + "; over seeds, the standard error of the "
            f"mean: {np.std(list(per_seed.values()), ddof=1) / math.sqrt(len(seeds)):.2g}"
            if len(seeds) > 1 else "",
        ))  # fmt: skip
    return verdicts, rows


def analyze(runs: dict[str, Run], figures: Path) -> Analysis:
    """Verdicts g1, g1-f32, g2, g3, g4-lsa, g4-gd from the stored runs; four figures."""
    construction: dict[int, Run] = {}
    teacher: dict[int, dict[int, Run]] = {}
    icl: dict[int, dict[str, Run]] = {}
    for name, run in sorted(runs.items()):
        match = _NAME.match(name)
        if match is None:
            continue
        seed = int(run.config["seed"])
        if match["hidden"]:
            teacher.setdefault(int(match["hidden"]), {})[seed] = run
        elif match["model"]:
            icl.setdefault(seed, {})[match["model"]] = run
        else:
            construction[seed] = run
    cfg = next(iter(next(iter(teacher.values())).values())).config
    n_c = cfg["n_heads"] * cfg["d_head"] ** 2
    verdicts, tables = [], {}
    v, rows = _construction(construction)
    verdicts += v
    tables["(a) construction vs linear attention, per seed and case"] = rows
    v, rows = _teacher(teacher, n_c)
    verdicts += v
    tables["(b) teacher–student per hidden size (mean over seeds)"] = rows
    v, rows = _icl(icl)
    verdicts += v
    tables["(c) in-context regression: MSE and agreement (mean over seeds)"] = rows
    teacher_runs = {h: list(by_seed.values()) for h, by_seed in teacher.items()}
    multiples = {h: h / n_c for h in teacher}
    icl_list = [icl[s] for s in sorted(icl)]
    paths = draw_figures(teacher_runs, multiples, icl_list, n_c, figures, G2_NMSE)
    return Analysis(verdicts, paths, tables)
