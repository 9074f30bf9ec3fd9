"""Pre-LN decoder-style Transformer for token or vector sequences.

Glossary (dimensions and symbols, TransformerLens names):
    batch, pos: number of sequences and sequence length; ``n_ctx`` is the largest ``pos``.
    n_layers:   number of blocks.
    d_model:    residual-stream width.
    n_heads, d_head: attention heads and their width (see :mod:`dynascope.nn.attention`).
    d_mlp:      hidden width of the MLP; ``None`` or 0 means attention-only blocks.
    d_vocab:    number of input token ids (token inputs ``[batch, pos]``, long).
    d_in:       width of input vectors (vector inputs ``[batch, pos, d_in]``, float).
    d_out:      width of the output (logits over ``d_out`` classes, or a regression target).
    W_E:        ``[d_vocab, d_model]`` token embedding; ``W_in``: ``[d_in, d_model]``.
    W_pos:      ``[n_ctx, d_model]`` learned positional embedding.
    W_U, b_U:   ``[d_model, d_out]``, ``[d_out]`` unembedding.
    MLP W_in, b_in, W_out, b_out: ``[d_model, d_mlp]``, ``[d_mlp]``, ``[d_mlp, d_model]``,
                ``[d_model]``.
    masks:      causal (``is_causal``), ``key_padding_mask [batch, key_pos]`` and ``attn_mask
                [batch, query_pos, key_pos]`` (any per-sequence pattern, e.g. a vertex of a
                cycle attends only to its neighbours), True = visible, combined by logical and
                (:mod:`dynascope.nn.attention`).

Forward (pre-LN, as GPT-2)::

    x = embed(input) + W_pos[:pos]
    for block in blocks:
        x = x + attn(ln1(x))
        x = x + mlp(ln2(x))          # skipped in attention-only blocks
    out = ln_final(x) @ W_U + b_U     # ln1, ln2, ln_final are identities when use_ln=False

Everything right-multiplies (``x @ W``); papers usually write the transposes.

References:
    Vaswani et al. (2017), "Attention Is All You Need", arXiv 1706.03762.
    Radford et al. (2019), "Language Models are Unsupervised Multitask Learners" (GPT-2:
        pre-LN, N(0, 0.02^2) embeddings).
    Xiong et al. (2020), "On Layer Normalization in the Transformer Architecture",
        arXiv 2002.04745 (pre-LN).
    Elhage et al. (2021), "A Mathematical Framework for Transformer Circuits"
        (attention-only transformers, residual-stream view).
    von Oswald et al. (2025), "Learning Randomized Algorithms with Transformers", ICLR,
        arXiv 2408.10818, sec. 4.2 (neighbour-only attention through ``attn_mask``).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import AttentionKind, MultiHeadAttention

__all__ = ["MLP", "Transformer", "TransformerBlock"]

Activation = Literal["gelu", "relu"]
_ACTIVATIONS = {"gelu": F.gelu, "relu": F.relu}
_POSITIONALS = ("learned", "none")


class MLP(nn.Module):
    """Two-layer perceptron ``act(x @ W_in + b_in) @ W_out + b_out`` applied per position.

    Initialisation: ``W_in ~ N(0, 1/d_model)``, ``W_out ~ N(0, 1/d_mlp)`` (fan-in), biases 0.

    Args:
        d_model: input and output width.
        d_mlp: hidden width.
        activation: ``"gelu"`` (exact, erf form) or ``"relu"``.
    Raises:
        ValueError: if ``d_model`` or ``d_mlp`` is not positive, or ``activation`` is unknown.
    """

    def __init__(self, d_model: int, d_mlp: int, *, activation: Activation = "gelu") -> None:
        super().__init__()
        if d_model <= 0 or d_mlp <= 0:
            raise ValueError(
                f"d_model and d_mlp must be positive (got d_model={d_model}, d_mlp={d_mlp})"
            )
        if activation not in _ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {tuple(_ACTIVATIONS)} (got activation={activation!r})"
            )
        self.d_model = d_model
        self.d_mlp = d_mlp
        self.activation = activation
        self.W_in = nn.Parameter(torch.empty(d_model, d_mlp))
        self.b_in = nn.Parameter(torch.zeros(d_mlp))
        self.W_out = nn.Parameter(torch.empty(d_mlp, d_model))
        self.b_out = nn.Parameter(torch.zeros(d_model))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw ``W_in ~ N(0, 1/d_model)``, ``W_out ~ N(0, 1/d_mlp)``; biases 0."""
        nn.init.normal_(self.W_in, std=1.0 / math.sqrt(self.d_model))
        nn.init.normal_(self.W_out, std=1.0 / math.sqrt(self.d_mlp))
        nn.init.zeros_(self.b_in)
        nn.init.zeros_(self.b_out)

    def forward(self, x: Tensor) -> Tensor:
        """``[..., d_model] -> [..., d_model]``."""
        hidden = _ACTIVATIONS[self.activation](x @ self.W_in + self.b_in)  # [..., d_mlp]
        return hidden @ self.W_out + self.b_out


