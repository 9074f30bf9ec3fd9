"""Recurrent-network instruments against hand-built cases, numpy, loops and closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from dynascope.nn.attention import MultiHeadAttention
from dynascope.nn.recurrent import GatedLinearRNN
from dynascope.probes.recurrent import (
    gradient_cosine,
    lambda_histogram,
    lambda_mass,
    linear_probe_r2,
    mid_lambda_mask,
    normalized_prediction_gap,
    one_step_gd_prediction,
    optimal_gd_learning_rate,
    pruned_copy,
    query_gradient,
)
from dynascope.tasks import InContextLinearRegression

F64 = torch.float64


@settings(max_examples=30, deadline=None)
@given(values=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=40), bins=st.integers(1, 25))
@example(values=[0.3], bins=10)  # on a bin edge up to rounding: torch.histc put it one bin up
def test_lambda_histogram_matches_numpy(values, bins):
    lam = torch.tensor(values, dtype=F64)
    expected, _ = np.histogram(np.array(values), bins=bins, range=(0.0, 1.0))
    assert_close(lambda_histogram(lam, bins), torch.tensor(expected, dtype=F64), rtol=0, atol=0)


def test_lambda_mass_and_mask_on_a_hand_built_case():
    lam = torch.tensor([0.0, 0.01, 0.05, 0.5, 0.95, 0.99, 1.0, 0.3])
    assert mid_lambda_mask(lam).tolist() == [False, False, True, True, True, False, False, True]
    mass = lambda_mass(lam)
    assert_close(
        torch.stack([mass["near_0"], mass["near_1"], mass["mid"]]),
        torch.tensor([2, 2, 4], dtype=F64) / 8,
    )
    complex_lam = torch.tensor([0.6 + 0.8j, 0.01j])  # |λ| = 1 and 0.01
    assert mid_lambda_mask(complex_lam).tolist() == [False, False]
    with pytest.raises(ValueError, match=r"delta must be in \(0, 0.5\)"):
        mid_lambda_mask(lam, 0.5)
    with pytest.raises(ValueError, match="lam must not contain NaN"):
        lambda_histogram(torch.tensor([float("nan")]))
    with pytest.raises(ValueError, match=r"lam must have shape \[d_hidden\]"):
        lambda_mass(torch.zeros(2, 2))


def test_pruned_copy_removes_exactly_the_masked_neurons():
    """Oracle: the same layer built with the pruned neurons' read-out rows set to 0 by hand."""
    torch.manual_seed(0)
    rnn = GatedLinearRNN(4, 6, lambda_kind="complex").double()
    before = {k: v.clone() for k, v in rnn.state_dict().items()}
    mask = torch.tensor([True, False, False, True, False, False])
    pruned = pruned_copy(rnn, mask)
    for k, v in rnn.state_dict().items():
        assert torch.equal(v, before[k]), k  # the original is untouched
    manual = GatedLinearRNN(4, 6, lambda_kind="complex").double()
    manual.load_state_dict(before)
    with torch.no_grad():
        manual.W_out_h[mask] = 0
        manual.W_out_h_im[mask] = 0
        x = torch.randn(2, 5, 4, dtype=F64)
        assert_close(pruned(x), manual(x), rtol=0, atol=1e-12)
        assert_close(pruned_copy(rnn, torch.zeros(6, dtype=torch.bool))(x), rnn(x), rtol=0, atol=0)
        assert torch.equal(
            pruned_copy(rnn, torch.ones(6, dtype=torch.bool))(x), torch.zeros(2, 5, 4, dtype=F64)
        )
    with pytest.raises(ValueError, match=r"mask must be a bool tensor of shape \[d_hidden=6\]"):
        pruned_copy(rnn, torch.zeros(5, dtype=torch.bool))


def _icl_batch(n=64, d_x=3, n_points=6, seed=0):
    task = InContextLinearRegression(d_x=d_x, n_points=n_points)
    with torch.random.fork_rng(devices=[]):
        torch.set_default_dtype(F64)
        try:
            return task.batch("train", n, torch.Generator().manual_seed(seed))
        finally:
            torch.set_default_dtype(torch.float32)


