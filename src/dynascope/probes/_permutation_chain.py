"""Hidden-unit permutations of a feed-forward chain of ``nn.Linear`` / ``nn.Conv2d`` layers.

Glossary:
    chain:    the model's ``nn.Linear`` and ``nn.Conv2d`` modules in the order the forward pass
              calls them, ``layer_0 .. layer_L`` (read from a recorded forward on a probe batch,
              :func:`trace_chain`; registration order only where no batch is given). Between
              them only parameter-free, channel-wise modules (ReLU, average pools, flatten of
              ``[batch, C, 1, 1]``, a global average pool in ``forward``). No BatchNorm.
    executed chain: every registered layer is called exactly once, ``layer_{l+1}`` reads
              only what ``layer_l`` wrote (``layer_0`` only the input), and the output depends
              only on ``layer_L``. Residual or skip connections, a layer called twice, a layer
              never called and branches are refused: a hidden-unit permutation of such a net
              is not a symmetry of the chain formulas below.
    probe:    a batch of inputs ``[n, ...]`` the model reads; the chain is recorded on its
              first :data:`TRACE_ROWS` rows, and a permuted copy is checked on its first
              :data:`VERIFY_ROWS` rows (:func:`check_same_function`).
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

from ._chain_trace import TRACE_ROWS as TRACE_ROWS
from ._chain_trace import permutable_layers as permutable_layers
from ._chain_trace import trace_chain as trace_chain

LayerParams = list[tuple[Tensor, Tensor | None]]

VERIFY_ROWS = 256  # rows of the probe batch a permuted copy is checked on


class ChainPermutation(list):
    """``[pi_0, .., pi_{L-1}]`` (a ``list`` of int64 tensors) with the probe batch it came from.

    :func:`activation_matching` returns one, so ``apply_permutation(model_b, perms)`` can check
    the permuted copy on the same inputs without being given them again.

    Attributes:
        probe: inputs ``[n, ...]`` the matching read (``None`` for a plain list).
    """

    def __init__(self, perms: Sequence[Tensor], probe: Tensor | None = None) -> None:
        super().__init__(perms)
        self.probe = probe


def layer_params(model: nn.Module, x: Tensor | None = None) -> LayerParams:
    """``[(weight, bias or None)]`` of the chain, detached (views of the live parameters).

    Args:
        model: see :func:`permutable_layers`.
        x: a probe batch: the layers come in executed order, checked to be a chain (give it
            for :func:`weight_matching`; ``None``: registration order).
    Raises:
        ValueError: as :func:`permutable_layers`.
    """
    return [
        (m.weight.detach(), None if m.bias is None else m.bias.detach())
        for _, m in permutable_layers(model, x)
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


def load_params(model: nn.Module, params: LayerParams, x: Tensor | None = None) -> nn.Module:
    """A deep copy of ``model`` holding ``params`` in its chain (``model`` is not modified).

    Args:
        model: see :func:`permutable_layers`.
        params: one ``(weight, bias)`` per layer, in the order of ``permutable_layers(model,
            x)``.
        x: a probe batch (executed order), or ``None`` (registration order).
    Raises:
        ValueError: if the layer count or a shape differs, or biases are present in one and
            missing in the other; or as :func:`permutable_layers`.
    """
    layers = permutable_layers(model, x)
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
        for (name, _), (weight, bias) in zip(layers, params):
            module = new.get_submodule(name)
            module.weight.copy_(weight)
            if bias is not None:
                module.bias.copy_(bias)
    return new


def check_same_function(model: nn.Module, permuted: nn.Module, x: Tensor) -> None:
    """Raise unless ``permuted`` computes ``model``'s function on ``x[:VERIFY_ROWS]``.

    Both run in eval mode without gradients (modes restored, RNG forked). Equal means
    ``max|f_perm(x) - f(x)| <= sqrt(eps) * max|f(x)|`` with ``eps`` the output dtype's machine
    epsilon (1.5e-8 relative in float64, 3.5e-4 in float32): reordering the sums of a
    permuted matmul moves outputs by a few ``eps``; a permutation that breaks the function
    moves them by O(1) (0.34-1.64 relative on small nets with a residual or a reused layer).

    Args:
        model, permuted: nets reading ``x``.
        x: probe batch ``[n, ...]``.
    Raises:
        ValueError: if the outputs' shapes differ or they differ by more than the tolerance.
    """
    probe = x[:VERIFY_ROWS]
    outputs = []
    for net in (model, permuted):
        was_training = [m.training for m in net.modules()]
        net.eval()
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                outputs.append(torch.as_tensor(net(probe)))
        finally:
            for module, training in zip(net.modules(), was_training):
                module.training = training
    expected, got = outputs
    if expected.shape != got.shape:
        raise ValueError(
            f"the permuted model's output shape {tuple(got.shape)} differs from the model's "
            f"{tuple(expected.shape)}"
        )
    if not expected.is_floating_point():
        expected, got = expected.double(), got.double()
    scale = expected.abs().amax().clamp_min(torch.finfo(expected.dtype).tiny)
    error = (got - expected).abs().amax() / scale
    tol = torch.finfo(expected.dtype).eps ** 0.5
    if not error <= tol:
        raise ValueError(
            f"the permuted model computes another function: max |f_perm(x) - f(x)| / "
            f"max |f(x)| = {error.item():.3g} on the probe batch (allowed <= {tol:.3g})"
        )


def probe_batch(perms: object, x: Tensor | None) -> Tensor:
    """``x``, else the probe recorded with ``perms``; raises if there is neither.

    Raises:
        ValueError: if ``x`` is ``None`` and ``perms`` has no ``probe``.
    """
    if x is None:
        x = getattr(perms, "probe", None)
    if x is None:
        raise ValueError(
            "x must be a probe batch to check the permuted model on (got x=None and perms "
            "without a recorded probe; pass x= or the result of a matching)"
        )
    return x


def apply_chain_permutation(
    model: nn.Module, perms: Sequence[Tensor], x: Tensor | None = None
) -> nn.Module:
    """A copy of ``model`` with its hidden units permuted by ``perms``, checked to be the same
    function.

    The chain is the executed one on the probe batch (:func:`trace_chain`), and the copy is
    checked against ``model`` on it (:func:`check_same_function`).

    Args:
        model: an MLP or CNN chain (:func:`permutable_layers`), with or without biases.
        perms: one permutation per hidden axis; ``perms[l][j]`` is the unit of ``model`` that
            lands at position ``j`` (a matching's output, :func:`activation_matching`).
        x: the probe batch ``[n, ...]``; ``None`` takes ``perms.probe`` (a
            :class:`ChainPermutation` from :func:`activation_matching`).
    Returns:
        A deep copy; ``model`` is not modified.
    Raises:
        ValueError: if there is no probe batch, as :func:`permutable_layers`,
            :func:`check_perms` and :func:`check_same_function`.
    """
    x = probe_batch(perms, x)
    params = layer_params(model, x)
    permuted = load_params(model, permute_params(params, perms), x)
    check_same_function(model, permuted, x)
    return permuted


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
