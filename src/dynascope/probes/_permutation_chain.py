"""Hidden-unit permutations of a feed-forward chain of ``nn.Linear`` / ``nn.Conv2d`` layers.

Glossary:
    chain:    the model's ``nn.Linear`` and ``nn.Conv2d`` modules in registration order,
              ``layer_0 .. layer_L``; between them only parameter-free, channel-wise modules
              (ReLU, average pools, flatten of ``[batch, C, 1, 1]``, a global average pool in
              ``forward``). No BatchNorm, no residual connections.
    params:   ``[(weight_l, bias_l or None) for l in 0..L]``; ``weight_l`` is ``[out, in]``
              (Linear) or ``[out, in, kh, kw]`` (Conv2d): output units on axis 0, input units
              on axis 1 (torch's layout; S7's ``x @ W`` formulas use ``W = weight.T``).
    hidden axis l (0 <= l < L): the ``d_l`` output units of ``layer_l`` = input units of
              ``layer_{l+1}``.
    perms:    ``[pi_0, .., pi_{L-1}]``, ``pi_l`` a permutation of ``range(d_l)`` (int64). Applying
              it puts unit ``pi_l[j]`` at position ``j``::

                  weight_l  <- weight_l[pi_l]           bias_l <- bias_l[pi_l]
                  weight_{l+1} <- weight_{l+1}[:, pi_l]

              which leaves the network's function unchanged (ReLU and pools act unit-wise).

References:
    Benzing et al. (2022), arXiv 2209.07509, Sec. 2 ("permuting hidden units").
    Ainsworth, Hayase, Srinivasa (2023), "Git Re-Basin", ICLR, arXiv 2209.04836, Sec. 3.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import Tensor, nn

LayerParams = list[tuple[Tensor, Tensor | None]]


def permutable_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The chain ``[(name, module)]`` of ``model``'s Linear/Conv2d layers, in order.

    Args:
        model: a feed-forward net whose parametrised modules are all ``nn.Linear`` or
            ``nn.Conv2d`` (groups 1), consecutive widths matching (a Linear after a Conv2d
            reads the globally pooled channels).
    Returns:
        ``[(qualified name, module)]``, at least two layers.
    Raises:
        ValueError: if another module holds parameters or buffers (BatchNorm, LayerNorm, ...),
            a convolution is grouped, there are fewer than two layers, or consecutive widths
            differ (e.g. a flatten of spatial maps).
    """
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
    for (name_a, a), (name_b, b) in zip(layers, layers[1:]):
        if a.weight.shape[0] != b.weight.shape[1]:
            raise ValueError(
                f"layer {name_b!r} reads {b.weight.shape[1]} inputs but {name_a!r} gives "
                f"{a.weight.shape[0]} units; only unit-preserving modules may sit between"
            )
    return layers


def layer_params(model: nn.Module) -> LayerParams:
    """``[(weight, bias or None)]`` of the chain, detached (views of the live parameters).

    Raises:
        ValueError: as :func:`permutable_layers`.
    """
    return [
        (m.weight.detach(), None if m.bias is None else m.bias.detach())
        for _, m in permutable_layers(model)
    ]


def hidden_widths(params: LayerParams) -> list[int]:
    """``[d_0, .., d_{L-1}]``: the size of each hidden axis."""
    return [w.shape[0] for w, _ in params[:-1]]


def check_perms(perms: Sequence[Tensor], widths: Sequence[int]) -> list[Tensor]:
    """Validate ``perms`` against the hidden ``widths``; return them as int64 CPU tensors.

    Raises:
        ValueError: if the count differs from ``len(widths)`` or ``perms[l]`` is not a
            permutation of ``range(widths[l])``.
    """
    if len(perms) != len(widths):
        raise ValueError(
            f"perms must hold one permutation per hidden axis ({len(widths)}) (got {len(perms)})"
        )
    out = []
    for i, (perm, width) in enumerate(zip(perms, widths)):
        perm = torch.as_tensor(perm).to(device="cpu", dtype=torch.int64)
        if perm.shape != (width,) or not torch.equal(perm.sort().values, torch.arange(width)):
            raise ValueError(
                f"perms[{i}] must be a permutation of range({width}) (got shape "
                f"{tuple(perm.shape)})"
            )
        out.append(perm)
    return out


