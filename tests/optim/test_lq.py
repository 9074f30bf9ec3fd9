"""lq_loss: the direct formula in float64, finiteness at huge q, the q -> inf limit, bad input."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dynascope.optim.lq import lq_loss


def _direct(losses: torch.Tensor, q: float) -> torch.Tensor:
    per_input = losses.mean(dim=1)
    return per_input.pow(q).mean().pow(1.0 / q)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 7),
    m=st.integers(1, 5),
    q=st.sampled_from([1.0, 1.5, 2.0, 16.0, 32.0, 100.0]),
    seed=st.integers(0, 2**16),
)
def test_equals_the_direct_formula_in_float64(n, m, q, seed):
    # Losses in [0.5, 1.5]: the direct formula neither overflows nor underflows at q <= 100,
    # so the two must agree to float64 rounding (rtol 1e-12).
    g = torch.Generator().manual_seed(seed)
    losses = 0.5 + torch.rand(n, m, generator=g, dtype=torch.float64)
    torch.testing.assert_close(lq_loss(losses, q), _direct(losses, q), rtol=1e-12, atol=0)


def test_gradient_matches_the_direct_formula():
    losses = torch.tensor([[0.3, 0.9], [1.2, 0.4], [0.7, 0.7]], dtype=torch.float64)
    a = losses.clone().requires_grad_()
    b = losses.clone().requires_grad_()
    lq_loss(a, 8.0).backward()
    _direct(b, 8.0).backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("q", [1e3, 1e4])
def test_finite_at_huge_q_where_the_direct_formula_is_not(q):
    losses = torch.tensor([[30.0, 50.0], [1.0, 2.0], [1e-3, 0.0]], dtype=torch.float64)
    assert not torch.isfinite(_direct(losses, q))  # 40^1e3 overflows float64
    value = lq_loss(losses, q)
    assert torch.isfinite(value)
    # Closed form: M (1/n)^(1/q) + tiny terms; (1/3)^(1/q) -> 1, so within M*(1 - 3^(-1/q)).
    assert 40 * 3 ** (-1 / q) <= value.item() <= 40.0


def test_q_to_infinity_is_the_max():
    losses = torch.tensor([[0.1, 0.3], [2.0, 4.0], [1.0, 1.0]], dtype=torch.float64)
    assert lq_loss(losses, math.inf).item() == 3.0
    # and the finite-q values approach it (1/n)^(1/q)-close
    for q in (10.0, 100.0, 1e4):
        assert 3.0 * 3 ** (-1 / q) - 1e-12 <= lq_loss(losses, q).item() <= 3.0


def test_q_one_is_the_expected_loss_and_zeros_give_zero_with_zero_gradient():
    losses = torch.tensor([[1.0, 3.0], [0.0, 2.0]], dtype=torch.float64)
    assert lq_loss(losses, 1).item() == pytest.approx(1.5, rel=1e-15)
    zeros = torch.zeros(3, 2, requires_grad=True)
    value = lq_loss(zeros, 10.0)
    value.backward()
    assert value.item() == 0.0
    torch.testing.assert_close(zeros.grad, torch.zeros(3, 2))


@pytest.mark.parametrize(
    ("losses", "q", "match"),
    [
        (torch.ones(2, 2), 0.5, "q must be a number >= 1"),
        (torch.ones(2, 2), float("nan"), "q must be"),
        (torch.ones(2, 2, 2), 2.0, "losses must be a non-empty"),
        (torch.ones(0, 2), 2.0, "losses must be a non-empty"),
        (torch.tensor([[1.0, -1.0]]), 2.0, "non-negative"),
        (torch.tensor([[1.0, float("nan")]]), 2.0, "non-negative"),
    ],
)
def test_bad_input(losses, q, match):
    with pytest.raises(ValueError, match=match):
        lq_loss(losses, q)
