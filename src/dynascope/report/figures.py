"""Figure helpers: one matplotlib style for every study, PNGs written atomically.

Matplotlib runs on the non-interactive Agg backend (no screen needed). Studies draw with
:func:`new_figure` and save with :func:`save_figure`.
"""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

__all__ = ["figure_problems", "new_figure", "save_figure"]

_STYLE = {
    "figure.dpi": 110,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "font.size": 9,
    "axes.titlesize": 10,
    "legend.fontsize": 8,
    "legend.frameon": False,
}


def new_figure(
    ncols: int = 1,
    nrows: int = 1,
    *,
    width: float = 4.2,
    height: float = 3.2,
    title: str | None = None,
) -> tuple[Figure, list[Axes]]:
    """A figure with ``nrows x ncols`` panels (flattened list of axes), in the house style."""
    with plt.rc_context(_STYLE):
        fig, axes = plt.subplots(
            nrows,
            ncols,
            figsize=(width * ncols, height * nrows),
            squeeze=False,
            layout="constrained",
        )
    for ax in axes.flat:
        ax.grid(True, alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
    if title:
        fig.suptitle(title)
    return fig, list(axes.flat)


def save_figure(fig: Figure, path: str | os.PathLike[str]) -> Path:
    """Save ``fig`` as PNG at ``path`` (atomic: temporary file, then rename) and close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, format="png")
    plt.close(fig)
    os.replace(tmp, path)
    return path


def _colours(ax: Axes) -> set[str]:
    """Distinct colours of the lines and scatter collections drawn on ``ax``."""
    from matplotlib.colors import to_hex

    colours = {to_hex(line.get_color()) for line in ax.get_lines() if line.get_visible()}
    for collection in ax.collections:
        faces = collection.get_facecolor()
        if len(faces) == 1:  # one colour per collection (a scatter series), not a colour map
            colours.add(to_hex(faces[0]))
    return colours


def figure_problems(fig: Figure) -> list[str]:
    """What a reader could not decode in ``fig``: panels without axis labels, and panels whose
    colours carry meaning (two or more colours) with no legend on the panel or the figure.

    Colour bars, hidden panels and empty panels are skipped; ``fig.supxlabel``/``supylabel``
    count as labels for every panel.

    Returns:
        One line per problem, ``"panel 2 ('title'): no y label"``; empty when none.
    """
    problems = []
    shared_x = getattr(fig, "_supxlabel", None) is not None
    shared_y = getattr(fig, "_supylabel", None) is not None
    figure_legend = bool(fig.legends)
    for i, ax in enumerate(fig.axes):
        has_data = ax.get_lines() or ax.collections or ax.images or ax.patches
        if not ax.get_visible() or not has_data or getattr(ax, "_colorbar", None) is not None:
            continue
        name = f"panel {i} ({ax.get_title()!r})"
        if not ax.get_xlabel() and not shared_x:
            problems.append(f"{name}: no x label")
        if not ax.get_ylabel() and not shared_y:
            problems.append(f"{name}: no y label")
        if len(_colours(ax)) > 1 and ax.get_legend() is None and not figure_legend:
            problems.append(f"{name}: {len(_colours(ax))} colours and no legend")
    return problems
