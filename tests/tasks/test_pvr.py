"""PVR labels by brute force (plain Python per example); the holdout never reaches training."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dynascope.tasks.pvr import HopPVR, VectorPVR, aggregate


def _brute(window: list[int], agg: str) -> int:
    if agg == "sum":
        return sum(window) % 10
    if agg == "min":
        return min(window)
    if agg == "max":
        return max(window)
    if agg == "median":
        return sorted(window)[(len(window) - 1) // 2]
    counts = Counter(window)
    top = max(counts.values())
    return min(v for v, c in counts.items() if c == top)


@pytest.mark.parametrize("agg", ["sum", "min", "max", "median", "mode"])
@pytest.mark.parametrize("m", [0, 1, 3, 9])
def test_vector_pvr_labels_match_brute_force(agg, m):
    task = VectorPVR(complexity=m, agg=agg)
    batch = task.batch("val", 200, torch.Generator().manual_seed(m))
    for x, y in zip(batch["x"].tolist(), batch["y"].tolist()):
        p, digits = x[0], x[1:]
        assert 0 <= p <= 9 - m  # the window never wraps
        assert y == _brute(digits[p : p + m + 1], agg)


@given(st.lists(st.integers(0, 9), min_size=1, max_size=10), st.sampled_from(["median", "mode"]))
@settings(max_examples=60, deadline=None)
def test_aggregate_edge_cases_match_brute_force(window, agg):
    """Even windows (lower median) and mode ties (smallest value) included."""
    assert int(aggregate(torch.tensor([window]), agg)[0]) == _brute(window, agg)


@pytest.mark.parametrize(("m", "k"), [(1, 1), (2, 3), (9, 50)])
def test_holdout_permutations_never_appear_in_training_windows(m, k):
    task = VectorPVR(complexity=m, agg="sum", holdout=k)
    held = {tuple(p) for p in itertools.islice(itertools.permutations(range(m + 1)), k)}
    assert {tuple(r) for r in task.held_out.tolist()} == held
    batch = task.batch("train", 4000, torch.Generator().manual_seed(0))
    for x, y in zip(batch["x"].tolist(), batch["y"].tolist()):
        window = tuple(x[1 + x[0] : 2 + x[0] + m])
        assert window not in held
        assert y == _brute(list(window), "sum")
    adv = task.adversarial_batch(300, torch.Generator().manual_seed(1))
    windows = {tuple(x[1 + x[0] : 2 + x[0] + m]) for x in adv["x"].tolist()}
    assert windows <= held and len(windows) == min(k, 300) or m == 9


def test_holdout_actually_triggers_for_a_small_window():
    """m = 1, k = 1: the window (0, 1) has probability 1/100 per example, so 4000 draws meet it
    about 40 times; the shift must have removed each."""
    plain = VectorPVR(complexity=1).batch("train", 4000, torch.Generator().manual_seed(0))
    hits = sum(tuple(x[1 + x[0] : 3 + x[0]]) == (0, 1) for x in plain["x"].tolist())
    assert hits > 10


@pytest.mark.parametrize("h", [1, 2, 3, 5])
def test_hop_pvr_labels_match_pointer_chasing(h):
    task = HopPVR(length=6, train_hops=(1, 2), max_hops=5)
    batch = task.batch_for_hops(h, 100, torch.Generator().manual_seed(h))
    for x, y in zip(batch["x"].tolist(), batch["y"].tolist()):
        assert x[0] == 6 + h - 1  # the HOP_h token
        pointer, digits = x[1], x[2:]
        for _ in range(h):
            pointer = digits[pointer]
        assert y == pointer
    mixed = task.batch("train", 200, torch.Generator().manual_seed(0))
    assert set(mixed["hops"].tolist()) == {1, 2}
    assert mixed["x"].shape == (200, task.n_ctx) and int(mixed["x"].max()) < task.d_vocab


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="complexity must be in 0..9"):
        VectorPVR(complexity=10)
    with pytest.raises(ValueError, match="agg must be one of"):
        VectorPVR(agg="mean")
    with pytest.raises(ValueError, match="holdout must be in 0..1"):
        VectorPVR(complexity=1, holdout=2)
    with pytest.raises(ValueError, match="holdout must be > 0"):
        VectorPVR().adversarial_batch(4, torch.Generator())
    with pytest.raises(ValueError, match="train_hops must be non-empty"):
        HopPVR(train_hops=(0,))
    with pytest.raises(ValueError, match="hops must be in 1..5"):
        HopPVR().batch_for_hops(6, 4, torch.Generator())
    with pytest.raises(ValueError, match="length must be in 2..10"):
        HopPVR(length=11)
