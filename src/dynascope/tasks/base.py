"""The task contract: what every data generator in ``dynascope.tasks`` provides.

Glossary (shapes use these names):
    batch       number of sequences in one batch.
    n_ctx       sequence length of ``x`` (positions per sequence).
    pos         one position, ``0 <= pos < n_ctx``.
    d_vocab     number of token ids (``input_kind == "tokens"``); ids are ``0..d_vocab-1``.
    d_in        feature size of one input vector (``input_kind == "vectors"``).
    d_out       size of the model's output at each position (logits or regression outputs).

A batch is a ``dict[str, Tensor]``:
    ``"x"``     ``[batch, n_ctx]`` int64 token ids (tokens) or ``[batch, n_ctx, d_in]`` float
                (vectors, in ``torch.get_default_dtype()``).
    ``"y"``     targets; the shape is task-specific and documented by each task.
    ``"mask"``  optional; task-specific.

Every batch is a pure function of ``(task arguments, split, batch_size, generator state)``:
the same seed gives the same batch. Tensors live on ``generator.device``; a CPU and a CUDA
generator with the same seed give different streams (PyTorch's generators differ).

Online tasks (drawn fresh each step) ignore ``split``; the trainer passes a separately seeded
generator for ``"val"``. Fixed-data tasks (``CharLM``) sample from the split they are given.

The model output passed to ``loss`` and ``metrics`` is ``[batch, n_ctx, d_out]`` for sequence
tasks (``output_kind == "sequence"``) and ``[batch, d_out]`` for classification of a whole
input (``output_kind == "pooled"``: a ViT's CLS or mean-pooled logits). ``loss``
returns a scalar mean; ``metrics`` returns scalar tensors (no ``.item()``, no device moves).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Literal

import torch
from torch import Tensor

Split = Literal["train", "val"]
SPLITS: tuple[str, ...] = ("train", "val")


class Task(ABC):
    """Abstract data generator: ``batch`` draws inputs and targets; ``loss``/``metrics`` score.

    Attributes:
        input_kind: ``"tokens"`` (``x`` holds int64 ids) or ``"vectors"`` (``x`` holds floats).
        d_vocab: number of token ids for token tasks, ``None`` for vector tasks.
        d_in: input feature size for vector tasks, ``None`` for token tasks.
        n_ctx: sequence length of ``x``.
        d_out: model output size per position.
    """

    input_kind: Literal["tokens", "vectors"]
    output_kind: Literal["sequence", "pooled"] = "sequence"
    d_vocab: int | None
    d_in: int | None
    n_ctx: int
    d_out: int

    @abstractmethod
    def batch(self, split: Split, batch_size: int, generator: torch.Generator) -> dict[str, Tensor]:
        """Draw one batch.

        Args:
            split: ``"train"`` or ``"val"``.
            batch_size: number of sequences, ``>= 1``.
            generator: source of all randomness; the batch lives on ``generator.device``.
        Returns:
            ``{"x": ..., "y": ...}`` (and optionally ``"mask"``), shapes per task.
        Raises:
            ValueError: if ``split`` is not ``"train"``/``"val"`` or ``batch_size < 1``.
        """

    @abstractmethod
    def loss(self, output: Tensor, batch: dict[str, Tensor]) -> Tensor:
        """Scalar mean training loss of ``output`` ``[batch, n_ctx, d_out]`` on ``batch``."""

    @abstractmethod
    def metrics(self, output: Tensor, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """Scalar evaluation metrics of ``output`` ``[batch, n_ctx, d_out]`` on ``batch``."""

    # -- helpers for subclasses ------------------------------------------------------------

    @staticmethod
    def _check_batch_args(split: str, batch_size: int) -> None:
        """Raise ``ValueError`` unless ``split`` is a known split and ``batch_size >= 1``."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of 'train', 'val' (got split={split!r})")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1 (got batch_size={batch_size!r})")

    def output_shape(self, batch_size: int) -> tuple[int, ...]:
        """Output shape ``loss`` expects: ``[batch, n_ctx, d_out]`` or ``[batch, d_out]``."""
        if self.output_kind == "pooled":
            return (batch_size, self.d_out)
        return (batch_size, self.n_ctx, self.d_out)

    def _check_output(self, output: Tensor, batch: dict[str, Tensor]) -> None:
        """Raise ``ValueError`` unless ``output`` has :meth:`output_shape` for ``batch``."""
        expected = self.output_shape(batch["x"].shape[0])
        if tuple(output.shape) != expected:
            names = "batch, d_out" if self.output_kind == "pooled" else "batch, n_ctx, d_out"
            raise ValueError(
                f"output must have shape [{names}] = {list(expected)} "
                f"(got output.shape={list(output.shape)})"
            )


def draw_from_split(
    x: Tensor, y: Tensor, batch_size: int, generator: torch.Generator
) -> dict[str, Tensor]:
    """A batch of a fixed split: all of it, in order, when ``batch_size >= len(y)`` (full batch);
    else ``batch_size`` rows drawn without replacement (``torch.randperm`` on ``generator``).
    The batch lives on ``generator.device``."""
    if batch_size < len(y):
        index = torch.randperm(len(y), generator=generator)[:batch_size]
        x, y = x[index], y[index]
    return {"x": x.to(generator.device), "y": y.to(generator.device)}


def _check_int(name: str, value: object, minimum: int) -> None:
    """Raise ``ValueError`` unless ``value`` is an int (not bool) ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum} (got {name}={value!r})")


def _check_float(name: str, value: object, *, positive: bool) -> None:
    """Raise ``ValueError`` unless ``value`` is a finite real number, ``> 0`` or ``>= 0``."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and value == value and abs(value) != float("inf")  # not NaN, finite
    ok = ok and (value > 0 if positive else value >= 0)
    if not ok:
        allowed = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be a finite number {allowed} (got {name}={value!r})")
