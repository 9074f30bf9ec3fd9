"""Transformer whose attention follows an arbitrary per-sequence mask (graph neighbourhoods).

Glossary (TransformerLens names, as :mod:`dynascope.nn.transformer`):
    batch, pos:  sequences and tokens per sequence (one token per graph vertex).
    d_in:        input token width; ``W_in [d_in, d_model]`` embeds it (no positions: a graph
                 has no order, vertex identity is part of the token).
    d_model, n_heads, d_head, d_mlp, n_layers, d_out: as in :class:`~dynascope.nn.Transformer`.
    attn_mask:   bool ``[batch, query_pos, key_pos]``; True where query i may attend to key j
                 (for a cycle: j is a neighbour of i, and i itself if ``self_loops``).

Each block is pre-LN ``x + attn(ln1(x))``, ``x + mlp(ln2(x))``; attention weights live in a
:class:`~dynascope.nn.MultiHeadAttention` (``blocks.{i}.attn``: W_Q, W_K, W_V, W_O in the
dynascope layout, so ``attention_views`` and the spectral probes read them), but the pattern is
computed here under ``attn_mask``: softmax over the visible keys (a row with no visible key is
all zeros), or the masked scores for linear attention. Output ``ln_final(x) @ W_U + b_U``.

The dense :class:`~dynascope.nn.Transformer` only offers causal and key-padding masks; this
module is the neighbour-only variant that cycle colouring needs.

References:
    von Oswald et al. (2025), "Learning Randomized Algorithms with Transformers", ICLR,
        arXiv 2408.10818, sec. 4.2 (a vertex attends only to its cycle neighbours).
    Vaswani et al. (2017), arXiv 1706.03762, eq. (1).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .attention import AttentionKind, MultiHeadAttention
from .transformer import MLP

__all__ = ["MaskedTransformer", "masked_attention"]


def masked_attention(attn: MultiHeadAttention, x: Tensor, attn_mask: Tensor) -> Tensor:
    """Apply ``attn``'s weights to ``x`` under an arbitrary mask.

    Args:
        attn: a :class:`MultiHeadAttention` (its ``kind`` and ``scale`` are used; its own
            ``is_causal`` is ignored: ``attn_mask`` is the whole mask).
        x: ``[batch, pos, d_model]``.
        attn_mask: bool ``[batch, query_pos, key_pos]``, True = visible.
    Returns:
        ``[batch, pos, d_model]``.
    Raises:
        ValueError: if ``attn_mask`` is not a bool ``[batch, pos, pos]`` tensor.
    """
    batch, pos, _ = x.shape
    if attn_mask.dtype != torch.bool or tuple(attn_mask.shape) != (batch, pos, pos):
        raise ValueError(
            f"attn_mask must be a bool tensor [batch, pos, pos] = {[batch, pos, pos]} "
            f"(got {attn_mask.dtype}, {list(attn_mask.shape)})"
        )
    q = attn._project(x, attn.W_Q, attn.b_Q)  # [batch, n_heads, pos, d_head]
    k = attn._project(x, attn.W_K, attn.b_K)
    v = attn._project(x, attn.W_V, attn.b_V)
    scores = attn.scale * q @ k.transpose(-1, -2)  # [batch, n_heads, query_pos, key_pos]
    mask = attn_mask[:, None]
    if attn.kind == "softmax":
        visible = mask.any(dim=-1, keepdim=True)
        filled = scores.masked_fill(~mask, float("-inf")).masked_fill(~visible, 0.0)
        pattern = filled.softmax(dim=-1).masked_fill(~visible, 0.0)
    else:
        pattern = scores.masked_fill(~mask, 0.0)
    z = pattern @ v  # [batch, n_heads, query_pos, d_head]
    out = torch.einsum("bhpd,hdm->bpm", z, attn.W_O)
    return out if attn.b_O is None else out + attn.b_O


class MaskedTransformer(nn.Module):
    """Pre-LN transformer on vector tokens with a per-sequence attention mask.

    Initialisation: ``W_in ~ N(0, 1/d_in)``, ``W_U ~ N(0, 1/d_model)``, ``b_U = 0``; attention
    and MLP as :class:`MultiHeadAttention` and :class:`MLP`.

    Args:
        n_layers, d_model, n_heads, d_head, d_mlp, d_in, d_out: sizes (all ``>= 1``; ``d_mlp``
            ``None`` or 0 for attention-only blocks).
        attention: ``"softmax"`` or ``"linear"``.
        use_ln: LayerNorms before attention, MLP and unembedding.
    Raises:
        ValueError: if a size is not positive; as :class:`MultiHeadAttention` and :class:`MLP`.
    References:
        von Oswald et al. (2025), arXiv 2408.10818, sec. 4.2.
    """

    def __init__(
        self,
        *,
        n_layers: int,
        d_model: int,
        n_heads: int,
        d_head: int | None = None,
        d_mlp: int | None = None,
        d_in: int,
        d_out: int,
        attention: AttentionKind = "softmax",
        use_ln: bool = True,
    ) -> None:
        super().__init__()
        for name, value in (("n_layers", n_layers), ("d_in", d_in), ("d_out", d_out)):
            if value <= 0:
                raise ValueError(f"{name} must be positive (got {name}={value})")
        self.W_in = nn.Parameter(torch.randn(d_in, d_model) / math.sqrt(d_in))
        self.blocks = nn.ModuleList()
        for _ in range(n_layers):
            block = nn.Module()
            block.ln1 = nn.LayerNorm(d_model) if use_ln else nn.Identity()
            block.attn = MultiHeadAttention(d_model, n_heads, d_head, kind=attention)
            block.ln2 = nn.LayerNorm(d_model) if (use_ln and d_mlp) else nn.Identity()
            block.mlp = MLP(d_model, d_mlp) if d_mlp else None
            self.blocks.append(block)
        self.ln_final = nn.LayerNorm(d_model) if use_ln else nn.Identity()
        self.W_U = nn.Parameter(torch.randn(d_model, d_out) / math.sqrt(d_model))
        self.b_U = nn.Parameter(torch.zeros(d_out))

    def forward(self, x: Tensor, attn_mask: Tensor) -> Tensor:
        """``[batch, pos, d_in]`` and bool ``[batch, pos, pos]`` -> ``[batch, pos, d_out]``.

        Raises:
            ValueError: if ``x`` is not ``[batch, pos, d_in]``; as :func:`masked_attention`.
        """
        if x.ndim != 3 or x.shape[-1] != self.W_in.shape[0]:
            raise ValueError(
                f"x must be [batch, pos, d_in={self.W_in.shape[0]}] (got {list(x.shape)})"
            )
        h = x @ self.W_in
        for block in self.blocks:
            h = h + masked_attention(block.attn, block.ln1(h), attn_mask)
            if block.mlp is not None:
                h = h + block.mlp(block.ln2(h))
        return self.ln_final(h) @ self.W_U + self.b_U
