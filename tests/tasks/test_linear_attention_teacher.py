"""LinearAttentionTeacher: the teacher is causal linear attention, the loss is normalised, the
construction scores 0, batches are deterministic, bad arguments are one-line errors."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from dynascope.nn.recurrent import causal_linear_attention, gated_rnn_from_linear_attention
from dynascope.tasks.linear_attention_teacher import LinearAttentionTeacher


def _task(**kw):
    return LinearAttentionTeacher(
        d_model=3, n_heads=2, d_head=2, n_ctx=5, seed=4, n_variance=2000, **kw
    )


def test_targets_are_the_teachers_linear_attention_output():
    task = _task()
    batch = task.batch("train", 6, torch.Generator().manual_seed(0))
    assert batch["x"].shape == batch["y"].shape == (6, 5, 3)
    expected = causal_linear_attention(batch["x"], task.W_Q, task.W_K, task.W_V, task.W_O)
    assert_close(batch["y"], expected, rtol=0, atol=0)
    assert task.W_Q.shape == (2, 3, 2) and task.W_O.shape == (2, 2, 3)


def test_weights_and_batches_are_deterministic():
    a, b = _task(), _task()
    assert torch.equal(a.W_V, b.W_V) and a.variance == b.variance
    x1 = a.batch("train", 3, torch.Generator().manual_seed(7))["x"]
    x2 = b.batch("val", 3, torch.Generator().manual_seed(7))["x"]
    assert torch.equal(x1, x2)
    other = LinearAttentionTeacher(d_model=3, n_heads=2, d_head=2, n_ctx=5, seed=5)
    assert not torch.equal(other.W_Q, a.W_Q)


def test_variance_matches_an_independent_estimate_and_zero_scores_one():
    """The stored E[y²] against 100k fresh float64 sequences: within 5 combined standard errors
    of the two Monte-Carlo means (the per-sequence y² means are heavy-tailed, so the error is
    estimated from their spread, not assumed). Predicting 0 then scores ≈ 1 by definition."""
    task = _task()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(11)
        x = torch.randn(100_000, 5, 3, dtype=torch.float64)
    W = [w.double() for w in (task.W_Q, task.W_K, task.W_V, task.W_O)]
    per_seq = causal_linear_attention(x, *W).pow(2).mean(dim=(1, 2))  # [n]
    std = float(per_seq.std())
    se = (std**2 / 100_000 + std**2 / 2000) ** 0.5
    assert abs(task.variance - float(per_seq.mean())) < 5 * se
    batch = {"x": x.float(), "y": causal_linear_attention(x, *W).float()}
    zero = float(task.loss(torch.zeros_like(batch["y"]), batch))
    assert_close(zero, float(per_seq.mean()) / task.variance, rtol=1e-5, atol=0)


def test_loss_is_zero_for_the_teacher_and_for_the_construction():
    task = _task()
    batch = task.batch("train", 64, torch.Generator().manual_seed(1))
    assert task.loss(batch["y"], batch) == 0
    rnn = gated_rnn_from_linear_attention(task.W_Q, task.W_K, task.W_V, task.W_O)
    with torch.no_grad():
        nmse = task.metrics(rnn(batch["x"]), batch)["nmse"]
    assert float(nmse) < 1e-10  # float32 rounding (~1e-7 relative), squared


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"d_head must be an int >= 1 \(got d_head=0\)"):
        LinearAttentionTeacher(d_head=0)
    with pytest.raises(ValueError, match="seed must be an int >= 0"):
        LinearAttentionTeacher(seed=-1)
    task = _task()
    batch = task.batch("train", 2, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"output must have shape \[batch, n_ctx, d_out\]"):
        task.loss(torch.zeros(2, 5, 1), batch)
    with pytest.raises(ValueError, match="split must be one of"):
        task.batch("test", 2, torch.Generator())
