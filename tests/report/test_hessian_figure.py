"""The Hessian-density figure: readable (figure_problems), log axis floor, and bad input."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

from dynascope.probes import spectral_density
from dynascope.report.figures import figure_problems, save_figure
from dynascope.report.hessian import plot_hessian_density


def _densities():
    nodes = torch.tensor([-0.3, 0.0, 0.01, 1.2, 2.0])
    weights = torch.tensor([0.05, 0.6, 0.3, 0.04, 0.01])
    grid = torch.linspace(-1, 3, 401)
    return {
        "step 0": spectral_density(nodes, weights, grid=grid, sigma=0.03),
        "step 100": spectral_density(nodes * 1.1, weights, grid=grid, sigma=0.03),
    }


def test_log_density_figure_is_readable_and_floors_at_1e_7_of_the_peak(tmp_path):
    densities = _densities()
    fig = plot_hessian_density(densities, log_y=True, markers={"2/η": 2.0}, title="t")
    ax = fig.axes[0]
    assert figure_problems(fig) == []
    assert ax.get_yscale() == "log"
    peak = max(float(d.max()) for _, d in densities.values())
    assert ax.get_ylim() == pytest.approx((1e-7 * peak, 2 * peak))
    np.testing.assert_allclose(ax.get_lines()[0].get_ydata(), densities["step 0"][1].numpy())
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["step 0", "step 100", "2/η"]
    assert save_figure(fig, tmp_path / "density.png").stat().st_size > 0


def test_linear_axis_into_a_given_axes():
    fig, ax = plt.subplots()
    out = plot_hessian_density({"only": _densities()["step 0"]}, ax=ax)
    assert out is fig and ax.get_yscale() == "linear" and ax.get_ylim()[0] == 0
    assert ax.get_legend() is None  # one curve, no markers: nothing to tell apart
    plt.close(fig)


def test_bad_input_is_a_one_line_error():
    grid = torch.linspace(0, 1, 5)
    with pytest.raises(ValueError, match=r"densities must hold at least one"):
        plot_hessian_density({})
    with pytest.raises(ValueError, match=r"densities\['a'\] must be a non-negative density"):
        plot_hessian_density({"a": (grid, -torch.ones(5))})
    with pytest.raises(ValueError, match=r"densities\['a'\] must be 1-D, finite"):
        plot_hessian_density({"a": (grid, torch.full((5,), float("nan")))})
    with pytest.raises(ValueError, match=r"densities\['a'\] is zero everywhere"):
        plot_hessian_density({"a": (grid, torch.zeros(5))}, log_y=True)
    plt.close("all")
