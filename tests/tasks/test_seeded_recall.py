"""SeededRecall: answers right by construction, loss = summed BCE, success = all bits right."""

from __future__ import annotations

import math

import pytest
import torch

from dynascope.tasks.seeded_recall import SeededRecall


def test_answer_is_the_value_of_the_token_holding_the_query_key():
    task = SeededRecall(n_keys=7, n_value_bits=5)
    batch = task.batch(64, torch.Generator().manual_seed(0))
    x, y = batch["x"], batch["y"]
    assert x.shape == (64, 8, 12) and y.shape == (64, 5)
    for i in range(64):
        keys = x[i, :7, :7]
        # every key appears exactly once
        torch.testing.assert_close(keys.sum(0), torch.ones(7))
        torch.testing.assert_close(keys.sum(1), torch.ones(7))
        query_key = x[i, 7, :7]
        assert x[i, 7, 7:].abs().sum() == 0  # value field of the query is empty
        t = int((keys == query_key).all(dim=1).nonzero())
        torch.testing.assert_close(y[i], x[i, t, 7:])


def test_loss_and_success_hand_built():
    task = SeededRecall(n_keys=2, n_value_bits=2)
    batch = {"x": torch.zeros(1, 3, 4), "y": torch.tensor([[1.0, 0.0]])}
    out = torch.zeros(1, 2, 3, 2)
    out[0, 0, -1] = torch.tensor([3.0, -2.0])  # right on both bits
    out[0, 1, -1] = torch.tensor([3.0, 1.0])  # second bit wrong
    loss = task.per_seed_loss(out, batch)
    expected0 = math.log1p(math.exp(-3.0)) + math.log1p(math.exp(-2.0))
    expected1 = math.log1p(math.exp(-3.0)) + math.log1p(math.exp(1.0))
    torch.testing.assert_close(loss, torch.tensor([[expected0, expected1]]))
    assert task.correct(out, batch).tolist() == [[True, False]]


def test_same_generator_state_same_batch_and_bad_input():
    task = SeededRecall(n_keys=4)
    a = task.batch(3, torch.Generator().manual_seed(5))
    b = task.batch(3, torch.Generator().manual_seed(5))
    torch.testing.assert_close(a["x"], b["x"])
    with pytest.raises(ValueError, match="n_keys must be an int >= 1"):
        SeededRecall(n_keys=0)
    with pytest.raises(ValueError, match="output must be"):
        task.per_seed_loss(torch.zeros(3, 2, 4, 5), a)
