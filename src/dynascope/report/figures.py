"""Figure helpers: one matplotlib style for every study, PNGs written atomically.

Matplotlib runs on the non-interactive Agg backend (no screen needed). Studies draw with
:func:`new_figure` and save with :func:`save_figure`.
"""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.cm import ScalarMappable  # noqa: E402
from matplotlib.colorbar import Colorbar  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import ScalarFormatter  # noqa: E402

__all__ = ["add_colorbar", "figure_problems", "new_figure", "note_below_axis", "save_figure"]

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


def add_colorbar(fig: Figure, mappable: ScalarMappable, ax: Axes, label: str, **kwargs) -> Colorbar:
    """A colour bar for ``mappable`` beside ``ax`` whose tick labels are the values themselves.

    Matplotlib's default shows a narrow range such as 3.8768-3.8776 as ticks of 0.0002 under
    an offset "+3.877" (or a multiplier "1e-6"), which a reader misreads; here every tick
    label is the full value (``ScalarFormatter`` without offset or scientific notation).
    ``kwargs`` go to :meth:`Figure.colorbar` (``pad``, ``orientation``...).
    """
    plain = ScalarFormatter(useOffset=False)
    plain.set_scientific(False)
    return fig.colorbar(mappable, ax=ax, label=label, format=plain, **kwargs)


def save_figure(fig: Figure, path: str | os.PathLike[str]) -> Path:
    """Save ``fig`` as PNG at ``path`` (atomic: temporary file, then rename) and close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, format="png")
    plt.close(fig)
    os.replace(tmp, path)
    return path


def note_below_axis(ax: Axes, what: str = "earlier points") -> bool:
    """Write "<what>: below <y_min>, off the axis" in the panel's lower right corner if any
    plotted line has a finite point under the y axis's lower limit (call it after ``set_ylim``);
    returns whether it did. For panels whose limits cut off an untrained model's values so that
    the trained ones stay readable."""
    floor = ax.get_ylim()[0]
    below = any(
        bool(np.any(np.isfinite(y) & (y < floor)))
        for y in (np.asarray(line.get_ydata(), dtype=float) for line in ax.get_lines())
    )
    if below:
        ax.annotate(f"{what}: below {floor:g}, off the axis", (0.98, 0.03), ha="right",
                    xycoords="axes fraction", fontsize=7, color="grey")  # fmt: skip
    return below


def _colours(ax: Axes) -> set[str]:
    """Distinct colours of the lines and scatter collections drawn on ``ax``."""
    from matplotlib.colors import to_hex

    colours = {to_hex(line.get_color()) for line in ax.get_lines() if line.get_visible()}
    for collection in ax.collections:
        faces = collection.get_facecolor()
        if len(faces) == 1:  # one colour per collection (a scatter series), not a colour map
            colours.add(to_hex(faces[0]))
    # greys (reference lines, guides) carry no category
    return {c for c in colours if len({c[1:3], c[3:5], c[5:7]}) > 1}


def _legend_colours(fig: Figure) -> set[str]:
    """Colours explained by any legend of ``fig`` (its panels' and its own)."""
    from matplotlib.colors import to_hex

    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    colours = set()
    for legend in legends:
        for handle in legend.legend_handles:
            for getter in ("get_color", "get_facecolor"):
                try:
                    value = getattr(handle, getter)()
                    colours.add(
                        to_hex(value if np.ndim(value) == 1 or isinstance(value, str) else value[0])
                    )
                except (AttributeError, ValueError, IndexError, TypeError):
                    continue
    return colours


def _is_number(text: str) -> bool:
    try:
        float(text.replace("\N{MINUS SIGN}", "-").strip("$"))
    except ValueError:
        return False
    return True


def _labelled(ax: Axes, axis: str) -> bool:
    """An axis is labelled by its own label, a shared axis's label, or category tick labels."""
    from matplotlib.category import StrCategoryFormatter
    from matplotlib.ticker import FixedFormatter, FixedLocator

    if getattr(ax, f"get_{axis}label")():
        return True
    scale = getattr(ax, f"{axis}axis")
    formatter, locator = scale.get_major_formatter(), scale.get_major_locator()
    if isinstance(formatter, StrCategoryFormatter | FixedFormatter):
        return True  # categories named on the ticks
    if isinstance(locator, FixedLocator):  # set_xticks(positions, names): names, not numbers?
        names = [str(formatter(value, i)) for i, value in enumerate(locator())]
        if any(not _is_number(name) for name in names if name):
            return True
    shared = getattr(ax, f"get_shared_{axis}_axes")()
    return any(getattr(other, f"get_{axis}label")() for other in shared.get_siblings(ax))


def _colorbar_offset(bar: Colorbar) -> str:
    """The offset or multiplier text drawn beside ``bar``'s ticks ("+3.877", "1e-6"), or ""."""
    axis = bar.ax.yaxis if bar.orientation == "vertical" else bar.ax.xaxis
    formatter = axis.get_major_formatter()
    formatter.set_locs(list(axis.get_majorticklocs()))
    return formatter.get_offset() if hasattr(formatter, "get_offset") else ""


def figure_problems(fig: Figure) -> list[str]:
    """What a reader could not decode in ``fig``: panels without axis labels, panels whose
    colours carry meaning (two or more colours) that no legend or colour bar explains, and
    colour bars whose tick labels need an offset or multiplier ("+3.877") to be read
    (:func:`add_colorbar` draws them plain).

    An axis counts as labelled by its own label, by a label on an axis it shares (``sharex``:
    the bottom row), by category names on its ticks, or by ``fig.supxlabel``/``supylabel``.
    Colours count as explained by a legend anywhere in the figure that shows them (one legend
    for panels coloured alike) or by a colour bar. Colour bars, hidden panels and empty panels
    are skipped.

    Returns:
        One line per problem, ``"panel 2 ('title'): no y label"``; empty when none.
    """
    problems = []
    for i, ax in enumerate(fig.axes):
        bar = getattr(ax, "_colorbar", None)
        offset = _colorbar_offset(bar) if bar is not None else ""
        if offset:
            problems.append(
                f"panel {i} (colour bar {ax.get_ylabel()!r}): ticks offset by {offset!r}"
            )
    shared_x = getattr(fig, "_supxlabel", None) is not None
    shared_y = getattr(fig, "_supylabel", None) is not None
    explained = _legend_colours(fig)
    has_colorbar = any(getattr(ax, "_colorbar", None) is not None for ax in fig.axes)
    for i, ax in enumerate(fig.axes):
        has_data = ax.get_lines() or ax.collections or ax.images or ax.patches
        if not ax.get_visible() or not has_data or getattr(ax, "_colorbar", None) is not None:
            continue
        name = f"panel {i} ({ax.get_title()!r})"
        if not shared_x and not _labelled(ax, "x"):
            problems.append(f"{name}: no x label")
        if not shared_y and not _labelled(ax, "y"):
            problems.append(f"{name}: no y label")
        colours = _colours(ax)
        if len(colours) > 1 and not has_colorbar and not colours <= explained:
            problems.append(f"{name}: {len(colours)} colours and no legend")
    return problems
