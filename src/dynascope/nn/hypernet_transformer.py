"""Vector-sequence Transformer with T5 relative positions, and the hypernetwork Transformer.

Glossary (dimensions and symbols, TransformerLens names):
    batch, pos: sequences and their length.
    d_in:       width of an input token (e.g. ``[x, y]``: ``d_x + 1``).
    d_out:      width of the readout.
    d_model, n_layers, n_heads, d_head, d_mlp: as in :mod:`dynascope.nn.transformer`.
    W_in, b_in: ``[d_in, d_model]``, ``[d_model]`` input embedding (a Dense layer).
    W_U, b_U:   ``[d_model, d_out]``, ``[d_out]`` readout after the final LayerNorm.
    d_x:        width of the query input of the hypernetwork MLP.
    d_latent:   width of the inferred latent code ``z_hat`` (S3: the number of modules, 6).
    d_hidden:   hidden width of the generated MLP (S3: 32).
    theta:      ``[d_latent, d_x, d_hidden]`` linear hypernetwork; module m is ``theta[m]``;
                ``W(z_hat) = sum_m z_hat_m theta[m]`` (``[batch, d_x, d_hidden]``).

Forward of :class:`SequenceTransformer` (pre-LN, no causal mask by default)::

    h = x @ W_in + b_in
    for block in blocks:
        h = h + attn(ln1(h))          # any MultiHeadAttention attention, T5 bias per layer
        h = h + mlp(ln2(h))           # GELU MLP
        hook_resid_post(h)            # capture point "blocks.{i}.hook_resid_post"
    out = ln_final(h) @ W_U + b_U

:class:`HypernetTransformer`: the transformer reads the context (ending in a ``(0, 0)`` token),
its last position's output is the latent ``z_hat`` (``W_U`` maps to ``d_latent``), and
``y = gelu(x_q @ W(z_hat) + b_hidden) @ w_readout + b_readout``.

References:
    Kobayashi, Schug, Akram, Redhardt, von Oswald, Pascanu, Lajoie, Sacramento (2024), "When can
        transformers compositionally generalize in-context?", arXiv 2407.12275, App. C.3
        (vanilla and hypernetwork transformer, Table 3).
    Schug et al. (2025), "Attention as a Hypernetwork", arXiv 2406.05816, App. (transformer
        used for fuzzy logic and sRAVEN: pre-LN, GELU MLP, final LN, Dense readout).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import AttentionKind, MultiHeadAttention
from .capture import CapturePoint
from .transformer import MLP

__all__ = ["HypernetTransformer", "SequenceTransformer"]


class _Block(nn.Module):
    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_head: int | None,
        d_mlp: int,
        attention: AttentionKind,
        relative_position_buckets: int | None,
        is_causal: bool,
    ) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = MultiHeadAttention(
            d_model,
            n_heads,
            d_head,
            attention=attention,
            is_causal=is_causal,
            use_bias=True,
            relative_position_buckets=relative_position_buckets,
        )
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, d_mlp, activation="gelu")
        self.hook_resid_post = CapturePoint()  # [batch, pos, d_model]

    def forward(self, h: Tensor, last_query: bool = False) -> Tensor:
        attended = self.attn(self.ln1(h), last_query=last_query)
        h = (h[:, -1:] if last_query else h) + attended
        h = h + self.mlp(self.ln2(h))
        return self.hook_resid_post(h)


class SequenceTransformer(nn.Module):
    """Pre-LN Transformer on vector tokens with per-layer T5 relative position bias.

    Args:
        d_in: token width.
        d_out: readout width (applied at every position).
        d_model: residual width.
        n_layers: blocks, ``>= 1``.
        n_heads: heads per block.
        d_head: per-head width; ``None`` means ``d_model // n_heads``. (The HYLA reference sets
            the total qk/v width ``n_heads * d_head`` apart from ``d_model``: 16 with 8 heads.)
        d_mlp: GELU MLP hidden width.
        attention: a :class:`MultiHeadAttention` attention (``"softmax"``, ``"linear"``, ``"hyla"``,
            ``"linear_rms_head"``, ...).
        relative_position_buckets: T5 buckets (= max distance); ``None`` disables the bias.
        is_causal: causal mask (the S3/S4 models use none).
    Raises:
        ValueError: if ``n_layers < 1`` or ``d_in``/``d_out`` is not positive; as
            :class:`MultiHeadAttention` and :class:`~dynascope.nn.MLP`.
    References:
        Schug et al. (2025), arXiv 2406.05816; Kobayashi et al. (2024), arXiv 2407.12275.
    """

    def __init__(
        self,
        d_in: int,
        d_out: int,
        *,
        d_model: int,
        n_layers: int,
        n_heads: int,
        d_head: int | None = None,
        d_mlp: int,
        attention: AttentionKind = "softmax",
        relative_position_buckets: int | None = None,
        is_causal: bool = False,
    ) -> None:
        super().__init__()
        if n_layers < 1:
            raise ValueError(f"n_layers must be >= 1 (got n_layers={n_layers})")
        if d_in < 1 or d_out < 1:
            raise ValueError(f"d_in and d_out must be positive (got d_in={d_in}, d_out={d_out})")
        self.d_in, self.d_out, self.d_model = d_in, d_out, d_model
        self.embed = nn.Linear(d_in, d_model)
        self.blocks = nn.ModuleList(
            _Block(d_model, n_heads, d_head, d_mlp, attention, relative_position_buckets, is_causal)
            for _ in range(n_layers)
        )
        self.ln_final = nn.LayerNorm(d_model)
        self.unembed = nn.Linear(d_model, d_out)

    def forward(self, x: Tensor, *, last_only: bool = False) -> Tensor:
        """``[batch, pos, d_in] -> [batch, pos, d_out]``; with ``last_only`` the last position's
        output ``[batch, 1, d_out]`` alone (the last block's other queries are not computed).

        Raises:
            ValueError: if ``x`` is not ``[batch, pos, d_in]``.
        """
        if x.ndim != 3 or x.shape[-1] != self.d_in:
            raise ValueError(
                f"x must have shape [batch, pos, d_in={self.d_in}] (got {tuple(x.shape)})"
            )
        h = self.embed(x)
        for i, block in enumerate(self.blocks):
            h = block(h, last_query=last_only and i == len(self.blocks) - 1)
        return self.unembed(self.ln_final(h))


class HypernetTransformer(nn.Module):
    """Transformer -> latent ``z_hat`` -> linear hypernetwork -> MLP on the query input.

    ``W(z_hat) = sum_m z_hat_m theta[m]``; ``y = gelu(x_q @ W(z_hat) + b_hidden) @ w_readout +
    b_readout``. ``theta ~ N(0, 1/(d_latent d_x))`` so that ``W`` has fan-in scale for
    ``O(1)`` codes; ``w_readout ~ N(0, 1/d_hidden)``; biases 0. ``W(z_hat)`` is not
    operator-norm normalised (SYSTEMS.md S3 open detail, default no).

    Args:
        d_in: context token width (``d_x + 1``).
        d_x: query input width.
        d_latent: latent width (S3: 6).
        d_hidden: generated MLP hidden width (S3: 32).
        d_out: output width (S3: 1).
        d_model, n_layers, n_heads, d_head, d_mlp, attention, relative_position_buckets: the
            encoder, as :class:`SequenceTransformer`.
    Raises:
        ValueError: if a width is not positive; as :class:`SequenceTransformer`.
    References:
        Kobayashi et al. (2024), arXiv 2407.12275, sec. 3 and App. C.3.
    """

    def __init__(
        self,
        d_in: int,
        d_x: int,
        *,
        d_latent: int,
        d_hidden: int,
        d_out: int = 1,
        d_model: int,
        n_layers: int,
        n_heads: int,
        d_head: int | None = None,
        d_mlp: int,
        attention: AttentionKind = "softmax",
        relative_position_buckets: int | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("d_x", d_x), ("d_latent", d_latent), ("d_hidden", d_hidden)):
            if value < 1:
                raise ValueError(f"{name} must be positive (got {name}={value})")
        self.d_x, self.d_latent, self.d_hidden = d_x, d_latent, d_hidden
        self.encoder = SequenceTransformer(
            d_in,
            d_latent,
            d_model=d_model,
            n_layers=n_layers,
            n_heads=n_heads,
            d_head=d_head,
            d_mlp=d_mlp,
            attention=attention,
            relative_position_buckets=relative_position_buckets,
        )
        self.theta = nn.Parameter(torch.empty(d_latent, d_x, d_hidden))
        self.b_hidden = nn.Parameter(torch.zeros(d_hidden))
        self.w_readout = nn.Parameter(torch.empty(d_hidden, d_out))
        self.b_readout = nn.Parameter(torch.zeros(d_out))
        self.hook_latent = CapturePoint()  # [batch, d_latent]
        nn.init.normal_(self.theta, std=1.0 / math.sqrt(d_latent * d_x))
        nn.init.normal_(self.w_readout, std=1.0 / math.sqrt(d_hidden))

    def latent(self, context: Tensor) -> Tensor:
        """``z_hat`` ``[batch, d_latent]`` from the context ``[batch, pos, d_in]`` (last token)."""
        return self.hook_latent(self.encoder(context)[:, -1])

    def forward(self, context: Tensor, x_query: Tensor) -> Tensor:
        """Predict ``[batch, d_out]`` for ``x_query`` ``[batch, d_x]`` given the context.

        Raises:
            ValueError: if ``x_query`` is not ``[batch, d_x]``; as :class:`SequenceTransformer`.
        """
        if x_query.ndim != 2 or x_query.shape[-1] != self.d_x:
            raise ValueError(
                f"x_query must have shape [batch, d_x={self.d_x}] (got {tuple(x_query.shape)})"
            )
        z_hat = self.latent(context)
        W = torch.einsum("bm,mih->bih", z_hat, self.theta)  # [batch, d_x, d_hidden]
        hidden = F.gelu(torch.einsum("bi,bih->bh", x_query, W) + self.b_hidden)
        return hidden @ self.w_readout + self.b_readout
