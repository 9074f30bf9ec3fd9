"""Visual PVR on digit tiles: each tile is found among the split's images (pixel-exact), labels
recomputed in plain Python from the found classes, and no validation tile comes from training."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from dynascope.tasks.digits_pvr import DigitsPVR


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
    return min(v for v, c in counts.items() if c == max(counts.values()))


def _tiles(x: torch.Tensor, grid: int, patch_size: int) -> torch.Tensor:
    """Undo the patching: ``[batch, n_ctx, p²]`` -> ``[batch, g², 8, 8]`` row-major tiles."""
    side, n = 8 * grid, 8 * grid // patch_size
    image = x.reshape(-1, n, n, patch_size, patch_size).permute(0, 1, 3, 2, 4)
    image = image.reshape(-1, side, side)
    tiles = image.reshape(-1, grid, 8, grid, 8).permute(0, 1, 3, 2, 4)
    return tiles.reshape(-1, grid * grid, 8, 8)


@pytest.mark.parametrize(
    ("grid", "m", "agg", "patch_size"),
    [(2, 0, "sum", 4), (3, 2, "sum", 2), (3, 3, "median", 8), (3, 7, "mode", 4), (2, 2, "min", 1)],
)
def test_labels_and_tiles_match_the_split_images(grid, m, agg, patch_size):
    task = DigitsPVR(grid=grid, complexity=m, agg=agg, patch_size=patch_size, n_train=1000)
    assert task.n_ctx == (8 * grid // patch_size) ** 2 and task.d_in == patch_size**2
    for split in ("train", "val"):
        batch = task.batch(split, 40, torch.Generator().manual_seed(grid + m))
        assert batch["x"].shape == (40, task.n_ctx, task.d_in)
        images, labels = task.images(split)
        flat = images.flatten(1)
        for tiles, y, p in zip(_tiles(batch["x"], grid, patch_size), batch["y"], batch["p"]):
            found = []
            for tile in tiles:
                match = (flat == tile.flatten()).all(1).nonzero()[:, 0]
                assert len(match) >= 1  # every tile is an image of this split
                assert len(set(labels[match].tolist())) == 1
                found.append(int(labels[match[0]]))
            assert 1 <= found[0] == int(p) <= grid * grid - 1 - m  # pointer tile's class
            assert int(y) == _brute(found[found[0] : found[0] + m + 1], agg)


def test_no_validation_tile_is_a_training_image():
    task = DigitsPVR(grid=2, complexity=1, patch_size=8, n_train=1000)
    train = task.images("train")[0].flatten(1)
    batch = task.batch("val", 64, torch.Generator().manual_seed(0))
    tiles = _tiles(batch["x"], 2, 8).flatten(2)  # [batch, 4, 64]
    same = (tiles[:, :, None, :] == train[None, None]).all(-1)  # [batch, 4, n_train]
    assert not same.any()


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="grid must be 2 or 3"):
        DigitsPVR(grid=4)
    with pytest.raises(ValueError, match=r"complexity must be in 0\.\.2"):
        DigitsPVR(grid=2, complexity=3)
    with pytest.raises(ValueError, match="agg must be one of"):
        DigitsPVR(agg="mean")
    with pytest.raises(ValueError, match="patch_size must be one of 1, 2, 4, 8"):
        DigitsPVR(patch_size=3)
    with pytest.raises(ValueError, match="split must be one of"):
        DigitsPVR(grid=2).batch("test", 4, torch.Generator())
