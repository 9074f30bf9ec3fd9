"""Modular arithmetic: exact equation counts, every equation true, a deterministic exact split."""

from __future__ import annotations

import math

import pytest
import torch

from dynascope.tasks.modular_arithmetic import ModularArithmetic, equations


@pytest.mark.parametrize(("op", "count"), [("+", 97 * 97), ("-", 97 * 97), ("*", 97 * 97),
                                           ("/", 97 * 96)])  # fmt: skip
def test_equation_counts_and_truth(op, count):
    table = equations(97, op)
    assert table.shape == (count, 3)
    a, b, c = table.T
    if op == "/":
        assert (b != 0).all() and ((b * c) % 97 == a).all()
        assert len({(int(x), int(y)) for x, y in zip(b, c)}) == count  # each (b, c) once
    else:
        expected = {"+": a + b, "-": a - b, "*": a * b}[op] % 97
        assert (c == expected).all()
        assert len({(int(x), int(y)) for x, y in zip(a, b)}) == count


@pytest.mark.parametrize("op", ["+", "/"])
def test_split_is_exact_disjoint_and_deterministic(op):
    task = ModularArithmetic(p=97, op=op, train_fraction=0.3, split_seed=0)
    n = 97 * 97 if op == "+" else 97 * 96
    n_train = round(n * 0.3)
    assert (task.split_size("train"), task.split_size("val")) == (n_train, n - n_train)
    train = task.batch("train", 10**6, torch.Generator())
    val = task.batch("val", 10**6, torch.Generator())
    rows = {tuple(r) for r in torch.cat([train["x"], val["x"]]).tolist()}
    assert len(rows) == n  # every equation in exactly one split
    assert train["x"][:, 1].eq(97).all() and train["x"][:, 3].eq(98).all()
    again = ModularArithmetic(p=97, op=op, train_fraction=0.3, split_seed=0)
    assert torch.equal(again.batch("train", 10**6, torch.Generator())["x"], train["x"])
    other = ModularArithmetic(p=97, op=op, train_fraction=0.3, split_seed=1)
    assert not torch.equal(other.batch("train", 10**6, torch.Generator())["x"], train["x"])


def test_loss_reads_only_the_answer_position():
    task = ModularArithmetic(p=5, op="+", train_fraction=0.5)
    batch = task.batch("train", 4, torch.Generator().manual_seed(0))
    output = torch.zeros(4, 4, 5)
    output[:, :3] = torch.randn(4, 3, 5)  # anything before '=' is ignored
    torch.testing.assert_close(task.loss(output, batch), torch.tensor(math.log(5)))
    output[torch.arange(4), -1, batch["y"]] = 30.0
    assert task.metrics(output, batch)["accuracy"] == 1.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"op": "^"}, r"op must be one of \+, -, \*, / \(got '\^'\)"),
        ({"p": 1}, r"p must be >= 2 \(got 1\)"),
        ({"p": 12, "op": "/"}, r"division needs a prime modulus \(got p=12\)"),
        ({"p": 5, "train_fraction": 0.01}, r"train_fraction must leave both splits non-empty"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ModularArithmetic(**kwargs)
