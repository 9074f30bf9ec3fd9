"""hyper-ut-pvr figures: accuracy and pondering per hop count, and the paper preset's
vector-PVR, digits and visual-PVR figures (seed means from the analysis tables)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dynascope.report import new_figure, save_figure
from dynascope.store import Run
from dynascope.tasks.pvr import AGGREGATIONS

from .runs import DIGITS_MODELS, TOKEN_MODELS

__all__ = ["digits_figure", "hops_figure", "vector_figure", "visual_figure"]

LABELS = {"fixed": "fixed 2-layer", "ut_act": "UT-ACT", "hyper_ut": "Hyper-UT", "vit": "ViT"}


def vector_figure(rows: list[dict], figures: Path) -> Path:
    """One panel per aggregation: accuracy vs m, solid standard, dashed adversarial."""
    aggs = [a for a in AGGREGATIONS if any(r["agg"] == a for r in rows)]
    fig, axes = new_figure(len(aggs), width=3.4, title="vector PVR: accuracy vs m (holdout)")
    for ax, agg in zip(axes, aggs):
        sub = [r for r in rows if r["agg"] == agg]
        ms = [r["m"] for r in sub]
        for i, model in enumerate(TOKEN_MODELS):
            if all(np.isnan(r[f"{model}.standard"]) for r in sub):
                continue  # not in this sweep
            ax.plot(
                ms,
                [r[f"{model}.standard"] for r in sub],
                "o-",
                color=f"C{i}",
                label=f"{LABELS[model]}",
            )
            ax.plot(ms, [r[f"{model}.adversarial"] for r in sub], "x--", color=f"C{i}")
        ax.plot(ms, [r["majority"] for r in sub], "k:", label="majority class")
        ax.set(title=f"agg = {agg}", xlabel="m (window m + 1)", ylim=(0, 1.05), xticks=ms)
    axes[0].set_ylabel("accuracy")
    axes[0].plot([], [], "-", color="grey", label="standard test set")
    axes[0].plot([], [], "x--", color="grey", label="adversarial (held-out windows)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=6, fontsize=8)
    return save_figure(fig, figures / "vector_pvr.png")


def digits_figure(rows: list[dict], figures: Path) -> Path:
    """Accuracy and mean layers per example, one bar per model."""
    fig, (ax1, ax2) = new_figure(2, title="digits: ViT vs adaptive depth")
    names = [LABELS[r["model"]] for r in rows]
    colors = [f"C{DIGITS_MODELS.index(r['model'])}" for r in rows]
    ax1.bar_label(ax1.bar(names, [r["accuracy"] for r in rows], color=colors), fmt="%.3f")
    ax1.set(ylabel="validation accuracy", ylim=(0, 1.1))
    ax2.bar_label(ax2.bar(names, [r["mean layers"] for r in rows], color=colors), fmt="%.2f")
    ax2.set(ylabel="mean layers per example (ACT: n + rem)")
    return save_figure(fig, figures / "digits_compute.png")


def visual_figure(rows: list[dict], figures: Path) -> Path:
    """Accuracy and mean layers per example vs m, one line per model."""
    fig, (ax1, ax2) = new_figure(2, title="visual PVR on digit tiles")
    ms = [r["m"] for r in rows]
    for i, model in enumerate(DIGITS_MODELS):
        if all(np.isnan(r[f"{model}.accuracy"]) for r in rows):
            continue  # not in this sweep
        ax1.plot(
            ms, [r[f"{model}.accuracy"] for r in rows], "o-", color=f"C{i}", label=LABELS[model]
        )
        ax2.plot(ms, [r[f"{model}.layers"] for r in rows], "o-", color=f"C{i}", label=LABELS[model])
    ax1.plot(ms, [r["majority"] for r in rows], "k:", label="majority class")
    ax1.set(xlabel="m (window m + 1)", ylabel="validation accuracy", ylim=(0, 1.05), xticks=ms)
    ax2.set(xlabel="m (window m + 1)", ylabel="mean layers per example (ACT: n + rem)", xticks=ms)
    ax1.legend(fontsize=7)
    return save_figure(fig, figures / "visual_pvr.png")


def hops_figure(by_model: dict[str, list[Run]], rows: list[dict], figures: Path) -> Path:
    """Accuracy and ponder per h (seed means), and every run's training loss."""
    hops = [r["h"] for r in rows]
    fig, (ax1, ax2, ax3) = new_figure(3, title="hop-PVR: accuracy and pondering vs hop count")
    for model in TOKEN_MODELS:
        color = f"C{TOKEN_MODELS.index(model)}"
        ax1.plot(
            hops, [r[f"{model}.accuracy"] for r in rows], "o-", color=color, label=LABELS[model]
        )
    ax1.plot(hops, [r["majority"] for r in rows], "k:", label="majority class")
    trained = max(r["h"] for r in rows if r["trained"])
    for ax in (ax1, ax2):
        ax.axvspan(trained + 0.5, hops[-1] + 0.5, color="grey", alpha=0.15)
    ax1.set(xlabel="hops h (shaded: untrained)", ylabel="accuracy", ylim=(0, 1.05))
    ax1.legend(fontsize=7)
    for model in ("ut_act", "hyper_ut"):
        color = f"C{TOKEN_MODELS.index(model)}"
        ax2.plot(hops, [r[f"{model}.ponder"] for r in rows], "o-", color=color, label=LABELS[model])
    ax2.set(xlabel="hops h", ylabel="mean n + rem (readout)")
    ax2.ticklabel_format(axis="y", useOffset=False)
    ax2.legend(fontsize=7)
    for model in TOKEN_MODELS:
        for k, run in enumerate(by_model.get(model, [])):
            series = run.scalar("train.loss")
            ax3.plot(
                series.index,
                series.values,
                color=f"C{TOKEN_MODELS.index(model)}",
                label=LABELS[model] if k == 0 else None,
            )
    ax3.set(xlabel="step", ylabel="train loss incl. ponder cost (nats)", yscale="log")
    ax3.legend(fontsize=7)
    return save_figure(fig, figures / "pvr_hops.png")