def permute_params(params: LayerParams, perms: Sequence[Tensor]) -> LayerParams:
    """Permute the hidden units of ``params`` (see the module docstring); a new list.

    Args:
        params: ``[(weight_l, bias_l or None)]``, ``L + 1`` layers.
        perms: ``L`` permutations, ``perms[l]`` of ``range(d_l)``.
    Returns:
        The permuted params (new tensors; the inputs are not modified).
    Raises:
        ValueError: as :func:`check_perms`.
    """
    perms = check_perms(perms, hidden_widths(params))
    out = []
    for i, (weight, bias) in enumerate(params):
        if i < len(perms):
            index = perms[i].to(weight.device)
            weight = weight.index_select(0, index)
            bias = None if bias is None else bias.index_select(0, index)
        if i > 0:
            weight = weight.index_select(1, perms[i - 1].to(weight.device))
        out.append((weight, bias))
    return out


def load_params(model: nn.Module, params: LayerParams) -> nn.Module:
    """A deep copy of ``model`` holding ``params`` in its chain (``model`` is not modified).

    Raises:
        ValueError: if the layer count or a shape differs, or biases are present in one and
            missing in the other.
    """
    layers = permutable_layers(model)
    if len(params) != len(layers):
        raise ValueError(f"params must hold {len(layers)} layers (got {len(params)})")
    for (name, module), (weight, bias) in zip(layers, params):
        if weight.shape != module.weight.shape or (bias is None) != (module.bias is None):
            raise ValueError(
                f"params for layer {name!r} must match weight {tuple(module.weight.shape)} "
                f"and bias {'present' if module.bias is not None else 'absent'}"
            )
    new = copy.deepcopy(model)
    with torch.no_grad():
        for (_, module), (weight, bias) in zip(permutable_layers(new), params):
            module.weight.copy_(weight)
            if bias is not None:
                module.bias.copy_(bias)
    return new


def apply_permutation(model: nn.Module, perms: Sequence[Tensor]) -> nn.Module:
    """A copy of ``model`` with its hidden units permuted by ``perms`` (same function).

    Args:
        model: an MLP or CNN chain (:func:`permutable_layers`), with or without biases.
        perms: one permutation per hidden axis; ``perms[l][j]`` is the unit of ``model`` that
            lands at position ``j`` (a matching's output, :func:`activation_matching`).
    Returns:
        A deep copy; ``model`` is not modified.
    Raises:
        ValueError: as :func:`permutable_layers` and :func:`check_perms`.
    """
    return load_params(model, permute_params(layer_params(model), perms))


def combine_params(params: Sequence[LayerParams], weights: Sequence[float]) -> LayerParams:
    """``sum_k weights[k] * params[k]`` layer by layer (interpolation and n-way averages).

    Raises:
        ValueError: if ``params`` is empty, lengths differ, or layer shapes differ.
    """
    if not params or len(params) != len(weights):
        raise ValueError(
            f"params and weights must be non-empty and of equal length "
            f"(got {len(params)} and {len(weights)})"
        )
    first = params[0]
    for k, other in enumerate(params[1:], start=1):
        shapes = [(w.shape, None if b is None else b.shape) for w, b in other]
        if shapes != [(w.shape, None if b is None else b.shape) for w, b in first]:
            raise ValueError(f"params[{k}] must have the layer shapes of params[0]")
    out = []
    for i in range(len(first)):
        weight = sum(c * p[i][0] for c, p in zip(weights, params))
        bias = None if first[i][1] is None else sum(c * p[i][1] for c, p in zip(weights, params))
        out.append((weight, bias))
    return out
