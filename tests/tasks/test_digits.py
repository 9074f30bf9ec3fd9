"""Digits: patches reassemble the images, the split is a fixed partition, full batches are whole."""

from __future__ import annotations

import pytest
import torch
from sklearn.datasets import load_digits

from dynascope.tasks import Digits
from dynascope.tasks.digits import N_DIGITS, patchify


def test_patchify_round_trips_by_hand():
    images = torch.arange(2 * 8 * 8, dtype=torch.float64).reshape(2, 8, 8)
    patches = patchify(images, 4)  # [2, 4, 16]
    assert patches.shape == (2, 4, 16)
    # patch 1 is the top-right 4x4 block, flattened row-major
    torch.testing.assert_close(patches[0, 1], images[0, :4, 4:].reshape(16), rtol=0, atol=0)
    torch.testing.assert_close(patches[1, 2], images[1, 4:, :4].reshape(16), rtol=0, atol=0)
    torch.testing.assert_close(patchify(images, 8)[:, 0], images.reshape(2, 64), rtol=0, atol=0)


@pytest.mark.parametrize("patch_size", [1, 2, 4, 8])
def test_split_is_a_fixed_partition_of_all_images(patch_size):
    task = Digits(patch_size=patch_size, n_train=200)
    assert (task.n_ctx, task.d_in) == ((8 // patch_size) ** 2, patch_size**2)
    full = {s: task.batch(s, 10_000, torch.Generator()) for s in ("train", "val")}
    assert full["train"]["x"].shape == (200, task.n_ctx, task.d_in)
    assert full["val"]["x"].shape == (N_DIGITS - 200, task.n_ctx, task.d_in)
    # every image appears once, pixels / 16 as in sklearn
    data = load_digits()
    pooled = torch.cat([full["train"]["x"], full["val"]["x"]]).reshape(N_DIGITS, -1)
    expected = patchify(torch.tensor(data.images) / 16.0, patch_size).reshape(N_DIGITS, -1)
    rows = sorted(map(tuple, pooled.double().tolist()))
    assert rows == sorted(map(tuple, expected.float().double().tolist()))
    labels = torch.cat([full["train"]["y"], full["val"]["y"]])
    assert torch.bincount(labels).tolist() == torch.bincount(torch.tensor(data.target)).tolist()
    # the same seed gives the same split; full batches ignore the generator
    again = Digits(patch_size=patch_size, n_train=200).batch("train", 500, torch.Generator())
    assert torch.equal(again["y"], full["train"]["y"])


def test_minibatches_draw_without_replacement():
    task = Digits(n_train=50)
    batch = task.batch("train", 40, torch.Generator().manual_seed(3))
    flat = batch["x"].reshape(40, -1)
    assert len({tuple(r) for r in flat.tolist()}) == 40


def test_loss_and_accuracy_by_hand():
    task = Digits(n_train=20)
    batch = task.batch("train", 20, torch.Generator())
    perfect = torch.nn.functional.one_hot(batch["y"], 10).double() * 50.0
    assert task.metrics(perfect, batch)["accuracy"] == 1.0
    uniform = torch.zeros(20, 10)
    torch.testing.assert_close(task.loss(uniform, batch), torch.log(torch.tensor(10.0)))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"patch_size": 3}, r"patch_size must be one of 1, 2, 4, 8 \(got 3\)"),
        ({"n_train": 0}, r"n_train must lie in \[1, 1796\] \(got 0\)"),
        ({"n_train": 1797}, r"n_train must lie in \[1, 1796\] \(got 1797\)"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Digits(**kwargs)
