"""Figures and a self-contained HTML page for :func:`dynascope.inspect` results.

Per model (or the last checkpoint of a series): heat maps layer x head of the W_QK and W_OV
effective ranks and, when inputs were given, the attention entropy; for a series, each layer's
head-mean of those metrics against the step.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from dynascope.keys import HEAD_COLUMN, with_head_index
from dynascope.report.figures import add_colorbar, new_figure, save_figure
from dynascope.report.html import write_table_report

__all__ = ["inspect_figures", "write_inspect_report"]

_PANELS = (
    ("qk_effective_rank", "W_QK effective rank"),
    ("ov_effective_rank", "W_OV effective rank"),
    ("attention_entropy", "attention entropy (nats)"),
)


def _panels(frame: pd.DataFrame) -> list[tuple[str, str]]:
    return [(c, label) for c, label in _PANELS if c in frame.columns]


def inspect_figures(frame: pd.DataFrame, figures_dir: str | os.PathLike[str]) -> list[Path]:
    """Draw ``heads.png`` (and ``over_steps.png`` for two or more steps) under ``figures_dir``.

    Args:
        frame: a DataFrame returned by :func:`dynascope.inspect` (one with the column
            ``head``, from before dynascope 0.2, is read with a ``DeprecationWarning``).
        figures_dir: where to write the PNGs.
    Returns:
        The paths written.
    """
    frame = with_head_index(frame)
    figures_dir = Path(figures_dir)
    panels = _panels(frame)
    series = "step" in frame.columns
    last = frame[frame["step"] == frame["step"].max()] if series else frame
    title = f"per head, step {int(last['step'].iloc[0])}" if series else "per head"
    fig, axes = new_figure(len(panels), width=3.6, height=3.0, title=title)
    ranks = last[["qk_effective_rank", "ov_effective_rank"]].to_numpy(dtype=float)
    rank_limits = (float(ranks.min()), float(ranks.max()))  # one colour scale for both ranks
    for ax, (column, label) in zip(axes, panels, strict=True):
        grid = last.pivot_table(index="layer", columns=HEAD_COLUMN, values=column, aggfunc="first")
        values = grid.to_numpy(dtype=float)
        limits = rank_limits if column.endswith("effective_rank") else (None, None)
        image = ax.imshow(values, aspect="auto", cmap="viridis", vmin=limits[0], vmax=limits[1])
        if values.size <= 64:  # small grids: the number in each cell
            for (i, j), value in np.ndenumerate(values):
                ink = "k" if image.norm(value) > 0.5 else "w"  # readable on light and dark cells
                ax.text(j, i, f"{value:.3g}", ha="center", va="center", color=ink, fontsize=7)
        ax.set(xlabel="head", ylabel="layer", title=label)
        ax.set_xticks(np.arange(grid.shape[1]), [str(h) for h in grid.columns])
        ax.set_yticks(np.arange(grid.shape[0]), [str(layer) for layer in grid.index])
        ax.grid(False)
        add_colorbar(fig, image, ax, label)
    paths = [save_figure(fig, figures_dir / "heads.png")]
    if series and frame["step"].nunique() > 1:
        fig, axes = new_figure(len(panels), width=3.6, height=3.0, title="mean over heads")
        layers = sorted(frame["layer"].unique())
        colors = {layer: f"C{i % 10}" for i, layer in enumerate(layers)}  # same in every panel
        means = frame.groupby(["layer", "step"]).mean(numeric_only=True).reset_index()
        for ax, (column, label) in zip(axes, panels, strict=True):
            for layer in layers:
                rows = means[means["layer"] == layer]
                ax.plot(
                    rows["step"], rows[column], marker=".", color=colors[layer], label=f"{layer}"
                )
            ax.set(xlabel="step", ylabel=label)
        handles, labels = axes[0].get_legend_handles_labels()  # same colours in every panel
        fig.legend(handles, labels, loc="outside right upper", title="attention\nlayer")
        paths.append(save_figure(fig, figures_dir / "over_steps.png"))
    return paths


def write_inspect_report(
    frame: pd.DataFrame | None,
    out: str | os.PathLike[str],
    title: str,
    layers: pd.DataFrame | None = None,
) -> tuple[Path | None, Path, list[Path]]:
    """Write ``inspect.csv``, the figures and ``inspect.html`` (self-contained) under ``out``;
    with ``layers`` (:func:`dynascope.inspect_layers`), ``layers.csv`` and its table too.

    Args:
        frame: the per-head frame of :func:`dynascope.inspect` (one with the column ``head``,
            from before dynascope 0.2, is read with a ``DeprecationWarning``), or ``None`` for
            a model without attention layers (then neither ``inspect.csv`` nor figures).
        out: the directory (created).
        title: the page's title.
        layers: the per-matrix frame of :func:`dynascope.inspect_layers`, or ``None``.
    Returns:
        ``(csv path or None, html path, figure paths)``.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    csv, figures, sections = None, [], []
    if frame is not None:
        frame = with_head_index(frame)
        csv = out / "inspect.csv"
        frame.to_csv(csv, index=False)
        figures = inspect_figures(frame, out / "figures")
        keys = [c for c in ("step", "layer") if c in frame.columns]
        per_layer = frame.drop(columns=["module", HEAD_COLUMN]).groupby(keys).mean().reset_index()
        sections += [
            ("Per layer (mean over heads)", per_layer.to_dict("records")),
            ("Per head", frame.to_dict("records")),
        ]
    if layers is not None:
        layers.to_csv(out / "layers.csv", index=False)
        sections.append(("Per weight matrix: ESD tail (power law)", layers.to_dict("records")))
    page = write_table_report(out / "inspect.html", title, figures, sections)
    return csv, page, figures
