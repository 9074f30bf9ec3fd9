"""Slingshot figures: norm and loss per run (cycles shaded), validation accuracy, grokking."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dynascope.report import new_figure, save_figure

from .measure import GROK_ACCURACY, Measured

__all__ = ["grokking_figure", "run_figures"]


def run_figures(measured: list[Measured], figures: Path) -> list[Path]:
    """Norm and loss per run (cycles shaded, spikes dotted); validation accuracy (first seed)."""
    seed0 = min((m.seed for m in measured), default=0)  # FCN runs only
    shown = sorted(  # Adam by ascending ε, then SGD
        (m for m in measured if m.seed == seed0), key=lambda m: (m.optimizer != "adam", m.value)
    )
    ncols = max(1, len(shown))
    fig, axes = new_figure(
        ncols,
        2,
        width=3.6,
        height=2.8,
        title=f"last-layer norm and training loss (seed {seed0}); shaded: detected cycles, "
        "dotted: spike",
    )
    for j, m in enumerate(shown):
        top, bottom = axes[j], axes[ncols + j]
        top.plot(m.series["steps"], m.series["norm"], lw=0.8)
        bottom.semilogy(m.series["steps"], np.maximum(m.series["loss"], 1e-12), lw=0.6)
        for ax in (top, bottom):
            for c in m.cycles:
                ax.axvspan(c.start_step, c.end_step, color="tab:orange", alpha=0.25, lw=0)
                ax.axvline(c.spike_step, color="tab:red", ls=":", lw=0.8)
        top.set(title=f"{m.name} ({len(m.cycles)} cycles)", xlabel="step", ylabel="‖W_U‖_F")
        bottom.set(xlabel="step", ylabel="train loss (nats, floor 1e-12)")
    paths = [save_figure(fig, figures / "norm_loss.png")]

    fig, (ax,) = new_figure(1, width=5.0, height=3.2, title=f"validation accuracy (seed {seed0})")
    for m in shown:
        (line,) = ax.plot(m.val_steps, m.val_acc, lw=1, label=m.name)
        for c in m.cycles:
            ax.axvline(c.start_step, color=line.get_color(), ls="--", lw=0.8)
    ax.axhline(GROK_ACCURACY, color="grey", ls=":", lw=1)
    ax.set(xlabel="step", ylabel="val accuracy", title="dashed: cycle onsets; dotted: 0.95")
    ax.legend()
    paths.append(save_figure(fig, figures / "val_accuracy.png"))
    return paths


def grokking_figure(grokking: list[Measured], figures: Path) -> Path:
    """Per grokking run: norm, training loss, validation accuracy; cycles shaded, spikes dotted,
    the grok step a dashed green line."""
    ncols = len(grokking)
    fig, axes = new_figure(
        ncols,
        3,
        width=4.4,
        height=2.6,
        title="grokking system: ‖W_U‖, train loss, val acc\n"
        "shaded: cycles, dotted: spike, dashed: grok",
    )
    for j, m in enumerate(grokking):
        top, middle, bottom = axes[j], axes[ncols + j], axes[2 * ncols + j]
        top.plot(m.series["steps"], m.series["norm"], lw=0.8)
        middle.semilogy(m.series["steps"], np.maximum(m.series["loss"], 1e-12), lw=0.6)
        bottom.plot(m.val_steps, m.val_acc, lw=1)
        bottom.axhline(GROK_ACCURACY, color="grey", ls=":", lw=1)
        for ax in (top, middle, bottom):
            for c in m.cycles:
                ax.axvspan(c.start_step, c.end_step, color="tab:orange", alpha=0.25, lw=0)
                ax.axvline(c.spike_step, color="tab:red", ls=":", lw=0.8)
            if m.grok is not None:
                ax.axvline(m.grok, color="tab:green", ls="--", lw=1)
        grok = m.grok if m.grok is not None else "-"
        top.set(title=f"{m.name} ({len(m.cycles)} cycles, grok {grok})", ylabel="‖W_U‖_F")
        middle.set(ylabel="train loss (nats, floor 1e-12)")
        bottom.set(xlabel="step", ylabel="val accuracy")
    return save_figure(fig, figures / "grokking.png")
