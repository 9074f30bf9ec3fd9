"""S5 modular teacher: named task sets have the stated supports (Blessed connected, Doomed not),
eval keys cover all C(M, h) masks with continuous codes, and every draw is deterministic."""

from __future__ import annotations

import math

import pytest
import torch

from dynascope.tasks.modular_teacher import (
    BLESSED,
    DOOMED,
    TASK_SETS,
    FewShotHyperteacher,
    ModularTeacher,
    continuous_codes,
    eval_keys,
    hyperteacher_split,
    k_hot_masks,
    masks_of,
    parse_task_set,
    support_structure,
)


def _discrete(name: str) -> torch.Tensor:
    m = masks_of(name)
    return m / m.norm(dim=-1, keepdim=True)


# Hand-derived components of each named set's module graph (spanning families only).
EXPECTED_COMPONENTS = {
    "one_hots": [(0,), (1,), (2,), (3,), (4,), (5,)],
    "ring": [(0,), (1,), (2,), (3,), (4,), (5,)],  # each pair is one ray: spans nothing
    "one_hots+two_triangles": [(0, 1, 2), (3, 4, 5)],
    "two_triples": [(0,), (1,), (2,), (3,), (4,), (5,)],
    "triple_ring": [(0,), (1,), (2,), (3,), (4,), (5,)],
    "all": [(0,), (1,), (2,), (3,), (4,), (5,)],
    "one_hots+ring": [(0, 1, 2, 3, 4, 5)],
    "one_hots+triples": [(0, 1, 2, 3, 4, 5)],
    "one_hots+triple_mix": [(0, 1, 2, 3, 4, 5)],
    "one_hots+all": [(0, 1, 2, 3, 4, 5)],
}


@pytest.mark.parametrize("name", sorted(TASK_SETS))
def test_named_task_sets_have_the_stated_support(name):
    structure = support_structure(_discrete(name))
    assert structure.components == EXPECTED_COMPONENTS[name]
    assert structure.connected == (name in BLESSED)
    assert (name in DOOMED) != (name in BLESSED)


def test_task_set_lists_match_s05():
    assert set(BLESSED) | set(DOOMED) == set(TASK_SETS)
    assert parse_task_set(TASK_SETS["one_hots+two_triangles"])[6:] == [
        (0, 1), (1, 2), (0, 2), (3, 4), (4, 5), (3, 5)
    ]  # fmt: skip
    assert len(parse_task_set(TASK_SETS["one_hots+triple_mix"])) == 12


def test_continuous_ring_of_pairs_is_connected_but_its_discrete_version_is_not():
    # A family spans its mask's subspace once it has enough distinct codes.
    masks = masks_of("ring").repeat(3, 1)
    codes = continuous_codes(masks, torch.Generator().manual_seed(0))
    assert support_structure(codes).connected
    assert not support_structure(_discrete("ring")).connected


def test_repeated_indices_collapse_to_a_one_hot():
    torch.testing.assert_close(
        masks_of("0,0;1,2"), torch.tensor([[1.0, 0, 0, 0, 0, 0], [0, 1, 1, 0, 0, 0]])
    )


@pytest.mark.parametrize("h", range(1, 7))
def test_k_hot_masks_enumerate_every_combination(h):
    masks = k_hot_masks(h, 6)
    assert masks.shape == (math.comb(6, h), 6)
    assert (masks.sum(-1) == h).all()
    assert len({tuple(m.tolist()) for m in masks}) == math.comb(6, h)


def test_eval_codes_are_continuous_on_their_masks():
    teacher = ModularTeacher()
    assert teacher.keys == ["train", *eval_keys(6)] and eval_keys(6)[1] == "eval_0.333"
    g = torch.Generator().manual_seed(0)
    for h, key in enumerate(eval_keys(6), start=1):
        z = teacher.sample_codes(key, 200, g)
        on = z > 0
        assert (on.sum(-1) == h).all()
        assert ((z[on] > 0.5) & (z[on] < 1.0)).all()
    seen = {tuple((z > 0).int().tolist()) for z in teacher.sample_codes("eval_0.500", 400, g)}
    assert len(seen) == math.comb(6, 3)


def test_train_codes_are_normalised_masks_of_the_set():
    teacher = ModularTeacher("one_hots+ring")
    z = teacher.sample_codes("train", 300, torch.Generator().manual_seed(1))
    torch.testing.assert_close(z.norm(dim=-1), torch.ones(300))
    allowed = {tuple(m.tolist()) for m in _discrete("one_hots+ring")}
    drawn = {tuple(row.tolist()) for row in z}
    assert drawn == allowed  # 300 draws of 12 codes cover all of them


