"""Diagonal attention head: dense multi-head attention as oracle, a hand-computed case, errors."""

from __future__ import annotations

import pytest
import torch

from dynascope.nn import DiagonalAttention, MultiHeadAttention, diagonal_attention

BATCH, N_CTX, D_MODEL, N_MODELS = 2, 7, 5, 3


def _x(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(BATCH, N_CTX, D_MODEL, generator=g, dtype=torch.float64)


def _model(scale: float = 1.0) -> DiagonalAttention:
    g = torch.Generator().manual_seed(1)
    theta0 = torch.randn(4, D_MODEL, generator=g, dtype=torch.float64)
    return DiagonalAttention(theta0, torch.tensor([0.3, 1.0, 2.0]), scale=scale)


@pytest.mark.parametrize("scale", [1.0, D_MODEL**-0.5])
def test_each_copy_equals_a_dense_multi_head_attention_with_diagonal_weights(scale):
    """Oracle: dynascope's MultiHeadAttention (one head, d_head = d_model, no bias) loaded with
    W_Q = diag(w_Q), … computes the same output; float64, so 1e-12 is rounding only."""
    model, x = _model(scale), _x()
    out = model(x)
    assert out.shape == (N_MODELS, BATCH, N_CTX, D_MODEL)
    for m in range(N_MODELS):
        dense = MultiHeadAttention(D_MODEL, 1, D_MODEL, scale=scale).double()
        with torch.no_grad():
            for name, weight in model.dense_weights(m).items():
                getattr(dense, name).copy_(weight)
        torch.testing.assert_close(out[m], dense(x), rtol=0, atol=1e-12)


def test_zero_scores_give_uniform_attention_and_the_mean_token():
    """Hand-computed: qk = 0 makes every pattern row uniform, so out = mean over tokens ⊙ ov."""
    x = _x()
    ov = torch.tensor([1.0, -2.0, 0.5, 0.0, 3.0], dtype=torch.float64)
    out, pattern = diagonal_attention(x, torch.zeros(D_MODEL, dtype=torch.float64), ov)
    torch.testing.assert_close(pattern, torch.full((BATCH, N_CTX, N_CTX), 1 / N_CTX).double())
    expected = x.mean(dim=1, keepdim=True).expand(-1, N_CTX, -1) * ov
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-14)


def test_one_active_entry_attends_by_that_coordinate_alone():
    """qk = e_0·c: scores_ij = c x_i0 x_j0, a hand-written softmax over keys."""
    x = _x()
    qk = torch.zeros(D_MODEL, dtype=torch.float64)
    qk[0] = 1.7
    _, pattern = diagonal_attention(x, qk, torch.ones(D_MODEL, dtype=torch.float64))
    scores = 1.7 * x[..., 0, None] * x[..., None, :, 0]
    expected = scores.exp() / scores.exp().sum(dim=-1, keepdim=True)
    torch.testing.assert_close(pattern, expected, rtol=0, atol=1e-14)


def test_init_is_alpha_times_theta0_and_products_are_entrywise():
    g = torch.Generator().manual_seed(1)
    theta0 = torch.randn(4, D_MODEL, generator=g, dtype=torch.float64)
    alphas = torch.tensor([0.3, 1.0, 2.0], dtype=torch.float64)
    model = DiagonalAttention(theta0, alphas)
    torch.testing.assert_close(model.w_K, alphas[:, None] * theta0[1])
    torch.testing.assert_close(model.qk, alphas[:, None] ** 2 * theta0[0] * theta0[1])
    torch.testing.assert_close(model.ov, alphas[:, None] ** 2 * theta0[2] * theta0[3])


def test_leading_dims_of_qk_batch_independent_heads():
    x = _x()
    g = torch.Generator().manual_seed(2)
    qk, ov = torch.randn(2, 3, D_MODEL, generator=g, dtype=torch.float64).unbind(0)
    out, pattern = diagonal_attention(x, qk, ov)
    assert out.shape == (3, BATCH, N_CTX, D_MODEL) and pattern.shape == (3, BATCH, N_CTX, N_CTX)
    for m in range(3):
        single, _ = diagonal_attention(x, qk[m], ov[m])
        torch.testing.assert_close(out[m], single, rtol=0, atol=1e-14)


def test_bad_inputs_raise_one_line_errors():
    x = _x()
    ones = torch.ones(D_MODEL, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"x must be \[batch, n_ctx, d_model\]"):
        diagonal_attention(x[0], ones, ones)
    with pytest.raises(ValueError, match="qk and ov must both be"):
        diagonal_attention(x, ones[:3], ones[:3])
    with pytest.raises(ValueError, match="qk and ov must both be"):
        diagonal_attention(x, ones, ones[None])
    theta0 = torch.ones(4, D_MODEL)
    with pytest.raises(ValueError, match=r"theta0 must be \[4, d_model\]"):
        DiagonalAttention(torch.ones(3, D_MODEL), torch.tensor([1.0]))
    with pytest.raises(ValueError, match="alphas must be finite and > 0"):
        DiagonalAttention(theta0, torch.tensor([0.1, 0.0]))
    with pytest.raises(ValueError, match="alphas must be finite and > 0"):
        DiagonalAttention(theta0, torch.tensor([]))
    with pytest.raises(ValueError, match="scale must be finite"):
        DiagonalAttention(theta0, torch.tensor([1.0]), scale=float("nan"))
    with pytest.raises(IndexError, match=r"index must lie in \[-1, 1\)"):
        DiagonalAttention(theta0, torch.tensor([1.0])).dense_weights(1)
