"""Adapters: where are W_Q, W_K, W_V, W_O (and the attention pattern) in a model?

Every adapter returns :class:`AttentionView` objects in the TransformerLens layout that all of
dynascope's instruments read::

    W_Q, W_K, W_V: [n_heads, d_model, d_head]      (right-multiplying: q = x @ W_Q[h])
    W_O:           [n_heads, d_head, d_model]
    b_Q, b_K, b_V: [n_heads, d_head] or None
    b_O:           [d_model] or None
    scale:         score multiplier (scores = scale * q k^T); rotary: RoPE between x @ W_Q and q k^T

The views are tensors that share storage with the model where the source layout allows it;
treat them as read-only. Each adapter knows its source layout by module class; none guesses
from shapes. Registered here, in this order:

    dynascope.nn.MultiHeadAttention   its own per-head parameters (the pattern: ``hook_pattern``)
    torch.nn.MultiheadAttention       ``_torch.py``: packed ``in_proj_weight`` or separate weights
    transformers.GPT2Attention        ``_hf.py``: fused ``Conv1D`` ``c_attn`` ``[in, out]``
    transformers.LlamaAttention-like  ``_hf_rotary.py``: ``q_proj/k_proj/v_proj/o_proj``, grouped
                                      K/V
    transformers.Phi3Attention-like   ``_hf_rotary.py``: fused ``qkv_proj`` (Q | K | V rows),
                                      ``o_proj``
    transformer_lens AbstractAttention ``_transformer_lens.py``: already this layout

:func:`capture_patterns` reads every attention pattern: through a ``hook_pattern``
:class:`~dynascope.nn.CapturePoint` (or TransformerLens ``HookPoint``) where the module has one,
otherwise by recomputing the
pattern from the inputs a forward pre-hook catches, with the adapter's pattern function (each
under a parity test against the module's own softmax). Register a new architecture with
:func:`register_adapter`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from dynascope.nn.attention import autodiff_transform_active as autodiff_transform_active
from dynascope.nn.capture import CapturePoint

from ._hf import eager_attention, gpt2_pattern, gpt2_view
from ._hf_rotary import fused_qkv_view, llama_pattern, llama_view, phi3_pattern
from ._torch import multihead_attention_pattern, multihead_attention_view, no_mha_fastpath
from ._transformer_lens import is_pattern_hook, transformer_lens_view
from ._view import AttentionView as AttentionView
from ._view import layout_weights

__all__ = [
    "AttentionView",
    "attention_views",
    "capture_patterns",
    "explicit_attention",
    "autodiff_transform_active",
    "register_adapter",
    "stack_views",
    "supported_architectures",
]

# An adapter: (qualified name, module) -> AttentionView, or None if it does not own the module.
Adapter = Callable[[str, nn.Module], "AttentionView | None"]
# A pattern function: (fresh view, forward args, forward kwargs) -> [batch, n_heads, q_pos, k_pos].
PatternFn = Callable[[AttentionView, tuple, dict], Tensor]
_ADAPTERS: dict[str, Adapter] = {}
_PATTERNS: dict[str, PatternFn] = {}


def register_adapter(architecture: str, adapter: Adapter, pattern: PatternFn | None = None) -> None:
    """Register ``adapter(name, module) -> AttentionView | None`` under ``architecture``.

    Args:
        architecture: a unique name, listed in error messages (``"torch.nn.MultiheadAttention"``).
        adapter: returns the module's view, or ``None`` for modules it does not own. It must
            recognise its modules by class, never by the shapes of their weights.
        pattern: optional ``pattern(view, args, kwargs) -> [batch, n_heads, query_pos,
            key_pos]``, the module's attention pattern recomputed from the inputs of one forward
            call; :func:`capture_patterns` needs it for modules without a ``hook_pattern``.
    Raises:
        ValueError: if ``architecture`` is already registered.
    """
    if architecture in _ADAPTERS:
        raise ValueError(f"adapter {architecture!r} is already registered")
    _ADAPTERS[architecture] = adapter
    if pattern is not None:
        _PATTERNS[architecture] = pattern


def supported_architectures() -> list[str]:
    """Names of the registered adapters, in registration order."""
    return list(_ADAPTERS)


def _dynascope_adapter(name: str, module: nn.Module) -> AttentionView | None:
    from dynascope.nn.attention import MultiHeadAttention

    if not isinstance(module, MultiHeadAttention):
        return None
    return AttentionView(name=name, **layout_weights(module), module=module, scale=module.scale)


register_adapter("dynascope.nn.MultiHeadAttention", _dynascope_adapter)
register_adapter(
    "torch.nn.MultiheadAttention", multihead_attention_view, multihead_attention_pattern
)
register_adapter("transformers.GPT2Attention", gpt2_view, gpt2_pattern)
register_adapter("transformers.LlamaAttention-like", llama_view, llama_pattern)
register_adapter("transformers.Phi3Attention-like", fused_qkv_view, phi3_pattern)
register_adapter("transformer_lens.AbstractAttention", transformer_lens_view)


def _owners(model: nn.Module) -> Iterator[tuple[str, nn.Module, str, AttentionView]]:
    """(qualified name, module, architecture, view) for every module an adapter owns."""
    for name, module in model.named_modules():
        for architecture, adapter in _ADAPTERS.items():
            view = adapter(name, module)
            if view is not None:
                yield name, module, architecture, view
                break


def _not_found(model: nn.Module) -> ValueError:
    return ValueError(
        f"no supported attention layer found in {type(model).__name__} "
        f"(supported: {', '.join(supported_architectures())}; "
        "register one with dynascope.adapters.register_adapter)"
    )


def attention_views(model: nn.Module) -> list[AttentionView]:
    """Find every attention layer of ``model`` and return its per-head views, in module order.

    Args:
        model: any ``nn.Module`` containing attention layers of a supported architecture.
    Returns:
        One :class:`AttentionView` per attention layer, ordered as ``model.named_modules()``.
    Raises:
        ValueError: if no supported attention layer is found; the message lists the supported
            architectures and how to register an adapter.
    """
    views = [view for _, _, _, view in _owners(model)]
    if not views:
        raise _not_found(model)
    return views


def stack_views(views: list[AttentionView], field: str) -> Tensor:
    """Stack one weight field over layers: ``[n_layers, n_heads, ...]``.

    Raises:
        ValueError: if the layers' shapes differ (stack per layer instead).
    """
    tensors = [getattr(v, field) for v in views]
    shapes = {tuple(t.shape) for t in tensors}
    if len(shapes) != 1:
        raise ValueError(f"{field} shapes differ across layers ({sorted(shapes)}); read per layer")
    return torch.stack(tensors)


@contextmanager
def capture_patterns(model: nn.Module) -> Iterator[dict[str, Tensor]]:
    """Record every attention layer's pattern, keyed by the attention module's qualified name.

    A module with a ``hook_pattern`` :class:`~dynascope.nn.CapturePoint` child (dynascope's own
    attention) or TransformerLens ``HookPoint`` child (``HookedTransformer``) is read through it.
    Every other module an adapter owns gets a forward pre-hook that catches its inputs and
    recomputes the pattern with the adapter's pattern function from a freshly read view, under
    ``torch.no_grad()``; a forward hook files it once the module's forward has succeeded (so the
    module's own input errors come first). The model's forward is not changed: no
    monkey-patching, no flags.

    Example::

        with capture_patterns(model) as patterns:
            model(x)
        patterns["transformer.h.0.attn"]  # [batch, n_heads, query_pos, key_pos]

    Args:
        model: any module containing attention layers of a supported architecture.
    Returns:
        A context manager yielding a dict layer name -> detached pattern
        ``[batch, n_heads, query_pos, key_pos]`` from the latest forward pass of that layer
        (before attention dropout); hooks removed on exit, also when the block raises.
    Raises:
        ValueError: if ``model`` has no attention layer of a supported architecture (the message
            lists them); if an adapter owning one of its layers registered no pattern function.
            During the block, the pattern function's errors (e.g. a KV cache holding past
            positions, which the layer's inputs do not show) are raised after the forward.
    """
    points: dict[str, nn.Module] = {}
    for name, module in model.named_modules():
        point = getattr(module, "hook_pattern", None)
        if isinstance(point, CapturePoint) or is_pattern_hook(point):
            points[name] = point
    recomputed = {
        name: (module, architecture)
        for name, module, architecture, _ in _owners(model)
        if name not in points
    }
    if not points and not recomputed:
        raise _not_found(model)
    missing = [f"{n} ({arch})" for n, (_, arch) in recomputed.items() if arch not in _PATTERNS]
    if missing:
        raise ValueError(
            f"no pattern function registered for {', '.join(missing)}; pass "
            "pattern= to dynascope.adapters.register_adapter"
        )

    store: dict[str, Tensor] = {}
    computed: dict[str, Tensor | Exception] = {}
    handles = []

    def point_hook(name: str):
        def hook(module: nn.Module, inputs: tuple, output: Tensor) -> None:
            store[name] = output.detach()

        return hook

    def pre_hook(name: str, architecture: str):
        adapter, pattern = _ADAPTERS[architecture], _PATTERNS[architecture]

        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            try:
                with torch.no_grad():
                    computed[name] = pattern(adapter(name, module), args, kwargs).detach()
            except Exception as error:  # raised after the forward, if the forward succeeds
                computed[name] = error

        return hook

    def post_hook(name: str):
        def hook(module: nn.Module, inputs: tuple, output: object) -> None:
            result = computed.pop(name, None)  # None: a re-entrant call already filed it
            if isinstance(result, Exception):
                raise result
            if result is not None:
                store[name] = result

        return hook

    try:
        for name, point in points.items():
            handles.append(point.register_forward_hook(point_hook(name)))
        for name, (module, architecture) in recomputed.items():
            handles.append(
                module.register_forward_pre_hook(pre_hook(name, architecture), with_kwargs=True)
            )
            handles.append(module.register_forward_hook(post_hook(name)))
        yield store
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def explicit_attention(model: nn.Module) -> Iterator[None]:
    """Inside the block, ``model``'s attention computes its softmax explicitly (no fused kernel).

    Forward-mode AD (``torch.func.jvp``, hence ``empirical_ntk(strategy="jvp_vjp")``,
    ``linearize`` and the NFK embedding) has no rule for ``F.scaled_dot_product_attention`` on
    CPU. dynascope's own attention switches itself while a forward-AD level is open
    (:func:`autodiff_transform_active`); Hugging Face models are switched here to their eager
    implementation (``config._attn_implementation = "eager"``), and ``torch.nn.MultiheadAttention``
    loses its fused inference fast path (``need_weights=False`` calls, as in
    ``nn.TransformerEncoderLayer``, still use SDPA and stay unsupported); the caller's settings
    come back on exit, also when the block raises. :func:`dynascope.probes.model_function` enters
    this block on every call, so kernels built from a module need nothing more; wrap calls on
    a hand-written ``model_fn`` / ``score_fn`` over a Hugging Face model in it::

        with explicit_attention(model):
            emb = nfk_embedding(score_fn, params, x)

    Both paths compute the same function (tests compare the jvp strategies with the Jacobian
    one on dynascope's Transformer and a tiny random GPT-2 with SDPA attention).

    Args:
        model: any module; modules without a fused attention backend are left alone.
    Returns:
        A context manager yielding nothing.
    """
    with eager_attention(model), no_mha_fastpath(model):
        yield
