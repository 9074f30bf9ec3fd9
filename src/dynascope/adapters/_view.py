"""AttentionView: one attention layer's per-head weights, in the TransformerLens layout.

Glossary:
    n_heads:  number of query heads (grouped K/V heads are repeated up to it).
    d_model:  width of the inputs to the query projection.
    d_key:    width of the inputs to the key projection (``d_model`` except for
              ``torch.nn.MultiheadAttention(kdim=...)``); ``d_value`` likewise for values.
    d_head:   width of one head's queries, keys and values.
    W_Q: ``[n_heads, d_model, d_head]``; W_K: ``[n_heads, d_key, d_head]``;
    W_V: ``[n_heads, d_value, d_head]``; W_O: ``[n_heads, d_head, d_model]``.
    b_Q, b_K, b_V: ``[n_heads, d_head]`` or ``None``; b_O: ``[d_model]`` or ``None``.
    scale:    the score multiplier, ``scores = scale * q_h k_h^T``.
    rotary:   True if the layer rotates q and k by position (RoPE) between ``x @ W_Q`` and the
              dot product; then ``W_QK = W_Q W_K^T`` is the bilinear form *outside* the rotation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor, nn

__all__ = ["AttentionView", "heads_from_columns", "heads_from_rows", "layout_weights", "slices"]


@dataclass(frozen=True)
class AttentionView:
    """Per-head weights of one attention layer, in the TransformerLens layout.

    Per head ``h``: ``q = x @ W_Q[h] + b_Q[h]``, ``k = x_k @ W_K[h] + b_K[h]``,
    ``v = x_v @ W_V[h] + b_V[h]``; ``scores = scale * q k^T`` (after rotating q and k by position
    when ``rotary``); the layer's output is ``sum_h softmax(scores + mask) @ v @ W_O[h] + b_O``.

    The tensors are differentiable functions of the model's parameters. They are views of the
    parameters (shared storage, so in-place updates show through) wherever the source layout
    allows; each adapter documents where it must copy (grouped K/V heads).

    Attributes:
        name: the module's qualified name in the model (``"blocks.0.attn"``).
        W_Q: ``[n_heads, d_model, d_head]``.
        W_K: ``[n_heads, d_key, d_head]`` (``d_key = d_model`` for self-attention).
        W_V: ``[n_heads, d_value, d_head]``.
        W_O: ``[n_heads, d_head, d_model]``.
        b_Q, b_K, b_V: ``[n_heads, d_head]`` or ``None``; b_O: ``[d_model]`` or ``None``.
        module: the source module (for capture hooks), or ``None``.
        scale: score multiplier; ``None`` at construction means ``1 / sqrt(d_head)``; always a
            float afterwards.
        rotary: True if rotary position embeddings act on q and k between the projection and the
            dot product. Then the effective score is ``q R_{i-j} k^T``, not ``x W_QK x^T``, and the
            spectrum of ``W_QK`` describes the form outside the rotation only.
        n_key_value_heads: number of distinct K/V heads in the source (grouped-query attention
            repeats each ``n_heads // n_key_value_heads`` times); ``None`` means ``n_heads``.

    References:
        Elhage et al. (2021), "A Mathematical Framework for Transformer Circuits" (layout).
        Su et al. (2021), "RoFormer: Enhanced Transformer with Rotary Position Embedding",
            arXiv 2104.09864, eq. (34) (rotary).
    """

    name: str
    W_Q: Tensor
    W_K: Tensor
    W_V: Tensor
    W_O: Tensor
    b_Q: Tensor | None = None
    b_K: Tensor | None = None
    b_V: Tensor | None = None
    b_O: Tensor | None = None
    module: nn.Module | None = None
    scale: float | None = None
    rotary: bool = False
    n_key_value_heads: int | None = None

    def __post_init__(self) -> None:
        if self.scale is None:
            object.__setattr__(self, "scale", 1.0 / math.sqrt(self.W_Q.shape[-1]))

    @property
    def n_heads(self) -> int:
        return self.W_Q.shape[0]

    @property
    def d_model(self) -> int:
        return self.W_Q.shape[1]

    @property
    def d_head(self) -> int:
        return self.W_Q.shape[2]


def heads_from_rows(weight: Tensor, n_heads: int) -> Tensor:
    """``[n_heads * d_head, d_in]`` (``nn.Linear`` rows, head-major) -> ``[n_heads, d_in, d_head]``.

    A view of ``weight`` (unflatten and transpose; no copy).
    """
    return weight.unflatten(0, (n_heads, -1)).transpose(1, 2)


def heads_from_columns(weight: Tensor, n_heads: int) -> Tensor:
    """``[d_in, n_heads * d_head]`` (GPT-2 ``Conv1D`` columns) -> ``[n_heads, d_in, d_head]``.

    A view of ``weight`` (unflatten and permute; no copy).
    """
    return weight.unflatten(1, (n_heads, -1)).permute(1, 0, 2)


def slices(t: Tensor, width: int, dim: int = 0) -> list[Tensor]:
    """Consecutive slices of ``width`` along ``dim`` (``t.split(width, dim)``, as plain slices).

    Plain slices are single-output views, so autograd still accepts them after the parameter is
    modified in place (an optimizer step); outputs of ``split``/``chunk`` it would reject.
    """
    return [t.narrow(dim, start, width) for start in range(0, t.shape[dim], width)]


def layout_weights(module: object) -> dict[str, Tensor]:
    """``W_Q, W_K, W_V, W_O, b_Q, b_K, b_V, b_O`` of a module that already keeps them in the
    TransformerLens layout (dynascope's attention, TransformerLens's), as view fields."""
    names = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")
    return {name: getattr(module, name) for name in names}
