"""Adapters: where are W_Q, W_K, W_V, W_O (and the attention pattern) in a model?

Every adapter returns :class:`AttentionView` objects in the TransformerLens layout that all of
dynascope's instruments read::

    W_Q, W_K, W_V: [n_heads, d_model, d_head]      (right-multiplying: q = x @ W_Q[h])
    W_O:           [n_heads, d_head, d_model]
    b_Q, b_K, b_V: [n_heads, d_head] or None
    b_O:           [d_model] or None

The views are tensors that share storage with the model where the source layout allows it;
treat them as read-only. Each adapter knows its source layout; none guesses from shapes.
This module knows dynascope's own :class:`dynascope.nn.MultiHeadAttention`; adapters for
``torch.nn.MultiheadAttention`` and Hugging Face models register themselves with
:func:`register_adapter`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from dynascope.nn.capture import capture_patterns as capture_patterns

__all__ = [
    "AttentionView",
    "attention_views",
    "capture_patterns",
    "register_adapter",
    "supported_architectures",
]


@dataclass(frozen=True)
class AttentionView:
    """Per-head weights of one attention layer, in the TransformerLens layout.

    Attributes:
        name: the module's qualified name in the model (``"blocks.0.attn"``).
        W_Q, W_K, W_V: ``[n_heads, d_model, d_head]``.
        W_O: ``[n_heads, d_head, d_model]``.
        b_Q, b_K, b_V: ``[n_heads, d_head]`` or ``None``; b_O: ``[d_model]`` or ``None``.
        module: the source module (for capture hooks), or ``None``.
    """

    name: str
    W_Q: Tensor
    W_K: Tensor
    W_V: Tensor
    W_O: Tensor
    b_Q: Tensor | None = None
    b_K: Tensor | None = None
    b_V: Tensor | None = None
    b_O: Tensor | None = None
    module: nn.Module | None = None

    @property
    def n_heads(self) -> int:
        return self.W_Q.shape[0]

    @property
    def d_model(self) -> int:
        return self.W_Q.shape[1]

    @property
    def d_head(self) -> int:
        return self.W_Q.shape[2]


# An adapter: (qualified name, module) -> AttentionView, or None if it does not own the module.
Adapter = Callable[[str, nn.Module], "AttentionView | None"]
_ADAPTERS: dict[str, Adapter] = {}


def register_adapter(architecture: str, adapter: Adapter) -> None:
    """Register ``adapter(name, module) -> AttentionView | None`` under ``architecture``.

    Raises:
        ValueError: if ``architecture`` is already registered.
    """
    if architecture in _ADAPTERS:
        raise ValueError(f"adapter {architecture!r} is already registered")
    _ADAPTERS[architecture] = adapter


def supported_architectures() -> list[str]:
    """Names of the registered adapters, in registration order."""
    return list(_ADAPTERS)


def _dynascope_adapter(name: str, module: nn.Module) -> AttentionView | None:
    from dynascope.nn.attention import MultiHeadAttention

    if not isinstance(module, MultiHeadAttention):
        return None
    return AttentionView(
        name=name,
        W_Q=module.W_Q,
        W_K=module.W_K,
        W_V=module.W_V,
        W_O=module.W_O,
        b_Q=module.b_Q,
        b_K=module.b_K,
        b_V=module.b_V,
        b_O=module.b_O,
        module=module,
    )


register_adapter("dynascope.nn.MultiHeadAttention", _dynascope_adapter)


def _iter_views(model: nn.Module) -> Iterator[AttentionView]:
    for name, module in model.named_modules():
        for adapter in _ADAPTERS.values():
            view = adapter(name, module)
            if view is not None:
                yield view
                break


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
    views = list(_iter_views(model))
    if not views:
        raise ValueError(
            f"no supported attention layer found in {type(model).__name__} "
            f"(supported: {', '.join(supported_architectures())}; "
            "register one with dynascope.adapters.register_adapter)"
        )
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
