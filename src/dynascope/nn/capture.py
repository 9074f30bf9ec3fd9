"""Named capture points and the context managers that read them.

A :class:`CapturePoint` is an identity module placed at a named spot inside a model (the
TransformerLens ``HookPoint`` idea). Because it is an ordinary ``nn.Module``, its qualified name
in ``model.named_modules()`` (``"blocks.0.attn.hook_pattern"``) addresses it, and standard
forward hooks read it: no monkey-patching and no ``return_pattern=`` flags through ``forward``.
A module may ask :attr:`CapturePoint.has_listener` to skip materialising a tensor nobody reads
(attention takes the fused kernel then).

Glossary:
    qualified name: the dotted name of a submodule, as given by ``model.named_modules()``.
    listener: a forward hook registered on a capture point.

References:
    Nanda & Bloom (2022), TransformerLens, ``HookPoint`` and ``run_with_cache``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from torch import Tensor, nn

__all__ = ["CapturePoint", "capture", "capture_patterns"]


class CapturePoint(nn.Module):
    """Identity module marking a named tensor inside a model, readable by forward hooks.

    ``forward(x)`` returns ``x`` unchanged (same object), so a capture point changes neither the
    function nor its gradients.
    """

    def forward(self, x: Tensor) -> Tensor:
        """Return ``x`` unchanged; forward hooks see it as the output."""
        return x

    @property
    def has_listener(self) -> bool:
        """True iff at least one forward hook is registered on this module (a dict check).

        Global hooks (``torch.nn.modules.module.register_module_forward_hook``) do not count.
        """
        return bool(self._forward_hooks)


def _capture_points(model: nn.Module) -> dict[str, CapturePoint]:
    return {name: m for name, m in model.named_modules() if isinstance(m, CapturePoint)}


@contextmanager
def _hooked(points: dict[str, CapturePoint]) -> Iterator[dict[str, Tensor]]:
    """Hook each ``points[key]``; its (detached) output goes to ``store[key]``."""
    store: dict[str, Tensor] = {}
    handles = []

    def make_hook(key: str):
        def hook(module: nn.Module, inputs: tuple, output: Tensor) -> None:
            store[key] = output.detach()

        return hook

    try:
        for key, point in points.items():
            handles.append(point.register_forward_hook(make_hook(key)))
        yield store
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def capture(model: nn.Module, names: Iterable[str] | None = None) -> Iterator[dict[str, Tensor]]:
    """Record the outputs of capture points during the forward passes inside the block.

    Example::

        with capture(model, ["blocks.0.attn.hook_pattern"]) as cache:
            model(x)
        cache["blocks.0.attn.hook_pattern"]  # [batch, n_heads, query_pos, key_pos]

    Args:
        model: any module containing :class:`CapturePoint` submodules.
        names: qualified names of the capture points to record; ``None`` records all of them.
    Returns:
        A context manager yielding a dict qualified name -> detached output. The dict fills
        during forward passes; a point run several times keeps its latest output. The hooks are
        removed on exit, also when the block raises.
    Raises:
        ValueError: if a name is not a capture point of ``model`` (the message lists the
            available ones).
    """
    available = _capture_points(model)
    if names is None:
        selected = available
    else:
        names = list(dict.fromkeys(names))
        unknown = [n for n in names if n not in available]
        if unknown:
            raise ValueError(
                f"unknown capture point(s) {unknown} in {type(model).__name__} "
                f"(available: {sorted(available) or 'none'})"
            )
        selected = {n: available[n] for n in names}
    with _hooked(selected) as store:
        yield store


@contextmanager
def capture_patterns(model: nn.Module) -> Iterator[dict[str, Tensor]]:
    """Record every attention layer's pattern, keyed by the attention module's qualified name.

    An attention layer is any submodule with a :class:`CapturePoint` child named
    ``hook_pattern`` (as :class:`dynascope.nn.MultiHeadAttention` has).

    Example::

        with capture_patterns(model) as patterns:
            model(x)
        patterns["blocks.0.attn"]  # [batch, n_heads, query_pos, key_pos]

    Args:
        model: a module containing attention layers with a ``hook_pattern`` capture point.
    Returns:
        A context manager yielding a dict layer name -> detached pattern
        ``[batch, n_heads, query_pos, key_pos]`` (latest forward pass); hooks removed on exit.
    Raises:
        ValueError: if ``model`` has no ``hook_pattern`` capture point.
    """
    points = {}
    for name, module in model.named_modules():
        point = getattr(module, "hook_pattern", None)
        if isinstance(point, CapturePoint):
            points[name] = point
    if not points:
        raise ValueError(
            f"no attention pattern capture point (hook_pattern) found in {type(model).__name__}"
        )
    with _hooked(points) as store:
        yield store
