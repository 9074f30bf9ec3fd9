"""Digits: scikit-learn's bundled 8×8 handwritten digits (1,797 images, 10 classes), as patches.

Glossary:
    image:      8×8 grey levels 0..16, scaled to [0, 1] (pixels / 16).
    patch_size: side of a square patch; 8 must be a multiple of it. ``n_ctx = (8 / patch_size)²``
                patches per image, each flattened row-major to ``d_in = patch_size²`` values
                (``patch_size = 8``: one token holding the whole flattened image, for MLPs).
    n_train:    images in the training split; the rest form the validation split.
    d_out:      10 classes.

Split: one permutation of the 1,797 images drawn from ``split_seed`` (``torch.Generator``);
the first ``n_train`` are training, the rest validation. Deterministic, and the same for every
run that uses the same ``n_train`` and ``split_seed``. With ``stratify=True`` the split keeps
the class proportions instead (``sklearn.model_selection.train_test_split`` with
``stratify=labels, random_state=split_seed``; SYSTEMS.md S7 proposes 1,297 / 500).

Images: with ``patch_size = 8`` the single token is the image flattened row-major, so
``x.reshape(batch, 1, 8, 8)`` is the 1×8×8 image a CNN reads.

Batches: ``batch(split, batch_size, generator)`` returns the whole split in its fixed order
when ``batch_size >= `` the split's size (full-batch training, as S13), else ``batch_size``
images drawn without replacement (``torch.randperm``) from the split.

Outputs: ``output_kind = "pooled"``: a classifier returns logits ``[batch, d_out]`` (ViT with
CLS or mean pooling, MLP on the flattened image). Loss: mean cross-entropy (nats); metric
``accuracy``.

References:
    Alpaydin & Kaynak (1998), UCI "Optical Recognition of Handwritten Digits" (the data behind
    ``sklearn.datasets.load_digits``). Used at CPU scale by SYSTEMS.md S10, S12, S13.
"""

from __future__ import annotations

from functools import cache

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import Task, draw_from_split

__all__ = ["Digits", "N_DIGITS"]

N_DIGITS = 1797


@cache
def _load() -> tuple[Tensor, Tensor]:
    """All images ``[1797, 8, 8]`` in [0, 1] (float64) and labels ``[1797]`` (int64)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    images = torch.tensor(data.images, dtype=torch.float64) / 16.0
    return images, torch.tensor(data.target, dtype=torch.int64)


def patchify(images: Tensor, patch_size: int) -> Tensor:
    """``[batch, H, W] -> [batch, (H/p)(W/p), p²]``: non-overlapping patches, row-major.

    Raises:
        ValueError: if ``patch_size`` does not divide H and W.
    """
    batch, height, width = images.shape
    if height % patch_size or width % patch_size:
        raise ValueError(
            f"patch_size must divide the image size {height}x{width} (got {patch_size})"
        )
    p = patch_size
    x = images.reshape(batch, height // p, p, width // p, p).permute(0, 1, 3, 2, 4)
    return x.reshape(batch, (height // p) * (width // p), p * p)


class Digits(Task):
    """8×8 digits as a sequence of patches (see the module docstring).

    Args:
        patch_size: 1, 2, 4 or 8.
        n_train: training images (1 .. 1796); the default 1,437 keeps 20% for validation.
        split_seed: seed of the permutation that splits the images.
        stratify: keep the class proportions in both splits (then ``10 <= n_train <= 1787``).
    Raises:
        ValueError: if ``patch_size`` does not divide 8 or ``n_train`` is out of range.
    """

    input_kind = "vectors"
    output_kind = "pooled"
    d_vocab = None

    def __init__(
        self,
        *,
        patch_size: int = 4,
        n_train: int = 1437,
        split_seed: int = 0,
        stratify: bool = False,
    ) -> None:
        if patch_size not in (1, 2, 4, 8):
            raise ValueError(f"patch_size must be one of 1, 2, 4, 8 (got {patch_size})")
        if not 1 <= n_train <= N_DIGITS - 1:
            raise ValueError(f"n_train must lie in [1, {N_DIGITS - 1}] (got {n_train})")
        if stratify and not 10 <= n_train <= N_DIGITS - 10:
            raise ValueError(
                f"n_train must lie in [10, {N_DIGITS - 10}] with stratify=True (got {n_train})"
            )
        self.patch_size = patch_size
        self.n_train = n_train
        self.split_seed = split_seed
        self.n_ctx = (8 // patch_size) ** 2
        self.d_in = patch_size * patch_size
        self.d_out = 10
        images, labels = _load()
        self.stratify = stratify
        if stratify:
            from sklearn.model_selection import train_test_split

            first, rest = train_test_split(
                range(N_DIGITS),
                train_size=n_train,
                stratify=labels.numpy(),
                random_state=split_seed,
            )
            order = torch.tensor([*first, *rest])
        else:
            order = torch.randperm(N_DIGITS, generator=torch.Generator().manual_seed(split_seed))
        x = patchify(images, patch_size).to(torch.get_default_dtype())
        self._x = {"train": x[order[:n_train]], "val": x[order[n_train:]]}
        self._y = {"train": labels[order[:n_train]], "val": labels[order[n_train:]]}

    def split_size(self, split: str) -> int:
        """Number of images in ``split``."""
        return len(self._y[split])

    def batch(self, split: str, batch_size: int, generator: torch.Generator) -> dict[str, Tensor]:
        """``x`` ``[batch, n_ctx, d_in]`` floats in [0, 1]; ``y`` ``[batch]`` labels 0..9.

        Raises:
            ValueError: for an unknown split or a batch size below 1.
        """
        self._check_batch_args(split, batch_size)
        return draw_from_split(self._x[split], self._y[split], batch_size, generator)

    def loss(self, output: Tensor, batch: dict[str, Tensor]) -> Tensor:
        """Mean cross-entropy of the logits ``[batch, 10]``, in nats (computed in float32+).

        Raises:
            ValueError: if ``output`` is not ``[batch, 10]``.
        """
        self._check_output(output, batch)
        return F.cross_entropy(
            output if output.dtype == torch.float64 else output.float(), batch["y"]
        )

    def metrics(self, output: Tensor, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """``accuracy``: fraction of images whose arg-max logit is the label."""
        self._check_output(output, batch)
        predicted = output.detach().argmax(dim=-1)
        return {"accuracy": (predicted == batch["y"]).double().mean()}
