"""gated-rnn-attention verdicts g1, g1-f32 (identities), g2, g2-falls, g3, g4-lsa, g4-gd on the
verdict contract, each judged per seed through the study's protocol (``protocol.py``; notes:
docs/studies/gated-rnn-attention.md). The controls of g2, g2-falls and g4 are read from the
ungated ablation runs (``b_ungated_h{n}_s{i}``, ``c_icl_grnn_ungated_s{i}``)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from dynascope.store import Run
from dynascope.studies.base import Analysis, Verdict
from dynascope.studies.verdict import Precondition

from .figures import draw_figures, last, mean, tensor
from .protocol import FIT_FRACTION, PROTOCOL

__all__ = ["analyze", "ratio_standard_error"]

_NAME = re.compile(r"^(?P<part>a_construction|b_(?P<arm>teacher|ungated)_h(?P<hidden>\d+)|"
                   r"c_icl_(?P<model>\w+?))_s(?P<i>\d+)$")  # fmt: skip


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
    gap = max((r["float64.scan_gap"] for r in rows), default=math.nan)
    leaky = lambda key: ", ".join(f"{v[key]:.3g}" for v in per_seed.values())  # noqa: E731
    verdicts = [
        PROTOCOL.claim("g1").judge(
            {s: v["f64"] for s, v in per_seed.items()}, precondition=precondition, control=None,
            detail=f"max |parallel scan − loop| {gap:.3g} (float64); the leaky construction "
            f"(λ = 1 − 1e-3) per seed, reported: {leaky('c64')}",
        ),
        PROTOCOL.claim("g1-f32").judge(
            {s: v["f32"] for s, v in per_seed.items()}, precondition=precondition, control=None,
            detail="relative to max|LSA|: float32 rounding grows with the output's magnitude; "
            f"the leaky construction per seed, reported: {leaky('c32')}",
        ),
    ]  # fmt: skip
    return verdicts, rows


# -- (b) ------------------------------------------------------------------------------------------
def _teacher_rows(teacher: dict[int, dict[int, Run]], n_c: int, arm: str) -> list[dict]:
    rows = []
    for hidden in sorted(teacher):
        runs = list(teacher[hidden].values())
        row = {"arm": arm, "d_hidden": hidden, "multiple": hidden / n_c, "seeds": len(runs)}
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
    return rows


def _top_and_slopes(students: dict[int, dict[int, Run]], seeds: list[int]):
    """Per seed: the largest student's final nmse and the slope of log nmse vs log size."""
    sizes = sorted(students)
    top, slopes = {}, {}
    for s in seeds:
        top[s] = last(students[sizes[-1]].get(s), "eval.nmse") if sizes else math.nan
        slopes[s] = _slope(sizes, [last(students[h].get(s), "eval.nmse") for h in sizes])
    return top, slopes


