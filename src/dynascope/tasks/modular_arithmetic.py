"""Modular arithmetic (Power et al. 2022): every equation ``a op b = c (mod p)``, split once.

Glossary:
    p:          the modulus (a prime for division); operands and results are ``0 .. p-1``.
    op:         ``+``, ``-``, ``*`` or ``/`` (``a / b = c`` means ``a = b·c mod p``, ``b != 0``).
    equation:   the tokens ``[a, op, b, =]`` → answer ``c``; token ids ``0 .. p-1`` are numbers,
                ``p`` is the operator, ``p + 1`` is ``=``; ``d_vocab = p + 2``, ``n_ctx = 4``.
    d_out:      ``p`` (logits over the answer).
    train_fraction: the share of all equations used for training, in (0, 1).

The equation table follows the reference data generator: for ``+ - *`` all ``p²`` pairs
``(a, b)``; for ``/`` the loop runs over ``(b, c)`` with ``b != 0`` and sets ``a = b·c mod p``
(``p (p - 1)`` equations, each quotient exactly once). The table is shuffled once with
``numpy.random.RandomState(split_seed)`` and the first ``round(N · train_fraction)`` rows are
the training split, the rest validation — so the split is exact and deterministic.

Batches: the whole split, in its fixed order, when ``batch_size >=`` the split's size;
otherwise ``batch_size`` equations drawn without replacement (``torch.randperm``).
The model output is ``[batch, 4, d_out]``; the loss is the cross-entropy of the last position
only (the token after ``=``), and ``accuracy`` counts an equation right when its arg-max answer
is ``c`` (one answer token: every right-hand side token right).

References:
    Power, Burda, Edwards, Babuschkin & Misra (2022), "Grokking: Generalization Beyond
    Overfitting on Small Algorithmic Datasets", arXiv 2201.02177, Sec. 2 and App. A.1.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .base import Task, draw_from_split

__all__ = ["OPERATIONS", "ModularArithmetic", "equations"]

OPERATIONS = ("+", "-", "*", "/")


def _is_prime(n: int) -> bool:
    return n >= 2 and all(n % k for k in range(2, int(n**0.5) + 1))


def equations(p: int, op: str) -> np.ndarray:
    """All equations of ``op`` modulo ``p`` as rows ``(a, b, c)``, in generator order.

    Returns:
        int64 array ``[N, 3]``: ``N = p²`` for ``+ - *``, ``p (p - 1)`` for ``/``.
    Raises:
        ValueError: for an unknown ``op``, ``p < 2``, or ``/`` with a ``p`` that is not prime.
    """
    if op not in OPERATIONS:
        raise ValueError(f"op must be one of {', '.join(OPERATIONS)} (got {op!r})")
    if p < 2:
        raise ValueError(f"p must be >= 2 (got {p})")
    if op == "/":
        if not _is_prime(p):
            raise ValueError(f"division needs a prime modulus (got p={p})")
        b, c = np.meshgrid(np.arange(1, p), np.arange(p), indexing="ij")
        a = (b * c) % p
        return np.stack([a.ravel(), b.ravel(), c.ravel()], axis=1).astype(np.int64)
    a, b = np.meshgrid(np.arange(p), np.arange(p), indexing="ij")
    c = {"+": a + b, "-": a - b, "*": a * b}[op] % p
    return np.stack([a.ravel(), b.ravel(), c.ravel()], axis=1).astype(np.int64)


class ModularArithmetic(Task):
    """``a op b = c (mod p)`` as 4-token sequences (see the module docstring).

    Args:
        p: the modulus (prime for ``/``).
        op: one of ``+ - * /``.
        train_fraction: share of the equations in the training split, in (0, 1).
        split_seed: seed of ``numpy.random.RandomState`` that shuffles the table.
    Raises:
        ValueError: as :func:`equations`; if ``train_fraction`` leaves a split empty.
    """

    input_kind = "tokens"
    d_in = None
    n_ctx = 4

    def __init__(
        self, *, p: int = 97, op: str = "+", train_fraction: float = 0.5, split_seed: int = 0
    ) -> None:
        table = equations(p, op)
        n_train = round(len(table) * train_fraction)
        if not 0 < n_train < len(table):
            raise ValueError(
                f"train_fraction must leave both splits non-empty (got {train_fraction} of "
                f"{len(table)} equations)"
            )
        self.p, self.op, self.train_fraction, self.split_seed = p, op, train_fraction, split_seed
        self.d_vocab = p + 2
        self.d_out = p
        table = table[np.random.RandomState(split_seed).permutation(len(table))]
        x = np.stack(
            [table[:, 0], np.full(len(table), p), table[:, 1], np.full(len(table), p + 1)], axis=1
        )
        x, y = torch.from_numpy(x), torch.from_numpy(table[:, 2].copy())
        self._x = {"train": x[:n_train], "val": x[n_train:]}
        self._y = {"train": y[:n_train], "val": y[n_train:]}

    def split_size(self, split: str) -> int:
        """Number of equations in ``split``."""
        return len(self._y[split])

    def batch(self, split: str, batch_size: int, generator: torch.Generator) -> dict[str, Tensor]:
        """``x`` ``[batch, 4]`` token ids ``[a, op, b, =]``; ``y`` ``[batch]`` answers ``c``.

        Raises:
            ValueError: for an unknown split or a batch size below 1.
        """
        self._check_batch_args(split, batch_size)
        return draw_from_split(self._x[split], self._y[split], batch_size, generator)

    def loss(self, output: Tensor, batch: dict[str, Tensor]) -> Tensor:
        """Cross-entropy (nats) of the answer, read at the last position (after ``=``)."""
        self._check_output(output, batch)
        return F.cross_entropy(output[:, -1].float(), batch["y"])

    def metrics(self, output: Tensor, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """``accuracy``: fraction of equations whose arg-max answer is ``c``."""
        self._check_output(output, batch)
        return {"accuracy": (output[:, -1].detach().argmax(-1) == batch["y"]).double().mean()}
