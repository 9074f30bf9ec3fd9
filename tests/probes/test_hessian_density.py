"""Hessian eigenvalue density by stochastic Lanczos quadrature, against dense eigenvalues.

Oracles:
- A diagonal quadratic ``½ Σ_k λ_k θ_k²`` with a planted spectrum: a Rademacher probe has
  ``(e_kᵀ z)² / P = 1/P`` exactly, so once Lanczos has as many steps as distinct eigenvalues
  the quadrature *is* the spectrum: nodes = the distinct λ, weights = multiplicity / P, to
  1e-10 (rounding of a float64 tridiagonal eigensolve).
- A tiny MLP and a tiny Transformer (float64): ``torch.func.hessian`` → ``eigvalsh``, and the
  1-Wasserstein distance (scipy) between the dense eigenvalues (weight 1/P each) and the SLQ
  nodes with their averaged weights. With 4 probes of 20 steps the measured distance is
  2.0–2.7% of the spectral range (MLP, seeds 0–2) and 0.32–0.39% (Transformer); the tests
  allow 4% and 1%. The error is the probes' sampling noise (it shrinks with more probes:
  1.2–2.1% with 8), not the quadrature's. Dropping the Gauss weights (the Ritz values weighed
  equally) misses by 11% and 6%: more than twice the tolerance.
- Gaussian smoothing of one node: the normal density (scipy.stats.norm), to 1e-9.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm, wasserstein_distance
from torch.func import functional_call

import dynascope as ds
from dynascope.probes import (
    HessianDensity,
    ProbeContext,
    hessian_density,
    hessian_quadrature,
    spectral_density,
)


def _tiny_mlp():
    """tanh MLP 5-7-3 (P = 66), cross-entropy on 11 examples, float64."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    net = net.double()
    x = torch.randn(11, 5, dtype=torch.float64)
    y = torch.randint(0, 3, (11,))
    params = {name: p.detach().clone() for name, p in net.named_parameters()}
    return (lambda p: F.cross_entropy(functional_call(net, p, (x,)), y)), params


def _tiny_transformer():
    """One-layer Transformer, d_model 4, 2 heads, d_mlp 6 (P = 203), next-token CE, float64."""
    torch.manual_seed(0)
    model = ds.nn.Transformer(
        n_layers=1, d_model=4, n_heads=2, d_mlp=6, d_vocab=5, d_out=5, n_ctx=3
    ).double()
    model.eval()
    x = torch.randint(0, 5, (3, 3), generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 5, (3, 3), generator=torch.Generator().manual_seed(2))
    params = {name: p.detach().clone() for name, p in model.named_parameters()}

    def loss_fn(p):
        return F.cross_entropy(functional_call(model, p, (x,)).reshape(-1, 5), y.reshape(-1))

    return loss_fn, params


def _diagonal_quadratic(eigenvalues):
    lam = torch.tensor(eigenvalues, dtype=torch.float64)
    params = {"w": torch.randn(lam.numel(), dtype=torch.float64)}
    return (lambda p: 0.5 * (lam * p["w"] ** 2).sum()), params


def _merged(nodes, weights, decimals=8):
    """Weights summed over nodes equal to ``decimals`` places: {node: weight}."""
    out: dict[float, float] = {}
    for node, weight in zip(nodes.tolist(), weights.tolist()):
        key = round(node, decimals) + 0.0
        out[key] = out.get(key, 0.0) + weight
    return out


# -- oracle: dense eigenvalues of small networks ---------------------------------------------


