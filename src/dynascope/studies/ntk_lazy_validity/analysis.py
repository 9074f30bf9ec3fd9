"""Verdicts of ``ntk-lazy-validity`` on the verdict contract (claims, metrics, thresholds and how
they were fixed: docs/studies/ntk-lazy-validity.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dynascope.store import Run
from dynascope.studies.base import Analysis
from dynascope.studies.verdict import Control, Precondition, Verdict, judge

from .figures import figures

__all__ = ["N1_SLOPE", "N2_EXPONENT", "alpha_slope", "analyze", "growth_exponent", "window"]

N1_ALPHAS = (8.0, 16.0, 32.0, 64.0, 128.0)
N1_SLOPE = -0.9  # D <= C T / alpha: slope -1 in log alpha, 0.1 tolerance (issue 18)
N2_EXPONENT = 1.1  # alpha*(T) ~ T^p: the theorem gives p <= 1 (the earlier bound: 2); S11's 0.1
N2_POINTS = 20
EARLY = (0.01, 0.1)  # t << 1: D ~ t^2 / alpha (second order), so p = 2 there (control)
ORACLE_MAX = 1e-10
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
        })  # fmt: skip
    return rows


def _per_seed(runs: list[Run], T: float, gate: bool) -> tuple[dict, dict, dict, dict]:
    """seed -> (n1 alpha-slope of D, its control: of move; n2 exponent, its early control)."""
    n1, n1c, n2, n2c = {}, {}, {}, {}
    for run in runs:
        seed = run.config["seed"]
        alphas = np.asarray(run.config["alphas"], dtype=float)
        gated = np.isin(alphas, N1_ALPHAS) if gate else np.ones(len(alphas), bool)
        t, D = _series(run, "D")
        _, move = _series(run, "move")
        n1[seed] = alpha_slope(alphas[gated], _at(t, D, T)[gated])
        n1c[seed] = alpha_slope(alphas[gated], _at(t, move, T)[gated])
        n2[seed] = growth_exponent(alphas[gated], t, D[:, gated], *window(T))
        n2c[seed] = growth_exponent(alphas[gated], t, D[:, gated], *EARLY)
    return n1, n1c, n2, n2c


def _verdicts(runs: list[Run], rows: list[dict], T: float, tag: str) -> list[Verdict]:
    n1, n1c, n2, n2c = _per_seed(runs, T, gate=True)
    oracle = max((r["oracle_error"] for r in rows), default=NAN)
    stable = max((r["eta*lambda_max"] for r in rows), default=NAN)
    finished = all(run.status == "finished" for run in runs)
    pre = Precondition(
        f"runs finished, GD stable (eta lambda_max(K) < 2; max {stable:.3g}) and the twin equals "
        f"the closed form f* - (I - eta K)^t f* to {ORACLE_MAX:g} (measured: the max error)",
        bool(finished and stable < 2 and oracle <= ORACLE_MAX),
        oracle,
    )
    lo, hi = window(T)
    aD = "; ".join(
        f"alpha={a:g}: alpha*D(T) {np.mean([r['alpha*D(T)'] for r in rows if r['alpha'] == a]):.4g}"
        for a in sorted({r["alpha"] for r in rows})
    )
    return [
        judge(
            claim=f"n1{tag}: the gap to the linearized twin falls at least like 1/alpha "
            "(D(alpha, T) <= C T / alpha)",
            metric=f"slope of log D(alpha, T={T:g}) vs log alpha over alpha in {{8..128}}",
            per_seed=n1,
            threshold=N1_SLOPE,
            direction="<=",
            precondition=pre,
            control=Control(
                "the same slope of the function's own movement sup_t ||alpha h(t) - alpha h(0)|| "
                "(O(1) at every alpha: it fits the targets)",
                per_seed=n1c,
            ),
            detail=aD,
        ),
        judge(
            claim=f"n2{tag}: alpha = O(T) suffices: the alpha that keeps D below a tolerance "
            "grows at most linearly in T",
            metric=f"p in alpha*(T) ~ T^p from a joint fit log D = a + b log alpha + c log T "
            f"on T in [{lo:g}, {hi:g}] (p = c / -b)",
            per_seed=n2,
            threshold=N2_EXPONENT,
            direction="<=",
            precondition=pre,
            control=Control(
                f"the same exponent on the early window T in [{EARLY[0]:g}, {EARLY[1]:g}] "
                "(second order in t: p = 2 derived for D ~ t^2 / alpha)",
                per_seed=n2c,
            ),
        ),
    ]


def _t_end(run: Run) -> float:
    return run.config["loop"]["steps"] * run.config["lr"]


def analyze(runs: dict[str, Run], out: Path) -> Analysis:
    """Verdicts n1, n2 per centering (the first centering unsuffixed); tables and figure."""
    main = {n: r for n, r in runs.items() if n != "eta_half"}
    T = float(max(_t_end(r) for r in main.values()))
    centerings = list(dict.fromkeys(r.config["centering"] for r in main.values()))
    rows = [row for run in main.values() for row in _rows(run, T)]
    verdicts = []
    for k, centering in enumerate(centerings):
        tag = "" if k == 0 else f"-{centering}"
        mine = [r for r in main.values() if r.config["centering"] == centering]
        verdicts += _verdicts(mine, [r for r in rows if r["centering"] == centering], T, tag)
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
