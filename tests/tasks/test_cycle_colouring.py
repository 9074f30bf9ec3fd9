"""CycleColouring: loss = brute-force expected conflicts; masks are the cycle's neighbours."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from dynascope.tasks.cycle_colouring import CycleColouring, all_cycles, conflicts


@pytest.mark.parametrize("n", [3, 4, 5])
def test_loss_equals_brute_force_expected_conflicts(n):
    # Oracle: enumerate all 3^n colourings, weight each by prod_u P(C(u)=c_u), count conflicts.
    task = CycleColouring(n_vertices=n)
    g = torch.Generator().manual_seed(n)
    batch = task.batch(2, g)
    logits = torch.randn(2, 3, n, 3, generator=g, dtype=torch.float64)  # [batch, m, n, C]
    loss = task.per_seed_loss(logits, batch)
    p = logits.softmax(-1)
    expected = torch.zeros(2, 3, dtype=torch.float64)
    for b in range(2):
        edges = batch["edges"][b].tolist()
        for j in range(3):
            for colours in itertools.product(range(3), repeat=n):
                prob = math.prod(float(p[b, j, u, c]) for u, c in enumerate(colours))
                bad = sum(colours[u] == colours[v] for u, v in edges)
                expected[b, j] += prob * bad
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)


def test_mask_and_edges_follow_the_order():
    task = CycleColouring(n_vertices=5, self_loops=False)
    batch = task.from_orders(torch.tensor([[2, 0, 4, 1, 3]]))
    assert batch["edges"][0].tolist() == [[2, 0], [0, 4], [4, 1], [1, 3], [3, 2]]
    mask = batch["attn_mask"][0]
    assert mask.sum(dim=1).tolist() == [2] * 5  # two neighbours each, no self
    assert mask[0].nonzero().flatten().tolist() == [2, 4]
    torch.testing.assert_close(mask, mask.T)


def test_success_needs_a_proper_colouring():
    task = CycleColouring(n_vertices=4)
    batch = task.from_orders(torch.tensor([[0, 1, 2, 3]]))
    good = torch.nn.functional.one_hot(torch.tensor([0, 1, 0, 1]), 3).float() * 10
    bad = torch.nn.functional.one_hot(torch.tensor([0, 0, 1, 2]), 3).float() * 10
    out = torch.stack([good, bad])[None]  # [1, 2, 4, 3]
    assert task.correct(out, batch).tolist() == [[True, False]]
    assert conflicts(torch.tensor([0, 0, 1, 2]), batch["edges"][0]).item() == 1


@pytest.mark.parametrize(("n", "count"), [(3, 1), (4, 3), (5, 12), (6, 60), (8, 2520)])
def test_all_cycles_counts_each_cycle_once(n, count):
    cycles = all_cycles(n)
    assert cycles.shape == (count, n)  # (n-1)!/2
    edge_sets = {frozenset(frozenset(e) for e in zip(c, c[1:] + c[:1])) for c in cycles.tolist()}
    assert len(edge_sets) == count


def test_bad_input():
    with pytest.raises(ValueError, match="n_vertices must be an int >= 3"):
        CycleColouring(n_vertices=2)
    with pytest.raises(ValueError, match="n must be an int in"):
        all_cycles(12)
