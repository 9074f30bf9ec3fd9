"""Latent covariance spectrum: dense oracle (eigvalsh of the explicit covariance), closed forms,
and edge cases (zero, constant, rank-deficient, NaN/inf, 1e30 scale)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dynascope.probes import (
    latent_covariance,
    latent_covariance_spectrum,
    latent_effective_rank,
    latent_rank,
)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def codes_with_spectrum(eigenvalues: list[float], n: int = 13, seed: int = 0) -> torch.Tensor:
    """``z`` ``[n, d]`` whose sample covariance has exactly ``eigenvalues`` (float64).

    Columns of Q are orthonormal and orthogonal to the all-ones vector (centred before QR), so
    ``(z - mean)^T (z - mean) = diag(c^2)`` with ``z = Q diag(c)``, rotated by an orthogonal R.
    """
    d = len(eigenvalues)
    g = torch.randn(n, d, generator=gen(seed), dtype=torch.float64)
    Q, _ = torch.linalg.qr(g - g.mean(dim=0))
    R, _ = torch.linalg.qr(torch.randn(d, d, generator=gen(seed + 1), dtype=torch.float64))
    c = torch.tensor(eigenvalues, dtype=torch.float64).mul(n - 1).sqrt()
    return (Q * c) @ R + 3.0  # an offset: the covariance is centred


def test_spectrum_matches_eigvalsh_of_the_explicit_covariance():
    """Dense oracle in float64; tolerance 1e-12 relative (both paths are backward stable)."""
    z = torch.randn(2, 17, 5, generator=gen(), dtype=torch.float64) * torch.tensor(
        [3.0, 1.0, 0.5, 0.2, 0.05], dtype=torch.float64
    )
    cov = torch.stack([torch.cov(zi.T) for zi in z])  # [2, 5, 5]
    oracle = torch.linalg.eigvalsh(cov).flip(-1)  # descending
    torch.testing.assert_close(
        latent_covariance_spectrum(z, normalize=False), oracle, rtol=1e-12, atol=1e-14
    )
    torch.testing.assert_close(
        latent_covariance_spectrum(z), oracle / oracle[..., :1], rtol=1e-12, atol=1e-14
    )
    torch.testing.assert_close(latent_covariance(z), cov, rtol=1e-12, atol=1e-14)


def test_covariance_matches_numpy_cov():
    z = torch.randn(9, 4, generator=gen(3), dtype=torch.float64)
    expected = torch.from_numpy(np.cov(z.numpy().T))
    torch.testing.assert_close(latent_covariance(z), expected, rtol=1e-12, atol=1e-14)


def test_closed_form_spectrum_and_ranks():
    eig = [4.0, 1.0, 0.25, 0.01, 1e-4]
    z = codes_with_spectrum(eig)
    expected = torch.tensor(eig, dtype=torch.float64)
    torch.testing.assert_close(
        latent_covariance_spectrum(z, normalize=False), expected, rtol=1e-10, atol=1e-14
    )
    # normalised: 1, 0.25, 0.0625, 0.0025, 2.5e-5 -> 3 above 1e-2, 5 above 1e-5
    assert int(latent_rank(z)) == 3
    assert int(latent_rank(z, rel_tol=1e-5)) == 5
    p = expected / expected.sum()
    torch.testing.assert_close(
        latent_effective_rank(z), torch.exp(-(p * p.log()).sum()), rtol=1e-10, atol=0
    )


@pytest.mark.parametrize("k", [1, 2, 4])
def test_rank_k_codes_have_exactly_k_nonzero_eigenvalues(k):
    """z = u @ B with u [n, k], B [k, d]: cov has rank k; the rest is rounding (< 1e-24 rel.)."""
    u = torch.randn(23, k, generator=gen(k), dtype=torch.float64)
    B = torch.randn(k, 7, generator=gen(k + 10), dtype=torch.float64)
    spectrum = latent_covariance_spectrum(u @ B)
    assert int(latent_rank(u @ B, rel_tol=1e-10)) == k
    assert bool((spectrum[:k] > 1e-6).all())
    assert float(spectrum[k:].max()) < 1e-24


def test_isotropic_codes_have_full_effective_rank():
    z = codes_with_spectrum([2.0] * 6)
    torch.testing.assert_close(latent_effective_rank(z), torch.tensor(6.0, dtype=torch.float64))
    assert int(latent_rank(z)) == 6


def test_fewer_codes_than_dimensions_pad_with_zeros():
    z = torch.randn(3, 8, generator=gen(), dtype=torch.float64)  # spans at most 2 directions
    spectrum = latent_covariance_spectrum(z)
    assert spectrum.shape == (8,)
    assert int(latent_rank(z, rel_tol=1e-10)) == 2
    assert float(spectrum[2:].abs().max()) < 1e-28


@pytest.mark.parametrize("z", [torch.zeros(5, 3), torch.ones(5, 3) * 7.0])
def test_zero_and_constant_codes_give_an_all_zero_spectrum(z):
    assert torch.equal(latent_covariance_spectrum(z), torch.zeros(3))
    assert int(latent_rank(z)) == 0
    assert float(latent_effective_rank(z)) == 0.0


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (math.nan, r"z must be finite \(got 1 NaN and 0 infinite entries\)"),
        (math.inf, r"z must be finite \(got 0 NaN and 1 infinite entries\)"),
    ],
)
def test_non_finite_codes_are_refused(bad, match):
    z = torch.randn(6, 4, generator=gen())
    z[2, 1] = bad
    for fn in (latent_covariance, latent_covariance_spectrum, latent_rank, latent_effective_rank):
        with pytest.raises(ValueError, match=match):
            fn(z)


@pytest.mark.parametrize(
    ("z", "match"),
    [
        (torch.randn(4), r"z must be \[\.\.\., n, d_latent\]"),
        (torch.randn(1, 4), "z needs n >= 2 codes"),
        (torch.ones(3, 4, dtype=torch.long), "z must be a floating-point tensor"),
    ],
)
def test_bad_shapes_and_dtypes_are_refused(z, match):
    with pytest.raises(ValueError, match=match):
        latent_covariance_spectrum(z)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_huge_codes_do_not_overflow_the_normalised_spectrum(dtype):
    """At 1e30 the covariance (1e60) overflows float32; the normalised spectrum does not."""
    z = codes_with_spectrum([1.0, 0.3, 0.02], seed=4).to(dtype)
    expected = latent_covariance_spectrum(z)
    huge = latent_covariance_spectrum(z * 1e30)
    assert bool(torch.isfinite(huge).all())
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(huge, expected, rtol=tol, atol=tol)
    assert int(latent_rank(z * 1e30)) == 3


@settings(max_examples=40, deadline=None)
@given(
    exponent=st.floats(min_value=-30, max_value=30),
    seed=st.integers(min_value=0, max_value=2**16),
    k=st.integers(min_value=1, max_value=4),
)
def test_normalised_spectrum_is_scale_invariant_and_rank_deficiency_is_seen(exponent, seed, k):
    u = torch.randn(12, k, generator=gen(seed), dtype=torch.float64)
    B = torch.randn(k, 5, generator=gen(seed + 1), dtype=torch.float64)
    z = u @ B
    spectrum = latent_covariance_spectrum(z)
    scaled = latent_covariance_spectrum(z * 10.0**exponent)
    torch.testing.assert_close(scaled, spectrum, rtol=1e-9, atol=1e-12)
    assert float(spectrum[0]) == pytest.approx(1.0)
    assert bool((spectrum[:-1] >= spectrum[1:]).all())  # descending
    assert int(latent_rank(z, rel_tol=1e-12)) == k
    erank = float(latent_effective_rank(z))
    assert 1.0 - 1e-9 <= erank <= k + 1e-9


def test_batched_rows_are_independent():
    z = torch.randn(3, 10, 4, generator=gen(8), dtype=torch.float64)
    batched = latent_covariance_spectrum(z)
    for i in range(3):
        torch.testing.assert_close(batched[i], latent_covariance_spectrum(z[i]))
    assert latent_rank(z).shape == (3,) and latent_rank(z).dtype == torch.long
