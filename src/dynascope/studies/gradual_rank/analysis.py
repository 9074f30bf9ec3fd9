"""Gradual-rank analysis: stages of the toy per seed (t1–t3) and the ViT's ΔW ranks (v1).

Thresholds, the drop window and the switch-on reading: ``docs/studies/gradual-rank.md``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from dynascope.store import Run
from dynascope.studies.base import Analysis
from dynascope.studies.verdict import Precondition, Verdict

from .figures import toy_figures, vit_figures
from .protocol import PROTOCOL, TOY_FIT, V1_MIN_ACCURACY
from .runs import ToyRun

__all__ = [
    "active_counts",
    "analyze",
    "find_drops",
    "midpoint_rise",
    "plateaus",
    "rescaled_time",
    "switch_on_index",
    "switched_on",
]

# The metrics' fixed parts; thresholds, directions and statistics live in .protocol (PROTOCOL).
DROP_FALL = 0.3  # a drop: the loss falls by >= 30% ...
DROP_REL_WINDOW = 0.05  # ... between tau and (1 + 0.05) * tau
DROP_ABS_WINDOW = 0.05  # S10's literal window (absolute), reported beside t1
T2_ACTIVE_FACTOR = 10.0  # active: |Δ entry| > 10 α (t2's end count)
T2_MAX_ALPHA = 1e-2
V1_SRANK_FRACTION = PROTOCOL.claim("v1-end").threshold  # srank(Δ_QK) at the end <= d_head / 4


def rescaled_time(steps: np.ndarray, lr: float, alpha: float) -> np.ndarray:
    """τ = η·t / log(1/α): gradient-flow time in units of log(1/α).

    Args:
        steps: ``[n]`` GD steps t.
        lr: step size η.
        alpha: init scale in (0, 1).
    Returns:
        ``[n]`` float64, dimensionless.
    Raises:
        ValueError: if ``alpha`` is not in (0, 1).
    References:
        Abbe et al. (2023), arXiv 2306.07042, Sec. 4 and Fig. 2 (time rescaled by log(1/α)).
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1) (got alpha={alpha})")
    return lr * np.asarray(steps, dtype=np.float64) / math.log(1.0 / alpha)


def _tau(steps: np.ndarray, lr: float, alpha: float) -> np.ndarray:
    """τ for every α of the grid: :func:`rescaled_time` for α < 1; η·t for the α = 1 control,
    which has no log(1/α) unit (the drop detector's window is relative to τ, so its count does
    not depend on τ's unit)."""
    return rescaled_time(steps, lr, alpha) if alpha < 1 else lr * np.asarray(steps, np.float64)


def find_drops(
    tau: np.ndarray,
    loss: np.ndarray,
    *,
    fall: float = DROP_FALL,
    rel_window: float | None = DROP_REL_WINDOW,
    abs_window: float | None = None,
) -> list[tuple[int, int, int]]:
    """Sharp loss drops: runs of indices where the loss falls by ≥ ``fall`` within a window.

    Index ``i`` is flagged when ``loss[j] <= (1 − fall)·loss[i]`` for ``j`` the last index with
    ``tau[j] <= tau[i]·(1 + rel_window)`` (or ``tau[i] + abs_window``). A drop runs from the
    first to the last ``j`` of a run of consecutive flagged indices; drops that overlap merge.

    Args:
        tau: ``[n]`` rescaled times, increasing.
        loss: ``[n]`` losses (> 0).
        fall: fractional fall that makes a drop, in (0, 1).
        rel_window: window relative to τ (exclusive with ``abs_window``).
        abs_window: absolute window in τ units.
    Returns:
        ``(start, end, steepest)`` indices per drop, in order; ``steepest`` is where log-loss
        falls fastest per unit τ inside the drop.
    Raises:
        ValueError: if not exactly one of ``rel_window``, ``abs_window`` is given, or ``tau``
            and ``loss`` differ in length.
    """
    if (rel_window is None) == (abs_window is None):
        raise ValueError("give exactly one of rel_window, abs_window (got both or neither)")
    tau, loss = np.asarray(tau, dtype=np.float64), np.asarray(loss, dtype=np.float64)
    if tau.shape != loss.shape or tau.ndim != 1:
        raise ValueError(f"tau and loss must be 1-d of one length (got {tau.shape}, {loss.shape})")
    if len(tau) < 2:
        return []
    limit = tau * (1 + rel_window) if rel_window is not None else tau + abs_window
    j = np.searchsorted(tau, limit, side="right") - 1  # last index inside each window
    flagged = (j > np.arange(len(tau))) & (loss[j] <= (1 - fall) * loss)
    drops: list[list[int]] = []
    i = 0
    while i < len(tau):
        if not flagged[i]:
            i += 1
            continue
        k = i
        while k + 1 < len(tau) and flagged[k + 1]:
            k += 1
        start, end = i, int(j[k])
        if drops and start <= drops[-1][1]:
            drops[-1][1] = max(drops[-1][1], end)
        else:
            drops.append([start, end])
        i = k + 1
    log_loss = np.log(np.maximum(loss, 1e-300))
    slope = np.diff(log_loss) / np.maximum(np.diff(tau), 1e-300)  # slope[i]: i -> i + 1
    out = []
    for start, end in drops:
        steepest = start + int(np.argmin(slope[start:end])) if end > start else start
        out.append((start, end, steepest))
    return out