@pytest.mark.parametrize(
    ("case", "tolerance"), [(_tiny_mlp, 0.04), (_tiny_transformer, 0.01)], ids=["mlp", "attention"]
)
def test_slq_measure_is_near_the_dense_spectrum_in_wasserstein_distance(
    case, tolerance, dense_hessian
):
    loss_fn, params = case()
    exact = torch.linalg.eigvalsh(dense_hessian(loss_fn, params)).numpy()
    spread = exact.max() - exact.min()
    quadrature = hessian_quadrature(loss_fn, params, n_probes=4, lanczos_steps=20, seed=0)
    nodes, weights = quadrature.nodes.numpy(), quadrature.weights.numpy()
    distance = wasserstein_distance(exact, nodes, None, weights)
    assert distance <= tolerance * spread, (distance, spread)
    # discriminating: Ritz values without their Gauss weights are > 2x the tolerance away
    assert wasserstein_distance(exact, nodes) > 2 * tolerance * spread
    # Ritz values interlace: every node lies in [λ_min, λ_max]
    assert exact.min() - 1e-9 * spread <= nodes.min() and nodes.max() <= exact.max() + 1e-9 * spread
    assert quadrature.steps.tolist() == [20] * 4
    torch.testing.assert_close(quadrature.weights.sum(), torch.tensor(1.0, dtype=torch.float64))


# -- oracle: planted spectra ------------------------------------------------------------------


def test_planted_spectrum_is_recovered_exactly():
    eigenvalues = [3.0, -1.5, 0.0, 0.0, 7.25, 3.0, 3.0, -40.0, 1e-3]
    loss_fn, params = _diagonal_quadratic(eigenvalues)
    quadrature = hessian_quadrature(loss_fn, params, n_probes=3, lanczos_steps=9, seed=5)
    assert quadrature.steps.tolist() == [6, 6, 6]  # 6 distinct eigenvalues: Lanczos breaks down
    expected = {lam: eigenvalues.count(lam) / 9 for lam in set(eigenvalues)}
    got = _merged(quadrature.nodes, quadrature.weights)
    assert got.keys() == {round(lam, 8) + 0.0 for lam in expected}
    for lam, weight in expected.items():
        assert got[round(lam, 8) + 0.0] == pytest.approx(weight, abs=1e-10)


@settings(max_examples=25, deadline=None)
@given(
    distinct=st.lists(
        st.floats(-1e3, 1e3, allow_nan=False).map(lambda x: round(x, 2)),
        min_size=1,
        max_size=6,
        unique=True,
    ),
    repeats=st.lists(st.integers(1, 3), min_size=6, max_size=6),
    seed=st.integers(0, 2**31 - 1),
    extra_steps=st.integers(0, 5),
)
def test_planted_spectra_any_sizes_multiplicities_and_scales(distinct, repeats, seed, extra_steps):
    eigenvalues = [lam for lam, r in zip(distinct, repeats) for _ in range(r)]
    loss_fn, params = _diagonal_quadratic(eigenvalues)
    steps = len(distinct) + extra_steps  # may exceed P: clamped
    quadrature = hessian_quadrature(loss_fn, params, n_probes=2, lanczos_steps=steps, seed=seed)
    scale = max(1.0, max(abs(lam) for lam in distinct))
    kept = quadrature.weights > 1e-12
    nodes, weights = quadrature.nodes[kept], quadrature.weights[kept]
    for lam, r in zip(distinct, repeats):
        near = (nodes - lam).abs() <= 1e-9 * scale
        assert float(weights[near].sum()) == pytest.approx(r / len(eigenvalues), abs=1e-9)
    assert float(weights.sum()) == pytest.approx(1.0, abs=1e-12)


# -- edge cases -------------------------------------------------------------------------------


def test_zero_hessian_is_one_node_at_zero_per_probe():
    params = {"w": torch.randn(2, 3, dtype=torch.float64), "b": torch.randn(4, dtype=torch.float64)}
    quadrature = hessian_quadrature(
        lambda p: 2.0 * p["w"].sum() - p["b"].sum(), params, n_probes=3, lanczos_steps=10
    )
    assert quadrature.steps.tolist() == [1, 1, 1]
    torch.testing.assert_close(quadrature.nodes, torch.zeros(3, dtype=torch.float64))
    torch.testing.assert_close(quadrature.weights, torch.full((3,), 1 / 3, dtype=torch.float64))
    grid, density = spectral_density(quadrature.nodes, quadrature.weights)
    assert bool(torch.isfinite(density).all()) and float(grid[density.argmax()]) == pytest.approx(
        0.0, abs=1e-3
    )


