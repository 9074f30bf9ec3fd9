"""weight-decay-low-rank verdicts on the contract (:mod:`dynascope.studies.verdict`).

Every claim is judged through its spec in :mod:`.protocol` (statistic, threshold, direction)
over the preset's seeds, against an ablation control and the fit of every arm it reads.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from dynascope.store import Run
from dynascope.studies.base import Analysis
from dynascope.studies.verdict import Precondition, Verdict
from dynascope.tasks import MatrixFactorization

from .figures import lm_figure, recall_figures, toy_figures
from .protocol import LEARNED, LM_LEARNED, PROTOCOL

__all__ = ["analyze", "fit_log_slope", "settled_step", "toy_seed_metrics"]

# How the toy's metrics are read (the protocol's preconditions state them).
A1_SETTLED = 1e-6
A1_FLOOR = 1e-12
A1_MIN_POINTS = 10
A3_MARGIN = 0.05


def settled_step(loss: np.ndarray, tol: float) -> int:
    """First step t whose relative loss change |ℓ_t − ℓ_{t−1}| / |ℓ_t| is below ``tol``."""
    rel = np.abs(np.diff(loss)) / np.maximum(np.abs(loss[1:]), 1e-300)
    below = np.flatnonzero(rel < tol)
    return int(below[0]) + 1 if below.size else len(loss)


def fit_log_slope(b: np.ndarray, start: int, floor: float, *, below_start: bool = True) -> float:
    """Least-squares slope of log b_t for t >= start and b_t/b_0 > floor (and < 1 when
    ``below_start``); NaN with fewer than :data:`A1_MIN_POINTS` points."""
    t = np.arange(len(b))
    rel = b / b[0]
    keep = (t >= start) & (rel > floor) & ((rel < 1.0) if below_start else True)
    if keep.sum() < A1_MIN_POINTS:
        return float("nan")
    slope, _ = np.polyfit(t[keep], np.log(b[keep]), 1)
    return float(slope)


def toy_seed_metrics(run: Run) -> dict:
    """One toy seed's claim and control values (a1–a3) and its per-λ table rows."""
    cfg = run.config
    eta, scale = float(cfg["lr"]), float(cfg["data_scale"])
    lambdas = run.tensors("lambdas")[1][0]
    _, bal = run.tensors("balancedness")  # [T+1, n]
    _, gap = run.tensors("gap")
    _, l2 = run.tensors("l2_term")
    _, loss = run.tensors("loss")
    _, sigma = run.tensors("sigma")  # [T+1, n, 5], descending
    d = np.asarray(MatrixFactorization(data_scale=scale).diag, dtype=np.float64)
    c = 1.0 / (2.0 * scale)
    positive, zero = np.flatnonzero(lambdas > 0), np.flatnonzero(lambdas == 0)
    settled = [settled_step(loss[:, j], A1_SETTLED) for j in range(len(lambdas))]
    slopes = [fit_log_slope(bal[:, j], settled[j], A1_FLOOR) for j in positive]
    ratios = [s / (-2 * eta * lambdas[j]) for s, j in zip(slopes, positive, strict=True)]
    # λ = 0 fits from where the first λ > 0 fit starts (its loss → 0 never settles relatively)
    start0 = min((settled[j] for j in positive), default=0)
    slope0 = [fit_log_slope(bal[:, j], start0, A1_FLOOR, below_start=False) for j in zero]
    gap_rel = np.where(l2[-1] > 0, gap[-1] / np.where(l2[-1] > 0, l2[-1], 1.0), 0.0)

    def worst(values) -> float:
        values = list(values)
        return float("nan") if not values or any(map(math.isnan, values)) else max(values)

    lam_cat, sig_cat = lambdas, sigma[-1]
    if int(cfg["fine_lambdas"]):
        lam_cat = np.concatenate([lambdas, run.tensors("fine.lambdas")[1][-1]])
        sig_cat = np.concatenate([sigma[-1], run.tensors("fine.sigma")[1][-1]])
    pred = np.maximum(d[None, :] - c * lam_cat[:, None], 0.0)[:, ::-1]
    margin = np.abs(d[None, :] - c * lam_cat[:, None])[:, ::-1]
    gated = margin >= A3_MARGIN
    err = np.abs(sig_cat - pred)
    rows = [
        {"seed": run.config["seed"], "lambda": float(lam), "loss_settled_step": settled[j],
         "fitted_log_slope": fit_log_slope(bal[:, j], settled[j], A1_FLOOR) if lam > 0
         else slope0[list(zero).index(j)],
         "theory_-2ηλ": float(-2 * eta * lam),
         "balancedness_T/0": float(bal[-1, j] / bal[0, j]), "gap_rel_T": float(gap_rel[j])}
        for j, lam in enumerate(lambdas)
    ]  # fmt: skip
    last = len(loss) - 1
    return {
        "a1": worst(abs(r - 1) for r in ratios),
        "a1_free": worst(
            abs(fit_log_slope(bal[:, j], settled[j], A1_FLOOR, below_start=False)
                / (-2 * eta * lambdas[j]) - 1)
            for j in positive
        ),  # fmt: skip
        "a1_window": min((settled[j] for j in positive), default=last) < last
        and not any(map(math.isnan, slopes)),
        "keep0": [float(bal[-1, j] / bal[0, j]) for j in zero],
        "a2": worst(gap_rel[positive]),
        "a3": float(err[gated].max()) if gated.any() else float("nan"),
        "a3_crosses": bool((gated & (pred == 0)).any() and (gated & (pred > 0)).any()),
        "a3_marginal": float(err[~gated].max()) if (~gated).any() else 0.0,
        "arrays": (lambdas, bal, gap, l2, sigma, lam_cat, sig_cat, d, c, eta),
        "rows": rows,
    }


