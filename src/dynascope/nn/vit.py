"""Vision Transformer (ViT) on pre-cut patches: patch embedding, pre-LN encoder blocks, pooling.

Glossary (TransformerLens names; see :mod:`dynascope.nn.transformer`):
    batch:      images per batch.
    n_patches:  patches per image (the task's ``n_ctx``); ``pos`` runs over them, plus one CLS
                position in front when ``pooling="cls"``.
    d_in:       values per patch (``patch_size²`` for grey images).
    d_model, n_heads, d_head, d_mlp, n_layers: as in :class:`~dynascope.nn.Transformer`.
    d_out:      classes.
    W_in, b_in: ``[d_in, d_model]``, ``[d_model]`` patch embedding (a linear map of each
                flattened patch, i.e. a stride-p convolution).
    cls:        ``[d_model]`` learned CLS token (``pooling="cls"`` only).
    W_pos:      ``[n_patches (+1), d_model]`` learned positions.
    W_U, b_U:   ``[d_model, d_out]``, ``[d_out]`` classification head.

Forward::

    x = patches @ W_in + b_in                      # [batch, n_patches, d_model]
    x = concat(cls, x) + W_pos                     # CLS in front when pooling="cls"
    for block in blocks: x = block(x)              # bidirectional attention (is_causal=False)
    h = ln_final(x)[:, 0] if cls else ln_final(x).mean(pos)
    logits = h @ W_U + b_U                         # [batch, d_out]

Attention layers live at ``blocks.{i}.attn`` (dynascope's :class:`MultiHeadAttention`), so every
instrument reads them as in the language models.

References:
    Dosovitskiy et al. (2021), "An Image is Worth 16x16 Words: Transformers for Image
    Recognition at Scale", ICLR, arXiv 2010.11929 (patch embedding, CLS token, pre-LN).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

from .attention import AttentionKind
from .transformer import Activation, TransformerBlock, _norm

__all__ = ["ViT"]

Pooling = Literal["cls", "mean"]


class ViT(nn.Module):
    """A small ViT for pre-cut patches (see the module docstring).

    Initialisation: ``W_in ~ N(0, 1/d_in)``, ``b_in = 0``, ``cls, W_pos ~ N(0, 0.02²)``,
    ``W_U ~ N(0, 1/d_model)``, ``b_U = 0``; blocks as :class:`TransformerBlock`.

    Args:
        n_layers, d_model, n_heads, d_head, d_mlp: as :class:`~dynascope.nn.Transformer`.
        d_in: values per patch.
        n_patches: patches per image.
        d_out: classes.
        pooling: ``"cls"`` (read the CLS position) or ``"mean"`` (average the patches).
        attention, use_bias, use_ln, activation: as :class:`TransformerBlock`.
    Raises:
        ValueError: if a size is not positive, ``pooling`` is unknown, or as
            :class:`TransformerBlock`.
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
        n_patches: int,
        d_out: int,
        pooling: Pooling = "cls",
        attention: AttentionKind = "softmax",
        use_bias: bool = True,
        use_ln: bool = True,
        activation: Activation = "gelu",
    ) -> None:
        super().__init__()
        for name, value in (
            ("n_layers", n_layers),
            ("d_in", d_in),
            ("n_patches", n_patches),
            ("d_out", d_out),
        ):
            if value <= 0:
                raise ValueError(f"{name} must be positive (got {name}={value})")
        if pooling not in ("cls", "mean"):
            raise ValueError(f"pooling must be 'cls' or 'mean' (got pooling={pooling!r})")
        self.pooling = pooling
        self.d_in = d_in
        self.n_patches = n_patches
        self.W_in = nn.Parameter(torch.empty(d_in, d_model))
        self.b_in = nn.Parameter(torch.zeros(d_model))
        self.cls = nn.Parameter(torch.empty(d_model)) if pooling == "cls" else None
        self.W_pos = nn.Parameter(torch.empty(n_patches + (pooling == "cls"), d_model))
        self.blocks = nn.ModuleList(
            TransformerBlock(
                d_model,
                n_heads,
                d_head,
                d_mlp=d_mlp,
                attention=attention,
                is_causal=False,
                use_bias=use_bias,
                use_ln=use_ln,
                activation=activation,
            )
            for _ in range(n_layers)
        )
        self.ln_final = _norm(d_model, use_ln)
        self.W_U = nn.Parameter(torch.empty(d_model, d_out))
        self.b_U = nn.Parameter(torch.zeros(d_out))
        nn.init.normal_(self.W_in, std=1.0 / math.sqrt(d_in))
        if self.cls is not None:
            nn.init.normal_(self.cls, std=0.02)
        nn.init.normal_(self.W_pos, std=0.02)
        nn.init.normal_(self.W_U, std=1.0 / math.sqrt(d_model))

    def forward(self, patches: Tensor) -> Tensor:
        """Classify images given as patches.

        Args:
            patches: ``[batch, n_patches, d_in]``.
        Returns:
            Logits ``[batch, d_out]``.
        Raises:
            ValueError: if ``patches`` is not ``[batch, n_patches, d_in]``.
        """
        if patches.ndim != 3 or patches.shape[1:] != (self.n_patches, self.d_in):
            raise ValueError(
                f"patches must have shape [batch, n_patches={self.n_patches}, d_in={self.d_in}] "
                f"(got {tuple(patches.shape)})"
            )
        x = patches @ self.W_in + self.b_in
        if self.cls is not None:
            x = torch.cat([self.cls.expand(x.shape[0], 1, -1), x], dim=1)
        x = x + self.W_pos
        for block in self.blocks:
            x = block(x)
        x = self.ln_final(x)
        pooled = x[:, 0] if self.cls is not None else x.mean(dim=1)
        return pooled @ self.W_U + self.b_U
