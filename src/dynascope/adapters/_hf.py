"""Adapters for Hugging Face transformers: GPT-2 and Llama-style attention.

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

import inspect
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from ._inputs import bind_inputs, project
from ._view import AttentionView, heads_from_columns, heads_from_rows, slices

__all__ = [
    "eager_attention",
    "fused_qkv_view",
    "gpt2_pattern",
    "gpt2_view",
    "llama_pattern",
    "llama_view",
    "phi3_pattern",
]

_GPT2 = ("transformers.models.gpt2.modeling_gpt2", "GPT2Attention")
# Classes whose forward is LlamaAttention's (rotate-half RoPE, float32 eager softmax, mask as
# given); sliding windows arrive inside the mask. Pattern recomputation is limited to these.
_LLAMA_FAMILY = (
    ("transformers.models.llama.modeling_llama", "LlamaAttention"),
    ("transformers.models.mistral.modeling_mistral", "MistralAttention"),
    ("transformers.models.qwen2.modeling_qwen2", "Qwen2Attention"),
)
_LLAMA_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj")
# Fused-qkv classes whose forward is Phi3Attention's (partial rotate-half RoPE, float32 eager
# softmax, mask as given).
_PHI3_FAMILY = (("transformers.models.phi3.modeling_phi3", "Phi3Attention"),)


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


# ---------------------------------------------------------------------------------- Llama-style


def _is_llama_like(module: nn.Module) -> bool:
    if any(_is_instance(module, spec) for spec in _LLAMA_FAMILY):
        return True
    return (
        all(isinstance(getattr(module, n, None), nn.Linear) for n in _LLAMA_LINEARS)
        and isinstance(getattr(module, "head_dim", None), int)
        and isinstance(getattr(module, "num_key_value_groups", None), int)
    )


def llama_view(name: str, module: nn.Module) -> AttentionView | None:
    """Views of a Llama-style attention module's weights, else ``None``.

    Returns:
        ``W_Q, W_K, W_V: [n_heads, d_model, d_head]``, ``W_O: [n_heads, d_head, d_model]``,
        biases or ``None``; ``n_heads`` counts query heads, grouped K/V repeated (copies when
        grouped, views otherwise); ``scale = module.scaling``; ``rotary=True`` for the Llama
        family, and for other modules iff their forward takes ``position_embeddings``.
    Raises:
        ValueError: if the projections' widths disagree with ``head_dim`` and
            ``num_key_value_groups``.
    """
    if not _is_llama_like(module):
        return None
    q_proj, k_proj, v_proj, o_proj = (getattr(module, n) for n in _LLAMA_LINEARS)
    d_head, groups = module.head_dim, module.num_key_value_groups
    n_heads, n_kv = q_proj.out_features // d_head, k_proj.out_features // d_head
    if (
        n_heads * d_head != q_proj.out_features
        or n_kv * d_head != k_proj.out_features
        or (n_kv * groups != n_heads)
    ):
        raise ValueError(
            f"{name}: q_proj/k_proj widths must be n_heads*head_dim and n_kv_heads*head_dim with "
            f"n_heads = n_kv_heads*num_key_value_groups (got {q_proj.out_features}, "
            f"{k_proj.out_features}, head_dim={d_head}, num_key_value_groups={groups})"
        )

    def kv_heads(t: Tensor | None) -> Tensor | None:  # [n_kv, ...] -> [n_heads, ...]
        return t if t is None or groups == 1 else t.repeat_interleave(groups, dim=0)

    def bias_heads(linear: nn.Linear) -> Tensor | None:
        return None if linear.bias is None else linear.bias.unflatten(0, (-1, d_head))

    known = any(_is_instance(module, spec) for spec in _LLAMA_FAMILY)
    return AttentionView(
        name=name,
        W_Q=heads_from_rows(q_proj.weight, n_heads),
        W_K=kv_heads(heads_from_rows(k_proj.weight, n_kv)),
        W_V=kv_heads(heads_from_rows(v_proj.weight, n_kv)),
        W_O=o_proj.weight.T.unflatten(0, (n_heads, d_head)),
        b_Q=bias_heads(q_proj),
        b_K=kv_heads(bias_heads(k_proj)),
        b_V=kv_heads(bias_heads(v_proj)),
        b_O=o_proj.bias,
        module=module,
        scale=float(getattr(module, "scaling", d_head**-0.5)),
        rotary=known or "position_embeddings" in inspect.signature(module.forward).parameters,
        n_key_value_heads=n_kv,
    )


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE, rotate-half convention ``x cos + [-x2, x1] sin``; cos, sin: ``[batch, pos, d_rot]``.

    ``x: [batch, n_heads, pos, d_head]``; its first ``d_rot <= d_head`` dims are rotated
    (``x1, x2`` are their two halves) and the rest pass through (Phi-3's partial rotary).
    """
    d_rot = cos.shape[-1]
    x_rot, x_pass = x[..., :d_rot], x[..., d_rot:]
    x1, x2 = x_rot.chunk(2, dim=-1)
    rotated = x_rot * cos[:, None] + torch.cat((-x2, x1), dim=-1) * sin[:, None]
    return torch.cat((rotated, x_pass), dim=-1)


