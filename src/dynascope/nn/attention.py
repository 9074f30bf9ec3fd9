"""Multi-head attention with per-head weights (softmax or linear).

Glossary (dimensions and symbols, TransformerLens names):
    batch:      number of sequences.
    pos:        sequence length; ``query_pos`` and ``key_pos`` index it on the two sides of a
                pattern (self-attention, so both run over the same ``pos`` positions).
    d_model:    width of the residual stream.
    n_heads:    number of attention heads.
    d_head:     width of one head's queries, keys and values (default ``d_model // n_heads``).
    W_Q, W_K, W_V: ``[n_heads, d_model, d_head]``; per head ``q = x @ W_Q[h] + b_Q[h]``.
    W_O:        ``[n_heads, d_head, d_model]``; head h writes ``z_h @ W_O[h]`` to the stream.
    b_Q, b_K, b_V: ``[n_heads, d_head]``; b_O: ``[d_model]`` (or ``None`` without biases).
    scale:      score multiplier, default ``1 / sqrt(d_head)``.
    attn_scores: ``scale * q_h k_h^T``, ``[batch, n_heads, query_pos, key_pos]``, before masking.
    pattern:    ``[batch, n_heads, query_pos, key_pos]``; softmax over ``key_pos`` of the masked
                scores (softmax attention) or the masked scores themselves (linear attention).
    W_QK = W_Q[h] @ W_K[h]^T, W_OV = W_V[h] @ W_O[h]: ``[d_model, d_model]``, rank <= d_head.

Everything right-multiplies (``x @ W``). Papers usually left-multiply and write the transposes
(``W_K^T W_Q``, ``W_O W_V``); those have the same singular values.

Output: ``sum_h pattern_h @ (x @ W_V[h] + b_V[h]) @ W_O[h] + b_O``.

Masks: with ``is_causal`` query ``i`` sees keys ``j <= i``; ``key_padding_mask[b, j]`` False
hides key ``j`` from every query of sequence ``b``; ``attn_mask[b, i, j]`` False hides key ``j``
from query ``i`` of sequence ``b`` (any pattern, e.g. graph neighbourhoods). The three combine by
logical and. A query that sees no key at all gets an all-zero pattern row (softmax attention,
matching PyTorch's fused kernel), so its output is ``b_O`` (:func:`masked_softmax`).

References:
    Vaswani et al. (2017), "Attention Is All You Need", arXiv 1706.03762, eq. (1) and sec. 3.2.2.
    Elhage et al. (2021), "A Mathematical Framework for Transformer Circuits",
        transformer-circuits.pub (per-head layout, W_QK and W_OV circuits).
    von Oswald et al. (2023), "Transformers learn in-context by gradient descent",
        arXiv 2212.07677 (linear self-attention).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd import forward_ad

from .capture import CapturePoint
from .hyla import MIXERS, RelativePositionBias, hypernetwork_output, rms_head

__all__ = ["MultiHeadAttention", "autodiff_transform_active", "masked_softmax"]

# Hypernetwork attentions (HYLA and its ablations, arXiv 2406.05816): see dynascope.nn.hyla.MIXERS.
AttentionKind = Literal[
    "softmax",
    "linear",
    "linear_rms_head",
    "hyla",
    "hyla_no_rms_head",
    "hyla_mlp_linear",
    "softmax_hyla",
]
_KINDS = tuple(MIXERS)


def autodiff_transform_active() -> bool:
    """True inside a ``torch.func`` transform (``jvp``, ``vjp``, ``grad``, ``vmap``, ``jacrev``,
    ``jacfwd``, ...) or a ``torch.autograd.forward_ad.dual_level()``.

    Attention then takes its explicit softmax path: ``F.scaled_dot_product_attention`` has no
    forward-AD rule on CPU (torch 2.13), and no batching rule for its backward, so under
    ``vmap`` torch loops over the batch one example at a time. torch exposes no public flag;
    this reads the open dual level (``torch.autograd.forward_ad._current_level``) and the
    functorch interpreter stack (``torch._C._functorch.peek_interpreter_stack``), and a test
    pins both against every entry point so a torch upgrade that moves them fails loudly. While
    ``torch.compile`` traces, the interpreter stack is not meaningful and only the dual level
    counts.
    """
    if forward_ad._current_level >= 0:
        return True
    return not torch.compiler.is_compiling() and (
        torch._C._functorch.peek_interpreter_stack() is not None
    )


def masked_softmax(
    scores: Tensor, mask: Tensor | None = None, *, every_row_visible: bool = False
) -> Tensor:
    """Softmax over ``key_pos`` of the visible keys: hidden keys get 0, a row with none is 0.

    ``pattern[..., i, j] = exp(s_ij) / sum_{j' visible} exp(s_ij')`` for a visible ``j``, else 0:
    the scores with ``-inf`` at hidden keys, softmaxed. A row with no visible key would be NaN;
    it gets zeros (as ``F.scaled_dot_product_attention``), with finite scores under the softmax so
    that no NaN reaches the gradients.

    Args:
        scores: ``[..., query_pos, key_pos]``, e.g. ``[batch, n_heads, query_pos, key_pos]``.
        mask: bool, broadcastable to ``scores``, True where a query may see a key; ``None``: every
            key is visible (a plain softmax).
        every_row_visible: the caller knows that every query sees at least one key (a causal
            mask: each query sees itself). The hidden keys are then added as a ``(0 | -inf)``
            bias: bitwise the same forward as the general path, with a cheaper backward.
    Returns:
        The pattern, the shape of ``scores`` broadcast with ``mask``; rows sum to 1, or to 0 where
        no key is visible.
    References:
        Vaswani et al. (2017), arXiv 1706.03762, eq. (1) (masking by ``-inf``, sec. 3.2.3).
    """
    if mask is None:
        return scores.softmax(dim=-1)
    if every_row_visible:
        hidden = torch.zeros(mask.shape, dtype=scores.dtype, device=scores.device)
        return (scores + hidden.masked_fill(~mask, float("-inf"))).softmax(dim=-1)
    visible = mask.any(dim=-1, keepdim=True)
    filled = scores.masked_fill(~mask, float("-inf")).masked_fill(~visible, 0.0)
    return filled.softmax(dim=-1).masked_fill(~visible, 0.0)


class MultiHeadAttention(nn.Module):
    """Self-attention with per-head ``W_Q, W_K, W_V, W_O`` and capture points for its pattern.

    Softmax attention: ``pattern_h = softmax(scale * q_h k_h^T)`` over the visible keys
    (:func:`masked_softmax`). Linear: ``pattern_h = scale * q_h k_h^T`` with hidden entries set
    to 0 (no softmax). Hypernetwork attentions (``hyla``, ``linear_rms_head``, ablations): see
    :mod:`dynascope.nn.hyla`; the pattern is the normalised score, the latent code of each
    (query, key) pair.

    When neither ``hook_attn_scores`` nor ``hook_pattern`` has a listener, softmax attention
    without ``attn_mask`` or relative position bias runs ``F.scaled_dot_product_attention``
    (fused, the pattern is never materialised); otherwise it computes scores and pattern
    explicitly. Both paths compute the same function. Inside ``torch.func`` transforms and
    forward-mode AD (:func:`autodiff_transform_active`) it always takes the explicit path: the CPU
    SDPA kernels have no forward-AD or vmap-of-backward rules. An ``attn_mask`` always takes the
    explicit path too: the studies that use one (cycle colouring, the grid world) were validated
    on it, and the fused kernel rounds differently.

    Initialisation: ``W_Q, W_K, W_V ~ N(0, 1/d_model)`` (unit-variance inputs give unit-variance
    q, k, v), ``W_O ~ N(0, 1/(n_heads * d_head))`` (fan-in of the concatenated heads), biases 0.

    Args:
        d_model: residual width.
        n_heads: number of heads.
        d_head: per-head width; ``None`` means ``d_model // n_heads``.
        attention: ``"softmax"``, ``"linear"``, or a hypernetwork attention of
            :data:`dynascope.nn.hyla.MIXERS` (``"hyla"``: RMSHead scores + ReLU value network;
            ``"linear_rms_head"``; the HYLA ablations).
        is_causal: if True, query ``i`` attends only to keys ``j <= i``.
        use_bias: if True, learn ``b_Q, b_K, b_V, b_O``; otherwise they are ``None``.
        scale: score multiplier; ``None`` means ``1 / sqrt(d_head)``.
        relative_position_buckets: if set, add a learned T5 relative position bias with this
            many buckets (= max distance) to the scores
            (:class:`dynascope.nn.hyla.RelativePositionBias`).
    Raises:
        ValueError: if ``d_model``, ``n_heads`` or ``d_head`` is not positive; if ``d_head`` is
            ``None`` and ``n_heads`` does not divide ``d_model``; if ``attention`` is not one of
            :data:`dynascope.nn.hyla.MIXERS`.
    References:
        Vaswani et al. (2017), arXiv 1706.03762; Elhage et al. (2021), "A Mathematical Framework
        for Transformer Circuits"; von Oswald et al. (2023), arXiv 2212.07677.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_head: int | None = None,
        *,
        attention: AttentionKind = "softmax",
        is_causal: bool = False,
        use_bias: bool = False,
        scale: float | None = None,
        relative_position_buckets: int | None = None,
    ) -> None:
        super().__init__()
        if d_model <= 0:
            raise ValueError(f"d_model must be positive (got d_model={d_model})")
        if n_heads <= 0:
            raise ValueError(f"n_heads must be positive (got n_heads={n_heads})")
        if d_head is None:
            if d_model % n_heads != 0:
                raise ValueError(
                    f"n_heads must divide d_model (got d_model={d_model}, n_heads={n_heads})"
                )
            d_head = d_model // n_heads
        if d_head <= 0:
            raise ValueError(f"d_head must be positive (got d_head={d_head})")
        if attention not in _KINDS:
            raise ValueError(f"attention must be one of {_KINDS} (got attention={attention!r})")
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_head = d_head
        self.attention = attention
        self.is_causal = is_causal
        self.use_bias = use_bias
        self.scale = 1.0 / math.sqrt(d_head) if scale is None else float(scale)
        # Optional T5 relative position bias added to the scores (n_buckets = max_distance).
        self.relative_position: RelativePositionBias | None = None
        if relative_position_buckets is not None:
            self.relative_position = RelativePositionBias(n_heads, relative_position_buckets)

        self.W_Q = nn.Parameter(torch.empty(n_heads, d_model, d_head))
        self.W_K = nn.Parameter(torch.empty(n_heads, d_model, d_head))
        self.W_V = nn.Parameter(torch.empty(n_heads, d_model, d_head))
        self.W_O = nn.Parameter(torch.empty(n_heads, d_head, d_model))
        self.b_Q: nn.Parameter | None
        self.b_K: nn.Parameter | None
        self.b_V: nn.Parameter | None
        self.b_O: nn.Parameter | None
        if use_bias:
            self.b_Q = nn.Parameter(torch.zeros(n_heads, d_head))
            self.b_K = nn.Parameter(torch.zeros(n_heads, d_head))
            self.b_V = nn.Parameter(torch.zeros(n_heads, d_head))
            self.b_O = nn.Parameter(torch.zeros(d_model))
        else:
            for name in ("b_Q", "b_K", "b_V", "b_O"):
                self.register_parameter(name, None)

        self.hook_attn_scores = CapturePoint()  # [batch, n_heads, query_pos, key_pos]
        self.hook_pattern = CapturePoint()  # [batch, n_heads, query_pos, key_pos]
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw ``W_Q, W_K, W_V ~ N(0, 1/d_model)``, ``W_O ~ N(0, 1/(n_heads d_head))``, b = 0."""
        std_in = 1.0 / math.sqrt(self.d_model)
        for W in (self.W_Q, self.W_K, self.W_V):
            nn.init.normal_(W, std=std_in)
        nn.init.normal_(self.W_O, std=1.0 / math.sqrt(self.n_heads * self.d_head))
        for b in (self.b_Q, self.b_K, self.b_V, self.b_O):
            if b is not None:
                nn.init.zeros_(b)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, n_heads={self.n_heads}, d_head={self.d_head}, "
            f"attention={self.attention!r}, is_causal={self.is_causal}, use_bias={self.use_bias}, "
            f"scale={self.scale:.4g}"
        )

    def _project(self, x: Tensor, W: Tensor, b: Tensor | None) -> Tensor:
        # x [batch, pos, d_model], W [n_heads, d_model, d_head] -> [batch, n_heads, pos, d_head]
        # (one fused [d_model, n_heads * d_head] product measured ~15% faster on S1's steps; not
        # adopted yet: it changes every transformer study's float32 rounding, not re-validated)
        out = torch.einsum("bpm,hmd->bhpd", x, W)
        if b is not None:
            out = out + b[:, None, :]
        return out

    def _mask(
        self, x: Tensor, key_padding_mask: Tensor | None, attn_mask: Tensor | None
    ) -> Tensor | None:
        """Bool ``[batch or 1, 1, query_pos, key_pos]``, True where a query may see a key."""
        pos = x.shape[1]
        masks = []
        if self.is_causal:
            masks.append(torch.ones(pos, pos, dtype=torch.bool, device=x.device).tril()[None, None])
        if key_padding_mask is not None:
            masks.append(key_padding_mask[:, None, None, :])  # [batch, 1, 1, key_pos]
        if attn_mask is not None:
            masks.append(attn_mask[:, None])  # [batch, 1, query_pos, key_pos]
        if not masks:
            return None
        mask = masks[0]
        for keep in masks[1:]:
            mask = mask & keep
        return mask

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None = None,
        *,
        attn_mask: Tensor | None = None,
        last_query: bool = False,
    ) -> Tensor:
        """Attend over the positions of ``x``.

        Args:
            x: ``[batch, pos, d_model]``.
            key_padding_mask: optional bool ``[batch, key_pos]``, True = keep (a real token),
                False = padding (hidden from every query). Note: the opposite of
                ``torch.nn.MultiheadAttention``'s convention.
            attn_mask: optional bool ``[batch, query_pos, key_pos]``, True where query ``i`` may
                see key ``j`` (the same convention; combined with ``is_causal`` and
                ``key_padding_mask`` by logical and).
            last_query: only the last position queries (over every key): the output's last
                row, ``[batch, 1, d_model]``, without computing the others.
        Returns:
            ``[batch, pos, d_model]`` (``[batch, 1, d_model]`` with ``last_query``).
        Raises:
            ValueError: if ``x`` is not ``[batch, pos, d_model]``; if ``key_padding_mask`` is not
                a bool tensor of shape ``[batch, pos]``; if ``attn_mask`` is not a bool tensor of
                shape ``[batch, pos, pos]``.
        """
        if x.ndim != 3 or x.shape[-1] != self.d_model:
            raise ValueError(
                f"x must have shape [batch, pos, d_model={self.d_model}] (got {tuple(x.shape)})"
            )
        if key_padding_mask is not None and (
            key_padding_mask.dtype != torch.bool or key_padding_mask.shape != x.shape[:2]
        ):
            raise ValueError(
                "key_padding_mask must be a bool tensor of shape [batch, key_pos] = "
                f"{tuple(x.shape[:2])} (got {key_padding_mask.dtype}, "
                f"{tuple(key_padding_mask.shape)})"
            )
        batch, pos = x.shape[:2]
        if attn_mask is not None and (
            attn_mask.dtype != torch.bool or tuple(attn_mask.shape) != (batch, pos, pos)
        ):
            raise ValueError(
                "attn_mask must be a bool tensor of shape [batch, query_pos, key_pos] = "
                f"{(batch, pos, pos)} (got {attn_mask.dtype}, {tuple(attn_mask.shape)})"
            )
        q = self._project(x[:, -1:] if last_query else x, self.W_Q, self.b_Q)
        k = self._project(x, self.W_K, self.b_K)  # [batch, n_heads, pos, d_head]
        v = self._project(x, self.W_V, self.b_V)
        mask = self._mask(x, key_padding_mask, attn_mask)
        if last_query and mask is not None:
            mask = mask[..., -1:, :]

        listened = self.hook_attn_scores.has_listener or self.hook_pattern.has_listener
        if (
            self.attention == "softmax"
            and self.relative_position is None
            and attn_mask is None
            and not listened
            and not autodiff_transform_active()
        ):
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
            out = torch.einsum("bhpd,hdm->bpm", z, self.W_O)
        else:
            normalization, target_network = MIXERS[self.attention]
            scores = self.scale * q @ k.transpose(-1, -2)  # [batch, n_heads, query_pos, key_pos]
            if self.relative_position is not None:
                n_keys = scores.shape[-1]  # the last query_pos rows of the key_pos x key_pos grid
                bias = self.relative_position(n_keys, n_keys)[..., -scores.shape[-2] :, :]
                scores = scores + bias
            scores = self.hook_attn_scores(scores)
            if normalization == "softmax":
                # the causal mask alone leaves every query its own key
                only_causal = key_padding_mask is None and attn_mask is None
                pattern = masked_softmax(scores, mask, every_row_visible=only_causal)
            else:  # masked entries are 0 without a softmax (as the HYLA reference code)
                pattern = scores if mask is None else scores.masked_fill(~mask, 0.0)
                if normalization == "rms_head":
                    pattern = rms_head(pattern)
            pattern = self.hook_pattern(pattern)  # [batch, n_heads, query_pos, key_pos]
            out = hypernetwork_output(pattern, v, self.W_O, target_network)
        if self.b_O is not None:
            out = out + self.b_O
        return out
