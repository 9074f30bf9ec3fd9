"""FuzzyLogic: split counts, disjoint and exhaustive splits, Zadeh targets, determinism."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from dynascope.tasks.fuzzy_logic import FuzzyLogic, fuzzy_logic_r2, zadeh


def _as_set(combos: torch.Tensor) -> set[tuple[int, ...]]:
    return {tuple(c) for c in combos.tolist()}


def test_l4_k2_counts_match_systems_md():
    task = FuzzyLogic(4, 2, 32, frac_ood_conj=0.25, frac_test=0.7)
    counts = task.counts()
    assert counts == {"test": 46, "train": 20, "ood": 6, "ind": 66, "terms": 16, "ood_terms": 4}


@pytest.mark.parametrize("L,K", [(3, 2), (4, 2), (5, 3)])
def test_splits_are_disjoint_and_exhaustive(L, K):
    task = FuzzyLogic(L, K, 8)
    train, test, ood = (_as_set(task.combos[s]) for s in ("train", "test", "ood"))
    assert not (train & test) and not (train & ood) and not (test & ood)
    n_seen = 2**L - task.n_ood_terms
    assert train | test == set(itertools.combinations(range(n_seen), K))
    assert ood == set(itertools.combinations(range(n_seen, 2**L), K))
    assert len(train) + len(test) == math.comb(n_seen, K)
    seen_terms = {t for c in train | test for t in c}
    assert seen_terms.isdisjoint({t for c in ood for t in c})  # ood uses only reserved terms


def test_zadeh_hand_case_and_tokens():
    # terms: x0 AND NOT x1 (1, 0); NOT x0 AND NOT x1 (0, 0)
    terms = torch.tensor([[[1, 0], [0, 0]]])
    x = torch.tensor([[[0.9, 0.2], [0.3, 0.4]]])
    # point 1: min(0.9, 0.8) = 0.8, min(0.1, 0.8) = 0.1 -> 0.8; point 2: min(.3,.6)=.3, min(.7,.6)=.6
    torch.testing.assert_close(zadeh(terms, x), torch.tensor([[0.8, 0.6]]))
    task = FuzzyLogic(3, 2, 6)
    b = task.sample("test", 5, torch.Generator().manual_seed(0))
    assert b["x"].shape == (5, 6, 4) and b["y"].shape == (5,)
    assert (b["x"][:, -1, -1] == 0).all()
    full = zadeh(task.terms[b["terms"]], b["x"][..., :-1])
    torch.testing.assert_close(full[:, -1], b["y"])
    torch.testing.assert_close(full[:, :-1], b["x"][:, :-1, -1])
    torch.testing.assert_close(b["base_mse"], full.var(dim=1, unbiased=False))
    assert (b["latent"].sum(1) == 2).all()
    assert _as_set(b["terms"]) <= _as_set(task.combos["test"])


def test_deterministic_from_generator():
    task = FuzzyLogic(4, 2, 8)
    a = task.sample("train", 4, torch.Generator().manual_seed(7))
    b = task.sample("train", 4, torch.Generator().manual_seed(7))
    c = task.sample("train", 4, torch.Generator().manual_seed(8))
    for key in a:
        torch.testing.assert_close(a[key], b[key])
    assert not torch.equal(a["x"], c["x"])
    same_split = FuzzyLogic(4, 2, 8, split_seed=0).combos["test"]
    torch.testing.assert_close(task.combos["test"], same_split)


def test_r2_and_bad_input():
    y = torch.tensor([1.0, 2.0])
    torch.testing.assert_close(fuzzy_logic_r2(y, y, torch.ones(2)), torch.ones(2))
    torch.testing.assert_close(
        fuzzy_logic_r2(y + 1, y, torch.full((2,), 4.0)), torch.full((2,), 0.75)
    )
    with pytest.raises(ValueError, match="split must be one of"):
        FuzzyLogic(3, 2, 4).sample("val", 2, torch.Generator())
    with pytest.raises(ValueError, match="n_terms=3: the ood split is empty"):
        FuzzyLogic(3, 3, 4, frac_ood_conj=0.25)
    with pytest.raises(ValueError, match="frac_test must be in"):
        FuzzyLogic(3, 2, 4, frac_test=1.0)
