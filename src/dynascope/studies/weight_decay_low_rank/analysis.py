"""weight-decay-low-rank verdicts on the contract (:mod:`dynascope.studies.verdict`).

Every claim is judged over the preset's seeds (default rule: the mean passes and ≥ 2/3 of the
seeds pass) against a negative control and a precondition; thresholds, controls and
preconditions, and how each was fixed: docs/studies/weight-decay-low-rank.md.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from dynascope.store import Run
from dynascope.studies.base import Analysis
from dynascope.studies.verdict import Control, Precondition, Verdict, judge
from dynascope.tasks import MatrixFactorization

from .figures import lm_figure, recall_figures, toy_figures

__all__ = ["analyze", "fit_log_slope", "settled_step", "toy_seed_metrics"]

# Frozen thresholds (docs/studies/weight-decay-low-rank.md says how each was set).
A1_RATE_TOL = 0.1
A1_SETTLED = 1e-6
A1_FLOOR = 1e-12
A1_MIN_POINTS = 10
A2_GAP_REL = 1e-4
A3_SIGMA_TOL = 1e-3
A3_MARGIN = 0.05
B_DROP = 2.0
B_LEARNED = 0.9
C_LOSS_GAP = 0.005
C_LEARNED = 0.6 * math.log(256)


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
    # control: the λ = 0 end point judged against the λ > 0 predictions (no shrinkage)
    pos_cat = lam_cat > 0
    ctl_err = np.abs(sigma[-1][zero[0]][None, :] - pred[pos_cat]) if zero.size else np.empty(0)
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
        "a1_control": worst(abs(slope0[0] / (-2 * eta * lambdas[j]) - 1) for j in positive)
        if zero.size
        else float("nan"),
        "a1_window": min((settled[j] for j in positive), default=last) < last
        and not any(map(math.isnan, slopes)),
        "keep0": [float(bal[-1, j] / bal[0, j]) for j in zero],
        "a2": worst(gap_rel[positive]),
        "a2_control": worst(gap_rel[zero]),
        "a3": float(err[gated].max()) if gated.any() else float("nan"),
        "a3_control": float(ctl_err[gated[pos_cat]].max())
        if ctl_err.size and gated.any()
        else float("nan"),
        "a3_crosses": bool((gated & (pred == 0)).any() and (gated & (pred > 0)).any()),
        "a3_marginal": float(err[~gated].max()) if (~gated).any() else 0.0,
        "arrays": (lambdas, bal, gap, l2, sigma, lam_cat, sig_cat, d, c, eta),
        "rows": rows,
    }


def _toy(runs: list[Run], figures: Path) -> tuple[list[Verdict], list[Path], list[dict]]:
    m = {int(r.config["seed"]): toy_seed_metrics(r) for r in runs}
    seeds = list(m)
    window_ok = all(v["a1_window"] for v in m.values())
    window = Precondition(
        f"every seed's loss settles (relative change < {A1_SETTLED:g}) before the last step "
        f"for every λ > 0 and leaves ≥ {A1_MIN_POINTS} points above b_t/b_0 = {A1_FLOOR:g}",
        window_ok,
    )
    lam0 = "the λ = 0 slice of the same runs"
    keep0 = ", ".join(f"{k:.3f}" for v in m.values() for k in v["keep0"])
    verdicts = [
        judge(
            claim="a1: balancedness decays at rate 2λ per unit time (log-slope −2ηλ per GD step)",
            metric="per seed, max over λ > 0 of |fitted log-slope of ‖AᵀA − BᵀB‖_F / (−2ηλ) − 1|",
            per_seed={s: m[s]["a1"] for s in seeds},
            threshold=A1_RATE_TOL,
            direction="<=",
            precondition=window,
            control=Control(
                f"{lam0}: its fitted slope against each λ > 0's −2ηλ",
                {s: m[s]["a1_control"] for s in seeds},
            ),
            detail=f"λ = 0 keeps b_T/b_0 = {keep0} (gradient flow conserves it)",
        ),
        judge(
            claim="a2: the L2–nuclear gap closes (½(‖A‖²+‖B‖²) → ‖ABᵀ‖_*)",
            metric="per seed, max over λ > 0 of gap / L2 term at the last step",
            per_seed={s: m[s]["a2"] for s in seeds},
            threshold=A2_GAP_REL,
            direction="<=",
            precondition=window,
            control=Control(
                f"{lam0}: gap / L2 term at the last step", {s: m[s]["a2_control"] for s in seeds}
            ),
        ),
        judge(
            claim="a3: singular values end soft-thresholded, σ_i = max(d_i − cλ, 0)",
            metric=f"per seed, max |σ_i − max(d_i − cλ, 0)| over modes with |d_i − cλ| ≥ "
            f"{A3_MARGIN}, main and fine λ grids",
            per_seed={s: m[s]["a3"] for s in seeds},
            threshold=A3_SIGMA_TOL,
            direction="<=",
            precondition=Precondition(
                "the λ grid crosses thresholds: some gated mode is predicted 0, some > 0",
                all(v["a3_crosses"] for v in m.values()),
            ),
            control=Control(
                f"{lam0}: its σ_i against the λ > 0 predictions",
                {s: m[s]["a3_control"] for s in seeds},
            ),
            detail="marginal modes (not gated) reach "
            + ", ".join(f"{m[s]['a3_marginal']:.3g}" for s in seeds),
        ),
    ]
    figs = toy_figures(*m[seeds[0]]["arrays"], figures)
    return verdicts, figs, [row for s in seeds for row in m[s]["rows"]]


def _final(run: Run, key: str) -> float:
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
    acc0 = float(np.mean([_final(base[s], "val.accuracy") for s in seeds]))
    acc = [_final(decayed[s], "val.accuracy") for s in seeds if s in decayed]
    chance = 1.0 / 16
    notes = f"val accuracy at λ_attn = {lam:g}: " + ", ".join(f"{a:.3f}" for a in acc)
    if acc and np.mean(acc) <= 1.5 * chance:
        notes += f" (near chance {chance:.3f}: the rank drop co-occurs with collapse)"
    verdicts = []
    for which in ("qk", "ov"):
        key = f"{which}.mean.rank_1e-2"

        def drop(other: dict[int, Run], s: int, key: str = key) -> float:
            return _final(base[s], key) - _final(other[s], key) if s in other else float("nan")

        verdicts.append(judge(
            claim=f"b-{which}: weight decay on attention lowers the head-mean rank of "
            f"W_{which.upper()} (recall)",
            metric=f"per seed, rank_1e-2 at λ_attn = 0 minus rank_1e-2 at λ_attn = {lam:g}",
            per_seed={s: drop(decayed, s) for s in seeds},
            threshold=B_DROP,
            direction=">=",
            precondition=Precondition(
                f"recall is learned without attention decay: mean val accuracy at λ_attn = 0 "
                f">= {B_LEARNED}", acc0 >= B_LEARNED, acc0),
            control=Control(f"decay moved off attention (λ_attn = 0, λ = {lam:g} on the other "
                            "matrices): the same rank drop", {s: drop(control, s) for s in seeds}),
            detail=notes,
        ))  # fmt: skip
    spectra = [(labels[a].replace("\n", " "), next(iter(sorted(r.items())))[1])
               for a, r in (("b_recall_wd0", base), (decayed_name, decayed),
                            ("b_recall_control", control))]  # fmt: skip
    return verdicts, recall_figures(rows, spectra, figures), rows


def _lm(runs: dict[str, Run], figures: Path):
    arms = _arms(runs, "c_lm")
    uniform, decoupled = arms["c_lm_uniform"], arms["c_lm_decoupled"]
    rows = [
        {"condition": cond, "seed": seed, "status": run.status,
         "val.loss": _final(run, "val.loss"), "perplexity": math.exp(_final(run, "val.loss")),
         "qk.rank_1e-2": _final(run, "qk.mean.rank_1e-2"),
         "ov.rank_1e-2": _final(run, "ov.mean.rank_1e-2"),
         "qk.effective_rank": _final(run, "qk.mean.effective_rank"),
         "ov.effective_rank": _final(run, "ov.mean.effective_rank")}
        for cond, seeded in (("uniform", uniform), ("decoupled", decoupled))
        for seed, run in seeded.items()
    ]  # fmt: skip
    seeds = sorted(decoupled)

    def diff(s: int, at_init: bool = False) -> float:
        if s not in uniform:
            return float("nan")
        pick = (lambda r: r.scalar("val.loss").iloc[0]) if at_init else (
            lambda r: _final(r, "val.loss"))  # fmt: skip
        return float(pick(uniform[s]) - pick(decoupled[s]))

    learned = float(np.mean([_final(decoupled[s], "val.loss") for s in seeds]))
    verdict = judge(
        claim="c: decaying attention less (decoupled) lowers the LM's validation loss",
        metric="per seed, val loss(uniform) − val loss(decoupled) at the last step, nats/byte",
        per_seed={s: diff(s) for s in seeds},
        threshold=C_LOSS_GAP,
        direction=">=",
        precondition=Precondition(
            f"the LM learns: mean val loss of the decoupled arm <= 0.6·ln 256 = {C_LEARNED:.2f} "
            "nats/byte", learned <= C_LEARNED, learned),
        control=Control("untrained twins: the same difference at step 0 (same seed, same init)",
                        {s: diff(s, at_init=True) for s in seeds}),
    )  # fmt: skip
    figure = lm_figure({"uniform": list(uniform.values()),
                        "decoupled": list(decoupled.values())}, rows, figures)  # fmt: skip
    return [verdict], [figure], rows


def analyze(runs: dict[str, Run], figures: Path) -> Analysis:
    """Verdicts a1–a3, b-qk, b-ov, c from the stored runs; figures under ``figures``."""
    toy = [r for name, r in sorted(runs.items()) if name.startswith("a_toy")]
    v_a, f_a, rows_a = _toy(toy, figures)
    v_b, f_b, rows_b = _recall(runs, figures)
    v_c, f_c, rows_c = _lm(runs, figures)
    return Analysis(
        v_a + v_b + v_c,
        f_a + f_b + f_c,
        {"(a) toy: balancedness rates and gaps per seed and λ": rows_a,
         "(b) recall: ranks and accuracy per arm and seed": rows_b,
         "(c) LM: validation loss and ranks per condition and seed": rows_c},
    )  # fmt: skip
