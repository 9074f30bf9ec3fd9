"""HyperTeacher (S3): supports, Alg. 1 latents, teacher formula, OOD disjointness, determinism."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from dynascope.tasks.hyper_teacher import SUPPORTS, HyperTeacher, latents_from_masks, masks_of


def _edges(support: str) -> set[frozenset[int]]:
    return {frozenset(i for i, c in enumerate(m) if c == "1") for m in SUPPORTS[support]}


def _components(edges: set[frozenset[int]], n: int = 6) -> int:
    parent = list(range(n))

    def find(i):
        while parent[i] != i:
            i = parent[i]
        return i

    for e in edges:
        a, b = tuple(e)
        parent[find(a)] = find(b)
    return len({find(i) for i in range(n)})


def test_supports_are_as_table_1():
    ring = {frozenset({i, (i + 1) % 6}) for i in range(6)}
    dist2 = {frozenset({i, (i + 2) % 6}) for i in range(6)}
    assert _edges("connected") == ring
    assert _edges("connected+") == ring | dist2
    assert _edges("disconnected") == {
        frozenset(p) for p in [(0, 1), (1, 2), (0, 2), (3, 4), (4, 5), (3, 5)]
    }
    assert _edges("ood") == {frozenset({i, i + 3}) for i in range(3)}
    assert _components(_edges("connected")) == 1 and _components(_edges("connected+")) == 1
    assert _components(_edges("disconnected")) == 2
    for name in ("connected", "disconnected", "connected+"):
        assert not (_edges(name) & _edges("ood"))  # OOD pairs unseen under all three
        assert (masks_of(name).sum(1) == 2).all()
    assert len(SUPPORTS["connected"]) == len(SUPPORTS["disconnected"]) == 6


def test_latents_follow_algorithm_1():
    masks = masks_of("connected+").repeat(50, 1)
    z = latents_from_masks(masks, torch.Generator().manual_seed(0))
    assert (z[masks == 0] == 0).all()
    on = z[masks == 1]
    assert (on >= 0.5).all() and (on <= 1.0).all()
    torch.testing.assert_close(z.sum(1), torch.full((len(z),), 0.5 + 0.5 * 2))  # 0.5(1 + |m|)
    with pytest.raises(ValueError, match="at least one active module"):
        latents_from_masks(torch.zeros(1, 6), torch.Generator())


def test_targets_match_the_teacher_formula_and_splits_use_their_masks():
    t = HyperTeacher(n_context=5)
    b = t.sample("ood", 7, torch.Generator().manual_seed(1))
    assert b["context"].shape == (7, 5, 17) and b["x_query"].shape == (7, 16)
    support = (b["z"] > 0).float()
    ood = masks_of("ood")
    assert all(any(torch.equal(s, m) for m in ood) for s in support)
    x = torch.cat([b["context"][:, :, :16], b["x_query"][:, None]], 1)
    assert x.abs().max() <= math.sqrt(3)
    for i in range(7):  # naive per-sequence oracle
        W = sum(b["z"][i, m] * t.theta[m] for m in range(6))
        W = W / torch.linalg.svdvals(W)[0]
        y = F.gelu(x[i] @ W.T) @ t.a
        torch.testing.assert_close(y[:-1], b["context"][i, :, -1])
        torch.testing.assert_close(y[-1], b["y_query"][i])
    assert t.theta.abs().max() <= 2 / math.sqrt(6)  # truncated at 2 std
    unstructured = t.sample("unstructured", 4, torch.Generator().manual_seed(2))
    assert ((unstructured["z"] > 0).sum(1) == 2).all() and (unstructured["mask_index"] == -1).all()


def test_deterministic_and_bad_input():
    t = HyperTeacher(n_context=4, teacher_seed=3)
    a = t.sample("train", 3, torch.Generator().manual_seed(5))
    b = HyperTeacher(n_context=4, teacher_seed=3).sample(
        "train", 3, torch.Generator().manual_seed(5)
    )
    for key in a:
        torch.testing.assert_close(a[key], b[key])
    with pytest.raises(ValueError, match="support must be one of"):
        HyperTeacher(support="ring")
    with pytest.raises(ValueError, match="split must be one of"):
        t.sample("test", 2, torch.Generator())
    with pytest.raises(ValueError, match="not n_modules=4"):
        HyperTeacher(n_modules=4)
