"""Figure of the loss Hessian's eigenvalue density (stochastic Lanczos quadrature).

Draws what :func:`dynascope.probes.hessian_density` (or the ``hessian_density`` probe's
``hessian_density.grid`` / ``hessian_density.density`` tensors) returns: one curve per density,
on a linear or logarithmic density axis, with optional vertical markers (a stability threshold
such as 2/η, λ = 0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from torch import Tensor

from dynascope.report.figures import new_figure

__all__ = ["plot_hessian_density"]

_LOG_FLOOR = 1e-7
"""On a log axis the density is drawn down to this fraction of its peak (the Gaussian tails
fall to 1e-300 and would squash the plot)."""


def _array(values: Tensor | np.ndarray | Sequence[float], name: str) -> np.ndarray:
    array = np.asarray(values.detach().cpu() if isinstance(values, Tensor) else values, float)
    if array.ndim != 1 or array.size < 2 or not np.isfinite(array).all():
        raise ValueError(f"{name} must be 1-D, finite, with >= 2 points (got shape {array.shape})")
    return array


def plot_hessian_density(
    densities: Mapping[str, tuple[Tensor | np.ndarray, Tensor | np.ndarray]],
    *,
    log_y: bool = False,
    markers: Mapping[str, float] | None = None,
    title: str | None = None,
    ax: Axes | None = None,
) -> Figure:
    """Plot eigenvalue densities of the Hessian, one labelled curve each.

    Args:
        densities: label -> ``(grid [G], density [G])`` (e.g. one per training step), grid in
            eigenvalue units (loss per parameter unit squared), density in their inverse.
        log_y: a logarithmic density axis, cut at 1e-7 of the highest peak (the bulk near 0
            and the few large outliers both show, as in Ghorbani et al. 2019, Fig. 1).
        markers: label -> eigenvalue, drawn as dashed grey vertical lines (e.g.
            ``{"2/η": 2 / lr}``), named in the legend.
        title: the panel's title.
        ax: draw into this axes; ``None`` makes a new figure in the house style.
    Returns:
        The figure (save it with :func:`dynascope.report.save_figure`).
    Raises:
        ValueError: if ``densities`` is empty; if a grid or density is not 1-D and finite with
            >= 2 points, or their lengths differ; if a density is negative; if ``log_y`` and a
            density is all zero.
    References:
        Ghorbani, Krishnan & Xiao (2019), "An Investigation into Neural Net Optimization via
        Hessian Eigenvalue Density", ICML, arXiv 1901.10159 (log-scale density plots).
    """
    if not densities:
        raise ValueError("densities must hold at least one (grid, density) pair")
    if ax is None:
        fig, (ax,) = new_figure(width=5.0, height=3.2, title=None)
    else:
        fig = ax.figure
    peak = 0.0
    for label, (grid, density) in densities.items():
        x, y = _array(grid, f"densities[{label!r}] grid"), _array(density, f"densities[{label!r}]")
        if x.shape != y.shape or (y < 0).any():
            raise ValueError(
                f"densities[{label!r}] must be a non-negative density on its grid (got grid "
                f"{x.shape}, density {y.shape}, min {y.min():g})"
            )
        if log_y and not (y > 0).any():
            raise ValueError(f"densities[{label!r}] is zero everywhere: nothing to draw on log_y")
        peak = max(peak, float(y.max()))
        ax.plot(x, y, label=label, linewidth=1.2)
    for label, value in (markers or {}).items():
        ax.axvline(float(value), color="grey", linestyle="--", linewidth=0.9, label=label)
    if log_y:
        ax.set_yscale("log")
        ax.set_ylim(bottom=_LOG_FLOOR * peak, top=2 * peak)
    else:
        ax.set_ylim(bottom=0)
    ax.set_xlabel("Hessian eigenvalue λ")
    ax.set_ylabel("density (log)" if log_y else "density")
    if title:
        ax.set_title(title)
    if len(densities) > 1 or markers:
        ax.legend()
    return fig
