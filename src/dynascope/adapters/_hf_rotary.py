"""Adapters for Hugging Face attention with rotary embeddings: Llama-style (``q_proj, k_proj,
v_proj, o_proj``, grouped K/V heads; Llama, Mistral, Qwen2) and fused ``qkv_proj`` (Phi-3,
partial RoPE). Layouts, the mask conventions and the references are in
:mod:`dynascope.adapters._hf`; transformers stays optional here too.
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor, nn

from ._hf import _check_no_past, _is_instance, _require_transformers_5, _softmax
from ._inputs import bind_inputs, project
from ._view import AttentionView, heads_from_rows

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
