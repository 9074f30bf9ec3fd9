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

__all__ = ["new_figure", "save_figure"]

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