def test_more_lanczos_steps_than_parameters_equals_p_steps():
    loss_fn, params = _tiny_mlp()
    full = hessian_quadrature(loss_fn, params, n_probes=1, lanczos_steps=66, seed=2)
    more = hessian_quadrature(loss_fn, params, n_probes=1, lanczos_steps=500, seed=2)
    assert int(more.steps[0]) <= 66
    assert torch.equal(full.nodes, more.nodes) and torch.equal(full.weights, more.weights)


def test_nan_loss_and_bad_arguments_are_one_line_errors():
    loss_fn, params = _tiny_mlp()
    bad = {n: p.clone() for n, p in params.items()}
    bad["0.bias"][0] = math.nan
    with pytest.raises(ValueError, match=r"^loss_fn returned a non-finite loss \(nan\)$"):
        hessian_density(loss_fn, bad, n_probes=1, lanczos_steps=2)
    with pytest.raises(ValueError, match=r"n_probes must be an integer >= 1 \(got n_probes=0\)"):
        hessian_quadrature(loss_fn, params, n_probes=0)
    with pytest.raises(ValueError, match=r"lanczos_steps must be an integer >= 1"):
        hessian_quadrature(loss_fn, params, lanczos_steps=2.5)
    nodes, weights = torch.tensor([0.0, 1.0]), torch.tensor([0.5, 0.5])
    with pytest.raises(ValueError, match=r"sigma must be a finite number > 0 \(got sigma=0\)"):
        spectral_density(nodes, weights, sigma=0)
    with pytest.raises(ValueError, match=r"grid must be strictly increasing"):
        spectral_density(nodes, weights, grid=torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match=r"holds none of the density"):
        spectral_density(nodes, weights, grid=torch.linspace(100, 101, 5), sigma=0.01)
    with pytest.raises(ValueError, match=r"weights must be >= 0 with a positive sum"):
        spectral_density(nodes, torch.tensor([0.5, -0.5]))


# -- smoothing --------------------------------------------------------------------------------


def test_smoothing_one_node_gives_the_normal_density_and_integrates_to_one():
    grid, density = spectral_density(torch.tensor([0.25]), torch.tensor([1.0]), sigma=0.5)
    torch.testing.assert_close(
        density, torch.from_numpy(norm.pdf(grid.numpy(), 0.25, 0.5)), rtol=1e-6, atol=1e-9
    )
    assert float(torch.trapezoid(density, grid)) == pytest.approx(1.0, abs=1e-12)
    # a user's grid that cuts the kernel: still integrates to 1 on it (renormalized)
    grid, density = spectral_density(
        torch.tensor([0.0, 2.0]),
        torch.tensor([0.3, 0.7]),
        grid=torch.linspace(0, 3, 301),
        sigma=0.2,
    )
    assert float(torch.trapezoid(density, grid)) == pytest.approx(1.0, abs=1e-12)


def test_hessian_density_of_a_planted_spectrum_peaks_at_its_eigenvalues():
    loss_fn, params = _diagonal_quadratic([-2.0, 1.0, 1.0, 1.0, 5.0])
    grid, density = hessian_density(loss_fn, params, n_probes=2, lanczos_steps=5, sigma=0.05)
    peaks = [
        float(grid[i])
        for i in range(1, len(grid) - 1)
        if density[i - 1] < density[i] > density[i + 1]
    ]
    assert peaks == pytest.approx([-2.0, 1.0, 5.0], abs=0.02)
    heights = [float(density[(grid - lam).abs().argmin()]) for lam in (-2.0, 1.0, 5.0)]
    assert heights[1] == pytest.approx(3 * heights[0], rel=0.02)  # multiplicity 3 vs 1