def llama_pattern(view: AttentionView, args: tuple, kwargs: dict) -> Tensor:
    """Recompute a Llama-family attention pattern from its forward's inputs.

    Args:
        view: the module's view.
        args, kwargs: the forward's inputs: ``hidden_states: [batch, pos, d_model]``,
            ``position_embeddings = (cos, sin)``, each ``[batch or 1, pos, d_head]``,
            ``attention_mask``, ``cache``.
    Returns:
        ``[batch, n_heads, query_pos, key_pos]`` in the hidden states' dtype, before dropout (the
        eager kernel's softmax runs in float32, so this one does too).
    Raises:
        ValueError: if the module is not of a class listed in ``_LLAMA_FAMILY`` (its forward may
            differ); if ``position_embeddings`` is missing; if a KV cache already holds
            positions for this layer; for an unknown mask form; if transformers < 5.
    """
    return _rotary_pattern(view, args, kwargs, _LLAMA_FAMILY, "Llama-style")


def _rotary_pattern(
    view: AttentionView, args: tuple, kwargs: dict, family: tuple, layout: str
) -> Tensor:
    """The Llama / Phi-3 pattern: RoPE on q and k, float32 eager softmax, mask as given."""
    module = view.module
    if not any(_is_instance(module, spec) for spec in family):
        raise ValueError(
            f"capture_patterns recomputes {layout} patterns only for "
            f"{', '.join(cls for _, cls in family)} (got {type(module).__name__}, whose "
            "forward may differ); register an adapter with its own pattern function"
        )
    _require_transformers_5(module)
    inputs = bind_inputs(module, args, kwargs)
    if inputs.get("position_embeddings") is None:
        raise ValueError(
            f"{type(module).__name__} was called without position_embeddings=(cos, sin); "
            "capture_patterns needs them to apply RoPE"
        )
    _check_no_past(module, inputs)
    x = inputs["hidden_states"]
    cos, sin = inputs["position_embeddings"]
    q = _rotate(project(x, view.W_Q, view.b_Q), cos, sin)  # [batch, n_heads, pos, d_head]
    k = _rotate(project(x, view.W_K, view.b_K), cos, sin)
    scores = (q @ k.transpose(-1, -2)) * view.scale
    eager = module.config._attn_implementation == "eager"
    is_causal = inputs.get("is_causal", module.is_causal)
    pattern = _softmax(
        scores, inputs.get("attention_mask"), eager=eager, is_causal=is_causal, float32=eager
    )
    return pattern.to(x.dtype)


# ------------------------------------------------------------------------- fused qkv (Phi-3)


def _is_fused_qkv(module: nn.Module) -> bool:
    if any(_is_instance(module, spec) for spec in _PHI3_FAMILY):
        return True
    return (
        all(isinstance(getattr(module, n, None), nn.Linear) for n in ("qkv_proj", "o_proj"))
        and isinstance(getattr(module, "head_dim", None), int)
        and isinstance(getattr(module, "num_key_value_heads", None), int)
    )


