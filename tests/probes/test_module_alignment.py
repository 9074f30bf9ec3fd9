"""Module alignment and code decodability: a student that is the teacher with mixed codes and
permuted, positively rescaled hidden units scores ≈ 1; an unrelated random student scores low;
ridge matches its closed form; R² ≈ 1 on a planted linear code and ≈ 0 on noise."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dynascope.probes.module_alignment import (
    code_r2,
    fit_code_map,
    generated_weight_alignment,
    module_alignment,
)

M, N_IN, N_HID = 6, 16, 16


def _oracle(seed: int, m_hat: int = 12, n_hid_hat: int = 32):
    """Teacher modules, and a student computing the same function: codes z_hat = z B (B of
    full row rank), modules B⁺ theta, hidden units permuted and positively rescaled (the extra
    units copy teacher units with other scales)."""
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(M, N_IN, N_HID, generator=g, dtype=torch.float64)
    B = torch.randn(M, m_hat, generator=g, dtype=torch.float64)
    mixed = torch.einsum("jm,mio->jio", torch.linalg.pinv(B), theta)  # [m_hat, in, hid]
    units = torch.cat(
        [
            torch.randperm(N_HID, generator=g),
            torch.randint(N_HID, (n_hid_hat - N_HID,), generator=g),
        ]
    )
    scale = torch.exp(torch.randn(n_hid_hat, generator=g, dtype=torch.float64))
    theta_hat = mixed[:, :, units] * scale
    z = torch.rand(200, M, generator=g, dtype=torch.float64)
    return theta, theta_hat, B, z, z @ B


def test_identified_student_scores_one():
    # Tolerance: ridge l2 = 0.01 against Ẑᵀ Ẑ of order 200·|B|² biases F by ~1e-4 relative.
    theta, theta_hat, _, z, z_hat = _oracle(0)
    F = fit_code_map(z_hat, z)
    torch.testing.assert_close(
        code_r2(F, z_hat, z), torch.ones(M, dtype=torch.float64), rtol=0, atol=1e-4
    )
    A = module_alignment(theta, theta_hat, F)
    torch.testing.assert_close(A, torch.ones(M, N_HID, dtype=torch.float64), rtol=0, atol=1e-4)
    torch.testing.assert_close(
        module_alignment(theta, theta_hat, F, variant="all"),
        torch.ones(N_HID, dtype=torch.float64),
        rtol=0,
        atol=1e-4,
    )
    avr, mx = generated_weight_alignment(theta, theta_hat, z, z_hat)
    torch.testing.assert_close(avr, torch.ones(N_HID, dtype=torch.float64), rtol=0, atol=1e-9)
    torch.testing.assert_close(mx, torch.ones(N_HID, dtype=torch.float64), rtol=0, atol=1e-9)


def test_unrelated_random_student_scores_low():
    # Max over 32 random cosines in 16 dims concentrates near 0.5 (std of one cosine: 1/4).
    theta, _, _, z, _ = _oracle(1)
    g = torch.Generator().manual_seed(99)
    theta_hat = torch.randn(12, N_IN, 32, generator=g, dtype=torch.float64)
    z_hat = torch.randn(200, 12, generator=g, dtype=torch.float64)
    F = fit_code_map(z_hat, z)
    assert module_alignment(theta, theta_hat, F).mean() < 0.7
    assert code_r2(F, z_hat, z).mean() < 0.2


def test_sign_flip_is_caught_by_signed_but_not_absolute_cosine():
    theta, theta_hat, _, z, z_hat = _oracle(2)
    F = fit_code_map(z_hat, z)
    flipped = -theta_hat  # mapped modules point the other way: not the teacher's units
    assert module_alignment(theta, flipped, F).max() < 0.9
    torch.testing.assert_close(
        module_alignment(theta, flipped, F, absolute=True),
        torch.ones(M, N_HID, dtype=torch.float64),
        rtol=0,
        atol=1e-4,
    )


def test_unit_variant_equals_a_loop_over_modules_and_units():
    """Oracle: pinv(F) mapping, per-unit normalisation and the max over student units, by loops."""
    theta, theta_hat, _, z, z_hat = _oracle(3)
    g = torch.Generator().manual_seed(4)
    noisy = theta_hat + 0.3 * torch.randn(theta_hat.shape, generator=g, dtype=torch.float64)
    F = fit_code_map(z_hat, z)
    pinv = np.linalg.pinv(F.numpy())
    t, th = theta.numpy(), noisy.numpy()
    expected = np.empty((t.shape[0], t.shape[2]))
    for m in range(t.shape[0]):
        mapped = sum(pinv[j, m] * th[j] for j in range(th.shape[0]))  # [n_input, n_hidden_hat]
        for o in range(t.shape[2]):
            a = t[m, :, o] / np.linalg.norm(t[m, :, o])
            expected[m, o] = max(
                a @ mapped[:, q] / np.linalg.norm(mapped[:, q]) for q in range(mapped.shape[1])
            )
    torch.testing.assert_close(
        module_alignment(theta, noisy, F), torch.from_numpy(expected), rtol=0, atol=1e-12
    )


def test_ridge_matches_its_closed_form_without_intercept():
    g = torch.Generator().manual_seed(5)
    X = (
        torch.randn(30, 4, generator=g, dtype=torch.float64) + 3.0
    )  # off-centre: an intercept would matter
    Y = torch.randn(30, 2, generator=g, dtype=torch.float64)
    Xn, Yn = X.numpy(), Y.numpy()
    expected = np.linalg.solve(Xn.T @ Xn + 0.5 * np.eye(4), Xn.T @ Yn).T
    torch.testing.assert_close(fit_code_map(X, Y, l2=0.5), torch.from_numpy(expected))
    torch.testing.assert_close(
        fit_code_map(X, Y, l2=0.0), torch.from_numpy(np.linalg.lstsq(Xn, Yn, rcond=None)[0].T)
    )


def test_r2_is_about_zero_on_noise_and_nan_on_constant_targets():
    g = torch.Generator().manual_seed(6)
    z_hat, z = torch.randn(4000, 12, generator=g), torch.randn(4000, 3, generator=g)
    F = fit_code_map(z_hat[:2000], z[:2000])
    r2 = code_r2(F, z_hat[2000:], z[2000:])
    torch.testing.assert_close(r2, torch.zeros(3, dtype=torch.float64), rtol=0, atol=0.02)
    const = torch.ones(50, 1)
    assert code_r2(torch.zeros(1, 12), z_hat[:50], const).isnan().all()


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**16), log_c=st.floats(-30, 30))
def test_alignment_is_invariant_to_scaling_the_student(seed, log_c):
    theta, theta_hat, _, z, z_hat = _oracle(seed % 50, m_hat=6, n_hid_hat=16)
    g = torch.Generator().manual_seed(seed)
    noisy = theta_hat + torch.randn(theta_hat.shape, generator=g, dtype=torch.float64)
    F = fit_code_map(z_hat, z, l2=0.0)
    torch.testing.assert_close(
        module_alignment(theta, noisy * np.exp(log_c), F),
        module_alignment(theta, noisy, F),
        rtol=1e-9,
        atol=1e-12,
    )


def test_zero_modules_and_bad_shapes():
    theta = torch.zeros(2, 3, 4)
    A = module_alignment(theta, torch.zeros(2, 3, 5), torch.eye(2))
    torch.testing.assert_close(A, torch.zeros(2, 4, dtype=torch.float64))  # no direction: cosine 0
    with pytest.raises(ValueError, match="must fit"):
        module_alignment(theta, torch.zeros(2, 4, 5), torch.eye(2))
    with pytest.raises(ValueError, match="variant must be 'unit' or 'all'"):
        module_alignment(theta, torch.zeros(2, 3, 5), torch.eye(2), variant="module")
    with pytest.raises(ValueError, match="must be finite"):
        module_alignment(theta, torch.full((2, 3, 5), float("nan")), torch.eye(2))
    with pytest.raises(ValueError, match="l2 must be >= 0"):
        fit_code_map(torch.zeros(3, 2), torch.zeros(3, 1), l2=-1.0)
    with pytest.raises(ValueError, match="same tasks"):
        fit_code_map(torch.zeros(3, 2), torch.zeros(4, 1))
    with pytest.raises(ValueError, match=r"F must be \[M=1, M_hat=2\]"):
        code_r2(torch.zeros(2, 2), torch.zeros(3, 2), torch.zeros(3, 1))
    with pytest.raises(ValueError, match="do not fit together"):
        generated_weight_alignment(
            theta, torch.zeros(2, 3, 5), torch.zeros(4, 3), torch.zeros(4, 2)
        )