def _teacher(
    teacher: dict[int, dict[int, Run]], ungated: dict[int, dict[int, Run]], n_c: int
) -> tuple[list[Verdict], list[dict]]:
    rows = _teacher_rows(teacher, n_c, "gated") + _teacher_rows(ungated, n_c, "ungated")
    sizes = sorted(teacher)
    top = sizes[-1] if sizes else None
    runs_top = teacher.get(top, {})
    seeds = sorted(runs_top)
    g2, slopes = _top_and_slopes(teacher, seeds)
    g2_control, slopes_control = _top_and_slopes(ungated, seeds)
    g3, g3_control = {}, {}
    for s in seeds:
        run = runs_top[s]
        g3[s] = last(run, "eval.nmse_pruned") - last(run, "eval.nmse")
        g3_control[s] = last(run, "eval.nmse_pruned_near1") - last(run, "eval.nmse")
    gated_runs = [r for by_seed in teacher.values() for r in by_seed.values()]
    ablation_runs = [r for by_seed in ungated.values() for r in by_seed.values()]
    finished = _finished(gated_runs) and _finished(ablation_runs)
    complete = sorted(ungated) == sizes and all(sorted(ungated[h]) == seeds for h in sizes)
    trained = [last(r, "eval.nmse") < _first(r, "eval.nmse") for r in ablation_runs]
    ablation_trained = complete and bool(trained) and all(trained)
    b_text = (
        f"every gated and ungated student run finished ({len(gated_runs)} + "
        f"{len(ablation_runs)}); the ungated students trained (nmse at the end below step 0's, "
        f"per size and seed: {sum(trained)} of {len(trained)})"
    )
    g2_bar = PROTOCOL.claim("g2").threshold
    worst = max(g2.values()) if g2 and all(map(math.isfinite, g2.values())) else math.nan
    spans = bool(sizes) and len(sizes) >= 2 and sizes[-1] >= 4 * sizes[0]
    verdicts = [
        PROTOCOL.claim("g2").judge(
            g2, precondition=Precondition(b_text, met=finished and ablation_trained),
            control=g2_control,
        ),
        PROTOCOL.claim("g2-falls").judge(
            slopes,
            precondition=Precondition(
                f"{b_text}; the sizes span >= 4x (here "
                f"{sizes[-1] / sizes[0]:g}x)" if sizes else "student runs exist",
                met=finished and ablation_trained and spans),
            control=slopes_control,
            detail=f"d_hidden {sizes}",
        ),
        PROTOCOL.claim("g3").judge(
            g3,
            precondition=Precondition(
                f"every student run finished and the largest student fits its teacher in every "
                f"seed (nmse <= {g2_bar:g}; measured: the worst)",
                met=_finished(gated_runs) and worst <= g2_bar, measured=worst),
            control=g3_control,
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
    ablation = [by_seed[s].get("grnn_ungated") for s in seeds]
    ablation_trained = bool(seeds) and all(
        r is not None and last(r, "eval.mse") < _first(r, "eval.mse") for r in ablation
    )
    verdicts = []
    for ref, _name in (("lsa", "trained linear attention"), ("gd", "one GD step with η*")):
        per_seed, control, fits, errors = {}, {}, [], []
        for s in seeds:
            grnn, other = by_seed[s].get("grnn"), by_seed[s].get(ref)
            per_seed[s] = _ratio(last(grnn, "eval.mse"), last(other, "eval.mse"))
            p, q, y = (tensor(r, k) for r, k in ((grnn, "eval.pred"), (other, "eval.pred"),
                                                  (grnn, "eval.y")))  # fmt: skip
            ok = p is not None and q is not None and y is not None
            errors.append(ratio_standard_error(p, q, y) if ok else math.nan)
            control[s] = _ratio(last(by_seed[s].get("grnn_ungated"), "eval.mse"),
                                last(other, "eval.mse"))  # fmt: skip
            for model in (ref, "grnn"):
                run = by_seed[s].get(model)
                fits.append(_ratio(last(run, "eval.mse"), last(run, "eval.y_power")))
        worst_fit = max(fits) if fits and all(map(math.isfinite, fits)) else math.nan
        spread = (f"; over seeds, the standard error of the mean: "
                  f"{np.std(list(per_seed.values()), ddof=1) / math.sqrt(len(seeds)):.2g}"
                  if len(seeds) > 1 else "")  # fmt: skip
        verdicts.append(PROTOCOL.claim(f"g4-{ref}").judge(
            per_seed,
            precondition=Precondition(
                f"every ICL run finished; MSE_{ref.upper()} and MSE_GRNN <= {FIT_FRACTION:g} × "
                f"the zero predictor's MSE in every seed (measured: the worst); the ungated "
                f"RNN trained (MSE at the end below step 0's in every seed: {ablation_trained})",
                met=_finished(all_runs) and worst_fit <= FIT_FRACTION and ablation_trained,
                measured=worst_fit),
            control=control,
            detail="standard error of each seed's ratio over its eval sequences (delta method): "
            + ", ".join(f"{e:.2g}" for e in errors) + spread,
        ))  # fmt: skip
    return verdicts, rows


def analyze(runs: dict[str, Run], figures: Path) -> Analysis:
    """Verdicts g1, g1-f32, g2, g2-falls, g3, g4-lsa, g4-gd from the stored runs (the ungated
    ablation runs give the controls of g2, g2-falls, g4); four figures."""
    construction: dict[int, Run] = {}
    teacher: dict[int, dict[int, Run]] = {}
    ungated: dict[int, dict[int, Run]] = {}
    icl: dict[int, dict[str, Run]] = {}
    for name, run in sorted(runs.items()):
        match = _NAME.match(name)
        if match is None:
            continue
        seed = int(run.config["seed"])
        if match["hidden"]:
            arm = teacher if match["arm"] == "teacher" else ungated
            arm.setdefault(int(match["hidden"]), {})[seed] = run
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
    v, rows = _teacher(teacher, ungated, n_c)
    verdicts += v
    tables["(b) teacher–student per arm and hidden size (mean over seeds)"] = rows
    v, rows = _icl(icl)
    verdicts += v
    tables["(c) in-context regression: MSE and agreement (mean over seeds)"] = rows
    teacher_runs = {h: list(by_seed.values()) for h, by_seed in teacher.items()}
    multiples = {h: h / n_c for h in teacher}
    icl_list = [{m: r for m, r in icl[s].items() if m != "grnn_ungated"} for s in sorted(icl)]
    g2_bar = PROTOCOL.claim("g2").threshold
    paths = draw_figures(teacher_runs, multiples, icl_list, n_c, figures, g2_bar)
    return Analysis(verdicts, paths, tables)