def _toy(
    runs: list[Run], product: list[Run], figures: Path
) -> tuple[list[Verdict], list[Path], list[dict]]:
    m = {int(r.config["seed"]): toy_seed_metrics(r) for r in runs}
    ablated = {int(r.config["seed"]): toy_seed_metrics(r) for r in product}
    seeds = list(m)
    window_ok = all(v["a1_window"] for v in m.values())
    window = Precondition(PROTOCOL.claim("a1").preconditions[0], window_ok)
    keep0 = ", ".join(f"{k:.3f}" for v in m.values() for k in v["keep0"])
    nan = float("nan")
    control = {
        key: {s: ablated[s][key] if s in ablated else nan for s in seeds}
        for key in ("a1_free", "a2", "a3")
    }
    verdicts = [
        PROTOCOL.claim("a1").judge(
            {s: m[s]["a1"] for s in seeds},
            precondition=window,
            control=control["a1_free"],
            detail=f"λ = 0 keeps b_T/b_0 = {keep0} (gradient flow conserves it)",
        ),
        PROTOCOL.claim("a2").judge(
            {s: m[s]["a2"] for s in seeds}, precondition=window, control=control["a2"]
        ),
        PROTOCOL.claim("a3").judge(
            {s: m[s]["a3"] for s in seeds},
            precondition=Precondition(
                PROTOCOL.claim("a3").preconditions[0], all(v["a3_crosses"] for v in m.values())
            ),
            control=control["a3"],
            detail="marginal modes (not gated) reach "
            + ", ".join(f"{m[s]['a3_marginal']:.3g}" for s in seeds),
        ),
    ]
    figs = toy_figures(*m[seeds[0]]["arrays"], figures)
    return verdicts, figs, [row for s in seeds for row in m[s]["rows"]]


def _final(run: Run | None, key: str) -> float:
    if run is None:
        return float("nan")
    try:
        return run.last(key)
    except KeyError:
        return float("nan")


def _arms(runs: dict[str, Run], prefix: str) -> dict[str, dict[int, Run]]:
    """Runs named ``{arm}_s{k}`` under ``prefix``: arm -> seed -> run."""
    arms: dict[str, dict[int, Run]] = {}
    for name, run in sorted(runs.items()):
        if name.startswith(prefix):
            arm = name.rsplit("_s", 1)[0]
            arms.setdefault(arm, {})[int(run.config["seed"])] = run
    return arms


