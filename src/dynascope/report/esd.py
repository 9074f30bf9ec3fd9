"""Figure of one weight matrix's ESD with its fitted power-law tail (:mod:`dynascope.probes.esd`).

Two panels, both log-log: the density of the eigenvalues of ``X = W^T W / N`` (a histogram on
log-spaced bins) with the fitted tail density, and the complementary CDF ``P(Lambda >= lambda)``
with the fitted tail's. Above ``x_min`` the fitted law, scaled to the tail's share ``n_tail /
n`` of the eigenvalues, is::

    density  (n_tail / n) (alpha - 1) / x_min (lambda / x_min)^(-alpha)
    CCDF     (n_tail / n) (lambda / x_min)^(1 - alpha)
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from torch import Tensor

from dynascope.probes.esd import MIN_TAIL, esd_eigenvalues, fit_power_law
from dynascope.report.figures import new_figure

__all__ = ["esd_figure"]


def esd_figure(
    W: Tensor | np.ndarray,
    *,
    name: str = "W",
    min_tail: int = MIN_TAIL,
    bins: int = 40,
) -> Figure:
    """Draw the ESD of ``W`` and its power-law tail fit (log-log density and CCDF panels).

    Example::

        from dynascope.probes import esd_matrices
        from dynascope.report import save_figure
        from dynascope.report.esd import esd_figure
        W = esd_matrices(model)["transformer.h.0.mlp.c_fc.weight"]
        save_figure(esd_figure(W, name="h.0 c_fc"), "esd.png")

    Args:
        W: ``[N, M]`` weight matrix (a conv kernel reshaped as in
            :func:`dynascope.probes.esd_matrices`), finite.
        name: the matrix's name, for the title.
        min_tail: as in :func:`dynascope.probes.fit_power_law`.
        bins: number of log-spaced histogram bins, ``>= 1``.
    Returns:
        The figure (save it with :func:`dynascope.report.save_figure`). Without a fit (too few
        eigenvalues, all equal) it shows the ESD alone and says why in the title; zero
        eigenvalues (rank deficiency) are left out of both panels (log axes), and counted in the
        title.
    Raises:
        ValueError: the errors of :func:`dynascope.probes.esd_eigenvalues` and
            :func:`~dynascope.probes.fit_power_law`; if ``bins < 1``.
    References:
        Martin & Mahoney (2021), JMLR 22(165) (ESD plots); Clauset, Shalizi & Newman (2009),
        SIAM Review 51(4), Sec. 3 (the fit, CCDF plots).
    """
    if bins < 1:
        raise ValueError(f"bins must be >= 1 (got {bins})")
    eigenvalues = esd_eigenvalues(W)
    fit = fit_power_law(eigenvalues, min_tail=min_tail)
    positive = eigenvalues[eigenvalues > 0]
    n = len(eigenvalues)
    zeros = n - len(positive)
    summary = (
        f"alpha = {fit.alpha:.3g} ± {fit.alpha_stderr:.2g}, D = {fit.ks_distance:.3g}, "
        f"n_tail = {fit.n_tail}"
        if not fit.reason
        else f"no fit: {fit.reason}"
    )
    title = f"{name}: {n} eigenvalues" + (f" ({zeros} zero)" if zeros else "") + f"\n{summary}"
    fig, (density_ax, ccdf_ax) = new_figure(2, width=3.8, height=3.2, title=title)
    if len(positive) == 0:
        for ax in (density_ax, ccdf_ax):
            ax.text(0.5, 0.5, "no positive eigenvalue", ha="center", transform=ax.transAxes)
        return fig
    low, high = positive.min(), positive.max()
    edges = np.geomspace(low, high, bins + 1) if high > low else np.array([low / 2, low * 2])
    counts, _ = np.histogram(positive, bins=edges)
    density = counts / (n * np.diff(edges))  # of all n eigenvalues, so the tail line fits it
    density_ax.stairs(density, edges, fill=True, alpha=0.5, color="C0", label="ESD")
    ccdf = (len(positive) - np.arange(len(positive))) / n  # P(Lambda >= lambda_(k)), ascending
    ccdf_ax.loglog(np.sort(positive), ccdf, ".", color="C0", markersize=3, label="ESD")
    if not fit.reason:
        share = fit.n_tail / n
        grid = np.geomspace(fit.x_min, high, 100)
        tail_density = share * (fit.alpha - 1) / fit.x_min * (grid / fit.x_min) ** -fit.alpha
        tail_ccdf = share * (grid / fit.x_min) ** (1 - fit.alpha)
        density_ax.plot(grid, tail_density, color="C3", label=f"power law, alpha={fit.alpha:.3g}")
        ccdf_ax.plot(grid, tail_ccdf, color="C3", label=f"power law, alpha={fit.alpha:.3g}")
        for ax in (density_ax, ccdf_ax):
            ax.axvline(fit.x_min, color="C7", linestyle="--", label="x_min")
    density_ax.set(xscale="log", yscale="log", xlabel="eigenvalue λ of WᵀW/N", ylabel="density")
    ccdf_ax.set(xlabel="eigenvalue λ of WᵀW/N", ylabel="P(Λ ≥ λ)")
    for ax in (density_ax, ccdf_ax):
        ax.legend()
    return fig