def fused_qkv_view(name: str, module: nn.Module) -> AttentionView | None:
    """Views of a fused-``qkv_proj`` attention module's weights (Phi-3 style), else ``None``.

    Returns:
        ``W_Q, W_K, W_V: [n_heads, d_model, d_head]``, ``W_O: [n_heads, d_head, d_model]``,
        biases or ``None``; ``n_heads = o_proj.in_features / head_dim`` counts query heads,
        grouped K/V repeated (copies when grouped, views of ``qkv_proj`` otherwise);
        ``scale = module.scaling``; ``rotary=True`` for Phi-3, and for other modules iff their
        forward takes ``position_embeddings``.
    Raises:
        ValueError: if ``qkv_proj``'s width is not ``(n_heads + 2 n_key_value_heads) head_dim``
            or ``n_key_value_heads`` does not divide ``n_heads``.
    """
    if not _is_fused_qkv(module):
        return None
    qkv, o_proj = module.qkv_proj, module.o_proj
    d_head, n_kv = module.head_dim, module.num_key_value_heads
    n_heads = o_proj.in_features // d_head
    if (
        n_heads * d_head != o_proj.in_features
        or qkv.out_features != (n_heads + 2 * n_kv) * d_head
        or n_kv < 1
        or n_heads % n_kv
    ):
        raise ValueError(
            f"{name}: qkv_proj width must be (n_heads + 2*num_key_value_heads)*head_dim with "
            f"n_heads = o_proj.in_features/head_dim a multiple of num_key_value_heads (got "
            f"{qkv.out_features}, o_proj.in_features={o_proj.in_features}, head_dim={d_head}, "
            f"num_key_value_heads={n_kv})"
        )
    groups, widths = n_heads // n_kv, [n_heads * d_head, n_kv * d_head, n_kv * d_head]
    W_q, W_k, W_v = qkv.weight.split(widths, dim=0)  # [width, d_model] each, views
    b_q, b_k, b_v = (None,) * 3 if qkv.bias is None else qkv.bias.split(widths)

    def kv_heads(t: Tensor | None) -> Tensor | None:  # [n_kv, ...] -> [n_heads, ...]
        return t if t is None or groups == 1 else t.repeat_interleave(groups, dim=0)

    def bias_heads(b: Tensor | None) -> Tensor | None:
        return None if b is None else b.unflatten(0, (-1, d_head))

    known = any(_is_instance(module, spec) for spec in _PHI3_FAMILY)
    return AttentionView(
        name=name,
        W_Q=heads_from_rows(W_q, n_heads),
        W_K=kv_heads(heads_from_rows(W_k, n_kv)),
        W_V=kv_heads(heads_from_rows(W_v, n_kv)),
        W_O=o_proj.weight.T.unflatten(0, (n_heads, d_head)),
        b_Q=bias_heads(b_q),
        b_K=kv_heads(bias_heads(b_k)),
        b_V=kv_heads(bias_heads(b_v)),
        b_O=o_proj.bias,
        module=module,
        scale=float(getattr(module, "scaling", d_head**-0.5)),
        rotary=known or "position_embeddings" in inspect.signature(module.forward).parameters,
        n_key_value_heads=n_kv,
    )


def phi3_pattern(view: AttentionView, args: tuple, kwargs: dict) -> Tensor:
    """Recompute a ``Phi3Attention`` pattern from its forward's inputs (as :func:`llama_pattern`,
    with the partial rotary of ``cos.shape[-1] <= d_head`` dims).

    Returns:
        ``[batch, n_heads, query_pos, key_pos]`` in the hidden states' dtype, before dropout.
    Raises:
        ValueError: as :func:`llama_pattern`, for modules not of a class in ``_PHI3_FAMILY``.
    """
    return _rotary_pattern(view, args, kwargs, _PHI3_FAMILY, "fused-qkv")


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
