"""Pointer-value retrieval (PVR): the vector task with window aggregation, and hop-PVR.

Glossary:
    digits:     the values ``d_0 .. d_{L-1}``, each in ``0 .. 9`` (vector PVR, L = 10) or
                ``0 .. L-1`` (hop-PVR).
    p:          the pointer; ``x[0]`` in vector PVR.
    m:          complexity (window size − 1): the label aggregates ``m + 1`` consecutive digits
                ``d_p .. d_{p+m}``; ``p ~ U{0 .. 9 − m}`` so the window never wraps; m = 0 is
                pure retrieval.
    agg:        ``sum`` (sum mod 10), ``min``, ``max``, ``median`` (the lower median
                ``sorted(w)[(len(w) − 1) // 2]`` for even windows), ``mode`` (the most frequent
                value; ties go to the smallest value).
    holdout:    k: the first k permutations of ``(0, .., m)`` (``itertools.permutations``
                order) never appear as a training window: a training window equal to one of them
                has every window value shifted +1 mod 10, repeated until it is not held out (for
                m = 9 a shift can land on another held-out permutation). ``adversarial_batch``
                plants exactly those permutations.
    h:          hop count (hop-PVR): ``p_k = d[p_{k−1}]``, label ``y = p_h``.
    HOP_h:      token id ``L + h − 1`` announcing the hop count; it is also the readout position.

Encodings (token ids, ``[batch, n_ctx]`` int64; labels ``[batch]`` in ``0 .. 9``):

- ``VectorPVR``: ``x = [p, d_0, .., d_9]`` (n_ctx 11, d_vocab 10); read out at position 0.
- ``HopPVR``: ``x = [HOP_h, p_0, d_0, .., d_{L−1}]`` (n_ctx L + 2, d_vocab L + max_hops); read
  out at position 0. Hop-PVR is our generator for "more sequential computation steps"; the
  paper's exact format is unverified (SYSTEMS.md S8). h = 1 is plain retrieval (PVR, m = 0).

Splits: ``train`` applies the holdout (vector PVR) and draws h from ``train_hops`` (hop-PVR);
``val`` is the same distribution without the holdout shift. ``batch_for_hops(h, ..)`` draws
hop-PVR examples with a fixed h (evaluation beyond the trained hop counts).

References:
    C. Zhang, M. Raghu, J. Kleinberg, S. Bengio (2021), "Pointer Value Retrieval: A new
        benchmark for understanding the limits of neural network generalization",
        arXiv 2107.12580, Sec. 2 (vector PVR, window aggregation, holdout).
    S. Abnar et al. (2023), "Adaptivity and Modularity for Efficient Generalization Over Task
        Complexity", arXiv 2310.08866 (PVR with more computation steps).
"""

from __future__ import annotations

import itertools
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import Task, _check_int

__all__ = ["HopPVR", "VectorPVR", "aggregate"]

Aggregation = Literal["sum", "min", "max", "median", "mode"]
AGGREGATIONS: tuple[str, ...] = ("sum", "min", "max", "median", "mode")