def _norm(d_model: int, use_ln: bool) -> nn.Module:
    # nn.LayerNorm initialises its gain to 1 and its bias to 0.
    return nn.LayerNorm(d_model) if use_ln else nn.Identity()


class TransformerBlock(nn.Module):
    """Pre-LN residual block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``.

    Args:
        d_model, n_heads, d_head: see :class:`MultiHeadAttention`.
        d_mlp: MLP hidden width; ``None`` or 0 gives an attention-only block (``mlp`` and
            ``ln2`` are ``None``).
        attention: ``"softmax"``, ``"linear"`` or another attention of
            :class:`MultiHeadAttention`.
        is_causal: causal attention mask.
        use_bias: attention biases ``b_Q, b_K, b_V, b_O`` (the MLP always has biases).
        use_ln: LayerNorm before attention and MLP; identities when False.
        activation: MLP activation.
    Raises:
        ValueError: as :class:`MultiHeadAttention` and :class:`MLP`; if ``d_mlp`` is negative.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_head: int | None = None,
        *,
        d_mlp: int | None = None,
        attention: AttentionKind = "softmax",
        is_causal: bool = True,
        use_bias: bool = False,
        use_ln: bool = True,
        activation: Activation = "gelu",
    ) -> None:
        super().__init__()
        if d_mlp is not None and d_mlp < 0:
            raise ValueError(f"d_mlp must be None, 0 or positive (got d_mlp={d_mlp})")
        self.ln1 = _norm(d_model, use_ln)
        self.attn = MultiHeadAttention(
            d_model, n_heads, d_head, attention=attention, is_causal=is_causal, use_bias=use_bias
        )
        self.ln2: nn.Module | None = None
        self.mlp: MLP | None = None
        if d_mlp:
            self.ln2 = _norm(d_model, use_ln)
            self.mlp = MLP(d_model, d_mlp, activation=activation)

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None = None,
        *,
        attn_mask: Tensor | None = None,
    ) -> Tensor:
        """``[batch, pos, d_model] -> [batch, pos, d_model]``; masks as in the attention."""
        x = x + self.attn(self.ln1(x), key_padding_mask=key_padding_mask, attn_mask=attn_mask)
        if self.mlp is not None:
            x = x + self.mlp(self.ln2(x))
        return x


class Transformer(nn.Module):
    """Embedding, ``n_layers`` pre-LN blocks, final LayerNorm and unembedding.

    Give exactly one of ``d_vocab`` (token ids ``[batch, pos]``, embedded by ``W_E``) or ``d_in``
    (vectors ``[batch, pos, d_in]``, embedded by ``x @ W_in``, no bias). Attention layers live at
    ``blocks.{i}.attn``, so ``dynascope.attention_views`` names them ``"blocks.0.attn"``, ...

    Initialisation (documented so runs are comparable):
        ``W_E, W_pos ~ N(0, 0.02^2)`` (GPT-2); ``W_in ~ N(0, 1/d_in)`` (fan-in, unit-scale
        inputs give unit-scale embeddings); ``W_U ~ N(0, 1/d_model)``, ``b_U = 0``;
        attention and MLP as in :class:`MultiHeadAttention` and :class:`MLP`; LayerNorm gain 1,
        bias 0. The unembedding is a plain parameter pair (not ``nn.Linear``) so that it
        right-multiplies like every other weight here.

    Args:
        n_layers: number of blocks (>= 1).
        d_model, n_heads, d_head: residual width, heads, head width (``d_head=None`` means
            ``d_model // n_heads``).
        d_mlp: MLP hidden width; ``None`` or 0 gives an attention-only model.
        d_vocab: number of token ids, for token inputs.
        d_in: input vector width, for vector inputs.
        d_out: output width.
        n_ctx: largest sequence length accepted.
        positional: ``"learned"`` adds ``W_pos[:pos]``; ``"none"`` adds nothing.
        attention: ``"softmax"``, ``"linear"`` or another attention of
            :class:`MultiHeadAttention`.
        is_causal: causal attention (decoder); False for a bidirectional encoder, or with an
            ``attn_mask`` that is the whole mask.
        use_bias: attention biases.
        use_ln: LayerNorms (``ln1``, ``ln2``, ``ln_final``); identities when False.
        activation: MLP activation, ``"gelu"`` or ``"relu"``.
    Raises:
        ValueError: if not exactly one of ``d_vocab``, ``d_in`` is given; if ``n_layers``,
            ``d_out``, ``n_ctx``, ``d_vocab`` or ``d_in`` is not positive; if ``positional`` is
            unknown; and as :class:`TransformerBlock`.
    """

    def __init__(
        self,
        *,
        n_layers: int,
        d_model: int,
        n_heads: int,
        d_head: int | None = None,
        d_mlp: int | None = None,
        d_vocab: int | None = None,
        d_in: int | None = None,
        d_out: int,
        n_ctx: int,
        positional: Literal["learned", "none"] = "learned",
        attention: AttentionKind = "softmax",
        is_causal: bool = True,
        use_bias: bool = False,
        use_ln: bool = True,
        activation: Activation = "gelu",
    ) -> None:
        super().__init__()
        if (d_vocab is None) == (d_in is None):
            raise ValueError(
                "exactly one of d_vocab (token inputs) and d_in (vector inputs) must be given "
                f"(got d_vocab={d_vocab}, d_in={d_in})"
            )
        for name, value in (
            ("n_layers", n_layers),
            ("d_out", d_out),
            ("n_ctx", n_ctx),
            ("d_vocab", d_vocab),
            ("d_in", d_in),
        ):
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive (got {name}={value})")
        if positional not in _POSITIONALS:
            raise ValueError(
                f"positional must be one of {_POSITIONALS} (got positional={positional!r})"
            )
        self.n_layers = n_layers
        self.d_model = d_model
        self.d_vocab = d_vocab
        self.d_in = d_in
        self.d_out = d_out
        self.n_ctx = n_ctx
        self.positional = positional

        self.W_E: nn.Parameter | None = None
        self.W_in: nn.Parameter | None = None
        if d_vocab is not None:
            self.W_E = nn.Parameter(torch.empty(d_vocab, d_model))
        else:
            self.W_in = nn.Parameter(torch.empty(d_in, d_model))
        self.W_pos: nn.Parameter | None = None
        if positional == "learned":
            self.W_pos = nn.Parameter(torch.empty(n_ctx, d_model))
        self.blocks = nn.ModuleList(
            TransformerBlock(
                d_model,
                n_heads,
                d_head,
                d_mlp=d_mlp,
                attention=attention,
                is_causal=is_causal,
                use_bias=use_bias,
                use_ln=use_ln,
                activation=activation,
            )
            for _ in range(n_layers)
        )
        self.ln_final = _norm(d_model, use_ln)
        self.W_U = nn.Parameter(torch.empty(d_model, d_out))
        self.b_U = nn.Parameter(torch.zeros(d_out))
        self._reset_own_parameters()

    def _reset_own_parameters(self) -> None:
        """Embeddings ``N(0, 0.02^2)``, ``W_in ~ N(0, 1/d_in)``, ``W_U ~ N(0, 1/d_model)``."""
        if self.W_E is not None:
            nn.init.normal_(self.W_E, std=0.02)
        if self.W_in is not None:
            nn.init.normal_(self.W_in, std=1.0 / math.sqrt(self.W_in.shape[0]))
        if self.W_pos is not None:
            nn.init.normal_(self.W_pos, std=0.02)
        nn.init.normal_(self.W_U, std=1.0 / math.sqrt(self.d_model))
        nn.init.zeros_(self.b_U)

    def embed(self, inputs: Tensor) -> Tensor:
        """Embed token ids ``[batch, pos]`` or vectors ``[batch, pos, d_in]`` into the stream.

        Returns:
            ``[batch, pos, d_model]``: embedding plus ``W_pos[:pos]`` (if positional="learned").
        Raises:
            ValueError: if the input's shape or dtype does not match the embedding, or
                ``pos > n_ctx``.
        """
        if self.W_E is not None:
            if inputs.ndim != 2 or inputs.dtype != torch.long:
                raise ValueError(
                    "token inputs must be a long tensor [batch, pos] "
                    f"(got {inputs.dtype}, {tuple(inputs.shape)})"
                )
        elif inputs.ndim != 3 or inputs.shape[-1] != self.d_in:
            raise ValueError(
                f"vector inputs must have shape [batch, pos, d_in={self.d_in}] "
                f"(got {tuple(inputs.shape)})"
            )
        pos = inputs.shape[1]
        if pos > self.n_ctx:
            raise ValueError(f"sequence length must be at most n_ctx={self.n_ctx} (got {pos})")
        x = self.W_E[inputs] if self.W_E is not None else inputs @ self.W_in
        if self.W_pos is not None:
            x = x + self.W_pos[:pos]
        return x  # [batch, pos, d_model]

    def forward(
        self,
        inputs: Tensor,
        key_padding_mask: Tensor | None = None,
        *,
        attn_mask: Tensor | None = None,
    ) -> Tensor:
        """Run the model.

        Args:
            inputs: token ids ``[batch, pos]`` (long) or vectors ``[batch, pos, d_in]``.
            key_padding_mask: optional bool ``[batch, pos]``, True = real token, False = padding.
            attn_mask: optional bool ``[batch, query_pos, key_pos]``, True where query ``i`` may
                see key ``j`` (e.g. a graph's neighbourhoods, with ``is_causal=False`` and
                ``positional="none"``); combined with the causal and padding masks.
        Returns:
            ``[batch, pos, d_out]`` (logits or predictions at every position).
        Raises:
            ValueError: as :meth:`embed`, and for a malformed ``key_padding_mask`` or
                ``attn_mask``.
        """
        x = self.embed(inputs)
        for block in self.blocks:
            x = block(x, key_padding_mask=key_padding_mask, attn_mask=attn_mask)
        return self.ln_final(x) @ self.W_U + self.b_U
