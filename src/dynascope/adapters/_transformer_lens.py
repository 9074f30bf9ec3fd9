"""Adapter for TransformerLens attention (``HookedTransformer`` blocks' ``attn``).

TransformerLens keeps every head in the layout dynascope uses (DESIGN.md borrows it), so the
view is the module's own tensors, no reshaping:

    W_Q: [n_heads, d_model, d_head]      W_K, W_V: [n_heads, d_model, d_head]
    W_O: [n_heads, d_head, d_model]      b_Q, b_K, b_V: [n_heads, d_head]; b_O: [d_model]

``Attention`` exposes its parameters directly (views, shared storage); ``GroupedQueryAttention``
stores ``_W_K, _W_V, _b_K, _b_V`` per K/V head and its ``W_K`` etc. properties repeat them to the
query heads (``repeat_interleave``, copies), as its forward does. Scores are
``q k^T / attn_scale`` (``attn_scale = sqrt(d_head)`` with ``use_attn_scale``, times
``layer_id + 1`` with ``scale_attn_by_inverse_layer_idx``), so ``scale = 1 / attn_scale``.
Rotary layers (``positional_embedding_type == "rotary"``) carry ``rotary=True``.

The pattern is read from the module's own ``hook_pattern`` (a TransformerLens ``HookPoint``,
an identity module applied to the softmax output), not recomputed: :func:`is_pattern_hook`
tells :func:`dynascope.adapters.capture_patterns` that it may listen there.

transformer_lens stays optional: its classes are looked up in ``sys.modules`` only, never
imported. Tested against TransformerLens 3.x (4.0 removed ``HookedTransformer``).

References:
    Nanda & Bloom (2022), "TransformerLens", https://github.com/TransformerLensOrg/TransformerLens.
    Elhage et al. (2021), "A Mathematical Framework for Transformer Circuits" (layout).
"""

from __future__ import annotations

import sys

from torch import nn

from ._view import AttentionView, layout_weights

__all__ = ["is_pattern_hook", "transformer_lens_view"]

_ATTENTION = ("transformer_lens.components.abstract_attention", "AbstractAttention")
_HOOK_POINT = ("transformer_lens.hook_points", "HookPoint")


def _is_instance(module: object, spec: tuple[str, str]) -> bool:
    source = sys.modules.get(spec[0])  # not imported -> no instance can exist
    cls = getattr(source, spec[1], None)
    return cls is not None and isinstance(module, cls)


def transformer_lens_view(name: str, module: nn.Module) -> AttentionView | None:
    """The per-head weights of a TransformerLens attention module, else ``None``.

    Returns:
        The module's ``W_Q, W_K, W_V: [n_heads, d_model, d_head]``, ``W_O: [n_heads, d_head,
        d_model]``, biases ``[n_heads, d_head]`` / ``[d_model]``; ``scale = 1 / attn_scale``;
        ``rotary`` for rotary layers; ``n_key_value_heads`` for grouped-query attention.
    """
    if not _is_instance(module, _ATTENTION):
        return None
    cfg = module.cfg
    n_kv = getattr(cfg, "n_key_value_heads", None)
    return AttentionView(
        name=name,
        **layout_weights(module),
        module=module,
        scale=1.0 / float(module.attn_scale),
        rotary=cfg.positional_embedding_type == "rotary",
        n_key_value_heads=n_kv if n_kv is not None and n_kv != cfg.n_heads else None,
    )


def is_pattern_hook(module: object) -> bool:
    """True for a TransformerLens ``HookPoint`` (identity; its output is the pattern)."""
    return _is_instance(module, _HOOK_POINT)
