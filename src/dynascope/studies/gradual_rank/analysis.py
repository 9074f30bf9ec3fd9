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
from dynascope.studies.verdict import MIN_SEEDS, Precondition, Verdict

from .figures import toy_figures, vit_figures
from .protocol import PROTOCOL, TOY_FIT, V1_MIN_ACCURACY
from .runs import ToyRun
from .stages import DROP_ABS_WINDOW, T2_ACTIVE_FACTOR, _tau
from .stages import active_counts as active_counts
from .stages import find_drops as find_drops
from .stages import midpoint_rise as midpoint_rise
from .stages import plateaus as plateaus
from .stages import rescaled_time as rescaled_time
from .stages import switch_on_index as switch_on_index
from .stages import switched_on as switched_on

__all__ = ["analyze"]  # and the stage readers of .stages, imported above

T2_MAX_ALPHA = 1e-2  # t2 reads the runs at α <= this
V1_SRANK_FRACTION = PROTOCOL.claim("v1-end").threshold  # srank(Δ_QK) at the end <= d_head / 4


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
    steps instead of τ. Precondition: every α the claim reads fits the teacher on every seed
    (final loss ≤ ``TOY_FIT`` × its initial loss); the α = 1 control is read only on the seeds
    where it fits (elsewhere its value is NaN: it sits at a spurious stationary point), and at
    least ``MIN_SEEDS`` of them must fit (amendment of 2026-12-07).
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
        control_fit = by_alpha[largest]["final loss / initial loss"] <= TOY_FIT  # NaN: no
        t1_control[seed] = float(len(per_alpha[largest]["spans"])) if control_fit else math.nan
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
        t2_control[seed] = (
            float(by_alpha[largest][rise]) if largest == 1.0 and control_fit else math.nan
        )
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

    def fitted(read: list[float], what: str, control: float | None = None) -> Precondition:
        """Every α of ``read`` fits on every seed; with ``control``, that α fits on at least
        ``MIN_SEEDS`` seeds (the control reads only those)."""
        worst = max((v for a in read for v in fit.get(a, [math.nan])), default=math.nan)
        text = (
            f"{what}; every α read ({', '.join(f'{a:g}' for a in read)}) fits the teacher on "
            f"every seed: final loss <= {TOY_FIT:g} × initial loss (measured: the worst ratio)"
        )
        met = bool(worst <= TOY_FIT)  # NaN fails
        if control is not None:
            ratios = fit.get(control, [])
            n_fit = sum(r <= TOY_FIT for r in ratios)
            text += (
                f"; the control α = {control:g} fits on >= {MIN_SEEDS} seeds and is read on "
                f"those only (fits on {n_fit} of {len(ratios)})"
            )
            met = met and n_fit >= MIN_SEEDS
        return Precondition(text, met=met, measured=worst)

    gated_alphas = [a for a in alphas if a <= T2_MAX_ALPHA * (1 + 1e-9)]
    has_control = len(alphas) >= 2 and largest == 1.0
    verdicts = [
        PROTOCOL.claim("t1").judge(
            t1,
            precondition=fitted(
                [smallest] if has_control else [],
                f"the grid has a small α and the control α = 1 ({has_control})",
                largest if has_control else None,
            ),
            control=t1_control,
            detail=f"at α = {smallest:g}; S10's literal window (≥ 30% within Δτ ≤ "
            f"{DROP_ABS_WINDOW}) finds {_per_seed(literal)} drops",
        ),
        PROTOCOL.claim("t2").judge(
            t2,
            precondition=fitted(gated_alphas if gated_alphas and has_control else [],
                                f"the grid has an α <= {T2_MAX_ALPHA:g} and the control α = 1",
                                largest if has_control else None),
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
