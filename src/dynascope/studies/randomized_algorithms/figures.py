"""Figures of the ``randomized-algorithms`` study (recall, sweeps, cycle colouring, grid world).

Glossary: A^E_R (q = 1, random seeds), A^q_R (Lq, random seeds), A^q_r0 (Lq, one fixed seed
r0); per-input success = fraction of evaluation seeds whose argmax answer is right; V =
predictive variance across seeds; C_n = cycle on n labelled vertices; "majority" for a
colouring = the cycle is coloured properly by more than half of the evaluation seeds.
Every function reads rows/stores built by :func:`dynascope.studies.randomized_algorithms.analyze`
and returns the PNG path(s) it wrote.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dynascope.report import new_figure, save_figure
from dynascope.store import Run

__all__ = ["colouring_figure", "grid_figure", "main_figures", "sweep_figure"]


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


_COLOURS = {
    "erm_random": "C0",
    "lq_random": "C3",
    "lq_fixed": "C2",
    "erm_fixed": "C7",
    "lq_m1": "C4",
}
_LABELS = {
    "erm_random": "A^E_R (q=1, random r)",
    "lq_random": "A^q_R (Lq, random r)",
    "lq_fixed": "A^q_r0 (Lq, fixed r0)",
    "erm_fixed": "A^E_r0 (q=1, fixed r0)",
    "lq_m1": "A^q_R m=1 (ablation)",
}
_HISTOGRAM_ORDER = ("erm_random", "lq_random", "lq_fixed")  # the paper's three; others after


def main_figures(
    runs: dict[str, Run], rows: list[dict], figures: Path, variance_guide: float
) -> list[Path]:
    """Recall: per-input success histograms, summary bars, V per model (``variance_guide``
    drawn as a dotted line), training curves."""
    if not rows:
        return []
    first = {}
    for row in rows:
        first.setdefault(row["model"], row["run"])
    fig, axes = new_figure(3, title="recall: per-input success over 30 seeds (held-out inputs)")
    bins = np.linspace(0, 1, 21)
    shown = sorted(first.items(), key=lambda kv: _HISTOGRAM_ORDER.index(kv[0])
                   if kv[0] in _HISTOGRAM_ORDER else len(_HISTOGRAM_ORDER))  # fmt: skip
    for ax, (model, name) in zip(axes, shown[:3], strict=False):
        try:
            s = runs[name].tensors("eval.per_input_success")[1][-1]
        except KeyError:
            continue
        ax.hist(s, bins=bins, color=_COLOURS.get(model, "C1"))
        ax.set(xlabel="per-input success", ylabel="inputs", title=_LABELS.get(model, model))
    paths = [save_figure(fig, figures / "recall_success_histograms.png")]

    fig, (ax1, ax2, ax3) = new_figure(3, title="recall: summary per model (mean over replicates)")
    models = list(first)
    metrics = ("mean_success", "p5_success", "majority_success", "sampled_success")
    width = 0.8 / len(models)
    for k, model in enumerate(models):
        vals = [_mean([r[m] for r in rows if r["model"] == model]) for m in metrics]
        ax1.bar(
            np.arange(len(metrics)) + (k - (len(models) - 1) / 2) * width,
            vals,
            width,
            color=_COLOURS.get(model, "C1"),
            label=_LABELS.get(model, model),
        )
        v = _mean([r["predictive_variance"] for r in rows if r["model"] == model])
        ax2.bar(k, max(v, 1e-12), color=_COLOURS.get(model, "C1"))
        ax2.annotate(f"{v:.2g}", (k, max(v, 1e-12)), ha="center", va="bottom", fontsize=8)
    ax1.set_xticks(np.arange(len(metrics)), ["mean", "p5", "majority", "sampled"])
    ax1.set(ylabel="success", ylim=(0, 1.15), title="success statistics")
    ax1.legend(loc="upper left", fontsize=7)
    ax2.set_yscale("log")
    ax2.axhline(variance_guide, color="grey", ls=":", lw=1)
    ax2.set_xticks(np.arange(len(models)), [m.replace("_", "\n") for m in models])
    ax2.set(
        ylabel="V (log; bars floored at 1e-12)",
        title=f"predictive variance (dotted: {variance_guide:g})",
    )
    for model, name in first.items():
        curve = runs[name].scalar("train.success")
        ax3.plot(curve.index, curve.values, color=_COLOURS.get(model, "C1"), label=model)
    ax3.set(xlabel="step", ylabel="train success (batch)", title="training")
    paths.append(save_figure(fig, figures / "recall_summary.png"))
    return paths


def sweep_figure(sweep: list[dict], msweep: list[dict], figures: Path) -> Path:
    """Paper sweeps: V vs q per N (A^q_R), and p5 / majority success vs training seeds m."""
    fig, (ax1, ax2) = new_figure(2, title="recall sweeps (paper preset)")
    for n in sorted({r["N"] for r in sweep}):
        part = sorted((r for r in sweep if r["N"] == n), key=lambda r: r["q"])
        ax1.plot(
            [r["q"] for r in part], [r["predictive_variance"] for r in part], "o-", label=f"N={n}"
        )
    ax1.set(xscale="log", yscale="symlog", xlabel="q", ylabel="V", title="predictive variance vs q")
    ax1.legend(fontsize=6, ncol=2)
    ms = sorted(msweep, key=lambda r: r["m"])
    ax2.plot([r["m"] for r in ms], [r["p5_success"] for r in ms], "o", label="p5")
    ax2.plot([r["m"] for r in ms], [r["majority_success"] for r in ms], "s", label="majority")
    ax2.set(xscale="log", xlabel="training seeds m", ylabel="success", title="m sweep (q large)")
    ax2.legend()
    return save_figure(fig, figures / "sweeps.png")


def colouring_figure(runs: dict[str, Run], per_q: list[dict], figures: Path) -> Path:
    """Cycle colouring per q: rates (bars), per-cycle success over seeds, training loss.

    Args:
        runs: the colouring runs (``colour_*``), each with ``eval.per_input_success``.
        per_q: one row per (n, q) with ``single_seed`` and ``majority`` (means over replicates).
        figures: output folder.
    """
    ns = sorted({r["n"] for r in per_q})
    fig, (ax1, ax2, ax3) = new_figure(
        3, title=f"cycle colouring C_{'/'.join(map(str, ns))}: the trend in q (not gated)"
    )
    rows = sorted(per_q, key=lambda r: (r["n"], r["q"]))
    x = np.arange(len(rows))
    for k, (key, label, colour) in enumerate(
        (("single_seed", "single seed", "C0"), ("majority", "> half of the seeds", "C3"))
    ):
        vals = [r[key] for r in rows]
        bars = ax1.bar(x + (k - 0.5) * 0.38, vals, 0.38, color=colour, label=label)
        ax1.bar_label(bars, [f"{v:.3f}" for v in vals], fontsize=7, padding=1)
    finite = [r[k] for r in rows for k in ("single_seed", "majority") if np.isfinite(r[k])]
    low = max(0.0, min(finite, default=0.0) - 0.1)
    ticks = [f"q={r['q']:g}" if len(ns) == 1 else f"n={r['n']}, q={r['q']:g}" for r in rows]
    ax1.set_xticks(x, ticks)
    ax1.set(ylim=(low, 1.04), ylabel="fraction of cycles coloured properly", title="all cycles")
    ax1.legend(loc="lower left", fontsize=7)
    for k, (name, run) in enumerate(sorted(runs.items(), key=lambda kv: kv[1].config["q"])):
        colour = f"C{k}"
        label = f"q={run.config['q']:g} ({name})"
        try:
            s = run.tensors("eval.per_input_success")[1][-1]
        except KeyError:
            continue
        e = int(run.config["eval_seeds"])  # success takes the values k / e, k = 0..e
        bins = (np.arange(e + 2) - 0.5) / e
        ax2.hist(s, bins=bins, histtype="step", lw=1.5, color=colour, label=label)
        loss = run.scalar("train.mean_loss")
        ax3.plot(loss.index, loss.values, color=colour, lw=1, label=label)
    ax2.set(
        yscale="log",
        xlabel="per-cycle success (fraction of eval seeds)",
        ylabel="cycles",
        title="per-cycle success over seeds",
    )
    ax2.legend(fontsize=7)
    ax3.set(
        yscale="log",
        xlabel="step",
        ylabel="expected conflicts (batch mean)",
        title="training loss (mean over cycles, seeds)",
    )
    ax3.legend(fontsize=7)
    return save_figure(fig, figures / "colouring_trend.png")


def grid_figure(grid: dict[str, Run], figures: Path) -> Path:
    """Grid world: worst-case and mean return per generation."""
    fig, (ax,) = new_figure(1, title="grid world: PGPE against the exact adversary")
    for name, run in sorted(grid.items()):
        for key, ls in (("eval.worst_return", "-"), ("eval.mean_return", ":")):
            s = run.scalar(key)
            ax.plot(s.index, s.values, ls, label=f"{name} {key.removeprefix('eval.')}")
    ax.set(xlabel="generation", ylabel="return")
    ax.legend(fontsize=7)
    return save_figure(fig, figures / "grid_world.png")
