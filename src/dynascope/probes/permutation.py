"""Permutation symmetry: activation matching, weight matching, interpolation barriers.

Glossary (see :mod:`._permutation_chain` for the chain and the permutation convention):
    chain:       a net's ``nn.Linear`` / ``nn.Conv2d`` layers ``layer_0 .. layer_L`` (MLP or CNN,
                 with or without biases, no BatchNorm); hidden axis ``l`` = outputs of
                 ``layer_l`` = inputs of ``layer_{l+1}``, of width ``d_l``.
    n:           rows of activations: inputs for an MLP; inputs x positions (``n * H * W``)
                 for a convolutional axis, whose channels are its units.
    A, B:        ``[n, d_l]`` activations of hidden axis ``l`` in nets a and b, read at the
                 input of ``layer_{l+1}`` (post-ReLU, after any pooling between; the
                 reference code hooks the same place).
    similarity:  ``S = Â^T B̂`` ``[d_l, d_l]``, columns normalised to unit norm (uncentred
                 cosine; ``center=True``: Pearson correlation). S7's cost is ``-S``.
    perm pi_l:   ``int64 [d_l]``; unit ``j`` of net a matches unit ``pi_l[j]`` of net b, and
                 ``apply_permutation(model_b, perms)`` puts it at position ``j``.

Two matchings:
    * :func:`activation_matching` (S7's method): one linear assignment per hidden layer,
      independently, maximising ``trace(S P)``.
    * :func:`weight_matching` (Git Re-Basin's, for comparison): coordinate descent over the
      layers' permutations, each maximising ``sum <W^a, P W^b>`` over the weights touching
      that axis with the other permutations held fixed.

Transformers (:class:`dynascope.nn.Transformer`): :func:`match_transformers` finds the
residual-stream, head, per-head ``d_head`` and MLP permutations, by activations or by weights
(:mod:`._transformer_permutation`); :func:`apply_permutation` takes its result too.

Never silent: the chain is the graph a forward on a probe batch executes (:func:`trace_chain`),
not registration order; residual connections, reused, unused and out-of-chain layers are
refused with a one-line error, and every :func:`apply_permutation` checks the permuted copy
against the model on a probe batch (:func:`check_same_function`) and raises if it differs.

Everything here is pure: no model is modified, no RNG is consumed except ``generator``.

References:
    Benzing, Schug, Meier, von Oswald, Akram, Zucchet, Aitchison, Steger (2022), "Random
    initialisations performing above chance and how to find them", OPT 2022, arXiv 2209.07509.
    Ainsworth, Hayase, Srinivasa (2023), "Git Re-Basin: merging models modulo permutation
    symmetries", ICLR, arXiv 2209.04836, Sec. 3.2 (weight matching, Alg. 1).
    Verma, Elbayad (2024), "Merging Text Transformer Models from Different Initializations",
    arXiv 2403.00986, Sec. 3 (transformer permutations).
    Li, Yosinski, Clune, Lipson, Hopcroft (2016), "Convergent learning", ICLR, arXiv 1511.07543
    (matching units by activation correlation).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ._assignment import activation_similarity as activation_similarity
from ._assignment import invert_permutation as invert_permutation
from ._assignment import match_units as match_units
from ._interpolation import DEFAULT_ALPHAS as DEFAULT_ALPHAS
from ._interpolation import InterpolationPath as InterpolationPath
from ._interpolation import evaluate as evaluate
from ._interpolation import interpolate as interpolate
from ._interpolation import loss_barrier as loss_barrier
from ._interpolation import tune_temperature as tune_temperature
from ._permutation_chain import ChainPermutation as ChainPermutation
from ._permutation_chain import LayerParams as LayerParams
from ._permutation_chain import apply_chain_permutation
from ._permutation_chain import check_perms as check_perms
from ._permutation_chain import check_same_function as check_same_function
from ._permutation_chain import combine_params as combine_params
from ._permutation_chain import hidden_widths as hidden_widths
from ._permutation_chain import layer_params as layer_params
from ._permutation_chain import load_params as load_params
from ._permutation_chain import permutable_layers as permutable_layers
from ._permutation_chain import permute_params as permute_params
from ._permutation_chain import trace_chain as trace_chain
from ._transformer_matching import interpolate_parameters as interpolate_parameters
from ._transformer_matching import match_transformers as match_transformers
from ._transformer_permutation import TransformerPermutation as TransformerPermutation
from ._transformer_permutation import apply_transformer_permutation
from ._transformer_permutation import (
    check_transformer_permutation as check_transformer_permutation,
)
from ._transformer_permutation import permute_transformer_state as permute_transformer_state

__all__ = [
    "DEFAULT_ALPHAS",
    "ChainPermutation",
    "InterpolationPath",
    "LayerParams",
    "TransformerPermutation",
    "activation_matching",
    "activation_similarity",
    "apply_permutation",
    "average_params",
    "check_perms",
    "check_same_function",
    "check_transformer_permutation",
    "combine_params",
    "evaluate",
    "hidden_activations",
    "hidden_widths",
    "interpolate",
    "interpolate_parameters",
    "invert_permutation",
    "layer_params",
    "load_params",
    "loss_barrier",
    "match_transformers",
    "match_units",
    "permutable_layers",
    "permute_params",
    "permute_transformer_state",
    "trace_chain",
    "tune_temperature",
    "weight_matching",
]


def _as_rows(acts: Tensor) -> Tensor:
    """``[n, d]`` stays; ``[n, C, H, W]`` -> ``[n * H * W, C]`` (channels are the units)."""
    if acts.ndim == 2:
        return acts
    return acts.movedim(1, -1).reshape(-1, acts.shape[1])


def hidden_activations(
    model: nn.Module, x: Tensor, *, batch_size: int | None = None
) -> list[Tensor]:
    """Activations of every hidden axis on ``x``: ``[[n_rows, d_l] for l in 0..L-1]``.

    Read with forward pre-hooks at the input of ``layer_{l+1}`` (removed on exit), under
    ``torch.no_grad()``; convolutional maps become rows per position (:data:`n` in the module
    glossary). The model's mode and parameters are untouched.

    Raises:
        ValueError: as :func:`permutable_layers` (the chain is the one executed on ``x``).
    """
    layers = permutable_layers(model, x)
    captured: list[list[Tensor]] = [[] for _ in layers[1:]]

    def hook(index: int):
        def read(module: nn.Module, args: tuple) -> None:
            captured[index].append(_as_rows(args[0].detach()))

        return read

    handles = [m.register_forward_pre_hook(hook(i)) for i, (_, m) in enumerate(layers[1:])]
    try:
        with torch.no_grad():
            for chunk in x.split(batch_size) if batch_size else (x,):
                model(chunk)
    finally:
        for handle in handles:
            handle.remove()
    return [torch.cat(parts) for parts in captured]


def activation_matching(
    model_a: nn.Module,
    model_b: nn.Module,
    x: Tensor,
    *,
    center: bool = False,
    batch_size: int | None = None,
) -> list[Tensor]:
    """Permutations aligning ``model_b``'s hidden units to ``model_a``'s by activations.

    Per hidden axis, independently (S7 "Activation matching"): activations of both nets on
    ``x`` (:func:`hidden_activations`), similarity ``S = Â^T B̂``, then ``pi_l = argmax_P
    trace(S P)`` (:func:`match_units`). Permuting one axis leaves every other axis's
    activations unchanged, so the axes are matched independently on the unpermuted nets.

    Args:
        model_a, model_b: chains of the same architecture.
        x: inputs ``[n, ...]`` both nets read (S7: the training images).
        center: Pearson correlation instead of uncentred cosine.
        batch_size: forward chunk size (``None``: one pass).
    Returns:
        A :class:`ChainPermutation` ``[pi_0, .., pi_{L-1}]`` (int64 CPU) carrying ``x`` as its
        probe; ``apply_permutation(model_b, perms)`` aligns b to a and checks it on ``x``.
    Raises:
        ValueError: if the architectures' hidden widths differ, or as
            :func:`permutable_layers` (each net's chain is the one executed on ``x``: residual
            connections, reused, unused layers are refused).
    References:
        Benzing et al. (2022), arXiv 2209.07509, Sec. 2; Li et al. (2016), arXiv 1511.07543.
    """
    widths_a = hidden_widths(layer_params(model_a, x))
    widths_b = hidden_widths(layer_params(model_b, x))
    if widths_a != widths_b:
        raise ValueError(f"hidden widths must agree (got a {widths_a}, b {widths_b})")
    acts_a = hidden_activations(model_a, x, batch_size=batch_size)
    acts_b = hidden_activations(model_b, x, batch_size=batch_size)
    perms = [
        match_units(activation_similarity(a, b, center=center)) for a, b in zip(acts_a, acts_b)
    ]
    return ChainPermutation(perms, probe=x)


def apply_permutation(model: nn.Module, perms: object, x: Tensor | None = None) -> nn.Module:
    """A copy of ``model`` permuted by ``perms``, checked to compute the same function.

    Two kinds of model and permutation:
        * a chain (MLP/CNN, :func:`permutable_layers`) and ``[pi_0, .., pi_{L-1}]`` (a list,
          or the :class:`ChainPermutation` of :func:`activation_matching`);
        * a :class:`dynascope.nn.Transformer` and a :class:`TransformerPermutation`
          (:func:`match_transformers`).

    Every call checks the copy against ``model`` on a probe batch
    (:func:`check_same_function`, relative tolerance ``sqrt(eps)``) and raises if it differs:
    ``x`` when given, else the probe the matching recorded (``perms.probe``).

    Args:
        model: the net to permute (not modified).
        perms: the permutation (above); ``perms[l][j]`` / ``perm.residual[j]`` is the unit of
            ``model`` that lands at position ``j``.
        x: probe batch ``[n, ...]`` (``None``: ``perms.probe``).
    Returns:
        A deep copy of ``model``, permuted.
    Raises:
        ValueError: if there is no probe batch; if the chain is not one (residual, reused,
            out-of-chain or unused layers, :func:`trace_chain`) or the transformer's layout is
            not supported; if a permutation has the wrong size; if the copy computes another
            function on the probe batch.
    References:
        Benzing et al. (2022), arXiv 2209.07509, Sec. 2; Ainsworth et al. (2023), arXiv
        2209.04836, Sec. 3.
    """
    if isinstance(perms, TransformerPermutation):
        return apply_transformer_permutation(model, perms, x)
    return apply_chain_permutation(model, perms, x)


def _unit_rows(weight: Tensor, axis: int) -> Tensor:
    """``weight`` with ``axis`` first, flattened to ``[d, -1]`` in float64."""
    return weight.movedim(axis, 0).reshape(weight.shape[axis], -1).to(torch.float64)


def _weight_similarity(
    params_a: LayerParams, params_b: LayerParams, perms: list[Tensor], axis: int
) -> Tensor:
    """``S[j, k]`` = inner product of a's unit j and b's unit k over every weight on ``axis``,
    b's other axes permuted by ``perms`` (Git Re-Basin Eq. 4's linear term)."""
    (wa, ba), (wb, bb) = params_a[axis], params_b[axis]
    if axis > 0:  # b's inputs of this layer come from the permuted previous axis
        wb = wb.index_select(1, perms[axis - 1].to(wb.device))
    similarity = _unit_rows(wa, 0) @ _unit_rows(wb, 0).mT
    if ba is not None:
        similarity = similarity + torch.outer(ba.to(torch.float64), bb.to(torch.float64))
    wa_next, wb_next = params_a[axis + 1][0], params_b[axis + 1][0]
    if axis + 1 < len(perms):  # the next layer's outputs are a permuted hidden axis too
        wb_next = wb_next.index_select(0, perms[axis + 1].to(wb_next.device))
    return similarity + _unit_rows(wa_next, 1) @ _unit_rows(wb_next, 1).mT


def weight_matching(
    params_a: LayerParams,
    params_b: LayerParams,
    *,
    max_sweeps: int = 100,
    tol: float = 1e-12,
    generator: torch.Generator | None = None,
) -> list[Tensor]:
    """Permutations aligning b to a by weights (Git Re-Basin's coordinate descent).

    Start from identities. Each sweep visits the hidden axes in a random order (``generator``);
    for axis ``l`` it builds ``S_l`` from every weight touching ``l`` (``weight_l``'s rows,
    ``bias_l``, ``weight_{l+1}``'s columns), with b's other axes permuted by the current
    permutations, and sets ``pi_l = argmax_P trace(S_l P)`` when that raises the objective by
    more than ``tol``. Stops after a sweep without such a gain, or after ``max_sweeps``.

    Args:
        params_a, params_b: :func:`layer_params` of two nets of the same architecture; give
            it the probe batch (``layer_params(model, x)``) so the layers come in executed
            order, checked to be a chain. Apply the result with ``apply_permutation(model_b,
            perms, x)``.
        max_sweeps: sweep cap (S7: 100).
        tol: minimum gain of ``sum_j S[j, pi[j]]`` that counts as progress (S7: 1e-12).
        generator: order of the visits (``None``: torch's global generator).
    Returns:
        ``[pi_0, .., pi_{L-1}]`` int64 CPU, same convention as :func:`activation_matching`.
    Raises:
        ValueError: if the layer shapes differ or ``max_sweeps < 1``.
    References:
        Ainsworth, Hayase, Srinivasa (2023), arXiv 2209.04836, Sec. 3.2, Alg. 1.
    """
    if max_sweeps < 1:
        raise ValueError(f"max_sweeps must be >= 1 (got {max_sweeps})")
    combine_params([params_a, params_b], [1.0, 0.0])  # raises if the shapes differ
    widths = hidden_widths(params_a)
    perms = [torch.arange(d) for d in widths]
    for _ in range(max_sweeps):
        progress = False
        for axis in torch.randperm(len(widths), generator=generator).tolist():
            similarity = _weight_similarity(params_a, params_b, perms, axis).cpu()
            new = match_units(similarity)
            rows = torch.arange(widths[axis])
            gain = similarity[rows, new].sum() - similarity[rows, perms[axis]].sum()
            if gain > tol:
                perms[axis] = new
                progress = True
        if not progress:
            break
    return perms


def average_params(params: Sequence[LayerParams]) -> LayerParams:
    """Uniform average of several nets' params (S7's n-way average of permuted inits).

    Raises:
        ValueError: if ``params`` is empty, or as :func:`combine_params`.
    """
    if not params:
        raise ValueError("params must hold at least one net (got 0)")
    return combine_params(params, [1.0 / len(params)] * len(params))
