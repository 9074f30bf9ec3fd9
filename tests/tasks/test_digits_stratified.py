"""Digits with ``stratify=True`` (S7's split): class proportions kept, a fixed partition."""

from __future__ import annotations

import pytest
import torch
from sklearn.datasets import load_digits

from dynascope.tasks import Digits
from dynascope.tasks.digits import N_DIGITS


def test_stratified_split_keeps_class_proportions_and_partitions_the_images():
    task = Digits(patch_size=8, n_train=1297, stratify=True)
    train = task.batch("train", 10_000, torch.Generator())
    val = task.batch("val", 10_000, torch.Generator())
    assert (len(train["y"]), len(val["y"])) == (1297, 500)
    counts = torch.bincount(torch.tensor(load_digits().target), minlength=10).double()
    expected = counts * 500 / N_DIGITS  # each class's share of the 500 validation images
    assert (torch.bincount(val["y"], minlength=10) - expected).abs().max() <= 1
    pooled = torch.cat([train["x"], val["x"]]).reshape(N_DIGITS, 64)
    assert len({tuple(r) for r in pooled.tolist()}) == len(
        {tuple(r) for r in (torch.tensor(load_digits().data) / 16).float().tolist()}
    )
    again = Digits(patch_size=8, n_train=1297, stratify=True).batch(
        "val", 10_000, torch.Generator()
    )
    assert torch.equal(again["y"], val["y"])
    other = Digits(patch_size=8, n_train=1297, stratify=True, split_seed=1)
    assert not torch.equal(other.batch("val", 10_000, torch.Generator())["y"], val["y"])


def test_stratified_split_needs_ten_images_on_each_side():
    with pytest.raises(ValueError, match=r"n_train must lie in \[10, 1787\] with stratify=True"):
        Digits(n_train=5, stratify=True)
