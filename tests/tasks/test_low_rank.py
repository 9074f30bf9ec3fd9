"""LowRankGaussian (S15 data): orthonormal mixing, determinism, covariance, rank."""

from __future__ import annotations

import math

import pytest
import torch

from dynascope.tasks.low_rank import LowRankGaussian


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_mixing_matrix_has_orthonormal_columns_and_is_deterministic():
    task = LowRankGaussian(d_in=11, variances=(3.0, 2.0, 1.0))
    A = task.mixing_matrix(gen(4))
    assert A.shape == (11, 3) and A.dtype == torch.float64
    torch.testing.assert_close(A.T @ A, torch.eye(3, dtype=torch.float64), rtol=0, atol=1e-14)
    torch.testing.assert_close(task.mixing_matrix(gen(4)), A, rtol=0, atol=0)
    assert not torch.allclose(task.mixing_matrix(gen(5)), A)


def test_samples_are_deterministic_and_shaped():
    task = LowRankGaussian(d_in=7, variances=(2.0, 1.0))
    A = task.mixing_matrix(gen())
    x = task.sample(A, 13, gen(1))
    assert x.shape == (13, 7) and x.dtype == torch.float64
    torch.testing.assert_close(task.sample(A, 13, gen(1)), x, rtol=0, atol=0)


def test_noiseless_samples_have_exactly_the_true_rank():
    task = LowRankGaussian(d_in=9, variances=(5.0, 4.0, 3.0), noise_std=0.0)
    A = task.mixing_matrix(gen())
    x = task.sample(A, 50, gen(1))
    s = torch.linalg.svdvals(x)
    assert float(s[2]) > 1.0 and float(s[3]) < 1e-12 * float(s[0])
    torch.testing.assert_close(x @ A @ A.T, x, rtol=0, atol=1e-12)  # x lies in span A


def test_sample_covariance_approaches_the_population_covariance():
    """N = 200,000: the sampling error of each entry is ~ sqrt(2/N) * 5 ~ 0.016; tolerance 0.05."""
    task = LowRankGaussian()
    A = task.mixing_matrix(gen())
    x = task.sample(A, 200_000, gen(1))
    empirical = x.T @ x / x.shape[0]
    torch.testing.assert_close(empirical, task.covariance(A), rtol=0, atol=0.05)
    eig = torch.linalg.eigvalsh(task.covariance(A)).flip(0)
    expected = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0], dtype=torch.float64) + 1e-4
    torch.testing.assert_close(eig[:5], expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(eig[5:], torch.full((27,), 1e-4, dtype=torch.float64))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"variances": ()}, "variances must be non-empty"),
        ({"variances": (1.0, -1.0)}, "variances must be finite numbers > 0"),
        ({"variances": (1.0, math.inf)}, "variances must be finite numbers > 0"),
        ({"d_in": 2, "variances": (1.0, 1.0, 1.0)}, "d_in must be an int >= 3"),
        ({"noise_std": -0.1}, "noise_std must be a finite number >= 0"),
    ],
)
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LowRankGaussian(**kwargs)


def test_sample_checks_its_arguments():
    task = LowRankGaussian(d_in=6, variances=(1.0, 1.0))
    with pytest.raises(ValueError, match=r"A must be \[6, 2\]"):
        task.sample(torch.zeros(5, 2), 3, gen())
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        task.sample(task.mixing_matrix(gen()), 0, gen())