def aggregate(window: Tensor, agg: str) -> Tensor:
    """Aggregate digit windows ``[batch, m + 1]`` (values 0..9) into labels ``[batch]``.

    Raises:
        ValueError: for an unknown ``agg``.
    """
    if agg == "sum":
        return window.sum(-1) % 10
    if agg == "min":
        return window.min(-1).values
    if agg == "max":
        return window.max(-1).values
    if agg == "median":
        return window.sort(-1).values[:, (window.shape[-1] - 1) // 2]
    if agg == "mode":
        counts = F.one_hot(window, 10).sum(-2)  # [batch, 10]
        return counts.argmax(-1)  # argmax returns the first (smallest) maximum
    raise ValueError(f"agg must be one of {AGGREGATIONS} (got agg={agg!r})")


def _pooled_loss_metrics(task: Task, output: Tensor, batch: dict[str, Tensor]):
    task._check_output(output, batch)
    loss = F.cross_entropy(output.float(), batch["y"])
    accuracy = (output.argmax(-1) == batch["y"]).float().mean()
    return loss, accuracy


class VectorPVR(Task):
    """Vector PVR (see the module docstring): ``x = [p, d_0..d_9]``, label ``agg(window)``.

    Args:
        complexity: m in 0..9.
        agg: ``sum``, ``min``, ``max``, ``median`` or ``mode``.
        holdout: k >= 0 held-out window permutations (at most (m + 1)! − 1, so some window
            orderings stay trainable).
    Raises:
        ValueError: for ``complexity`` outside 0..9, an unknown ``agg`` or ``holdout`` out of
            range.
    """

    input_kind = "tokens"
    output_kind = "pooled"
    d_in = None

    def __init__(self, *, complexity: int = 0, agg: Aggregation = "sum", holdout: int = 0) -> None:
        _check_int("complexity", complexity, 0)
        if complexity > 9:
            raise ValueError(f"complexity must be in 0..9 (got complexity={complexity})")
        if agg not in AGGREGATIONS:
            raise ValueError(f"agg must be one of {AGGREGATIONS} (got agg={agg!r})")
        _check_int("holdout", holdout, 0)
        n_perms = 1
        for i in range(2, complexity + 2):
            n_perms *= i
        if holdout > n_perms - 1:
            raise ValueError(
                f"holdout must be in 0..{n_perms - 1} for m={complexity} (got {holdout})"
            )
        self.m, self.agg, self.holdout = complexity, agg, holdout
        self.d_vocab, self.n_ctx, self.d_out = 10, 11, 10
        perms = list(itertools.islice(itertools.permutations(range(complexity + 1)), holdout))
        self.held_out = torch.tensor(perms, dtype=torch.long).reshape(holdout, complexity + 1)

    def _is_held_out(self, window: Tensor) -> Tensor:
        if self.holdout == 0:
            return torch.zeros(window.shape[0], dtype=torch.bool, device=window.device)
        held = self.held_out.to(window.device)
        return (window[:, None, :] == held[None]).all(-1).any(-1)

    def _assemble(self, p: Tensor, digits: Tensor) -> dict[str, Tensor]:
        offsets = torch.arange(self.m + 1, device=p.device)
        window = digits.gather(1, p[:, None] + offsets)
        x = torch.cat([p[:, None], digits], dim=1)
        return {"x": x, "y": aggregate(window, self.agg)}

    def batch(self, split: str, batch_size: int, generator: torch.Generator) -> dict[str, Tensor]:
        """``x`` ``[batch, 11]`` token ids, ``y`` ``[batch]``; ``train`` applies the holdout.

        Raises:
            ValueError: for an unknown split or a batch size below 1.
        """
        self._check_batch_args(split, batch_size)
        dev = generator.device
        p = torch.randint(10 - self.m, (batch_size,), generator=generator, device=dev)
        digits = torch.randint(10, (batch_size, 10), generator=generator, device=dev)
        if split == "train":
            offsets = torch.arange(self.m + 1, device=dev)
            index = p[:, None] + offsets
            window = digits.gather(1, index)
            held = self._is_held_out(window)
            while held.any():
                window = torch.where(held[:, None], (window + 1) % 10, window)
                held = self._is_held_out(window)
            digits = digits.scatter(1, index, window)
        return self._assemble(p, digits)

    def adversarial_batch(self, batch_size: int, generator: torch.Generator) -> dict[str, Tensor]:
        """Batches whose windows are exactly the held-out permutations (uniformly chosen).

        Raises:
            ValueError: if ``holdout == 0`` or ``batch_size < 1``.
        """
        if self.holdout == 0:
            raise ValueError("holdout must be > 0 for an adversarial batch (got holdout=0)")
        self._check_batch_args("val", batch_size)
        dev = generator.device
        p = torch.randint(10 - self.m, (batch_size,), generator=generator, device=dev)
        digits = torch.randint(10, (batch_size, 10), generator=generator, device=dev)
        which = torch.randint(self.holdout, (batch_size,), generator=generator, device=dev)
        index = p[:, None] + torch.arange(self.m + 1, device=dev)
        digits = digits.scatter(1, index, self.held_out.to(dev)[which])
        return self._assemble(p, digits)

    def loss(self, output: Tensor, batch: dict[str, Tensor]) -> Tensor:
        """Mean cross-entropy of ``[batch, 10]`` logits (nats)."""
        return _pooled_loss_metrics(self, output, batch)[0]

    def metrics(self, output: Tensor, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """``loss`` and ``accuracy``."""
        loss, accuracy = _pooled_loss_metrics(self, output, batch)
        return {"loss": loss, "accuracy": accuracy}


class HopPVR(Task):
    """Hop-PVR: ``x = [HOP_h, p_0, d_0..d_{L−1}]``, label ``p_h`` with ``p_k = d[p_{k−1}]``.

    Args:
        length: L, number of digits and of pointer values (2..10).
        train_hops: hop counts drawn uniformly for ``split="train"`` and ``"val"``.
        max_hops: largest hop count the vocabulary announces (>= max(train_hops)).
    Raises:
        ValueError: if ``length`` is outside 2..10, ``train_hops`` is empty or holds a value
            outside 1..max_hops.
    """

    input_kind = "tokens"
    output_kind = "pooled"
    d_in = None

    def __init__(
        self, *, length: int = 10, train_hops: tuple[int, ...] = (1, 2, 3, 4), max_hops: int = 5
    ) -> None:
        _check_int("length", length, 2)
        if length > 10:
            raise ValueError(f"length must be in 2..10 (got length={length})")
        _check_int("max_hops", max_hops, 1)
        hops = tuple(train_hops)
        if not hops or any(not 1 <= h <= max_hops for h in hops):
            raise ValueError(f"train_hops must be non-empty values in 1..{max_hops} (got {hops})")
        self.length, self.train_hops, self.max_hops = length, hops, max_hops
        self.d_vocab, self.n_ctx, self.d_out = length + max_hops, length + 2, 10

    def _draw(self, hops: Tensor, generator: torch.Generator) -> dict[str, Tensor]:
        n, dev, L = hops.shape[0], generator.device, self.length
        p = torch.randint(L, (n,), generator=generator, device=dev)
        digits = torch.randint(L, (n, L), generator=generator, device=dev)
        pointer = p
        for k in range(1, int(hops.max()) + 1):
            step = digits.gather(1, pointer[:, None])[:, 0]
            pointer = torch.where(hops >= k, step, pointer)
        x = torch.cat([(L + hops - 1)[:, None], p[:, None], digits], dim=1)
        return {"x": x, "y": pointer, "hops": hops}

    def batch(self, split: str, batch_size: int, generator: torch.Generator) -> dict[str, Tensor]:
        """``x`` ``[batch, L + 2]``, ``y`` ``[batch]``, ``hops`` ``[batch]`` (h per example).

        Raises:
            ValueError: for an unknown split or a batch size below 1.
        """
        self._check_batch_args(split, batch_size)
        choices = torch.tensor(self.train_hops, device=generator.device)
        pick = torch.randint(
            len(choices), (batch_size,), generator=generator, device=generator.device
        )
        return self._draw(choices[pick], generator)

    def batch_for_hops(self, hops: int, batch_size: int, generator: torch.Generator):
        """A batch whose every example takes ``hops`` hops (1..max_hops).

        Raises:
            ValueError: if ``hops`` is outside 1..max_hops or ``batch_size < 1``.
        """
        if not 1 <= hops <= self.max_hops:
            raise ValueError(f"hops must be in 1..{self.max_hops} (got hops={hops})")
        self._check_batch_args("val", batch_size)
        return self._draw(torch.full((batch_size,), hops, device=generator.device), generator)

    def loss(self, output: Tensor, batch: dict[str, Tensor]) -> Tensor:
        """Mean cross-entropy of ``[batch, 10]`` logits (nats)."""
        return _pooled_loss_metrics(self, output, batch)[0]

    def metrics(self, output: Tensor, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """``loss`` and ``accuracy``."""
        loss, accuracy = _pooled_loss_metrics(self, output, batch)
        return {"loss": loss, "accuracy": accuracy}
