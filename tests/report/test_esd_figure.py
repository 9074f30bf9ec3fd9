"""``dynascope.report.esd.esd_figure``: the drawn data are the ESD and the fitted law.

Oracles: the CCDF panel's points are the eigenvalues of ``W^T W / N`` from
``numpy.linalg.eigvalsh`` (1e-9 relative) against ``k / n``; the fitted line equals
``(n_tail / n) (lambda / x_min)^(1 - alpha)`` with the fit of :func:`fit_power_law`
(1e-12 relative); the histogram integrates to the share of positive eigenvalues. Every
figure passes :func:`dynascope.report.figures.figure_problems`.
"""

import matplotlib.pyplot as plt
import numpy as np
import pytest
from torch.testing import assert_close

from dynascope.probes import esd_eigenvalues, fit_power_law
from dynascope.report.esd import esd_figure
from dynascope.report.figures import figure_problems


def test_panels_hold_the_esd_and_the_fitted_tail():
    rng = np.random.default_rng(0)
    W = rng.standard_t(3, (120, 80))  # heavy-ish tails
    fig = esd_figure(W, name="t3")
    density_ax, ccdf_ax = fig.axes
    eigenvalues = np.linalg.eigvalsh(W.T @ W / 120)
    fit = fit_power_law(esd_eigenvalues(W))
    points, tail_line = ccdf_ax.get_lines()[:2]
    assert_close(np.asarray(points.get_xdata()), eigenvalues, rtol=1e-9, atol=0)
    assert_close(np.asarray(points.get_ydata()), (80 - np.arange(80)) / 80, rtol=0, atol=0)
    grid = np.asarray(tail_line.get_xdata())
    assert grid[0] == fit.x_min
    expected = fit.n_tail / 80 * (grid / fit.x_min) ** (1 - fit.alpha)
    assert_close(np.asarray(tail_line.get_ydata()), expected, rtol=1e-12, atol=0)
    (bars,) = density_ax.patches
    heights, edges, _ = bars.get_data()  # StepPatch: values, edges, baseline
    assert float((heights * np.diff(edges)).sum()) == pytest.approx(1.0, rel=1e-12)
    assert f"alpha = {fit.alpha:.3g}" in fig._suptitle.get_text()
    assert figure_problems(fig) == []
    plt.close(fig)


@pytest.mark.parametrize(
    "W, text",
    [
        (np.zeros((4, 3)), "(3 zero)\nno fit: too few positive values (0 < min_tail=10)"),
        (np.eye(12), "no fit: all values equal"),
    ],
)
def test_no_fit_is_said_in_the_title(W, text):
    fig = esd_figure(W)
    assert text in fig._suptitle.get_text()
    assert figure_problems(fig) == []
    plt.close(fig)


def test_bad_bins():
    with pytest.raises(ValueError, match=r"^bins must be >= 1 \(got 0\)$"):
        esd_figure(np.eye(3), bins=0)
