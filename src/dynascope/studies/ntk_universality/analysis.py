"""ntk-universality verdicts: u1 (eNTK change) and u2 (distance to the kernel-GD twin) per
architecture, judged on per-seed log-log slopes vs width (docs/studies/ntk-universality.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dynascope.store import Run
from dynascope.studies.base import Analysis
from dynascope.studies.verdict import Control, Precondition, judge

from .figures import means, universality_figure

__all__ = ["ARCHITECTURES", "KGD_STABLE", "MIN_WIDTH_SPAN", "SLOPE_MAX", "analyze", "slope"]

ARCHITECTURES = ("mlp", "rnn", "attention")
SLOPE_MAX = -0.4  # S17's threshold for u1 and u2 (theory -0.5); frozen
MIN_WIDTH_SPAN = 4.0  # precondition: w_max / w_min
KGD_STABLE = 2.0  # precondition: (eta / N) lambda_max(Theta_0) below this in every run


def _measure(run: Run) -> dict:
    def last(key: str) -> float:
        try:
            return run.last(key)
        except KeyError:
            return float("nan")

    change = run.scalar("ntk.relative_change")
    try:
        f = run.tensors("f")[1]  # [steps + 1, N]
        untrained_gap = float(np.linalg.norm(f - f[0], axis=-1).max())
    except KeyError:
        untrained_gap = float("nan")
    return {
        "arch": run.config["arch"], "width": run.config["width"], "seed": run.config["seed"],
        "status": run.status,
        "kernel_change_sup": float(change.max()) if len(change) else float("nan"),
        "kgd_deviation": last("kgd.deviation"),
        "untrained_deviation": untrained_gap,
        "kgd_analytic_deviation": last("kgd_analytic.deviation"),
        "init_deviation": last("ntk.init_deviation"),
        "lr_lambda_max_over_N": last("lr_lambda_max_over_N"),
    }  # fmt: skip


def slope(widths: np.ndarray, values: np.ndarray) -> float:
    ok = np.isfinite(values) & (values > 0)
    if ok.sum() < 2:
        return float("nan")
    return float(np.polyfit(np.log(widths[ok]), np.log(values[ok]), 1)[0])


def _seed_slopes(rows: list[dict], arch: str, key: str) -> dict[int, float]:
    """Per seed: the log-log slope of ``key`` vs width over that seed's runs of ``arch``.

    A run that did not finish counts as NaN, so its seed's slope is NaN (a failing seed) unless
    two other widths remain.
    """
    out = {}
    for seed in sorted({r["seed"] for r in rows if r["arch"] == arch}):
        mine = sorted((r for r in rows if r["arch"] == arch and r["seed"] == seed),
                      key=lambda r: r["width"])  # fmt: skip
        widths = np.array([r["width"] for r in mine], dtype=float)
        values = np.array([r[key] if r["status"] == "finished" else np.nan for r in mine])
        out[seed] = slope(widths, values)
    return out


def _precondition(rows: list[dict], arch: str) -> Precondition:
    mine = [r for r in rows if r["arch"] == arch]
    widths = [r["width"] for r in mine]
    span = max(widths) / min(widths)
    stability = max(r["lr_lambda_max_over_N"] for r in mine)
    finished = all(r["status"] == "finished" for r in mine)
    return Precondition(
        f"every run finished, kernel GD is stable (max (eta/N) lambda_max(Theta_0) < "
        f"{KGD_STABLE:g}; measured) and the widths span w_max / w_min >= {MIN_WIDTH_SPAN:g} "
        f"(here {span:g})",
        met=finished and bool(stability < KGD_STABLE) and span >= MIN_WIDTH_SPAN,
        measured=stability,
    )


def analyze(runs: dict[str, Run], figures: Path) -> Analysis:
    """Verdicts u1/u2 per architecture and the reported MLP checks, from the stored runs."""
    rows = [_measure(run) for run in runs.values()]
    archs = [a for a in ARCHITECTURES if any(r["arch"] == a for r in rows)]
    verdicts, slopes = [], []
    for tag, key, what in (("u1", "kernel_change_sup", "sup_t relative eNTK change"),
                           ("u2", "kgd_deviation", "sup_t ||f_t - f_t^kGD||_2")):  # fmt: skip
        for arch in archs:
            w, m = means(rows, arch, key)
            slopes.append({"claim": f"{tag}-{arch}", "slope of seed means": slope(w, m)})
            verdicts.append(judge(
                claim=f"{tag}-{arch}: {what} shrinks with width at least like width^-0.4",
                metric="per seed, least-squares slope of log(value) vs log(width), widths "
                f"{w.astype(int).tolist()}",
                per_seed=_seed_slopes(rows, arch, key),
                threshold=SLOPE_MAX,
                direction="<=",
                precondition=_precondition(rows, arch),
                control=Control(
                    "the same slope of the distance to the untrained twin, "
                    "sup_t ||f_t - f_0||_2 (training still moves f by Θ(1))",
                    per_seed=_seed_slopes(rows, arch, "untrained_deviation"),
                ),
                detail="theory -0.5 (Theta_0) to -1 (change during training); seed means: "
                + ", ".join(f"{int(a)}: {b:.3g}" for a, b in zip(w, m)),
            ))  # fmt: skip
    for arch in archs:
        w, m = means(rows, arch, "untrained_deviation")
        slopes.append({"claim": f"control-{arch}", "slope of seed means": slope(w, m)})
    if "mlp" in archs:
        for key in ("kgd_analytic_deviation", "init_deviation"):
            w, m = means(rows, "mlp", key)
            slopes.append({"claim": f"reported: mlp {key}", "slope of seed means": slope(w, m)})
    tables = {"slopes vs width (log-log)": slopes, "per run": rows}
    return Analysis(verdicts, [universality_figure(rows, archs, figures)], tables)