def test_draws_and_teacher_are_deterministic():
    a, b = ModularTeacher(teacher_seed=3), ModularTeacher(teacher_seed=3)
    torch.testing.assert_close(a.network.theta[0], b.network.theta[0], rtol=0, atol=0)
    assert not torch.equal(a.network.theta[0], ModularTeacher(teacher_seed=4).network.theta[0])
    outs = []
    for _ in range(2):
        g = torch.Generator().manual_seed(5)
        z = a.sample_codes("eval_0.667", 7, g)
        x = a.sample_x(7, 11, g)
        outs.append((z, x, a(x, z)))
    for first, second in zip(*outs):
        torch.testing.assert_close(first, second, rtol=0, atol=0)
    x = outs[0][1]
    assert x.shape == (7, 11, 16) and x.abs().max() <= math.sqrt(3)
    assert outs[0][2].shape == (7, 11, 4)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="module index >= n_modules=6"):
        masks_of("0,6")
    with pytest.raises(ValueError, match="is not a list of module indices"):
        masks_of("0,a")
    with pytest.raises(ValueError, match="key must be one of"):
        ModularTeacher().sample_codes("ood", 3, torch.Generator())
    with pytest.raises(ValueError, match=r"h must be in \[1, n_modules=6\]"):
        k_hot_masks(0, 6)
    with pytest.raises(ValueError, match="codes must be a finite"):
        support_structure(torch.tensor([[float("nan"), 1.0]]))


# -- hyperteacher ------------------------------------------------------------------------------
def _rows(t: torch.Tensor) -> set:
    return {tuple(r.flatten().int().tolist()) for r in t}


@pytest.mark.parametrize(
    ("support", "M", "K", "n_train", "n_ood"),
    [
        ("random", 4, 2, 75, 25),  # (4 + 6)² tasks, 25 % held out
        ("non_compositional", 4, 2, 60, 40),  # 4 of 10 last-layer choices use expert 3
        ("diagonal", 4, 2, 64, 36),  # per layer 4 windows + 4 one-hots
        ("connected", 6, 2, 324, 117),  # per layer 6 + 6 + 6 of 21 choices
        ("disconnected", 6, 2, 36, 117),
    ],
)
def test_hyperteacher_splits_are_disjoint_and_counted(support, M, K, n_train, n_ood):
    train, ood = hyperteacher_split(M, K, 2, support, generator=torch.Generator().manual_seed(0))
    assert (len(train), len(ood)) == (n_train, n_ood)
    assert not _rows(train) & _rows(ood)
    assert len(_rows(train)) == n_train and len(_rows(ood)) == n_ood
    if support in ("random", "non_compositional", "diagonal"):  # exhaustive
        every = len(k_hot_masks(1, M)) + len(k_hot_masks(2, M))
        assert n_train + n_ood == every**2


def test_hyperteacher_disconnected_tasks_stay_in_one_half():
    train, _ = hyperteacher_split(6, 2, 2, "disconnected")
    used = train.amax(1)  # experts used by any layer
    assert ((used[:, :3].sum(-1) == 0) | (used[:, 3:].sum(-1) == 0)).all()
    assert support_structure(used).components == [(0, 1, 2), (3, 4, 5)]
    connected, _ = hyperteacher_split(6, 2, 2, "connected")
    assert support_structure(connected.amax(1)).connected
    held = hyperteacher_split(4, 2, 2, "non_compositional")[1]
    assert (held[:, -1, -1] == 1).all()


def test_hyperteacher_samples_are_deterministic_soft_targets():
    teacher = FewShotHyperteacher(seed=1)
    a = teacher.sample("ood", 3, 5, torch.Generator().manual_seed(2))
    b = FewShotHyperteacher(seed=1).sample("ood", 3, 5, torch.Generator().manual_seed(2))
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)
    assert a["x"].shape == (3, 5, 16) and a["y"].shape == (3, 5, 8)
    torch.testing.assert_close(a["y"].sum(-1), torch.ones(3, 5))
    torch.testing.assert_close(a["hard"], a["y"].argmax(-1))
    assert _rows(a["embedding"]) <= _rows(teacher.ood_tasks)
    # z-scored logits: over the reference inputs each output has mean 0 and std 1
    ref = teacher.logits(a["embedding"], teacher.reference_x.expand(3, -1, -1))
    assert ref.std(1).min() > 0


def test_hyperteacher_bad_arguments():
    with pytest.raises(ValueError, match="needs num_hot=2 and an even n_experts > 4"):
        hyperteacher_split(4, 2, 2, "connected")
    with pytest.raises(ValueError, match="support must be one of"):
        hyperteacher_split(4, 2, 2, "ring")
    with pytest.raises(ValueError, match="n_hidden_layers must be >= 2"):
        FewShotHyperteacher(n_hidden_layers=1)
    with pytest.raises(ValueError, match="split must be 'train' or 'ood'"):
        FewShotHyperteacher().sample("test", 1, 1, torch.Generator())
