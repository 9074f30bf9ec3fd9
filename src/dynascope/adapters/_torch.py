"""Adapter for ``torch.nn.MultiheadAttention``: its weights as views, its pattern recomputed.

Source layout (``nn.Linear`` convention, ``y = x @ weight.T + bias``; weights are ``[out, in]``):
    packed (``_qkv_same_embed_dim``, i.e. ``kdim == vdim == embed_dim``):
        ``in_proj_weight: [3 d_model, d_model]``, rows Q | K | V, each head-major
        (rows ``h d_head : (h + 1) d_head`` belong to head ``h``).
    separate (``kdim`` or ``vdim`` differs from ``embed_dim``):
        ``q_proj_weight: [d_model, d_model]``, ``k_proj_weight: [d_model, d_key]``,
        ``v_proj_weight: [d_model, d_value]``.
    ``in_proj_bias: [3 d_model]`` (Q | K | V) or ``None``; ``out_proj``: ``nn.Linear``,
    ``weight: [d_model, d_model]`` (columns head-major), ``bias: [d_model]`` or ``None``.

Every view field is a view of these parameters (no copy). The score scale is applied to q
inside the kernel (``q * sqrt(1 / d_head)``), never folded into the weights. With
``add_bias_kv`` the learned extra key/value (``bias_k``, ``bias_v``) are not part of the view;
the recomputed pattern includes their key position, as the module's own weights do.

Pattern recomputation follows the module's ``need_weights=True`` path: per head
``softmax(q_scaled k^T + attn_mask + key_padding_mask)``, bool masks turned into ``-inf`` where
True (not allowed), float masks added. ``is_causal`` is only a hint in torch: the ``attn_mask``
that must accompany it decides. Rows with no allowed key are NaN, as in the module. With
``need_weights=False`` torch may run a fused kernel; it computes the same function.
``nn.TransformerEncoderLayer``'s fused inference path, which would skip ``self_attn``, is not
taken while any submodule has hooks (torch checks), so capture sees every encoder layer.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._inputs import bind_inputs, project
from ._view import AttentionView, heads_from_rows, slices

__all__ = ["multihead_attention_pattern", "multihead_attention_view", "no_mha_fastpath"]


@contextmanager
def no_mha_fastpath(model: nn.Module) -> Iterator[None]:
    """Turn off ``nn.MultiheadAttention``'s fused inference fast path while ``model`` has one.

    The fast path (``aten::_native_multi_head_attention``, taken in eval mode) has no
    forward-AD rule; without it a ``need_weights=True`` call (the default) computes its softmax
    explicitly. ``need_weights=False`` calls (``nn.TransformerEncoderLayer``) still go through
    ``F.scaled_dot_product_attention``. The global flag
    (``torch.backends.mha.set_fastpath_enabled``) is restored on exit, also on errors.
    """
    if not any(isinstance(m, nn.MultiheadAttention) for m in model.modules()):
        yield
        return
    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(enabled)


def multihead_attention_view(name: str, module: nn.Module) -> AttentionView | None:
    """Views of a ``torch.nn.MultiheadAttention``'s weights, or ``None`` for other modules.

    Returns:
        ``W_Q: [n_heads, d_model, d_head]``, ``W_K: [n_heads, d_key, d_head]``,
        ``W_V: [n_heads, d_value, d_head]``, ``W_O: [n_heads, d_head, d_model]``, biases
        ``[n_heads, d_head]`` / ``[d_model]`` or ``None``; all share storage with the module.
        ``scale = sqrt(1 / d_head)``, as the module computes it.
    """
    if not isinstance(module, nn.MultiheadAttention):
        return None
    n_heads = module.num_heads
    if module._qkv_same_embed_dim:
        W_q, W_k, W_v = slices(module.in_proj_weight, module.embed_dim)  # views, rows Q | K | V
    else:
        W_q, W_k, W_v = module.q_proj_weight, module.k_proj_weight, module.v_proj_weight
    if module.in_proj_bias is None:
        b_Q = b_K = b_V = None
    else:
        b_Q, b_K, b_V = (
            b.unflatten(0, (n_heads, -1)) for b in slices(module.in_proj_bias, module.embed_dim)
        )
    return AttentionView(
        name=name,
        W_Q=heads_from_rows(W_q, n_heads),
        W_K=heads_from_rows(W_k, n_heads),
        W_V=heads_from_rows(W_v, n_heads),
        # out_proj.weight: [d_model, n_heads * d_head] -> [n_heads, d_head, d_model]
        W_O=module.out_proj.weight.T.unflatten(0, (n_heads, -1)),
        b_Q=b_Q,
        b_K=b_K,
        b_V=b_V,
        b_O=module.out_proj.bias,
        module=module,
        scale=math.sqrt(1.0 / module.head_dim),  # the kernel's own expression, bit for bit
    )


def _canonical(mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """Bool masks (True = not allowed) -> float with ``-inf`` there; float masks unchanged."""
    if mask is None or mask.is_floating_point():
        return mask
    return torch.zeros_like(mask, dtype=dtype).masked_fill_(mask, float("-inf"))


def _additive_mask(
    inputs: dict[str, Any], batch: int, n_heads: int, n_extra: int, dtype: torch.dtype
) -> Tensor | None:
    """Merged ``attn_mask + key_padding_mask``, broadcastable to the scores, or ``None``."""
    attn_mask = _canonical(inputs.get("attn_mask"), dtype)
    padding = _canonical(inputs.get("key_padding_mask"), dtype)
    mask = None
    if attn_mask is not None:
        if attn_mask.dim() == 2:  # [query_pos, key_pos]
            mask = attn_mask[None, None]
        else:  # [batch * n_heads, query_pos, key_pos], batch-major
            mask = attn_mask.unflatten(0, (batch, n_heads))
    if padding is not None:
        padding = padding.reshape(batch, 1, 1, -1)  # [batch, key_pos]; unbatched: [key_pos]
        mask = padding if mask is None else mask + padding
    if mask is not None and n_extra:
        mask = F.pad(mask, (0, n_extra))  # the appended keys are always visible
    return mask


def multihead_attention_pattern(view: AttentionView, args: tuple, kwargs: dict) -> Tensor:
    """Recompute a ``torch.nn.MultiheadAttention`` pattern from its forward's inputs.

    Args:
        view: the module's view (``view.module`` is the module).
        args, kwargs: the forward's inputs: ``query``, ``key`` (``[batch, pos, d]`` with
            ``batch_first``, ``[pos, batch, d]`` without, ``[pos, d]`` unbatched),
            ``key_padding_mask``, ``attn_mask``, ``is_causal``.
    Returns:
        ``[batch, n_heads, query_pos, key_pos]`` (batch 1 for unbatched inputs; key_pos counts
        the ``add_bias_kv`` / ``add_zero_attn`` keys), what ``need_weights=True,
        average_attn_weights=False`` returns, before dropout.
    Raises:
        ValueError: if ``query`` or ``key`` is a nested tensor.
    """
    module = view.module
    inputs = bind_inputs(module, args, kwargs)
    query, key = inputs["query"], inputs["key"]
    if query.is_nested or key.is_nested:
        raise ValueError(
            "capture_patterns cannot read nested-tensor inputs of torch.nn.MultiheadAttention "
            "(got a nested query or key); pass padded tensors and a key_padding_mask"
        )
    if query.dim() == 2:  # unbatched: [pos, d]
        query, key = query[None], key[None]
    elif not module.batch_first:  # [pos, batch, d] -> [batch, pos, d]
        query, key = query.transpose(0, 1), key.transpose(0, 1)
    batch = query.shape[0]
    q = project(query, view.W_Q, view.b_Q) * view.scale  # [batch, n_heads, query_pos, d_head]
    k = project(key, view.W_K, view.b_K)  # [batch, n_heads, key_pos, d_head]
    extra = []
    if module.bias_k is not None:  # [1, 1, d_model], head-major
        bias_k = module.bias_k.reshape(1, view.n_heads, 1, view.d_head)
        extra.append(bias_k.expand(batch, -1, -1, -1))
    if module.add_zero_attn:
        extra.append(k.new_zeros(batch, view.n_heads, 1, view.d_head))
    if extra:
        k = torch.cat([k, *extra], dim=2)
    scores = q @ k.transpose(-1, -2)  # [batch, n_heads, query_pos, key_pos]
    mask = _additive_mask(inputs, batch, view.n_heads, len(extra), q.dtype)
    if mask is not None:
        scores = scores + mask
    return scores.softmax(dim=-1)