def _recall(runs: dict[str, Run], figures: Path):
    arms = _arms(runs, "b_recall")
    base = arms.pop("b_recall_wd0")
    control = arms.pop("b_recall_control")
    ((decayed_name, decayed),) = arms.items()
    lam = next(iter(decayed.values())).config["optimizer"]["weight_decay"]["attention"]
    labels = {"b_recall_wd0": "λ_attn = 0", decayed_name: f"λ_attn = {lam:g}",
              "b_recall_control": f"control: λ_attn = 0,\nλ_other = {lam:g}"}  # fmt: skip
    columns = {"qk.rank_1e-2": "qk.mean.rank_1e-2", "ov.rank_1e-2": "ov.mean.rank_1e-2",
               "qk.effective_rank": "qk.mean.effective_rank",
               "ov.effective_rank": "ov.mean.effective_rank",
               "val.accuracy": "val.accuracy", "val.loss": "val.loss"}  # fmt: skip
    rows = [
        {"arm": labels[arm], "seed": seed, "status": run.status}
        | {column: _final(run, key) for column, key in columns.items()}
        for arm, seeded in (("b_recall_wd0", base), (decayed_name, decayed),
                            ("b_recall_control", control))
        for seed, run in seeded.items()
    ]  # fmt: skip
    seeds = sorted(base)
    reads = {"b_recall_wd0": base, decayed_name: decayed, "b_recall_control": control}
    fit = {arm: [_final(seeded.get(s), "val.accuracy") for s in seeds]
           for arm, seeded in reads.items()}  # fmt: skip
    worst_fit = min((a for accs in fit.values() for a in accs), default=float("nan"))
    acc = fit[decayed_name]
    chance = 1.0 / 16
    notes = "val accuracy per arm: " + "; ".join(
        f"{labels[arm].replace(chr(10), ' ')} " + ", ".join(f"{a:.3f}" for a in accs)
        for arm, accs in fit.items()
    )
    if acc and np.mean(acc) <= 1.5 * chance:
        notes += f" (λ_attn = {lam:g} near chance {chance:.3f}: the rank drop co-occurs with "
        notes += "collapse)"
    verdicts = []
    for which in ("qk", "ov"):
        key = f"{which}.mean.rank_1e-2"

        def drop(other: dict[int, Run], s: int, key: str = key) -> float:
            return _final(base[s], key) - _final(other[s], key) if s in other else float("nan")

        spec = PROTOCOL.claim(f"b-{which}")
        verdicts.append(spec.judge(
            {s: drop(decayed, s) for s in seeds},
            precondition=Precondition(spec.preconditions[0], worst_fit >= LEARNED, worst_fit),
            control={s: drop(control, s) for s in seeds},
            detail=notes,
        ))  # fmt: skip
    spectra = [(labels[a].replace("\n", " "), next(iter(sorted(r.items())))[1])
               for a, r in (("b_recall_wd0", base), (decayed_name, decayed),
                            ("b_recall_control", control))]  # fmt: skip
    return verdicts, recall_figures(rows, spectra, figures), rows


def _lm(runs: dict[str, Run], figures: Path):
    arms = _arms(runs, "c_lm")
    uniform, decoupled = arms["c_lm_uniform"], arms["c_lm_decoupled"]
    ablated = arms["c_lm_control"]
    conditions = (("uniform", uniform), ("decoupled", decoupled),
                  ("control: λ_other = 0", ablated))  # fmt: skip
    rows = [
        {"condition": cond, "seed": seed, "status": run.status,
         "val.loss": _final(run, "val.loss"), "perplexity": math.exp(_final(run, "val.loss")),
         "qk.rank_1e-2": _final(run, "qk.mean.rank_1e-2"),
         "ov.rank_1e-2": _final(run, "ov.mean.rank_1e-2"),
         "qk.effective_rank": _final(run, "qk.mean.effective_rank"),
         "ov.effective_rank": _final(run, "ov.mean.effective_rank")}
        for cond, seeded in conditions
        for seed, run in seeded.items()
    ]  # fmt: skip
    seeds = sorted(decoupled)

    def diff(other: dict[int, Run], s: int) -> float:
        return _final(uniform.get(s), "val.loss") - _final(other.get(s), "val.loss")

    # the worst LM arm and seed; np.max is NaN when any loss is (an unfinished run fails the bar)
    worst = float(np.max([_final(seeded.get(s), "val.loss") for _, seeded in conditions
                          for s in seeds]))  # fmt: skip
    spec = PROTOCOL.claim("c")
    verdict = spec.judge(
        {s: diff(decoupled, s) for s in seeds},
        precondition=Precondition(spec.preconditions[0], worst <= LM_LEARNED, worst),
        control={s: diff(ablated, s) for s in seeds},
    )
    figure = lm_figure({cond: list(seeded.values()) for cond, seeded in conditions}, rows, figures)
    return [verdict], [figure], rows


def analyze(runs: dict[str, Run], figures: Path) -> Analysis:
    """Verdicts a1–a3, b-qk, b-ov, c from the stored runs; figures under ``figures``."""
    toy = [r for name, r in sorted(runs.items()) if name.startswith("a_toy")]
    product = [r for name, r in sorted(runs.items()) if name.startswith("a_product")]
    v_a, f_a, rows_a = _toy(toy, product, figures)
    v_b, f_b, rows_b = _recall(runs, figures)
    v_c, f_c, rows_c = _lm(runs, figures)
    return Analysis(
        v_a + v_b + v_c,
        f_a + f_b + f_c,
        {"(a) toy: balancedness rates and gaps per seed and λ": rows_a,
         "(b) recall: ranks and accuracy per arm and seed": rows_b,
         "(c) LM: validation loss and ranks per condition and seed": rows_c},
    )  # fmt: skip