def test_one_step_gd_matches_a_loop_and_a_linear_attention_layer():
    """Loop oracle, and the LSA layer that implements one GD step (von Oswald et al. 2023,
    Prop. 1): W_Q = W_K select x, W_V selects y, W_O writes to the label slot, scale η/N."""
    batch = _icl_batch()
    x = batch["x"]
    eta, n_points, d_x = 0.7, 6, 3
    loop = torch.zeros(64, dtype=F64)
    for b in range(64):
        grad = sum(x[b, i, -1] * x[b, i, :-1] for i in range(n_points)) / n_points  # −∇L(0)
        loop[b] = eta * grad @ x[b, -1, :-1]
    assert_close(one_step_gd_prediction(x, eta), loop, rtol=0, atol=1e-12)
    lsa = MultiHeadAttention(
        d_x + 1, 1, d_x, attention="linear", is_causal=True, scale=eta / n_points
    ).double()
    with torch.no_grad():
        select = torch.eye(d_x + 1, d_x, dtype=F64)
        lsa.W_Q.copy_(select[None])
        lsa.W_K.copy_(select[None])
        lsa.W_V.zero_()[0, d_x, 0] = 1.0
        lsa.W_O.zero_()[0, 0, d_x] = 1.0
        assert_close(lsa(x)[:, -1, -1], loop, rtol=0, atol=1e-12)


def test_optimal_learning_rate_is_the_one_dimensional_least_squares_solution():
    batch = _icl_batch(n=500, seed=3)
    s = one_step_gd_prediction(batch["x"], 1.0).numpy()
    expected, *_ = np.linalg.lstsq(s[:, None], batch["y"].numpy(), rcond=None)
    assert_close(
        optimal_gd_learning_rate(batch["x"], batch["y"]), torch.tensor(expected[0], dtype=F64)
    )
    with pytest.raises(ValueError, match=r"y must have shape \[batch=500\]"):
        optimal_gd_learning_rate(batch["x"], batch["y"][:3])


def test_query_gradient_of_gd_is_its_closed_form_and_inputs_are_untouched():
    """∂ŷ_GD/∂x_q = (η/N) Σ_i y_i x_i."""
    x = _icl_batch()["x"]
    copy = x.clone()
    grad = query_gradient(lambda t: one_step_gd_prediction(t, 0.5), x)
    expected = 0.5 * torch.einsum("bi,bid->bd", x[:, :-1, -1], x[:, :-1, :-1]) / 6
    assert_close(grad, expected, rtol=0, atol=1e-12)
    assert torch.equal(x, copy) and not grad.requires_grad
    with pytest.raises(ValueError, match=r"x must have shape \[batch, N \+ 1, d_x \+ 1\]"):
        query_gradient(lambda t: t.sum((1, 2)), torch.zeros(2, 1, 3))


def test_gap_and_cosine_closed_forms():
    ref = torch.tensor([1.0, -2.0, 3.0], dtype=F64)
    assert normalized_prediction_gap(ref, ref) == 0
    assert_close(
        normalized_prediction_gap(torch.zeros(3, dtype=F64), ref), torch.tensor(1.0, dtype=F64)
    )
    assert_close(normalized_prediction_gap(2 * ref, ref), torch.tensor(1.0, dtype=F64))
    a = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    b = torch.tensor([[2.0, 0.0], [-1.0, -1.0], [1.0, 0.0]])
    assert_close(gradient_cosine(a, b), torch.tensor([1.0, -1.0, 0.0]))
    with pytest.raises(ValueError, match="pred and ref must have the same shape"):
        normalized_prediction_gap(ref, ref[:2])
    with pytest.raises(ValueError, match=r"a and b must be equal \[batch, d\] shapes"):
        gradient_cosine(a, b[:2])


def test_linear_probe_r2_is_one_for_linear_targets_and_near_zero_for_noise():
    g = torch.Generator().manual_seed(0)
    features = torch.randn(2000, 5, generator=g, dtype=F64)
    targets = torch.stack(
        [
            features @ torch.arange(5.0, dtype=F64) + 3.0,
            torch.randn(2000, generator=g, dtype=F64),
            torch.ones(2000, dtype=F64),
        ],
        -1,
    )
    r2 = linear_probe_r2(features, targets)
    assert_close(r2[0], torch.tensor(1.0, dtype=F64), rtol=0, atol=1e-10)
    assert abs(float(r2[1])) < 0.01  # 6 fitted coefficients on 2000 rows: E[R²] ≈ 6/2000
    assert math.isnan(float(r2[2]))
    complex_features = torch.complex(features[:, :2], features[:, 2:4])
    r2c = linear_probe_r2(complex_features, features[:, 3:4] * 2)  # an imaginary part
    assert_close(r2c, torch.ones(1, dtype=F64), rtol=0, atol=1e-10)
    with pytest.raises(ValueError, match="need the same n"):
        linear_probe_r2(features, targets[:10])
