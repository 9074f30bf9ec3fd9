"""ntk-universality figure: distance from the kernel regime vs width (seed means)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.lines import Line2D
from matplotlib.ticker import NullFormatter

from dynascope.report import new_figure, save_figure

__all__ = ["means", "universality_figure"]


def means(rows: list[dict], arch: str, key: str) -> tuple[np.ndarray, np.ndarray]:
    """Widths and the seed mean of ``key`` at each width, for ``arch``."""
    widths = sorted({r["width"] for r in rows if r["arch"] == arch})
    values = [
        np.mean([r[key] for r in rows if r["arch"] == arch and r["width"] == w]) for w in widths
    ]
    return np.array(widths, dtype=float), np.array(values, dtype=float)


def universality_figure(rows: list[dict], archs: list[str], figures: Path) -> Path:
    """u1/u2 quantities and the MLP's analytic-NTK distances vs width (log-log)."""
    fig, axes = new_figure(3, title="S17: distance from the kernel regime vs width (seed means)")
    panels = (
        ("kernel_change_sup", r"$\sup_t\,\|\Theta_t - \Theta_0\|_F\,/\,\|\Theta_0\|_F$",
         "eNTK change"),
        ("kgd_deviation", r"$\sup_t\,\|f_t - f_t^{\mathrm{kGD}}\|_2$", "net vs kernel-GD twin"),
    )  # fmt: skip
    for ax, (key, ylabel, title) in zip(axes, panels):
        for arch in archs:
            w, m = means(rows, arch, key)
            (line,) = ax.loglog(w, m, "o-", label=arch)
            ax.loglog(w, m[0] * (w / w[0]) ** -0.5, ":", color=line.get_color(), lw=1)
        ax.set(xlabel="width $n$", ylabel=ylabel, title=title)
        _width_ticks(ax, rows)
        _legend_with_guide(ax)
    ax = axes[2]
    if "mlp" in archs:
        ring = r"\mathring{\Theta}"  # the analytic (infinite-width) NTK
        for key, label in (
            ("init_deviation", rf"$\|\Theta_0 - {ring}\|_F\,/\,\|{ring}\|_F$"),
            ("kgd_analytic_deviation", rf"$\sup_t\,\|f_t - f_t^{{\mathrm{{kGD}}}}({ring})\|_2$"),
        ):
            w, m = means(rows, "mlp", key)
            (line,) = ax.loglog(w, m, "o-", label=label)
            ax.loglog(w, m[0] * (w / w[0]) ** -0.5, ":", color=line.get_color(), lw=1)
        _legend_with_guide(ax)
    ax.set(
        xlabel="width $n$",
        ylabel=r"distance from analytic NTK $\mathring{\Theta}$",
        title=r"MLP vs the analytic NTK $\mathring{\Theta}$",
    )
    _width_ticks(ax, rows)
    return save_figure(fig, figures / "universality.png")


def _legend_with_guide(ax) -> None:
    """Legend of the measured curves plus one entry explaining the dotted n^-1/2 guides."""
    handles, labels = ax.get_legend_handles_labels()
    guide = Line2D([], [], color="grey", ls=":", lw=1)
    ax.legend([*handles, guide], [*labels, r"$\propto n^{-1/2}$ from the first point"], fontsize=8)


def _width_ticks(ax, rows: list[dict]) -> None:
    """Label the measured widths only (log axes otherwise crowd 2x10^2, 3x10^2, ...)."""
    widths = sorted({r["width"] for r in rows})
    ax.set_xticks(widths, [str(w) for w in widths])
    ax.xaxis.set_minor_formatter(NullFormatter())
