"""Visual pointer-value retrieval on a grid of sklearn digit tiles (load_digits, 8×8 each).

Glossary:
    g:          grid side; an image is ``g × g`` tiles, ``8g × 8g`` pixels in [0, 1].
    cell:       tile position ``0 .. g² − 1``, row-major; cell 0 (top left) is the pointer.
    p:          the pointer: the class of the tile in cell 0, drawn uniformly from
                ``1 .. g² − 1 − m`` (a tile of that class is drawn from the split), so the value
                window never runs off the grid (vector PVR's "no wrap").
    m:          complexity: the label aggregates the classes of cells ``p .. p + m``.
    agg:        as :func:`dynascope.tasks.pvr.aggregate` (sum mod 10, min, max, lower median,
                mode with ties to the smallest value).
    patch_size: the image is cut into ``(8g / patch_size)²`` square patches, row-major, each
                flattened to ``d_in = patch_size²`` values (``patch_size = 8``: one per tile).

Tiles come from one split of :class:`dynascope.tasks.Digits` (same ``n_train`` and
``split_seed``): ``train`` batches use only training images, ``val`` only validation images, so
no evaluation tile was seen in training. Value tiles (cells 1 .. g² − 1) are uniform over the
split's images; the pointer tile is uniform over the split's images of class p.

Batches: ``x`` ``[batch, n_ctx, d_in]``, ``y`` ``[batch]`` (0..9), ``p`` ``[batch]`` and
``classes`` ``[batch, g²]`` (each tile's label). Our format; the paper's visual PVR uses MNIST
(S8: "visual PVR ... could use load_digits tiles").

References:
    C. Zhang, M. Raghu, J. Kleinberg, S. Bengio (2021), "Pointer Value Retrieval", arXiv
        2107.12580, Sec. 2 (visual PVR: a grid of digits whose top-left digit is the pointer).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import Task
from .digits import Digits, patchify
from .pvr import AGGREGATIONS, aggregate

__all__ = ["DigitsPVR"]


class DigitsPVR(Task):
    """A ``g × g`` grid of digit tiles; label = agg of the classes in cells ``p .. p + m``.

    Args:
        grid: g, 2 or 3.
        complexity: m in ``0 .. g² − 2``.
        agg: ``sum``, ``min``, ``max``, ``median`` or ``mode``.
        patch_size: 1, 2, 4 or 8.
        n_train, split_seed: the :class:`Digits` split the tiles come from.
    Raises:
        ValueError: for ``grid`` not 2 or 3, ``complexity`` out of range, an unknown ``agg``,
            a ``patch_size`` not in 1, 2, 4, 8, or as :class:`Digits` (``n_train``); also if a
            split lacks a pointer class.
    """

    input_kind = "vectors"
    output_kind = "pooled"
    d_vocab = None

    def __init__(
        self,
        *,
        grid: int = 3,
        complexity: int = 0,
        agg: str = "sum",
        patch_size: int = 4,
        n_train: int = 1437,
        split_seed: int = 0,
    ) -> None:
        if grid not in (2, 3):
            raise ValueError(f"grid must be 2 or 3 (got grid={grid})")
        if not 0 <= complexity <= grid * grid - 2:
            raise ValueError(f"complexity must be in 0..{grid * grid - 2} (got {complexity})")
        if agg not in AGGREGATIONS:
            raise ValueError(f"agg must be one of {AGGREGATIONS} (got agg={agg!r})")
        if patch_size not in (1, 2, 4, 8):
            raise ValueError(f"patch_size must be one of 1, 2, 4, 8 (got {patch_size})")
        self.grid, self.m, self.agg, self.patch_size = grid, complexity, agg, patch_size
        self.n_cells = grid * grid
        self.n_ctx = (8 * grid // patch_size) ** 2
        self.d_in, self.d_out = patch_size * patch_size, 10
        digits = Digits(patch_size=8, n_train=n_train, split_seed=split_seed)
        self._images: dict[str, Tensor] = {}
        self._labels: dict[str, Tensor] = {}
        self._by_class: dict[str, tuple[Tensor, Tensor, Tensor]] = {}
        for split in ("train", "val"):
            whole = digits.batch(split, digits.split_size(split), torch.Generator())
            images, labels = whole["x"].reshape(-1, 8, 8), whole["y"]
            order = torch.argsort(labels, stable=True)
            counts = torch.bincount(labels, minlength=10)
            missing = [c for c in range(1, self.n_cells - complexity) if counts[c] == 0]
            if missing:
                raise ValueError(f"n_train: the {split} split has no image of class {missing}")
            self._images[split], self._labels[split] = images, labels
            self._by_class[split] = (order, counts, torch.cumsum(counts, 0) - counts)

    def images(self, split: str) -> tuple[Tensor, Tensor]:
        """The split's tiles ``[n, 8, 8]`` and their labels ``[n]`` (for oracles)."""
        return self._images[split], self._labels[split]

    def batch(self, split: str, batch_size: int, generator: torch.Generator) -> dict[str, Tensor]:
        """``x`` ``[batch, n_ctx, d_in]``, ``y``, ``p`` ``[batch]``, ``classes`` ``[batch, g²]``.

        Raises:
            ValueError: for an unknown split or a batch size below 1.
        """
        self._check_batch_args(split, batch_size)
        images, labels = self._images[split], self._labels[split]
        order, counts, starts = self._by_class[split]
        p = 1 + torch.randint(self.n_cells - 1 - self.m, (batch_size,), generator=generator)
        within = (torch.rand(batch_size, generator=generator) * counts[p]).long()
        pointer = order[starts[p] + within.minimum(counts[p] - 1)]
        values = torch.randint(len(labels), (batch_size, self.n_cells - 1), generator=generator)
        index = torch.cat([pointer[:, None], values], dim=1)  # [batch, g²]
        classes = labels[index]
        window = classes.gather(1, p[:, None] + torch.arange(self.m + 1))
        g = self.grid
        tiles = images[index].reshape(batch_size, g, g, 8, 8).permute(0, 1, 3, 2, 4)
        x = patchify(tiles.reshape(batch_size, 8 * g, 8 * g), self.patch_size)
        dev = generator.device
        return {
            "x": x.to(dev),
            "y": aggregate(window, self.agg).to(dev),
            "p": p.to(dev),
            "classes": classes.to(dev),
        }

    def loss(self, output: Tensor, batch: dict[str, Tensor]) -> Tensor:
        """Mean cross-entropy of ``[batch, 10]`` logits (nats)."""
        self._check_output(output, batch)
        return F.cross_entropy(output.float(), batch["y"])

    def metrics(self, output: Tensor, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """``loss`` and ``accuracy``."""
        self._check_output(output, batch)
        accuracy = (output.argmax(-1) == batch["y"]).float().mean()
        return {"loss": self.loss(output, batch), "accuracy": accuracy}
