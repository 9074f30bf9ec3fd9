"""Verdicts of ``ntk-lazy-validity`` on the verdict contract (claims, metrics, thresholds and how
they were fixed: docs/studies/ntk-lazy-validity.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dynascope.store import Run
from dynascope.studies.base import Analysis
from dynascope.studies.verdict import Precondition, Verdict

from .figures import figures
from .protocol import EARLY, FIT_MAX, N1_ALPHAS, ORACLE_MAX, PROTOCOL

__all__ = ["alpha_slope", "analyze", "fit_residual", "growth_exponent", "window"]

# Thresholds, directions and statistics live in .protocol (PROTOCOL).
N2_POINTS = 20
CONTROL = "none"  # the uncentered net: n1's ablation control
NAN = float("nan")


def window(T: float) -> tuple[float, float]:
    """The fit window of n2: ``[1, T]`` (S11's [1, 50] at T = 50), ``[T / 10, T]`` for T < 10."""
    return (1.0, T) if T >= 10 else (T / 10, T)


def _series(run: Run, key: str) -> tuple[np.ndarray, np.ndarray]:
    """``(t [n], values [n, A])`` with t = eta * step."""
    steps, values = run.tensors(key)
    values = values.reshape(len(steps), -1)
    return steps * run.config["lr"], values


def _at(t: np.ndarray, values: np.ndarray, T: float) -> np.ndarray:
    """Values ``[A]`` at time T (NaN where T was not reached)."""
    keep = np.flatnonzero(t <= T * (1 + 1e-9))
    if not keep.size or t[keep[-1]] < T * (1 - 1e-9):
        return np.full(values.shape[1], NAN)
    return values[keep[-1]]


def alpha_slope(alphas: np.ndarray, values: np.ndarray) -> float:
    """Least-squares slope of log value vs log alpha (NaN with < 3 positive values)."""
    ok = np.isfinite(values) & (values > 0)
    if ok.sum() < 3:
        return NAN
    return float(np.polyfit(np.log(alphas[ok]), np.log(values[ok]), 1)[0])


def growth_exponent(
    alphas: np.ndarray, t: np.ndarray, D: np.ndarray, lo: float, hi: float
) -> float:
    """p in ``alpha*(T) ~ T^p``: fit ``log D = a + b log alpha + c log t`` jointly over the
    alphas and the logged times nearest ``N2_POINTS`` log-spaced targets in [lo, hi]; then
    ``D(alpha*, T) = eps`` gives ``alpha* ~ T^(c / -b)`` for every tolerance eps. NaN when
    fewer than 5 times are in the window or D does not fall with alpha (b >= 0)."""
    keep = np.flatnonzero((t >= lo * (1 - 1e-9)) & (t <= hi * (1 + 1e-9)) & (t > 0))
    if keep.size == 0:
        return NAN
    targets = np.log(np.geomspace(lo, hi, N2_POINTS))
    idx = np.unique([keep[int(np.argmin(np.abs(np.log(t[keep]) - g)))] for g in targets])
    if len(idx) < 5:
        return NAN
    la, lt = np.meshgrid(np.log(alphas), np.log(t[idx]))
    y = D[idx]
    ok = np.isfinite(y) & (y > 0)
    X = np.stack([np.ones(ok.sum()), la[ok], lt[ok]], axis=1)
    _, b, c = np.linalg.lstsq(X, np.log(y[ok]), rcond=None)[0]
    return float(c / -b) if b < 0 else NAN


def _rows(run: Run, T: float) -> list[dict]:
    alphas = np.asarray(run.config["alphas"], dtype=float)
    t, D = _series(run, "D")
    _, dist = _series(run, "param_dist")
    d_T = _at(t, D, T)
    kernel = run.tensors("ntk.relative_change")[1].reshape(-1, len(alphas))[-1]
    oracle = _series(run, "oracle_error")[1][-1]
    lo, hi = window(T)
    _, residual = _series(run, "residual")
    fit = _at(t, residual, T) / residual[0]
    rows = []
    for j, alpha in enumerate(alphas):
        keep = (t >= lo) & (t <= hi) & (D[:, j] > 0)
        slope = (
            float(np.polyfit(np.log(t[keep]), np.log(D[keep, j]), 1)[0]) if keep.sum() > 2 else NAN
        )
        rows.append({
            "run": run.name, "centering": run.config["centering"], "seed": run.config["seed"],
            "alpha": float(alpha), "status": run.status, "D(T)": float(d_T[j]),
            "alpha*D(T)": float(alpha * d_T[j]), "slope log D vs log t": slope,
            "alpha*|w(T)-w0|": float(alpha * _at(t, dist, T)[j]),
            "eta*lambda_max": float(run.scalar("lr_lambda_max").iloc[0]),
            "ntk.relative_change(T)": float(kernel[j]), "oracle_error": float(oracle[j]),
            "residual(T) / residual(0)": float(fit[j]),
        })  # fmt: skip
    return rows


def fit_residual(run: Run, T: float) -> float:
    """The worst relative residual ``||alpha h(T) - f*|| / ||alpha h(0) - f*||`` over the gated
    alphas (:data:`N1_ALPHAS`) of one run: how much of the residual GD left at T (NaN: T not
    reached or a non-finite residual).

    Args:
        run: one run of the study (its ``residual`` tensor ``[n_logged, A]``).
        T: the horizon, in units of t = eta * step.
    Returns:
        The ratio, dimensionless.
    """
    alphas = np.asarray(run.config["alphas"], dtype=float)
    gated = np.isin(alphas, N1_ALPHAS)
    t, residual = _series(run, "residual")
    ratio = _at(t, residual, T)[gated] / residual[0][gated]
    return float(np.max(ratio)) if ratio.size and np.all(np.isfinite(ratio)) else NAN


def _per_seed(runs: list[Run], T: float) -> tuple[dict, dict, dict, dict]:
    """seed -> (n1 alpha-slope of D, n2 exponent, its early-window value, the fit residual)."""
    n1, n2, n2c, fit = {}, {}, {}, {}
    for run in runs:
        seed = run.config["seed"]
        alphas = np.asarray(run.config["alphas"], dtype=float)
        gated = np.isin(alphas, N1_ALPHAS)
        t, D = _series(run, "D")
        n1[seed] = alpha_slope(alphas[gated], _at(t, D, T)[gated])
        n2[seed] = growth_exponent(alphas[gated], t, D[:, gated], *window(T))
        n2c[seed] = growth_exponent(alphas[gated], t, D[:, gated], *EARLY)
        fit[seed] = fit_residual(run, T) if run.status == "finished" else NAN
    return n1, n2, n2c, fit


def _verdicts(
    runs: list[Run], control: list[Run], rows: list[dict], T: float, tag: str
) -> list[Verdict]:
    n1, n2, n2c, fit = _per_seed(runs, T)
    n1_none, _, _, fit_none = _per_seed(control, T)
    oracle = max((r["oracle_error"] for r in rows), default=NAN)
    stable = max((r["eta*lambda_max"] for r in rows), default=NAN)
    finished = all(run.status == "finished" for run in (*runs, *control))
    instrument_ok = bool(finished and stable < 2 and oracle <= ORACLE_MAX)
    instrument = (
        f"runs finished, GD stable (eta lambda_max(K) < 2; max {stable:.3g}) and the twin equals "
        f"the closed form to {ORACLE_MAX:g} (max error {oracle:.3g})"
    )

    def fitted(arms: str, values: list[float]) -> tuple[str, bool, float]:
        worst = max(values) if values and all(np.isfinite(values)) else NAN
        text = (
            f"{instrument}; {arms} trained (GD at least halved the residual): ||alpha h(T) - "
            f"f*|| / ||alpha h(0) - f*|| <= {FIT_MAX:g} for every gated alpha and seed "
            f"(measured: the worst, {worst:.3g})"
        )
        return text, bool(instrument_ok and worst <= FIT_MAX), worst

    pre = Precondition(*fitted("this centering and the uncentered control", [
        *fit.values(), *fit_none.values()]))  # fmt: skip
    n2_pre = Precondition(*fitted("this centering", list(fit.values())))
    own = [r for r in rows if r["centering"] != CONTROL]
    aD = "; ".join(
        f"alpha={a:g}: alpha*D(T) {np.mean([r['alpha*D(T)'] for r in own if r['alpha'] == a]):.4g}"
        for a in sorted({r["alpha"] for r in own})
    )
    lo, hi = window(T)
    return [
        PROTOCOL.claim(f"n1{tag}").judge(
            n1, precondition=pre, control=n1_none,
            detail=f"T = {T:g}; {aD}",
        ),
        PROTOCOL.claim(f"n2{tag}").judge(
            n2, precondition=n2_pre, control=n2c,
            detail=f"fit window T in [{lo:g}, {hi:g}]; control window {list(EARLY)}",
        ),
    ]  # fmt: skip


def _t_end(run: Run) -> float:
    return run.config["loop"]["steps"] * run.config["lr"]


def analyze(runs: dict[str, Run], out: Path) -> Analysis:
    """Verdicts n1, n2 per centering (the first centering unsuffixed); tables and figure."""
    main = {n: r for n, r in runs.items() if n != "eta_half"}
    T = float(max(_t_end(r) for r in main.values()))
    centerings = list(dict.fromkeys(r.config["centering"] for r in main.values()))
    rows = [row for run in main.values() for row in _rows(run, T)]
    control = [r for r in main.values() if r.config["centering"] == CONTROL]
    verdicts = []
    for k, centering in enumerate(c for c in centerings if c != CONTROL):
        tag = "" if k == 0 else f"-{centering}"
        mine = [r for r in main.values() if r.config["centering"] == centering]
        mine_rows = [r for r in rows if r["centering"] in (centering, CONTROL)]
        verdicts += _verdicts(mine, control, mine_rows, T, tag)
    tables = {"per centering and alpha: D(T), alpha*D, slope in t, distance, oracle": rows}
    if "eta_half" in runs:
        tables["gradient-flow check: eta vs eta/2"] = [_eta_check(runs["eta_half"], main, T)]
    return Analysis(verdicts, figures(main, rows, T, out), tables)


def _eta_check(half: Run, main: dict[str, Run], T: float) -> dict:
    alpha = half.config["alphas"][0]
    same = next(
        r for r in main.values()
        if r.config["centering"] == half.config["centering"]
        and r.config["seed"] == half.config["seed"]
    )  # fmt: skip
    alphas = np.asarray(same.config["alphas"])
    j = int(np.argmin(np.abs(alphas - alpha)))
    d_eta = float(_at(*_series(same, "D"), T)[j])
    d_half = float(_at(*_series(half, "D"), T)[0])
    return {"alpha": alpha, "centering": half.config["centering"], "D(T) at eta": d_eta,
            "D(T) at eta/2": d_half, "relative change": abs(d_half - d_eta) / d_eta}  # fmt: skip
