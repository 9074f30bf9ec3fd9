"""Latent-code probes: planted linear codes decode (R² ≈ 1), noise does not (≈ 0); oracles."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression, Ridge

from dynascope.probes.latent_code import (
    attention_latent_code,
    logistic_f1,
    ridge_fit,
    ridge_r2,
)
from dynascope.probes.module_alignment import module_alignment


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def test_ridge_matches_sklearn():
    """sklearn Ridge (intercept unpenalised) as oracle; float64, tol 1e-8 (solver rounding)."""
    X = torch.randn(50, 4, generator=_gen(0), dtype=torch.float64)
    Y = torch.randn(50, 3, generator=_gen(1), dtype=torch.float64)
    W, b = ridge_fit(X, Y, alpha=2.0)
    ref = Ridge(alpha=2.0).fit(X.numpy(), Y.numpy())
    torch.testing.assert_close(W, torch.from_numpy(ref.coef_.T), rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(b, torch.from_numpy(ref.intercept_), rtol=1e-8, atol=1e-8)


def test_planted_linear_code_gives_r2_one_and_noise_gives_zero():
    z = torch.randn(2000, 3, generator=_gen(2), dtype=torch.float64)  # the task code
    A = torch.randn(3, 10, generator=_gen(3), dtype=torch.float64)
    feats = z @ A  # the code is linearly embedded in a 10-d representation
    r2, mean = ridge_r2(feats[:1000], z[:1000], feats[1000:], z[1000:], alpha=1e-6)
    torch.testing.assert_close(r2, torch.ones(3, dtype=torch.float64), rtol=0, atol=1e-9)
    noise = torch.randn(2000, 10, generator=_gen(4), dtype=torch.float64)
    _, mean_noise = ridge_r2(noise[:1000], z[:1000], noise[1000:], z[1000:])
    # held-out R² of an independent regressor: E ≈ -d/n ≈ -0.01, sd ≈ 0.01; |.| < 0.05
    assert abs(float(mean_noise)) < 0.05


def test_constant_columns_are_skipped():
    X = torch.randn(20, 2, generator=_gen(5), dtype=torch.float64)
    Y = torch.cat([X[:, :1], torch.zeros(20, 1, dtype=torch.float64)], 1)
    r2, mean = ridge_r2(X[:10], Y[:10], X[10:], Y[10:], alpha=1e-9)
    assert torch.isnan(r2[1]) and abs(float(mean) - 1) < 1e-6


def test_logistic_f1_planted_and_noise_against_sklearn():
    g = _gen(6)
    X = torch.randn(800, 5, generator=g, dtype=torch.float64)
    labels = (X[:, :2] > 0).double()  # two labels, each a half-space of the features
    f1, mean = logistic_f1(X[:400], labels[:400], X[400:], labels[400:])
    assert float(mean) > 0.97
    ref = LogisticRegression(C=1e4).fit(X[:400].numpy(), labels[:400, 0].numpy())
    pred = ref.predict(X[400:].numpy())
    tp = float(np.sum(pred * labels[400:, 0].numpy()))
    ref_f1 = 2 * tp / (pred.sum() + labels[400:, 0].sum().item())
    assert abs(float(f1[0]) - ref_f1) < 0.02  # same separable problem; solvers differ slightly
    noise = torch.randn(800, 5, generator=g, dtype=torch.float64)
    rand_labels = (torch.rand(800, 1, generator=g) > 0.5).double()
    _, m = logistic_f1(noise[:400], rand_labels[:400], noise[400:], rand_labels[400:])
    assert 0.3 < float(m) < 0.7  # chance-level F1 for balanced labels ≈ 0.5


def test_attention_latent_code_picks_the_diagonal():
    p = torch.arange(2 * 3 * 4 * 4, dtype=torch.float32).reshape(2, 3, 4, 4)
    torch.testing.assert_close(attention_latent_code(p), p[:, :, 3, 3])
    torch.testing.assert_close(attention_latent_code(p, 1, 0), p[:, :, 1, 0])
    with pytest.raises(ValueError, match="query must be in"):
        attention_latent_code(p, 4)
    with pytest.raises(ValueError, match="pattern must be"):
        attention_latent_code(p[0])


def test_module_alignment_oracle_mixed_permuted_rescaled_teacher():
    """Student = teacher with codes mixed by invertible A, units permuted, positively rescaled."""
    g = _gen(7)
    theta = torch.randn(4, 6, 5, generator=g, dtype=torch.float64)
    A = torch.randn(4, 4, generator=g, dtype=torch.float64) + 3 * torch.eye(4, dtype=torch.float64)
    perm = torch.randperm(5, generator=g)
    scale = torch.rand(5, generator=g, dtype=torch.float64) + 0.5
    # theta_hat_j = sum_m A[m, j] theta_m (units permuted and rescaled); then
    # sum_j pinv(F)[j, m] theta_hat_j = theta_m exactly when A pinv(F) = I, i.e. F = A.
    theta_hat = torch.einsum("mj,mih->jih", A, theta)[:, :, perm] * scale
    torch.testing.assert_close(
        module_alignment(theta, theta_hat, A),
        torch.ones(4, 5, dtype=torch.float64),
        rtol=0,
        atol=1e-10,
    )
    noise = torch.randn(4, 6, 5, generator=g, dtype=torch.float64)
    assert float(module_alignment(theta, noise, torch.eye(4, dtype=torch.float64)).mean()) < 0.9
