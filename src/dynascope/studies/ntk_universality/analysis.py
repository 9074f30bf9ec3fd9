"""ntk-universality verdicts: u1 (eNTK change) and u2 (distance to the kernel-GD twin) per
architecture, judged on per-seed log-log slopes vs width (docs/studies/ntk-universality.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dynascope.store import Run
from dynascope.studies.base import Analysis
from dynascope.studies.verdict import Precondition

from .figures import means, universality_figure
from .protocol import FIT_MAX, KGD_STABLE, MIN_WIDTH_SPAN, PROTOCOL

__all__ = ["ARCHITECTURES", "analyze", "slope"]

ARCHITECTURES = ("mlp", "rnn", "attention")
NAN = float("nan")


def _measure(run: Run) -> dict:
    def last(key: str) -> float:
        try:
            return run.last(key)
        except KeyError:
            return NAN

    change = run.scalar("ntk.relative_change")
    try:
        f = run.tensors("f")[1]  # [steps + 1, N]
        untrained_gap = float(np.linalg.norm(f - f[0], axis=-1).max())
    except KeyError:
        untrained_gap = NAN
    try:
        mse = run.scalar("fit.mse")
        fit = float(mse.iloc[-1] / mse.iloc[0]) if len(mse) >= 2 else NAN
    except KeyError:
        fit = NAN
    return {
        "arch": run.config["arch"], "width": run.config["width"], "seed": run.config["seed"],
        "parametrization": run.config.get("parametrization", "ntk"), "status": run.status,
        "kernel_change_sup": float(change.max()) if len(change) else NAN,
        "kgd_deviation": last("kgd.deviation"),
        "untrained_deviation": untrained_gap,
        "kgd_analytic_deviation": last("kgd_analytic.deviation"),
        "init_deviation": last("ntk.init_deviation"),
        "lr_lambda_max_over_N": last("lr_lambda_max_over_N"),
        "final / initial mse": fit,
    }  # fmt: skip


def slope(widths: np.ndarray, values: np.ndarray) -> float:
    ok = np.isfinite(values) & (values > 0)
    if ok.sum() < 2:
        return float("nan")
    return float(np.polyfit(np.log(widths[ok]), np.log(values[ok]), 1)[0])


def _seed_slopes(rows: list[dict], arch: str, key: str) -> dict[int, float]:
    """Per seed: the log-log slope of ``key`` vs width over that seed's runs of ``arch`` (pass
    the rows of one parametrization).

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
    """Every run of ``arch`` (both parametrizations in ``rows``) finished, is stable at init,
    fit its targets (``final / initial mse <= FIT_MAX``), and the widths span 4x; measured:
    the worst run's final / initial MSE."""
    mine = [r for r in rows if r["arch"] == arch]
    widths = [r["width"] for r in mine]
    span = max(widths) / min(widths)
    stability = max(r["lr_lambda_max_over_N"] for r in mine)
    finished = all(r["status"] == "finished" for r in mine)
    fits = [r.get("final / initial mse", NAN) for r in mine]
    worst_fit = max(fits) if fits and all(np.isfinite(fits)) else NAN
    arms = sorted({r.get("parametrization", "ntk") for r in mine})
    return Precondition(
        f"every run ({'/'.join(arms)}, every width and seed) finished and fit its targets "
        f"(final / initial train MSE <= {FIT_MAX:g}; measured: the worst run's), kernel GD is "
        f"stable (max (eta/N) lambda_max(Theta_0) < {KGD_STABLE:g}; here {stability:.3g}) and "
        f"the widths span w_max / w_min >= {MIN_WIDTH_SPAN:g} (here {span:g})",
        met=finished
        and bool(stability < KGD_STABLE)
        and span >= MIN_WIDTH_SPAN
        and bool(worst_fit <= FIT_MAX),
        measured=worst_fit,
    )


def analyze(runs: dict[str, Run], figures: Path) -> Analysis:
    """Verdicts u1/u2 per architecture (NTK nets, against their muP ablation) and the reported
    MLP checks, from the stored runs."""
    rows = [_measure(run) for run in runs.values()]
    ntk = [r for r in rows if r["parametrization"] == "ntk"]
    mup = [r for r in rows if r["parametrization"] == "mup"]
    archs = [a for a in ARCHITECTURES if any(r["arch"] == a for r in ntk)]
    verdicts, slopes = [], []
    for tag, key in (("u1", "kernel_change_sup"), ("u2", "kgd_deviation")):
        for arch in archs:
            w, m = means(ntk, arch, key)
            wc, mc = means(mup, arch, key) if mup else (w[:0], m[:0])
            slopes.append({"claim": f"{tag}-{arch}", "slope of seed means": slope(w, m),
                           "muP (control)": slope(wc, mc)})  # fmt: skip
            verdicts.append(PROTOCOL.claim(f"{tag}-{arch}").judge(
                _seed_slopes(ntk, arch, key),
                precondition=_precondition(rows, arch),
                control=_seed_slopes(mup, arch, key),
                detail=f"widths {w.astype(int).tolist()}; theory -0.5 (Theta_0) to -1 (change "
                "during training); seed means NTK: "
                + ", ".join(f"{int(a)}: {b:.3g}" for a, b in zip(w, m))
                + "; muP: " + ", ".join(f"{int(a)}: {b:.3g}" for a, b in zip(wc, mc)),
            ))  # fmt: skip
    for arch in archs:
        w, m = means(ntk, arch, "untrained_deviation")
        slopes.append({"claim": f"reported: {arch} sup_t ||f_t - f_0||", "slope of seed means":
                       slope(w, m)})  # fmt: skip
    if "mlp" in archs:
        for key in ("kgd_analytic_deviation", "init_deviation"):
            w, m = means(ntk, "mlp", key)
            slopes.append({"claim": f"reported: mlp {key}", "slope of seed means": slope(w, m)})
    tables = {"slopes vs width (log-log)": slopes, "per run": rows}
    return Analysis(verdicts, [universality_figure(ntk, archs, figures)], tables)
