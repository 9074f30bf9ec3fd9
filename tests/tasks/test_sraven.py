"""sRAVEN: counts, rules satisfied by answers, permutations column-consistent, ambiguity oracle."""

from __future__ import annotations

import itertools

import pytest
import torch

from dynascope.tasks.sraven import RULES, SymbolicRaven


def _row_ok(rule: str, rows: list[list[int]], n: int) -> bool:
    """Plain-Python rule check on all three full rows (independent of the detectors)."""
    if rule == "constant":
        return all(r[0] == r[1] == r[2] for r in rows)
    if rule.startswith("progression"):
        d = int(rule.removeprefix("progression"))
        return all((r[1] - r[0]) % n == d % n and (r[2] - r[1]) % n == d % n for r in rows)
    if rule == "addition":
        return all((r[0] + r[1]) % n == r[2] for r in rows)
    if rule == "subtraction":
        return all((r[0] - r[1]) % n == r[2] for r in rows)
    sets = [sorted(r) for r in rows]
    return len(set(rows[0])) == 3 and all(s == sets[0] for s in sets)


def test_counts_match_systems_md():
    task = SymbolicRaven(4, 8, frac_ood=0.25)
    assert task.counts() == {"all": 330, "ood": 82, "train": 248}
    assert set(task.split_index["ood"].tolist()).isdisjoint(task.split_index["train"].tolist())
    assert (
        len(set(task.split_index["ood"].tolist()) | set(task.split_index["train"].tolist())) == 330
    )


def test_answers_satisfy_their_rules_and_permutations_are_column_consistent():
    task = SymbolicRaven(4, 8)
    b = task.sample("ood", 64, torch.Generator().manual_seed(0))
    ood = {tuple(sorted(task.tasks[i].tolist())) for i in task.split_index["ood"]}
    for i in range(64):
        assert tuple(sorted(b["rules"][i].tolist())) in ood
        grid = b["panels"][i].reshape(3, 3, 4)
        perm = b["perms"][i]
        for slot in range(4):  # undo the column permutation: slot s sits at position inv[c][s]
            rows = [
                [int(grid[r, c, (perm[c] == slot).nonzero()[0, 0]]) for c in range(3)]
                for r in range(3)
            ]
            assert _row_ok(RULES[int(b["rules"][i, slot])], rows, 8)
    assert b["x"].shape == (64, 36, 8)
    assert (b["x"][:, 32:] == 0).all() and (b["x"][:, :32].sum(-1) == 1).all()
    torch.testing.assert_close(b["x"][:, :32].argmax(-1), b["panels"][:, :8].reshape(64, 32))
    torch.testing.assert_close(b["y"], b["panels"][:, 8])


def _oracle_ambiguous(panels: torch.Tensor, n: int, mode: str) -> bool:
    k = panels.shape[1]
    grid = panels.reshape(3, 3, k).tolist()
    for perms in itertools.product(itertools.permutations(range(k)), repeat=3):
        sets = []
        for f in range(k):
            seq = [[grid[r][c][perms[c][f]] for c in range(3)] for r in range(3)]
            shown = seq[2][2]
            valid = set()
            for v in range(n):
                seq[2][2] = v
                if any(_row_ok(rule, seq, n) for rule in RULES):
                    valid.add(v)
            sets.append((valid, shown))
        if mode == "reference" and all(v - {s} for v, s in sets):
            return True
        if mode == "any_feature" and all(v for v, _ in sets) and any(v - {s} for v, s in sets):
            return True
    return False


@pytest.mark.parametrize("mode", ["reference", "any_feature"])
def test_ambiguity_flags_match_a_brute_force_oracle(mode):
    task = SymbolicRaven(2, 4, frac_ood=0.25)  # small F makes ambiguity common
    b = task.sample("train", 60, torch.Generator().manual_seed(1))
    flags = task.check_is_ambiguous(b["panels"], mode)
    expected = torch.tensor([_oracle_ambiguous(p, 4, mode) for p in b["panels"]])
    assert 0 < int(expected.sum()) < 60  # both kinds present
    torch.testing.assert_close(flags, expected)


def test_deterministic_unpermuted_and_bad_input():
    task = SymbolicRaven(3, 8)
    a = task.sample("train", 5, torch.Generator().manual_seed(3))
    b = task.sample("train", 5, torch.Generator().manual_seed(3))
    for key in a:
        torch.testing.assert_close(a[key], b[key])
    u = task.sample("train_unpermuted", 5, torch.Generator().manual_seed(3))
    assert (u["perms"] == torch.arange(3)).all()
    with pytest.raises(ValueError, match="split must be one of"):
        task.sample("test", 2, torch.Generator())
    with pytest.raises(ValueError, match="n_values must be >= 3"):
        SymbolicRaven(2, 2)
    with pytest.raises(ValueError, match="panels must be"):
        task.check_is_ambiguous(torch.zeros(2, 8, 3, dtype=torch.long))
