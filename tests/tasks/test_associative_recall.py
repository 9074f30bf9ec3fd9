"""AssociativeRecall: encoding checked against a naive per-sequence oracle."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dynascope.tasks import AssociativeRecall


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_sizes() -> None:
    task = AssociativeRecall(n_keys=7, n_values=5, n_pairs=3)
    assert (task.d_vocab, task.d_out, task.n_ctx, task.input_kind) == (12, 12, 7, "tokens")
    default = AssociativeRecall()
    assert (default.d_vocab, default.n_ctx) == (32, 17)


def test_targets_match_naive_oracle() -> None:
    task = AssociativeRecall(n_keys=7, n_values=5, n_pairs=3)
    batch = task.batch("train", 11, gen(3))
    for row, target in zip(batch["x"].tolist(), batch["y"].tolist(), strict=True):
        keys, values, query = row[0:-1:2], row[1:-1:2], row[-1]
        assert len(keys) == 3 and len(set(keys)) == 3, "keys are distinct"
        assert all(0 <= k < 7 for k in keys)
        assert all(7 <= v < 12 for v in values)
        assert query in keys
        expected = next(v for k, v in zip(keys, values, strict=True) if k == query)
        assert target == expected


def test_sampling_covers_keys_values_and_query_positions() -> None:
    task = AssociativeRecall(n_keys=4, n_values=3, n_pairs=2)
    batch = task.batch("train", 400, gen(0))
    x = batch["x"]
    assert set(x[:, 0::2].flatten().tolist()) == set(range(4))  # all keys occur (incl. query)
    assert set(x[:, 1:-1:2].flatten().tolist()) == {4, 5, 6}
    query_is_first = (x[:, -1] == x[:, 0]).float().mean()
    assert abs(float(query_is_first) - 0.5) < 0.1  # query uniform over the 2 pairs


def test_n_pairs_equal_n_keys_uses_every_key() -> None:
    task = AssociativeRecall(n_keys=5, n_values=2, n_pairs=5)
    keys = task.batch("train", 6, gen(0))["x"][:, 0:-1:2]
    torch.testing.assert_close(keys.sort(dim=1).values, torch.arange(5).expand(6, 5))


def test_loss_is_cross_entropy_at_last_position_only() -> None:
    task = AssociativeRecall(n_keys=3, n_values=4, n_pairs=2)
    batch = task.batch("train", 2, gen(0))
    output = torch.zeros(2, task.n_ctx, task.d_out)
    output[:, :-1] = 100.0 * torch.randn(2, task.n_ctx - 1, task.d_out, generator=gen(1))
    # Uniform logits at the last position: loss log(d_vocab), whatever earlier positions hold.
    torch.testing.assert_close(task.loss(output, batch), torch.tensor(math.log(7.0)))
    output[torch.arange(2), -1, batch["y"]] = 50.0
    assert float(task.metrics(output, batch)["accuracy"]) == 1.0
    assert float(task.loss(output, batch)) < 1e-12


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_keys": 0}, r"n_keys must be an int >= 1 \(got n_keys=0\)"),
        ({"n_values": 0}, r"n_values must be an int >= 1 \(got n_values=0\)"),
        ({"n_pairs": 0}, r"n_pairs must be in \[1, n_keys\] \(got n_pairs=0, n_keys=16\)"),
        ({"n_pairs": 20}, r"n_pairs must be in \[1, n_keys\] \(got n_pairs=20, n_keys=16\)"),
        ({"n_pairs": 2.0}, r"n_pairs must be in \[1, n_keys\] \(got n_pairs=2.0, n_keys=16\)"),
        ({"n_keys": True}, r"n_keys must be an int >= 1 \(got n_keys=True\)"),
    ],
)
def test_bad_arguments_raise(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AssociativeRecall(**kwargs)


def test_arguments_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        AssociativeRecall(16, 16, 8)  # type: ignore[misc]


@settings(max_examples=30, deadline=None)
@given(
    n_keys=st.integers(1, 12),
    n_values=st.integers(1, 6),
    data=st.data(),
    seed=st.integers(0, 2**31),
)
def test_any_valid_arguments_give_valid_sequences(n_keys, n_values, data, seed) -> None:
    n_pairs = data.draw(st.integers(1, n_keys))
    task = AssociativeRecall(n_keys=n_keys, n_values=n_values, n_pairs=n_pairs)
    batch = task.batch("val", 3, gen(seed))
    x, y = batch["x"], batch["y"]
    keys = x[:, 0:-1:2]
    assert x.shape == (3, 2 * n_pairs + 1)
    assert (keys.sort(dim=1).values.diff(dim=1) > 0).all()
    assert ((y >= n_keys) & (y < n_keys + n_values)).all()
    hit = keys == x[:, -1:]
    assert (hit.sum(dim=1) == 1).all()
    torch.testing.assert_close(x[:, 1:-1:2][hit], y)
