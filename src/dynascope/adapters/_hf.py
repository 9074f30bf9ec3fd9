"""Adapters for Hugging Face transformers: GPT-2 here, Llama-style and fused-qkv attention in
:mod:`._hf_rotary` (the layouts of all three are described here).

transformers stays optional: its classes are looked up in ``sys.modules`` only, never imported.
A model whose attention classes were never imported cannot contain their instances.

GPT-2 (``GPT2Attention``), ``Conv1D`` convention ``y = x @ weight + bias`` (weights ``[in, out]``):
    ``c_attn.weight: [d_model, 3 d_model]``, columns Q | K | V, each head-major;
    cross-attention: ``q_attn.weight: [d_model, d_model]``, ``c_attn.weight: [d_model, 2 d_model]``
    (K | V, read from ``encoder_hidden_states``). ``c_proj.weight: [d_model, d_model]``, rows
    head-major. Score scale: ``scaling`` (``d_head**-0.5`` if ``scale_attn_weights``, else 1;
    divided by ``layer_idx + 1`` if ``scale_attn_by_inverse_layer_idx``). With
    ``reorder_and_upcast_attn`` the eager kernel forms scores and softmax in float32.
    All view fields are views of the parameters (no copy).

Llama-style (``LlamaAttention`` and any module with ``nn.Linear`` ``q_proj``, ``k_proj``,
``v_proj``, ``o_proj``, an int ``head_dim`` and ``num_key_value_groups``), ``nn.Linear``
convention (weights ``[out, in]``):
    ``q_proj.weight: [n_heads d_head, d_model]``; ``k_proj``, ``v_proj``:
    ``[n_key_value_heads d_head, d_model]``; ``o_proj.weight: [d_model, n_heads d_head]``.
    Grouped K/V heads are repeated (``repeat_interleave``) to the ``n_heads`` query heads, as
    ``repeat_kv`` does: query head ``h`` reads K/V head ``h // num_key_value_groups``. Those
    repeated ``W_K, W_V, b_K, b_V`` are copies when ``num_key_value_groups > 1``; everything
    else is a view. RoPE rotates q and k between ``x @ W_Q`` and the dot product, so the views
    carry ``rotary=True``.

Fused ``qkv_proj`` (``Phi3Attention`` and any module with ``nn.Linear`` ``qkv_proj`` and
``o_proj``, an int ``head_dim`` and ``num_key_value_heads``), ``nn.Linear`` convention:
    ``qkv_proj.weight: [(n_heads + 2 n_key_value_heads) d_head, d_model]``, rows Q | K | V,
    each head-major; ``o_proj.weight: [d_model, n_heads d_head]``. Grouped K/V heads are
    repeated as for Llama. Phi-3's RoPE may rotate only the first ``cos.shape[-1]`` dims of
    each head (``partial_rotary_factor``); the rest pass through.

Pattern recomputation follows transformers 5.x: ``attention_mask`` reaches the layer as an
additive float mask ``[batch, 1, query_pos, key_pos]`` (eager), a bool mask (True = attend;
sdpa), a 2-D padding mask (flash) or ``None``. ``None`` means no mask for the eager kernel and
causal masking (``is_causal`` layers, more than one query) for the others. Bool-masked rows with
no visible key give all-zero pattern rows, as ``scaled_dot_product_attention`` does.

References:
    Radford et al. (2019), "Language Models are Unsupervised Multitask Learners" (GPT-2).
    Touvron et al. (2023), "LLaMA", arXiv 2302.13971; Ainslie et al. (2023), "GQA",
        arXiv 2305.13245 (grouped K/V heads).
    Su et al. (2021), "RoFormer", arXiv 2104.09864, eq. (34) (rotary embeddings).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from ._inputs import bind_inputs, project
from ._view import AttentionView, heads_from_columns, slices

__all__ = [
    "eager_attention",
    "gpt2_pattern",
    "gpt2_view",
]

_GPT2 = ("transformers.models.gpt2.modeling_gpt2", "GPT2Attention")


def _is_instance(module: nn.Module, spec: tuple[str, str]) -> bool:
    source = sys.modules.get(spec[0])  # not imported -> no instance can exist
    cls = getattr(source, spec[1], None)
    return cls is not None and isinstance(module, cls)


def _require_transformers_5(module: nn.Module) -> None:
    version = getattr(sys.modules.get("transformers"), "__version__", "0")
    if int(version.split(".")[0]) < 5:
        raise ValueError(
            f"capture_patterns recomputes {type(module).__name__} patterns with the attention-mask "
            f"semantics of transformers>=5 (got transformers {version})"
        )


# ------------------------------------------------------------------------ attention backend


def _attention_configs(model: nn.Module) -> list[Any]:
    """Every distinct config of the Hugging Face (sub)models in ``model`` and their sub-configs,
    parents before children (so a restore in this order is exact)."""
    source = sys.modules.get("transformers.modeling_utils")  # not imported -> no HF model
    pretrained = getattr(source, "PreTrainedModel", None)
    if pretrained is None:
        return []
    seen: dict[int, Any] = {}
    queue = [m.config for m in model.modules() if isinstance(m, pretrained)]
    while queue:
        config = queue.pop(0)
        if id(config) in seen or not hasattr(config, "_attn_implementation"):
            continue
        seen[id(config)] = config
        queue.extend(getattr(config, key, None) for key in getattr(config, "sub_configs", {}))
    return list(seen.values())


@contextmanager
def eager_attention(model: nn.Module) -> Iterator[None]:
    """Run every Hugging Face (sub)model inside ``model`` with the eager attention kernel.

    transformers reads ``config._attn_implementation`` at each forward (masks and kernel), so
    setting it to ``"eager"`` switches SDPA / flash models to the explicit softmax; on exit
    every config gets its own previous value back, also when the block raises. A model without
    Hugging Face submodels is left alone.
    """
    configs = _attention_configs(model)
    saved = [config._attn_implementation for config in configs]
    try:
        for config in configs:
            config._attn_implementation = "eager"
        yield
    finally:
        for config, value in zip(configs, saved, strict=True):
            config._attn_implementation = value


# ---------------------------------------------------------------------------------------- GPT-2


def _gpt2_scale(module: nn.Module) -> float:
    scaling = getattr(module, "scaling", None)  # transformers 5.x precomputes it
    if scaling is not None:
        return float(scaling)
    scale = module.head_dim**-0.5 if module.scale_attn_weights else 1.0
    if module.scale_attn_by_inverse_layer_idx:
        scale /= float(module.layer_idx + 1)
    return scale


def gpt2_view(name: str, module: nn.Module) -> AttentionView | None:
    """Views of a ``GPT2Attention``'s weights (self- or cross-attention), else ``None``.

    Returns:
        ``W_Q, W_K, W_V: [n_heads, d_model, d_head]``, ``W_O: [n_heads, d_head, d_model]``,
        ``b_Q, b_K, b_V: [n_heads, d_head]``, ``b_O: [d_model]``, all views of ``c_attn``
        (and ``q_attn``) and ``c_proj``; ``scale`` = the module's score multiplier.
    """
    if not _is_instance(module, _GPT2):
        return None
    n_heads, d_model = module.num_heads, module.embed_dim
    W, b = module.c_attn.weight, module.c_attn.bias  # [d_model, 3 d_model] or [d_model, 2 d_model]
    if module.is_cross_attention:
        W_q, b_q = module.q_attn.weight, module.q_attn.bias
        (W_k, W_v), (b_k, b_v) = slices(W, d_model, dim=1), slices(b, d_model)
    else:
        (W_q, W_k, W_v), (b_q, b_k, b_v) = slices(W, d_model, dim=1), slices(b, d_model)
    return AttentionView(
        name=name,
        W_Q=heads_from_columns(W_q, n_heads),
        W_K=heads_from_columns(W_k, n_heads),
        W_V=heads_from_columns(W_v, n_heads),
        W_O=module.c_proj.weight.unflatten(0, (n_heads, -1)),  # rows head-major
        b_Q=b_q.unflatten(0, (n_heads, -1)),
        b_K=b_k.unflatten(0, (n_heads, -1)),
        b_V=b_v.unflatten(0, (n_heads, -1)),
        b_O=module.c_proj.bias,
        module=module,
        scale=_gpt2_scale(module),
    )


def gpt2_pattern(view: AttentionView, args: tuple, kwargs: dict) -> Tensor:
    """Recompute a ``GPT2Attention`` pattern from its forward's inputs.

    Args:
        view: the module's view.
        args, kwargs: the forward's inputs: ``hidden_states: [batch, pos, d_model]``,
            ``attention_mask``, ``encoder_hidden_states`` / ``encoder_attention_mask``
            (cross-attention), ``cache``.
    Returns:
        ``[batch, n_heads, query_pos, key_pos]`` in the hidden states' dtype, before dropout.
    Raises:
        ValueError: if a KV cache already holds positions for this layer; if the attention mask
            has a form other than those listed in the module docstring; if transformers < 5.
    """
    module = view.module
    _require_transformers_5(module)
    inputs = bind_inputs(module, args, kwargs)
    x = inputs["hidden_states"]
    eager = module.config._attn_implementation == "eager"
    if inputs.get("encoder_hidden_states") is not None:
        x_k, mask = inputs["encoder_hidden_states"], inputs.get("encoder_attention_mask")
    else:
        _check_no_past(module, inputs)
        x_k, mask = x, inputs.get("attention_mask")
    q = project(x, view.W_Q, view.b_Q)  # [batch, n_heads, query_pos, d_head]
    k = project(x_k, view.W_K, view.b_K)  # [batch, n_heads, key_pos, d_head]
    if eager and module.reorder_and_upcast_attn:
        q, k = q.float(), k.float()
    scores = (q @ k.transpose(-1, -2)) * view.scale
    is_causal = inputs.get("is_causal", module.is_causal)
    return _softmax(scores, mask, eager=eager, is_causal=is_causal).to(x.dtype)


# ----------------------------------------------------------------------------------------- masks


def _check_no_past(module: nn.Module, inputs: dict[str, Any]) -> None:
    cache = inputs.get("cache", inputs.get("past_key_values"))
    cache = getattr(cache, "self_attention_cache", cache)  # EncoderDecoderCache
    if cache is None or not hasattr(cache, "get_seq_length"):
        return
    past = int(cache.get_seq_length(module.layer_idx))
    if past:
        raise ValueError(
            f"capture_patterns recomputes {type(module).__name__} patterns from the layer's "
            f"inputs and cannot see the {past} cached positions; run with use_cache=False"
        )


def _softmax(
    scores: Tensor, mask: Any, *, eager: bool, is_causal: bool, float32: bool = False
) -> Tensor:
    """Masked softmax over ``key_pos`` of ``scores: [batch, n_heads, query_pos, key_pos]``."""
    dtype = torch.float32 if float32 else None
    query_pos, key_pos = scores.shape[-2:]
    if isinstance(mask, Tensor) and mask.dim() == 4 and mask.is_floating_point():
        return (scores + mask[..., :key_pos]).softmax(dim=-1, dtype=dtype)  # additive (eager)
    if mask is None:
        keep = None
    elif isinstance(mask, Tensor) and mask.dim() == 4 and mask.dtype == torch.bool:
        keep = mask[..., :key_pos]  # [batch, 1, query_pos, key_pos], True = attend (sdpa)
    elif isinstance(mask, Tensor) and mask.dim() == 2:
        keep = mask.bool()[:, None, None, :]  # [batch, key_pos] padding mask (flash)
    else:
        raise ValueError(
            "capture_patterns reads attention_mask as None, a 4-D float or bool tensor or a 2-D "
            f"padding tensor (got {type(mask).__name__} {getattr(mask, 'shape', '')}); "
            "use attn_implementation='eager' or 'sdpa'"
        )
    # Kernels other than eager mask causally themselves when given no mask or a padding mask.
    kernel_causal = (mask is None and not eager) or (keep is not None and mask.dim() == 2)
    if kernel_causal and is_causal and query_pos > 1:
        causal = torch.ones(query_pos, key_pos, dtype=torch.bool, device=scores.device).tril()
        keep = causal if keep is None else keep & causal
    if keep is None:
        return scores.softmax(dim=-1, dtype=dtype)
    visible = keep.any(dim=-1, keepdim=True)
    filled = scores.masked_fill(~keep, float("-inf")).masked_fill(~visible, 0.0)
    return filled.softmax(dim=-1, dtype=dtype).masked_fill(~visible, 0.0)
