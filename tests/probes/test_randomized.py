"""Randomized-algorithm evaluation against hand-built cases and naive loops."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dynascope.probes.randomized import (
    bits_to_int,
    majority_vote,
    per_input_success,
    predictive_variance,
    sample_bits,
    success_percentile,
)


def test_per_input_success_and_percentiles_hand_built():
    correct = torch.tensor(
        [[1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0]], dtype=torch.bool
    )
    s = per_input_success(correct)
    torch.testing.assert_close(s, torch.tensor([1.0, 0.25, 0.0, 0.5]))
    assert success_percentile(s, 0.0).item() == 0.0
    assert success_percentile(s, 100.0).item() == 1.0
    # numpy-style linear interpolation: sorted [0, .25, .5, 1], 50th pct = (.25 + .5) / 2
    assert success_percentile(s, 50.0).item() == pytest.approx(0.375)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 6), m=st.integers(1, 7), k=st.integers(1, 5), seed=st.integers(0, 999))
def test_majority_vote_equals_a_naive_loop(n, m, k, seed):
    g = torch.Generator().manual_seed(seed)
    answers = torch.randint(k, (n, m), generator=g)
    votes = majority_vote(answers, k)
    for i in range(n):
        counts = [int((answers[i] == c).sum()) for c in range(k)]
        assert votes[i].item() == counts.index(max(counts))  # smallest id among the maxima


def test_majority_vote_ties_go_to_the_smallest_class():
    assert majority_vote(torch.tensor([[2, 1, 2, 1]]), 3).tolist() == [1]


def test_bits_to_int_and_sampling_extremes():
    assert bits_to_int(torch.tensor([[1, 0, 1], [0, 0, 0]])).tolist() == [5, 0]
    logits = torch.tensor([[40.0, -40.0, 40.0]])
    assert sample_bits(logits, torch.Generator().manual_seed(0)).tolist() == [[1, 0, 1]]


def test_predictive_variance_closed_forms():
    # seed-independent model: 0
    logits = torch.randn(5, 1, 3).expand(5, 4, 3)
    assert predictive_variance(logits).item() == pytest.approx(0.0, abs=1e-12)
    # bit probabilities 0 and 1 on two seeds (logits -inf/+inf): variance 1/4 everywhere
    big = torch.tensor([[[-1e4, 1e4], [1e4, -1e4]]])  # [n=1, m=2, b=2]
    assert predictive_variance(big).item() == pytest.approx(0.25)
    # naive double loop in float64
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 2, generator=g, dtype=torch.float64)
    p = torch.sigmoid(x)
    naive = (
        sum(
            float(((p[i, :, b] - p[i, :, b].mean()) ** 2).mean())
            for i in range(3)
            for b in range(2)
        )
        / 6
    )
    assert predictive_variance(x).item() == pytest.approx(naive, rel=1e-12)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: per_input_success(torch.ones(3, dtype=torch.bool)), "correct must be"),
        (lambda: success_percentile(torch.ones(3), 101.0), "percentile must be in"),
        (lambda: success_percentile(torch.ones(0), 5.0), "success must be"),
        (lambda: majority_vote(torch.tensor([[0, 3]]), 3), "answers must lie"),
        (lambda: majority_vote(torch.tensor([[0, 1]]), 0), "n_classes must be"),
        (lambda: predictive_variance(torch.ones(2, 3)), "logits must be"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
