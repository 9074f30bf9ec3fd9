"""Kernel instruments: empirical NTK, kernel change and alignment, analytic ReLU NTK/NNGP, the
linearized model and its kernel-gradient-descent twin (SYSTEMS.md S11, S17).

Glossary:
    model_fn:  ``model_fn(params, x) -> [n, d_out]`` (``[n]`` is read as ``d_out = 1``), a pure
               function of a dict of parameter tensors; :func:`model_function` makes one from an
               ``nn.Module`` (optionally over a subset of its parameters).
    n1, n2:    examples in ``x1``, ``x2``; ``d_out``: outputs per example; P: parameters.
    J(x):      ``[n, d_out, P]`` Jacobian of the outputs w.r.t. ``params`` (never formed by
               ``linearize``; formed per parameter tensor and example block by ``jacobian``).
    Theta:     the empirical NTK, ``Theta(x, x')_{cc'} = sum_p J(x)_{cp} J(x')_{c'p}``.
    Sigma:     the NNGP covariance of the infinite-width net.
    N, M:      training and test examples of kernel gradient descent.

References:
    Jacot, Gabriel & Hongler (2018), "Neural Tangent Kernel", NeurIPS, arXiv 1806.07572.
    Lee et al. (2019), "Wide Neural Networks of Any Depth Evolve as Linear Models Under Gradient
    Descent", NeurIPS, arXiv 1902.06720 (linearized model, eq. 6). Novak et al. (2022), "Fast
    Finite Width Neural Tangent Kernel", ICML, arXiv 2206.08720 (Jacobian contraction, jvp/vjp,
    structured derivatives).
    Yang & Littwin (2021), "Tensor Programs IIb", ICML, arXiv 2105.03703.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor, nn
from torch.func import functional_call

from dynascope.adapters import explicit_attention
from dynascope.probes._kernels_entk import ModelFn, entk_jacobian, entk_jvp_vjp, quiet_functorch
from dynascope.probes._kernels_memory import STRATEGIES, estimate, summarize
from dynascope.probes._kernels_structured import entk_structured, structure
from dynascope.probes.base import Probe, ProbeContext, register_probe

from ._kernels_compare import _cosine
from ._kernels_compare import centered_kernel_alignment as centered_kernel_alignment
from ._kernels_compare import kernel_alignment as kernel_alignment
from ._kernels_compare import ntk_relative_change as ntk_relative_change
from ._kernels_limits import analytic_ntk_relu as analytic_ntk_relu
from ._kernels_limits import kernel_gd_predictions as kernel_gd_predictions
from ._kernels_limits import linearize as linearize
from ._kernels_limits import nngp_relu as nngp_relu

__all__ = [
    "NTKDrift",
    "analytic_ntk_relu",
    "centered_kernel_alignment",
    "empirical_ntk",
    "empirical_ntk_memory",
    "empirical_ntk_structure",
    "kernel_alignment",
    "kernel_gd_predictions",
    "linearize",
    "model_function",
    "nngp_relu",
    "ntk_relative_change",
]

NTKMode = Literal["full", "trace", "diagonal"]
NTKStrategy = Literal["auto", "structured", "jacobian", "jvp_vjp"]


def model_function(
    model: nn.Module, include: Sequence[str] | None = None
) -> tuple[ModelFn, dict[str, Tensor]]:
    """``(model_fn, params)`` for :func:`empirical_ntk` from a module, over a parameter subset.

    Args:
        model: any module whose ``forward(x)`` returns ``[n, ...]``; outputs are flattened to
            ``[n, d_out]``.
        include: parameter-name prefixes to take the kernel over (e.g. ``["blocks.0.attn."]``
            for attention only); ``None`` takes every parameter. The others stay fixed at their
            current (detached) values.
    Returns:
        ``model_fn(params, x) -> [n, d_out]`` and ``params`` (detached tensors, by name). Each
        call runs inside :func:`dynascope.adapters.explicit_attention`, so forward-mode AD
        (``strategy="jvp_vjp"``, :func:`linearize`) works on Hugging Face models whatever
        their attention backend (switched to eager for the call, restored after it).
    Raises:
        ValueError: if ``include`` selects no parameter.
    """
    named = {k: p.detach() for k, p in model.named_parameters()}
    if include is None:
        chosen = named
    else:
        chosen = {k: v for k, v in named.items() if any(k.startswith(p) for p in include)}
    if not chosen:
        raise ValueError(f"include selects no parameter of the model (got {list(include or [])})")
    frozen = {k: v for k, v in named.items() if k not in chosen}
    buffers = dict(model.named_buffers())

    def model_fn(params: dict[str, Tensor], x: Tensor) -> Tensor:
        with explicit_attention(model):  # forward-mode AD needs the explicit softmax
            out = functional_call(model, {**frozen, **buffers, **params}, (x,))
        return out.reshape(out.shape[0], -1)

    return model_fn, chosen


def _check_inputs(params, x1, x2, mode, chunk_size) -> Tensor:
    if mode not in ("full", "trace", "diagonal"):
        raise ValueError(f"mode must be one of full, trace, diagonal (got {mode!r})")
    if chunk_size is not None and (
        isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1
    ):
        raise ValueError(f"chunk_size must be None or an integer >= 1 (got {chunk_size!r})")
    if not params:
        raise ValueError("params must hold at least one tensor (got an empty dict)")
    if x2 is None:
        x2 = x1
    if x1.shape[1:] != x2.shape[1:]:
        raise ValueError(
            f"x1 and x2 must share the per-example shape (got {tuple(x1.shape)} and "
            f"{tuple(x2.shape)})"
        )
    if mode == "diagonal" and x1.shape[0] != x2.shape[0]:
        raise ValueError(
            f"diagonal mode pairs examples: n1 must equal n2 (got {x1.shape[0]}, {x2.shape[0]})"
        )
    return x2


def empirical_ntk(
    model_fn: ModelFn,
    params: dict[str, Tensor],
    x1: Tensor,
    x2: Tensor | None = None,
    *,
    mode: NTKMode = "full",
    strategy: NTKStrategy = "auto",
    chunk_size: int | None = None,
    memory_budget: int | None = None,
) -> Tensor:
    """Empirical NTK ``Theta(x, x')_{cc'} = sum_p df_c(x)/dtheta_p * df_c'(x')/dtheta_p``.

    The sum runs over the parameters in ``params`` only: pass a subset (see
    :func:`model_function`) for the kernel of some layers (e.g. only attention).

    Strategies (all exact; they differ in time and memory):

    - ``"structured"`` (Novak et al. 2022, section 3.3): for a weight W of a linear map
      ``y = a W`` (``nn.Linear``, ``x @ W``, an einsum such as W_Q/W_K/W_V/W_O; shared over
      positions p) ``Theta_W(x, x')_{cc'} = sum_{p,p'} (a_p . a'_p') (g_{c,p} . g'_{c',p'})``
      from the map's inputs a and the cotangents g of its output (one batched backward pass
      per block: d_out cotangents at once), never the per-example Jacobian; biases and other
      added parameters ``(sum_p g_p) . (sum_p' g'_p')``; embedding rows ``W_E[ids]`` with
      ``a_p . a'_p' = [id_p == id'_p']``. The uses are found by tracing ``model_function``'s
      forward; every other parameter (LayerNorm, fused or unknown ops) goes to ``"jacobian"``
      over that subset. :func:`empirical_ntk_structure` says which parameter went where.
    - ``"jacobian"``: per-example Jacobians (``vmap`` over examples of ``jacrev``),
      contracted over parameters.
    - ``"jvp_vjp"``: for each example i of x1 and output c, one vjp ``v = J(x1_i)^T e_c``
      then one jvp ``J(x2) v`` over all of x2; no Jacobian of x2 is formed, at the price of
      n1 * d_out forward passes over x2 (needs forward-mode AD through the model).
    - ``"auto"`` (default), the fastest that applies: ``"structured"``, which takes every
      parameter it can read (a linear map, an embedding, an added bias) and hands the others
      to ``"jacobian"`` (reverse mode only, so it applies to every model and attention
      backend); with nothing to read this is ``"jacobian"`` plus one traced forward pass
      (``"jvp_vjp"`` can then be faster for full kernels with many outputs: pass it). On the
      MLP of ``benchmarks/entk.py`` (32-512-512-10, 128 inputs, one CPU thread) structured
      takes 0.06 s (full) and 0.03 s (trace) against 11.9 s and 2.0 s for ``"jacobian"`` and
      5.4 s and 5.1 s for ``"jvp_vjp"``, on par with neural-tangents (docs/benchmarks.md).

    Every strategy assumes the model treats examples independently (no batch statistics) and,
    for ``"structured"``, that examples lie on the first axis of every activation.

    Args:
        model_fn: ``model_fn(params, x) -> [n, d_out]`` (or ``[n]``), pure in ``params``.
        params: parameter tensors by name (requires_grad is not needed).
        x1: ``[n1, ...]`` inputs.
        x2: ``[n2, ...]`` inputs; ``None`` means ``x1``. In ``diagonal`` mode examples are
            paired, so ``n2 = n1``.
        mode: ``"full"`` -> ``[n1, n2, d_out, d_out]``; ``"trace"`` -> ``[n1, n2]``, the
            **sum** over outputs ``sum_c Theta_cc`` (neural-tangents and others average: divide
            by d_out to compare); ``"diagonal"`` -> ``[n1, d_out]``, ``Theta(x1_i, x2_i)_cc``.
        strategy: ``"auto"``, ``"structured"``, ``"jacobian"`` or ``"jvp_vjp"`` (above).
        chunk_size: ``None``: everything at once. An int bounds memory: examples are handled in
            blocks of ``chunk_size``; ``jacobian`` also takes one parameter tensor at a time
            (peak ``chunk_size * d_out * max_tensor_size``), ``jvp_vjp`` vmaps at most
            ``chunk_size`` basis vectors at once (peak ``chunk_size * P``), ``structured``
            traces blocks of ``chunk_size`` examples.
        memory_budget: bytes. When given, the peak is estimated first
            (:func:`empirical_ntk_memory`); if it exceeds the budget and ``chunk_size`` is
            ``None``, the largest power-of-two ``chunk_size`` that fits is used.
    Returns:
        The kernel in ``params``' dtype, in squared output units per unit parameter squared.
    Raises:
        ValueError: unknown ``mode`` or ``strategy``; ``chunk_size < 1``; empty ``params``;
            ``x1``/``x2`` with different trailing shapes, or ``n1 != n2`` in ``diagonal``
            mode; ``model_fn`` returning neither ``[n]`` nor ``[n, d_out]``; ``memory_budget``
            not a positive integer, or below the estimate (of ``chunk_size`` if given, else of
            ``chunk_size=1``).
        RuntimeError: (``structured``) a later block of examples uses the parameters
            differently from the first (data-dependent control flow).
    References:
        Jacot et al. (2018), arXiv 1806.07572, eq. (6); Novak et al. (2022), arXiv 2206.08720,
        sections 3.1-3.3 (Jacobian contraction; NTK-vector products; structured derivatives).
    """
    if strategy not in ("auto", *STRATEGIES):
        raise ValueError(
            f"strategy must be one of auto, structured, jacobian, jvp_vjp (got {strategy!r})"
        )
    x2 = _check_inputs(params, x1, x2, mode, chunk_size)
    if memory_budget is not None and (
        isinstance(memory_budget, bool) or not isinstance(memory_budget, int) or memory_budget < 1
    ):
        raise ValueError(f"memory_budget must be None or bytes >= 1 (got {memory_budget!r})")
    with quiet_functorch():
        if strategy == "auto":  # structured covers what it can; the rest is the jacobian's
            strategy = "structured"
        if memory_budget is not None:
            summary = summarize(model_fn, params, x1)
            chunk_size = _fit_budget(summary, x1, x2, mode, strategy, chunk_size, memory_budget)
        if strategy == "structured":
            return entk_structured(model_fn, params, x1, x2, mode, chunk_size, entk_jacobian)
        compute = entk_jacobian if strategy == "jacobian" else entk_jvp_vjp
        return compute(model_fn, params, x1, x2, mode, chunk_size)


def _fit_budget(summary, x1, x2, mode, strategy, chunk_size, budget) -> int | None:
    """``chunk_size`` itself if it fits, else the largest power of two that does."""
    n1, n2, same = x1.shape[0], x2.shape[0], x2 is x1
    need = estimate(summary, n1, n2, same, mode, strategy, chunk_size)
    if need <= budget:
        return chunk_size
    if chunk_size is None:
        chunk = 1 << max(n1, n2).bit_length()
        while chunk > 1:
            chunk //= 2
            if estimate(summary, n1, n2, same, mode, strategy, chunk) <= budget:
                return chunk
        need = estimate(summary, n1, n2, same, mode, strategy, 1)
    raise ValueError(
        f"memory_budget={budget} bytes is below the estimated peak of {need} bytes (strategy "
        f"{strategy!r}, chunk_size={chunk_size or 1}); raise it or use fewer examples"
    )


def empirical_ntk_memory(
    model_fn: ModelFn,
    params: dict[str, Tensor],
    x1: Tensor,
    x2: Tensor | None = None,
    *,
    mode: NTKMode = "full",
    chunk_size: int | None = None,
) -> dict[str, int]:
    """Estimated peak memory of :func:`empirical_ntk` per strategy, before computing anything.

    Traces one example (one forward and one backward pass) and counts the large tensors each
    strategy holds at once: the kernel; ``jacobian``: the Jacobians of a block (all parameters,
    or the largest tensor when chunked) and d_out cotangents of every activation;
    ``jvp_vjp``: n1 (or ``chunk_size``) x d_out parameter-sized tangents and their forward
    over x2; ``structured``: activations and d_out cotangents of two blocks, the kept
    cotangents and the largest Gram piece ``[n1 P d_out, n2 P d_out]`` (P positions), or the
    jacobian estimate of its fallback parameters if larger. Activations count every tensor
    the forward computes (an upper bound on what autograd keeps); measured against peak RSS
    in docs/benchmarks.md ("eNTK").

    Args:
        model_fn, params, x1, x2, mode, chunk_size: as :func:`empirical_ntk`.
    Returns:
        ``{"structured": bytes, "jacobian": bytes, "jvp_vjp": bytes}`` (ints).
    Raises:
        ValueError: as :func:`empirical_ntk` for ``mode``, ``chunk_size``, ``params`` and the
            shapes of ``x1``, ``x2``.
    """
    x2 = _check_inputs(params, x1, x2, mode, chunk_size)
    with quiet_functorch():
        summary = summarize(model_fn, params, x1)
    n1, n2, same = x1.shape[0], x2.shape[0], x2 is x1
    return {s: estimate(summary, n1, n2, same, mode, s, chunk_size) for s in STRATEGIES}


def empirical_ntk_structure(
    model_fn: ModelFn, params: dict[str, Tensor], x: Tensor
) -> dict[str, str]:
    """How the ``"structured"`` strategy of :func:`empirical_ntk` takes each parameter.

    Args:
        model_fn, params: as :func:`empirical_ntk`.
        x: ``[n, ...]`` a few inputs to trace the forward on.
    Returns:
        ``{name: kind}`` with kind ``"linear"`` (``y = a W``, maybe shared over positions),
        ``"embedding"`` (rows picked by token ids), ``"additive"`` (a bias or positional
        embedding), ``"unused"`` (no effect on the output) or ``"fallback (reason)"``.
    Raises:
        ValueError: if ``params`` is empty or ``model_fn`` does not return one row per example.
    """
    if not params:
        raise ValueError("params must hold at least one tensor (got an empty dict)")
    with quiet_functorch():
        return structure(model_fn, params, x)


@register_probe("ntk_drift")
class NTKDrift(Probe):
    """Relative change of the empirical NTK on a fixed probe batch, ``||Theta_t - Theta_0||_F /
    ||Theta_0||_F`` (S17), at the steps the monitor schedules.

    The probe batch is the first ``n_examples`` rows of ``ctx.batch[input_key]`` at the first
    call (or ``x`` if given); ``Theta_0`` is the kernel at that call. Both are kept in
    :meth:`state_dict`, so a resumed run compares with the same reference. Outputs are flattened
    per example (``d_out`` = everything after the batch axis; cost grows with d_out and P).
    The kernel is taken with the model in eval mode (restored afterwards), so dropout is off and
    modules with in-place buffer updates (σReparam's power iteration) leave their state alone.

    Keys: ``ntk.relative_change`` (0 at the first call), ``ntk.trace`` (trace of the
    ``[n, n]`` trace-mode Gram, output units^2), ``ntk.alignment_0`` (cosine of the Gram with
    ``Theta_0``'s).

    Args:
        n_examples: probe-batch size (>= 1).
        include: parameter-name prefixes for a parameter subset (see :func:`model_function`).
        x: a fixed probe batch ``[n, ...]`` instead of the first ``ctx.batch``.
        input_key: the batch entry holding the inputs.
        chunk_size: passed to :func:`empirical_ntk`.
    Raises:
        ValueError: ``n_examples < 1``; (call) if no probe batch is held (no ``x``, no earlier
            call) and ``ctx.batch`` has no ``input_key``, as :class:`AttentionEntropy` does (a
            Hugging Face callback steps the monitor without a batch: pass ``x``).
    """

    def __init__(
        self,
        *,
        n_examples: int = 8,
        include: Sequence[str] | None = None,
        x: Tensor | None = None,
        input_key: str = "x",
        chunk_size: int | None = None,
    ) -> None:
        if isinstance(n_examples, bool) or not isinstance(n_examples, int) or n_examples < 1:
            raise ValueError(f"n_examples must be an integer >= 1 (got {n_examples!r})")
        self.n_examples = n_examples
        self.include = None if include is None else list(include)
        self.input_key = input_key
        self.chunk_size = chunk_size
        self.x = None if x is None else x[:n_examples].detach().clone()
        self.K0: Tensor | None = None

    def state_dict(self) -> dict:
        """The probe batch and ``Theta_0`` (empty before the first reading)."""
        if self.K0 is None or self.x is None:
            return {}
        return {"x": self.x, "K0": self.K0}

    def load_state_dict(self, state: dict) -> None:
        """Restore the probe batch and ``Theta_0``."""
        self.x, self.K0 = (state.get("x"), state.get("K0")) if state else (self.x, None)

    def _kernel(self, model: nn.Module, x: Tensor) -> Tensor:
        model_fn, params = model_function(model, self.include)
        return empirical_ntk(model_fn, params, x, mode="trace", chunk_size=self.chunk_size)

    def measure(self, model: nn.Module, ctx: ProbeContext) -> dict[str, Tensor | float]:
        if self.x is None:
            if ctx.batch is None or self.input_key not in ctx.batch:
                got = "no batch" if ctx.batch is None else f"batch keys {sorted(ctx.batch)}"
                raise ValueError(
                    "ntk_drift needs inputs: pass x= when constructing it, or a batch with key "
                    f"{self.input_key!r} to monitor.step(step, batch) (got {got})"
                )
            self.x = ctx.batch[self.input_key][: self.n_examples].detach().clone()
        device = next(model.parameters()).device
        # eval mode (restored by Probe.__call__): the kernel of the deterministic f(x; θ), with
        # dropout off and no module updating its buffers in place (SigmaReparam's power
        # iteration would, and torch.func forbids writes to captured tensors).
        model.eval()
        K = self._kernel(model, self.x.to(device)).detach().cpu()
        if self.K0 is None:
            self.K0 = K
        return {
            "ntk.relative_change": float(ntk_relative_change(K, self.K0)),
            "ntk.trace": float(torch.diagonal(K).sum()),
            "ntk.alignment_0": float(_cosine(K, self.K0)),
        }
