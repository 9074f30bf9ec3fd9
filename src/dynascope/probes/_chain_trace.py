"""Recording a feed-forward chain: which ``nn.Linear`` / ``nn.Conv2d`` layers a model calls,
in order, read from a forward on a probe batch, and the refusal of anything that is not an
executed chain (glossary in :mod:`._permutation_chain`, which re-exports these).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

TRACE_ROWS = 16  # rows of the probe batch the chain is recorded on
_INPUT = "<input>"


class _Provenance(TorchFunctionMode):
    """Tags every tensor computed during a forward with the chain layers it depends on.

    A layer's output is tagged with its own name (forward hook); any other op's output gets
    the union of its tensor arguments' tags (parameters carry none). Tensors are kept alive
    for the whole forward so that ``id`` is a stable key.
    """

    def __init__(self) -> None:
        super().__init__()
        self.tags: dict[int, frozenset[str]] = {}
        self.alive: list[Tensor] = []

    def tag(self, value: object, tags: frozenset[str]) -> None:
        for t in _tensors(value):
            self.tags[id(t)] = tags
            self.alive.append(t)

    def of(self, value: object) -> frozenset[str]:
        tags: frozenset[str] = frozenset()
        for t in _tensors(value):
            tags = tags | self.tags.get(id(t), frozenset())
        return tags

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        tags = self.of((args, kwargs))
        if tags:
            self.tag(out, tags)
        return out


def _tensors(value: object):
    """Every tensor in ``value``, descending into tuples, lists and dict values."""
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def _names(tags: frozenset[str]) -> str:
    return ", ".join("the input" if t == _INPUT else repr(t) for t in sorted(tags)) or "nothing"


def _registered_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Linear/Conv2d modules in registration order; refuses other parametrised modules."""
    layers = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear | nn.Conv2d):
            if isinstance(module, nn.Conv2d) and module.groups != 1:
                raise ValueError(f"layer {name!r}: groups must be 1 (got {module.groups})")
            layers.append((name, module))
        elif any(True for _ in module.parameters(recurse=False)) or any(
            True for _ in module.buffers(recurse=False)
        ):
            raise ValueError(
                f"module {name!r} ({type(module).__name__}) holds parameters or buffers; only "
                "chains of nn.Linear / nn.Conv2d with parameter-free modules between are allowed"
            )
    if len(layers) < 2:
        raise ValueError(f"model must hold at least 2 Linear/Conv2d layers (got {len(layers)})")
    return layers


def trace_chain(model: nn.Module, x: Tensor) -> list[str]:
    """Names of the chain's layers in the order one forward on ``x`` calls them.

    Records a forward on ``x[:TRACE_ROWS]`` (eval mode, no gradients, RNG forked; mode and
    hooks restored) with a hook on every Linear/Conv2d and a torch-function mode that tags
    each tensor with the layers it depends on; then checks that the executed graph is a
    chain (module glossary). A net whose layers are registered in another order than they
    are called is accepted: the executed order is the chain.

    Args:
        model: a feed-forward net of ``nn.Linear`` / ``nn.Conv2d`` layers.
        x: a probe batch ``[n, ...]`` of inputs ``model`` reads.
    Returns:
        ``[name_0, .., name_L]`` qualified module names, in call order.
    Raises:
        ValueError: if a layer is never called on ``x`` or called more than once; if a layer
            reads anything but the previous layer's output (the input, for the first: a
            residual or skip connection, a branch); if the output depends on anything but the
            last layer; or as :func:`permutable_layers` without ``x``.
    """
    registered = _registered_layers(model)
    mode = _Provenance()
    calls: list[str] = []
    reads: list[frozenset[str]] = []

    def before(name: str):
        def hook(module: nn.Module, args: tuple) -> None:
            calls.append(name)
            reads.append(mode.of(args))

        return hook

    def after(name: str):
        def hook(module: nn.Module, args: tuple, output: object) -> None:
            mode.tag(output, frozenset({name}))

        return hook

    handles = []
    for name, module in registered:
        handles.append(module.register_forward_pre_hook(before(name)))
        handles.append(module.register_forward_hook(after(name)))
    was_training = [m.training for m in model.modules()]
    model.eval()
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]), mode:
            probe = x[:TRACE_ROWS]
            mode.tag(probe, frozenset({_INPUT}))
            depends = mode.of(model(probe))
    finally:
        for handle in handles:
            handle.remove()
        for module, training in zip(model.modules(), was_training):
            module.training = training
    for name, _ in registered:
        count = calls.count(name)
        if count != 1:
            what = "never called" if count == 0 else f"called {count} times"
            raise ValueError(
                f"layer {name!r} is {what} in one forward on x; a permutation chain calls "
                "each registered Linear/Conv2d exactly once"
            )
    for k, (name, read) in enumerate(zip(calls, reads)):
        expected = frozenset({_INPUT if k == 0 else calls[k - 1]})
        if read != expected:
            kind = "a residual or skip connection" if expected < read else "not a chain"
            raise ValueError(
                f"layer {name!r} reads {_names(read)} but a chain layer reads only "
                f"{_names(expected)} ({kind})"
            )
    if depends != frozenset({calls[-1]}):
        raise ValueError(
            f"the model's output depends on {_names(depends)}, not only on the last layer "
            f"called {calls[-1]!r} (a residual or skip connection)"
        )
    return calls


def permutable_layers(model: nn.Module, x: Tensor | None = None) -> list[tuple[str, nn.Module]]:
    """The chain ``[(name, module)]`` of ``model``'s Linear/Conv2d layers, in order.

    With ``x``, the order is the executed one and the graph is checked to be a chain
    (:func:`trace_chain`). Without ``x`` it is registration order, unchecked: enough where
    only the list of layers matters (interpolation, averaging), not for permutations.

    Args:
        model: a feed-forward net whose parametrised modules are all ``nn.Linear`` or
            ``nn.Conv2d`` (groups 1), consecutive widths matching (a Linear after a Conv2d
            reads the globally pooled channels).
        x: a probe batch ``[n, ...]`` (``None``: registration order).
    Returns:
        ``[(qualified name, module)]``, at least two layers.
    Raises:
        ValueError: if another module holds parameters or buffers (BatchNorm, LayerNorm, ...),
            a convolution is grouped, there are fewer than two layers, consecutive widths
            differ (e.g. a flatten of spatial maps), or as :func:`trace_chain`.
    """
    layers = _registered_layers(model)
    if x is not None:
        modules = dict(layers)
        layers = [(name, modules[name]) for name in trace_chain(model, x)]
    for (name_a, a), (name_b, b) in zip(layers, layers[1:]):
        if a.weight.shape[0] != b.weight.shape[1]:
            raise ValueError(
                f"layer {name_b!r} reads {b.weight.shape[1]} inputs but {name_a!r} gives "
                f"{a.weight.shape[0]} units; only unit-preserving modules may sit between"
            )
    return layers