def plateaus(n: int, drops: list[tuple[int, int, int]]) -> list[tuple[int, int]]:
    """Index intervals ``(first, last)`` around the drops of a length-``n`` trace: before the
    first drop, between drops, after the last; an empty one (a drop that runs to the end of
    the trace) is left out, so there are ``len(drops) + 1`` or ``len(drops)`` of them."""
    edges = [0]
    for start, end, _ in drops:
        edges += [start, end]
    edges.append(n - 1)
    spans = [(edges[2 * k], edges[2 * k + 1]) for k in range(len(edges) // 2)]
    return [(a, b) for a, b in spans if b > a]


def active_counts(values: np.ndarray, alpha: float, factor: float = T2_ACTIVE_FACTOR) -> np.ndarray:
    """Active entries ``#{i : |values[t, i] − values[0, i]| > factor·α}`` per logged step.

    Args:
        values: ``[n_steps, d_model]`` a diagonal (``w_Q⊙w_K`` or ``w_V⊙w_O``) over time; row 0
            is the initialisation.
        alpha: init scale.
        factor: threshold in units of α (S10: 10, ≫ the α² scale of the initial products).
    Returns:
        ``[n_steps]`` int counts (the rank of the diagonal Δ above the threshold).
    """
    return (np.abs(values - values[:1]) > factor * alpha).sum(axis=-1)


def switch_on_index(
    values: np.ndarray, alpha: float, factor: float = T2_ACTIVE_FACTOR
) -> list[int]:
    """For each entry active at the end (``|Δ| > factor·α``), the first logged index where its
    ``|Δ|`` reaches half of its final value (a reading of "switches on" that does not depend on
    α; reported beside t2, not gated).

    Args:
        values: ``[n_steps, d_model]`` a diagonal over time, row 0 the initialisation.
        alpha: init scale.
        factor: activity threshold in units of α.
    Returns:
        Indices, sorted ascending (one per entry active at the end).
    """
    delta = np.abs(values - values[:1])
    final = delta[-1]
    out = [
        int(np.argmax(delta[:, i] >= final[i] / 2)) for i in np.flatnonzero(final > factor * alpha)
    ]
    return sorted(out)


def switched_on(values: np.ndarray, alpha: float, factor: float = T2_ACTIVE_FACTOR) -> np.ndarray:
    """Entries switched on at each logged step: active at the end (``|Δ| > factor·α``) and
    with ``|Δ|`` at least ½ of its final value (the α-free reading of t2).

    Args:
        values: ``[n_steps, d_model]`` a diagonal over time, row 0 the initialisation.
        alpha: init scale.
        factor: activity threshold in units of α (only selects the entries that count).
    Returns:
        ``[n_steps]`` int counts.
    """
    delta = np.abs(values - values[:1])
    final = delta[-1]
    return ((delta >= final / 2) & (final > factor * alpha)).sum(axis=-1)


def midpoint_rise(values: np.ndarray, support: np.ndarray, mids: list[int]) -> int:
    """t2's reading: the largest rise, between consecutive plateau midpoints, of the number of
    teacher entries switched on (past ½ of their final |Δ| for the first time).

    With fewer than two plateaus the stages are not resolved: the whole run is one stage and
    the rise is the number of teacher entries that switch on at all.

    Args:
        values: ``[n_steps, d_model]`` a diagonal (``w_Q⊙w_K`` or ``w_V⊙w_O``) over time, row 0
            the initialisation.
        support: ``[d_model]`` bool, the teacher's nonzero entries (the entries to switch on).
        mids: the plateaus' midpoint indices, in order.
    Returns:
        The rise, an entry count.
    References:
        Abbe et al. (2023), arXiv 2306.07042, Sec. 4 (each stage raises the rank by at most
        one); SYSTEMS.md S10, t2 (counts read at each plateau's midpoint).
    """
    delta = np.abs(values - values[:1])[:, support]
    final = delta[-1]
    on = [int(np.argmax(delta[:, i] >= final[i] / 2)) for i in np.flatnonzero(final > 0)]
    if len(mids) < 2:
        return len(on)
    counts = [sum(i <= m for i in on) for m in mids]
    return max(b - a for a, b in zip(counts, counts[1:]))


def _toy_traces(run: Run) -> tuple[ToyRun, np.ndarray, dict[str, np.ndarray]]:
    """Config, logged steps ``[n]`` and traces ``loss [n, n_alpha]``, ``qk``/``ov`` ``[n,
    n_alpha, d_model]`` (a one-element tensor is stored as a scalar: one α gives scalar rows)."""
    cfg = ToyRun.model_validate(run.config)
    n_alpha = len(cfg.alphas)
    traces = {}
    for key in ("loss", "qk", "ov"):
        try:
            steps, values = run.tensors(key)
        except KeyError:
            series = run.scalar(key)
            steps, values = series.index.to_numpy(), series.to_numpy(dtype=np.float64)
        traces[key] = values.reshape(len(steps), n_alpha, -1).astype(np.float64)
    traces["loss"] = traces["loss"][..., 0]
    traces["teacher"] = np.asarray(run.tensors("teacher")[1][0], np.float64).reshape(-1)
    return cfg, steps, traces


def _toy_seed(run: Run) -> tuple[dict, list[dict], dict]:
    """One toy run: per α its τ, drops, plateaus and counts, and its table rows."""
    cfg, steps, tr = _toy_traces(run)
    per_alpha, rows = {}, []
    for j, alpha in enumerate(cfg.alphas):
        tau = _tau(steps, cfg.lr, alpha)
        loss = tr["loss"][:, j]
        drops = find_drops(tau, loss)
        literal = find_drops(tau, loss, rel_window=None, abs_window=DROP_ABS_WINDOW)
        spans = plateaus(len(tau), drops)
        counts = {p: active_counts(tr[p][:, j], alpha) for p in ("qk", "ov")}
        mids = [int(np.searchsorted(tau, (tau[a] + tau[b]) / 2)) for a, b in spans]
        support = tr["teacher"] != 0
        stage_rise = max(midpoint_rise(tr[p][:, j], support, mids) for p in ("qk", "ov"))
        at_mid = {p: [int(counts[p][m]) for m in mids] for p in counts}
        on = {p: switch_on_index(tr[p][:, j], alpha) for p in ("qk", "ov")}
        half_mid = {p: [sum(i <= m for i in on[p]) for m in mids] for p in on}
        rises = {p: [b - a for a, b in zip(v, v[1:])] for p, v in half_mid.items()}
        rises_10a = {p: [b - a for a, b in zip(v, v[1:])] for p, v in at_mid.items()}
        on_count = {p: switched_on(tr[p][:, j], alpha) for p in ("qk", "ov")}
        across = {p: [int(c[e] - c[s]) for s, e, _ in drops] for p, c in on_count.items()}
        whole = {
            p: int(c[drops[-1][1]] - c[drops[0][0]]) if drops else 0 for p, c in on_count.items()
        }
        per_alpha[alpha] = {
            "tau": tau,
            "drops": drops,
            "spans": spans,
            "counts": counts,
            "drop_tau": [float(tau[s]) for _, _, s in drops],
        }
        rows.append(
            {
                "seed": int(cfg.seed),
                "alpha": alpha,
                "drops": len(drops),
                "plateaus": len(spans),
                "drop_tau (steepest)": ", ".join(f"{tau[s]:.2f}" for _, _, s in drops),
                "drops with |Δτ| ≤ 0.05 (S10 literal)": len(literal),
                "qk on (½ final) at plateaus": " → ".join(map(str, half_mid["qk"])),
                "ov on (½ final) at plateaus": " → ".join(map(str, half_mid["ov"])),
                "qk rise across each drop (½ final)": ", ".join(map(str, across["qk"])),
                "ov rise across each drop (½ final)": ", ".join(map(str, across["ov"])),
                "max rise across a drop (½ final)": (
                    max(r for v in across.values() for r in v) if drops else math.nan
                ),
                "rise first drop start → last drop end (½ final)": max(whole.values()),
                "max rise between plateau midpoints (½ final)": max(
                    (r for v in rises.values() for r in v), default=0
                ),
                f"qk |Δ| > {T2_ACTIVE_FACTOR:g}α at plateaus": " → ".join(map(str, at_mid["qk"])),
                f"ov |Δ| > {T2_ACTIVE_FACTOR:g}α at plateaus": " → ".join(map(str, at_mid["ov"])),
                f"max rise (> {T2_ACTIVE_FACTOR:g}α)": max(
                    (r for v in rises_10a.values() for r in v), default=0
                ),
                "t2: max rise between plateau midpoints (teacher entries, ½ final)": stage_rise,
                "final loss / initial loss": float(loss[-1] / loss[0]),
                "qk active at end": int(counts["qk"][-1]),
                "ov active at end": int(counts["ov"][-1]),
                "final loss": float(loss[-1]),
                "tau_end": float(tau[-1]),
            }
        )
    return per_alpha, rows, {"cfg": cfg, "tr": tr}


def _per_seed(values: dict[int, float]) -> str:
    return ", ".join(f"seed {s}: {v:.3g}" for s, v in sorted(values.items()))


def _analyze_toy(runs: list[Run], figures: Path) -> tuple[list[Verdict], list[Path], list[dict]]:
    """t1–t3 per seed, judged through the protocol (docs/studies/gradual-rank.md).

    Controls: t1 and t2 on the standard init α = 1 (θ(0) = θ0: the products start at the
    teacher's scale, so the small-init mechanism is removed), the same count; t3 with raw
    steps instead of τ. Precondition: every α the claim reads (the control α = 1 included)
    fits the teacher, per seed (final loss ≤ ``TOY_FIT`` × its initial loss).
    """
    seeds = [_toy_seed(run) for run in runs]
    rows = [row for _, seed_rows, _ in seeds for row in seed_rows]
    cfg = seeds[0][2]["cfg"]
    alphas = sorted(cfg.alphas)
    n_teacher = sum(c != 0 for c in cfg.strengths)
    smallest, largest = alphas[0], alphas[-1]
    t1, t1_control, t2, t2_control, t2_10a, t2_drop, t3, t3_control, literal = (
        {} for _ in range(9)
    )
    fit: dict[float, list[float]] = {}  # α -> final / initial loss over the seeds
    for per_alpha, seed_rows, data in seeds:
        seed = int(data["cfg"].seed)
        by_alpha = {r["alpha"]: r for r in seed_rows}
        for r in seed_rows:
            fit.setdefault(r["alpha"], []).append(r["final loss / initial loss"])
        t1[seed] = float(len(per_alpha[smallest]["spans"]))
        t1_control[seed] = float(len(per_alpha[largest]["spans"]))
        literal[seed] = float(by_alpha[smallest]["drops with |Δτ| ≤ 0.05 (S10 literal)"])
        rise = "t2: max rise between plateau midpoints (teacher entries, ½ final)"
        gated = [r for r in seed_rows if r["alpha"] <= T2_MAX_ALPHA * (1 + 1e-9)]
        if gated:
            ends_ok = all(
                r["qk active at end"] == n_teacher and r["ov active at end"] == n_teacher
                for r in gated
            )
            worst = max(r[rise] for r in gated)
            t2[seed] = float(worst) if ends_ok else math.nan  # a wrong end count fails
            t2_10a[seed] = float(max(r[f"max rise (> {T2_ACTIVE_FACTOR:g}α)"] for r in gated))
            t2_drop[seed] = float(max(r["max rise across a drop (½ final)"] for r in gated))
        t2_control[seed] = float(by_alpha[largest][rise]) if largest == 1.0 else math.nan
        if len(alphas) >= 2:
            a1, a2 = alphas[:2]
            t_1, t_2 = per_alpha[a1]["drop_tau"], per_alpha[a2]["drop_tau"]
            rel = [abs(b - a) / a for a, b in zip(t_1, t_2)]
            t3[seed] = max(rel) if rel and len(t_1) == len(t_2) else math.nan
            # raw steps: τ · log(1/α) / η, so the ratio of step times is the ratio of τ·log(1/α)
            raw = [
                abs(b * math.log(1 / a2) - a * math.log(1 / a1)) / (a * math.log(1 / a1))
                for a, b in zip(t_1, t_2)
            ]
            t3_control[seed] = max(raw) if raw and len(t_1) == len(t_2) else math.nan

    def fitted(read: list[float], what: str) -> Precondition:
        worst = max((v for a in read for v in fit.get(a, [math.nan])), default=math.nan)
        return Precondition(
            f"{what}; every α read ({', '.join(f'{a:g}' for a in read)}) fits the teacher on "
            f"every seed: final loss <= {TOY_FIT:g} × initial loss (measured: the worst ratio)",
            met=bool(worst <= TOY_FIT),  # NaN fails
            measured=worst,
        )

    gated_alphas = [a for a in alphas if a <= T2_MAX_ALPHA * (1 + 1e-9)]
    has_control = len(alphas) >= 2 and largest == 1.0
    verdicts = [
        PROTOCOL.claim("t1").judge(
            t1,
            precondition=fitted(
                [smallest, largest] if has_control else [],
                f"the grid has a small α and the control α = 1 ({has_control})",
            ),
            control=t1_control,
            detail=f"at α = {smallest:g}; S10's literal window (≥ 30% within Δτ ≤ "
            f"{DROP_ABS_WINDOW}) finds {_per_seed(literal)} drops",
        ),
        PROTOCOL.claim("t2").judge(
            t2,
            precondition=fitted([*gated_alphas, largest] if gated_alphas and has_control else [],
                                f"the grid has an α <= {T2_MAX_ALPHA:g} and the control α = 1"),
            control=t2_control,
            detail=f"{n_teacher} teacher entries; not gated: the rise across each drop (the "
            f"reading of 2026-12-02): {_per_seed(t2_drop)}; the > {T2_ACTIVE_FACTOR:g}α "
            f"reading: {_per_seed(t2_10a)}",
        ),
        PROTOCOL.claim("t3").judge(
            t3,
            precondition=fitted(alphas[:2] if len(alphas) >= 2 else [], "the grid has >= 2 α"),
            control=t3_control,
            detail=f"α = {', '.join(f'{a:g}' for a in alphas[:2])}",
        ),
    ]  # fmt: skip
    per_alpha, _, data = seeds[0]
    figs = toy_figures(data["cfg"], alphas, data["tr"], per_alpha, figures, T2_ACTIVE_FACTOR)
    return verdicts, figs, rows


# -- analysis: the ViT ------------------------------------------------------------------------
def _d_head(run: Run) -> int:
    model = run.config["model"]
    return int(model.get("d_head") or model["d_model"] // model["n_heads"])


def _layer_series(run: Run, product: str) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per layer: (steps, head-mean srank) of ``product`` (``dqk``/``dov``), step 0 dropped."""
    out = {}
    for layer in range(int(run.config["model"]["n_layers"])):
        series = run.scalar(f"L{layer}.{product}.mean.stable_rank")
        series = series[series.index > 0]
        out[layer] = (series.index.to_numpy(), series.to_numpy(dtype=np.float64))
    return out


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    from scipy.stats import spearmanr

    if len(x) < 3 or np.ptp(y) == 0 or not np.isfinite(y).all():
        return float("nan")
    return float(spearmanr(x, y).statistic)


def _worst(values: list[float], pick) -> float:
    """``pick`` (min or max) of per-layer values; NaN if any layer is NaN or there is none."""
    return math.nan if not values or any(map(math.isnan, values)) else float(pick(values))


def _vit_statistics(runs: list[Run]) -> tuple[dict, dict, dict, list[dict]]:
    """Per seed of one ViT arm: v1-rise (min over layers of Spearman ρ(step, head-mean
    srank(Δ_QK)) over the log-points), v1-end (max over layers of srank(Δ_QK)_end / d_head),
    the final val accuracy (NaN unless finished), and the per-layer table rows."""
    rows = []
    rise, end, accuracy = {}, {}, {}
    for run in runs:
        d_head = _d_head(run)
        seed = int(run.config.get("seed", 0))
        rhos, ends = [], []
        for product in ("dqk", "dov"):
            for layer, (steps, srank) in _layer_series(run, product).items():
                rows.append(
                    {
                        "run": run.name,
                        "seed": seed,
                        "optimizer": run.config["optimizer"]["name"],
                        "status": run.status,
                        "product": product,
                        "layer": layer,
                        "spearman_rho": _spearman(steps, srank),
                        "srank_end": float(srank[-1]) if len(srank) else math.nan,
                        "srank_max": float(srank.max()) if len(srank) else math.nan,
                        "d_head": d_head,
                        "val.accuracy": _final(run, "val.accuracy"),
                    }
                )
                if product == "dqk":
                    rhos.append(rows[-1]["spearman_rho"])
                    ends.append(rows[-1]["srank_end"] / d_head)
        rise[seed], end[seed] = _worst(rhos, min), _worst(ends, max)
        accuracy[seed] = _final(run, "val.accuracy") if run.status == "finished" else math.nan
    return rise, end, accuracy, rows


def _analyze_vit(
    runs: list[Run], sgd_runs: list[Run], figures: Path
) -> tuple[list[Verdict], list[Path], list[dict]]:
    """v1-rise and v1-end over the Adam ViT's seeds, each with the SGD-trained ViT (same
    seeds, same steps) as its ablation control, read with the same statistic.

    Precondition: every ViT of both arms finished and learnt the task (val accuracy >=
    V1_MIN_ACCURACY; chance is 0.1).
    """
    rise, end, accuracy, rows = _vit_statistics(runs)
    rise_control, end_control, sgd_accuracy, sgd_rows = _vit_statistics(sgd_runs)
    acc = list(accuracy.values()) + list(sgd_accuracy.values())
    fit = Precondition(
        f"every ViT, Adam and the SGD control, finished and learnt digits (val accuracy >= "
        f"{V1_MIN_ACCURACY:g}; chance 0.1; measured: the lowest)",
        met=bool(accuracy) and bool(sgd_accuracy) and all(a >= V1_MIN_ACCURACY for a in acc),
        measured=float(min(acc)) if acc else math.nan,  # NaN fails above
    )
    ov = [r for r in rows if r["product"] == "dov"]

    def listing(key: str) -> str:
        return ", ".join(f"{r['run']} L{r['layer']}: {r[key]:.3g}" for r in ov)

    verdicts = [
        PROTOCOL.claim("v1-rise").judge(
            rise,
            precondition=fit,
            control=rise_control,
            detail=f"Δ_OV (not gated): {listing('spearman_rho')}",
        ),
        PROTOCOL.claim("v1-end").judge(
            end,
            precondition=fit,
            control=end_control,
            detail=f"srank(Δ_OV) at the end (not gated): {listing('srank_end')}",
        ),
    ]
    d_head = _d_head(runs[0]) if runs else 0
    return (
        verdicts,
        vit_figures(runs, sgd_runs, figures, V1_SRANK_FRACTION * d_head),
        rows + sgd_rows,
    )


def _final(run: Run, key: str) -> float:
    try:
        return run.last(key)
    except KeyError:
        return float("nan")


def analyze(runs: dict[str, Run], figures: Path) -> Analysis:
    """Verdicts t1–t3 (toy, over its seeds) and v1-rise, v1-end (ViT) from the stored runs."""
    toy_runs = [runs[name] for name in sorted(runs) if name.startswith("toy")]
    verdicts, figs, rows = _analyze_toy(toy_runs, figures)
    tables = {"toy: stages per seed and α": rows}
    vit_runs = [runs[name] for name in sorted(runs) if re.fullmatch(r"vit_s\d+", name)]
    sgd_runs = [runs[name] for name in sorted(runs) if re.fullmatch(r"vit_sgd_s\d+", name)]
    v, f, vit_rows = _analyze_vit(vit_runs, sgd_runs, figures)
    tables["ViT: stable rank of ΔW per layer"] = vit_rows
    return Analysis(verdicts + v, figs + f, tables)