# -- the probe --------------------------------------------------------------------------------


def test_probe_keys_match_its_quadrature_and_resume_from_state():
    torch.manual_seed(0)
    task = ds.tasks.AssociativeRecall(n_keys=6, n_values=5, n_pairs=3)
    model = ds.nn.Transformer(
        n_layers=1, d_model=8, n_heads=2, d_mlp=12, d_vocab=11, d_out=11, n_ctx=7
    ).double()
    batch = task.batch("train", 6, torch.Generator().manual_seed(1))
    probe = HessianDensity(loss=task.loss, n_probes=2, lanczos_steps=12, seed=3)
    out = probe(model, ProbeContext(step=0, batch=batch))
    nodes, weights = out["hessian_density.nodes"], out["hessian_density.weights"]
    assert float(weights.sum()) == pytest.approx(1.0, abs=1e-12)
    assert out["hessian_density.top_node"] == float(nodes.max())
    assert out["hessian_density.bottom_node"] == float(nodes.min()) < 0
    floor = 1e-3 * float(nodes.abs().max())  # zero_tol's default
    negative, zero = out["hessian_density.negative_mass"], out["hessian_density.zero_mass"]
    assert negative == pytest.approx(float(weights[nodes < -floor].sum()), abs=1e-15)
    assert zero == pytest.approx(float(weights[nodes.abs() <= floor].sum()), abs=1e-15)
    assert 0 < negative < 1 and 0 <= zero < 1 - negative
    grid, density = out["hessian_density.grid"], out["hessian_density.density"]
    assert grid.shape == density.shape == (512,)
    assert float(torch.trapezoid(density, grid)) == pytest.approx(1.0, abs=1e-12)

    model.eval()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    direct = hessian_quadrature(
        lambda p: task.loss(functional_call(model, p, (batch["x"],)), batch),
        params,
        n_probes=2,
        lanczos_steps=12,
        seed=3,
    )
    torch.testing.assert_close(nodes, direct.nodes, rtol=1e-9, atol=1e-9)

    resumed = HessianDensity(loss=task.loss, n_probes=2, lanczos_steps=12, seed=3)
    resumed.load_state_dict(probe.state_dict())
    again = resumed(model, ProbeContext(step=5))  # the held batch travels in the state
    assert torch.equal(again["hessian_density.nodes"], nodes)


def test_probe_errors():
    with pytest.raises(ValueError, match=r"n_probes must be an integer >= 1"):
        HessianDensity(n_probes=0)
    with pytest.raises(ValueError, match=r"sigma must be a finite number > 0 or None"):
        HessianDensity(sigma=-1.0)
    with pytest.raises(ValueError, match=r"zero_tol must be in \[0, 1\) \(got zero_tol=1\)"):
        HessianDensity(zero_tol=1)
    model = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match=r"hessian_density needs a batch: pass batch="):
        HessianDensity()(model, ProbeContext(step=0))


# -- the docs snippet -------------------------------------------------------------------------


@pytest.mark.slow  # the docs' Digits MLP (P = 4810): 4-7 s on a loaded 2-core machine
def test_docs_snippet_runs_as_written_with_fewer_steps(tmp_path, monkeypatch):
    text = (Path(__file__).parents[2] / "docs" / "instruments.md").read_text()
    section = text[text.index("## The Hessian's eigenvalue density") :]
    code = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    for full, short in [
        ("range(1001)", "range(3)"),
        ("(0, 1000)", "(0, 2)"),
        ("n_probes=4, lanczos_steps=60", "n_probes=1, lanczos_steps=4"),
    ]:
        assert full in code
        code = code.replace(full, short)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "docs/instruments.md", "exec"), namespace)
    assert sorted(namespace["densities"]) == ["step 0", "step 2"]
    assert (tmp_path / "hessian_density.png").stat().st_size > 0
