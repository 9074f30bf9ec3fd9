"""The local learning coefficient (LLC): how degenerate the loss is around a point w*.

Glossary:
    loss_fn:   ``loss_fn(params, batch) -> scalar``, the mean negative log-likelihood per sample
               of one batch (for Gaussian noise of variance 1: half the mean squared error), a
               function of a dict of parameter tensors (name -> tensor).
    batches:   a sequence of equal-size batches that together hold the n training samples;
               ``L_n(w)`` is the mean of the batch losses, ``L_b(w)`` the loss of batch b.
    w*:        ``params``, the point whose LLC is measured (a local minimum of L_n).
    nβ:        ``n_beta`` = n·β, the inverse temperature times the sample size; Watanabe's WBIC
               temperature β = 1/log n gives nβ = n / log n (:func:`default_n_beta`).
    γ:         ``localization``, the strength of the Gaussian prior ``exp(−γ/2 ‖w − w*‖²)`` that
               keeps the sampler near w*.
    ε:         ``step_size`` of SGLD, in parameter units squared.
    λ:         the learning coefficient (real log canonical threshold); λ = d/2 for a regular
               model with d parameters, smaller for a degenerate (singular) one.

The estimator (Lau et al. 2023, eq. 6 and Definition 3) is
``λ̂(w*) = nβ (E_w[L_n(w)] − L_n(w*))``, the expectation over the localized tempered posterior
``p(w) ∝ exp(−nβ L_n(w) − γ/2 ‖w − w*‖²)``, sampled by stochastic-gradient Langevin dynamics
(Welling & Teh 2011) started at w*:
``Δw = (ε/2) (−nβ ∇L_b(w) − γ (w − w*)) + N(0, ε)``, b a random batch. Each draw contributes
``nβ (L_b(w_t) − L_b(w*))``: the same batch's loss at w*, subtracted as a control variate, is
unbiased for ``L_n(w*)`` and cancels most of the batch-to-batch noise. With
``preconditioner="rmsprop"`` the drift and the noise are scaled per entry by
``G = 1/(sqrt(V) + 0.1)``, V the running mean of ``(∇L_b)²`` (decay 0.99): devinterp's
RMSpropSGLD, after Li et al. (2016), without their correction term.

At finite n the estimate carries biases the samplers cannot remove: γ pulls it down (for a
regular model ``λ̂ = ½ Σ_i nβh_i / (nβh_i + γ)``, h_i the Hessian's eigenvalues), the step
size pushes it up (Langevin with step ε overestimates a Gaussian's variance by ``1/(1 − εnβh/4)``),
and at a singular point with multiplicity m > 1 the posterior converges to λ only like
``(m − 1)/log(nβ)``. :func:`llc_calibrate` chooses ε and γ from the diagnostics.

References:
    Lau, Furman, Wang, Murfet & Wei (2023), "The Local Learning Coefficient: A
    Singularity-Aware Complexity Measure", arXiv 2308.12108 (first circulated as "Quantifying
    degeneracy in singular models via the learning coefficient"), eq. (6), Definition 3, §4.
    Watanabe (2013), "A widely applicable Bayesian information criterion", JMLR 14 (β = 1/log n).
    Watanabe (2009), "Algebraic Geometry and Statistical Learning Theory", Cambridge (λ, m).
    Welling & Teh (2011), "Bayesian learning via stochastic gradient Langevin dynamics", ICML.
    Li, Chen, Carlson & Carin (2016), "Preconditioned stochastic gradient Langevin dynamics for
    deep neural networks", AAAI, arXiv 1512.07666.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor, nn

from dynascope.probes._hessian_ops import check_params
from dynascope.probes._hessian_probe import BatchLoss, HessianProbe
from dynascope.probes._llc_sampler import (
    BatchLossFn,
    Restriction,
    chain,
    diagnose,
    restriction_masks,
    step_bias,
)
from dynascope.probes.base import ProbeContext, register_probe

__all__ = [
    "LLC",
    "LLCCalibration",
    "LLCResult",
    "default_n_beta",
    "head_restriction",
    "llc",
    "llc_calibrate",
]


class LLCResult(NamedTuple):
    """The result of :func:`llc`.

    Attributes:
        mean: λ̂, the mean of ``per_chain`` (dimensionless; NaN if a chain diverged).
        std: the standard deviation of ``per_chain`` (ddof 1; NaN with one chain).
        per_chain: ``[n_chains]`` each chain's mean of its ``trace`` row.
        trace: ``[n_chains, n_draws]`` float64, the per-draw estimates
            ``nβ (L_b(w_t) − L_b(w*))`` after burn-in; NaN from where a chain diverged.
        init_loss: ``L_n(w*)``, the mean batch loss at w* (loss units).
        step_bias: the relative bias of ``mean`` that the step size causes, estimated from the
            draws as ``ε E[Σ_i G_i drift_i²] / (8 λ̂)`` (exact to first order in ε for a
            Gaussian posterior; includes minibatch noise; inf when λ̂ <= 0).
    """

    mean: float
    std: float
    per_chain: Tensor
    trace: Tensor
    init_loss: float
    step_bias: float


def default_n_beta(n: int) -> float:
    """``nβ = n / log n``: Watanabe's WBIC inverse temperature β = 1/log n times n samples.

    Raises:
        ValueError: if ``n`` is not an integer >= 2.
    References:
        Watanabe (2013), JMLR 14, "A widely applicable Bayesian information criterion", §4.
    """
    _check_int("n", n, 2)
    return n / math.log(n)


def head_restriction(prefix: str, head: int, *, biases: bool = True) -> dict[str, Any]:
    """A ``restrict`` argument that samples one head of a dynascope ``MultiHeadAttention``.

    Its per-head weights ``W_Q, W_K, W_V: [n_heads, d_model, d_head]`` and
    ``W_O: [n_heads, d_head, d_model]`` (and ``b_Q, b_K, b_V: [n_heads, d_head]``) are indexed
    by ``head`` along their first dimension; ``b_O`` is shared by all heads and stays fixed.
    ``llc(..., restrict=head_restriction("blocks.0.attn", 2))`` is the LLC of head 2 of block 0
    with every other parameter held at w* (per-head LLC). With ``biases`` and a module built
    without biases, drop the ``b_*`` keys (``llc`` rejects names that ``params`` lacks).

    Args:
        prefix: the attention module's name in ``model.named_parameters()`` (no trailing dot).
        head: the head index, 0-based.
        biases: also sample ``b_Q, b_K, b_V`` of the head.
    Raises:
        ValueError: if ``head`` is not an integer >= 0.
    """
    _check_int("head", head, 0)
    names = ["W_Q", "W_K", "W_V", "W_O"] + (["b_Q", "b_K", "b_V"] if biases else [])
    return {f"{prefix}.{name}": head for name in names}


def _check_int(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low} (got {name}={value!r})")


def _check_positive(name: str, value: Any, *, allow_zero: bool = False) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {bound} (got {name}={value!r})")


def _init_losses(loss_fn: BatchLossFn, params: dict[str, Tensor], batches: Sequence[Any]):
    losses = []
    with torch.no_grad():
        for index, batch in enumerate(batches):
            loss = loss_fn(params, batch)
            if not isinstance(loss, Tensor) or loss.numel() != 1:
                got = tuple(loss.shape) if isinstance(loss, Tensor) else type(loss).__name__
                raise ValueError(f"loss_fn must return a scalar tensor (got {got})")
            if not bool(torch.isfinite(loss)):
                raise ValueError(f"loss_fn is not finite at params on batch {index} ({loss})")
            losses.append(float(loss))
    return torch.tensor(losses, dtype=torch.float64)


def llc(
    loss_fn: BatchLossFn,
    params: dict[str, Tensor],
    batches: Sequence[Any],
    *,
    n_beta: float,
    localization: float,
    step_size: float,
    n_chains: int = 4,
    n_draws: int = 1000,
    seed: int = 0,
    restrict: Restriction = None,
    burn_in: int | None = None,
    preconditioner: Literal["rmsprop"] | None = None,
) -> LLCResult:
    """The local learning coefficient λ̂(w*) = nβ (E_w[L_n(w)] − L_n(w*)), by localized SGLD.

    ``n_chains`` independent chains start at w* = ``params``; each takes ``burn_in + n_draws``
    steps (one gradient each) and averages its last ``n_draws`` per-draw estimates (module
    docstring). The chains run one after another with one private ``torch.Generator`` seeded
    by ``seed`` (batch picks and noise), so a seeded call is repeatable and leaves the global
    RNG alone. Cost: ``n_chains · (burn_in + n_draws)`` forward-backward passes of one batch,
    plus one forward per batch for ``L_b(w*)``.

    Args:
        loss_fn: ``loss_fn(params, batch) -> scalar tensor``, the mean negative log-likelihood
            per sample of ``batch`` (differentiable in ``params``; it must not detach them).
        params: name -> tensor, the point w*; one floating dtype and device. Not modified.
        batches: equal-size batches (anything ``loss_fn`` accepts) holding the n samples.
        n_beta: nβ > 0, usually ``default_n_beta(n)`` = n / log n.
        localization: γ >= 0 (1/parameter units squared).
        step_size: ε > 0 (parameter units squared).
        n_chains: chains (>= 1).
        n_draws: recorded draws per chain (>= 2).
        seed: seeds the private generator.
        restrict: which entries to sample; the rest stay at w*. ``None``: all. A dict
            name -> ``True`` (the whole tensor), a bool mask of the tensor's shape, or an index
            (``2``, ``(slice(None), 0)``), e.g. :func:`head_restriction`; names not in it stay
            fixed. Or a callable ``(name, tensor) -> any of those, or None``.
        burn_in: steps discarded before the first draw (>= 0); ``None``: ``n_draws // 4``.
        preconditioner: ``None`` (plain SGLD) or ``"rmsprop"``.
    Returns:
        :class:`LLCResult` ``(mean, std, per_chain [n_chains], trace [n_chains, n_draws],
        init_loss)``. A chain whose loss or parameters stop being finite ends early; its
        ``per_chain`` entry and ``mean`` are then NaN.
    Raises:
        ValueError: if ``params`` is empty, not floating or mixes dtypes or devices; if
            ``batches`` is empty; if ``n_beta``, ``step_size``, ``localization``, ``n_chains``,
            ``n_draws`` or ``burn_in`` is out of range; if ``preconditioner`` is not None or
            ``"rmsprop"``; if ``restrict`` names unknown parameters, does not fit them or selects
            nothing; if ``loss_fn`` returns no scalar or is not finite at w*.
    References:
        Lau et al. (2023), arXiv 2308.12108, eq. (6) and Definition 3 (estimator, localization).
    """
    check_params(params)
    if len(batches) == 0:
        raise ValueError("batches must hold at least one batch (got 0)")
    _check_positive("n_beta", n_beta)
    _check_positive("step_size", step_size)
    _check_positive("localization", localization, allow_zero=True)
    _check_int("n_chains", n_chains, 1)
    _check_int("n_draws", n_draws, 2)
    burn_in = n_draws // 4 if burn_in is None else burn_in
    _check_int("burn_in", burn_in, 0)
    if preconditioner not in (None, "rmsprop"):
        raise ValueError(
            f"preconditioner must be None or 'rmsprop' (got preconditioner={preconditioner!r})"
        )
    params = {name: p.detach() for name, p in params.items()}
    masks = restriction_masks(params, restrict)
    init_losses = _init_losses(loss_fn, params, batches)
    device = next(iter(params.values())).device
    generator = torch.Generator(device=device).manual_seed(seed)
    runs = [
        chain(
            loss_fn,
            params,
            masks,
            batches,
            init_losses,
            n_beta=float(n_beta),
            localization=float(localization),
            step_size=float(step_size),
            n_steps=burn_in + n_draws,
            burn_in=burn_in,
            use_rmsprop=preconditioner == "rmsprop",
            generator=generator,
        )
        for _ in range(n_chains)
    ]
    trace = torch.stack([draws for draws, _ in runs])
    per_chain = trace.mean(dim=1)
    mean = float(per_chain.mean())
    std = float(per_chain.std()) if n_chains > 1 else math.nan
    energy = sum(energy for _, energy in runs) / n_chains
    bias = step_bias(float(step_size), energy, mean)
    return LLCResult(mean, std, per_chain, trace, float(init_losses.mean()), bias)


class LLCCalibration(NamedTuple):
    """The result of :func:`llc_calibrate`.

    Attributes:
        step_size: the chosen ε.
        localization: the chosen γ.
        result: the :class:`LLCResult` of the accepted run (at ``step_size``, ``localization``).
        tried: every run, in order, as ``(localization, step_size, mean, verdict)``; verdict is
            ``"ok"`` or what failed.
    """

    step_size: float
    localization: float
    result: LLCResult
    tried: list[tuple[float, float, float, str]]


def _ladder(name: str, values: Sequence[float] | None, default: list[float]) -> list[float]:
    if values is None:
        return default
    values = [float(v) for v in values]
    if not values or any(not (math.isfinite(v) and v > 0) for v in values):
        raise ValueError(f"{name} must be a non-empty list of finite numbers > 0 (got {values})")
    return sorted(values, reverse=True)


def llc_calibrate(
    loss_fn: BatchLossFn,
    params: dict[str, Tensor],
    batches: Sequence[Any],
    *,
    n_beta: float,
    n_chains: int = 4,
    n_draws: int = 1000,
    seed: int = 0,
    restrict: Restriction = None,
    burn_in: int | None = None,
    preconditioner: Literal["rmsprop"] | None = None,
    step_sizes: Sequence[float] | None = None,
    localizations: Sequence[float] | None = None,
    rtol: float = 0.05,
) -> LLCCalibration:
    """Choose SGLD's step size ε and the localization γ of :func:`llc` from diagnostics.

    A run "passes" when no chain diverged (every draw finite), its trace is stationary after
    burn-in (the drift between the two halves of each chain, averaged over chains, is within
    ``rtol · |λ̂|`` up to two standard errors over chains) and its chains agree (Gelman–Rubin
    R̂ <= 1.1 on the per-draw trace). The recipe:

    1. Step size: walk the step ladder down (largest first) to the first ε whose run passes
       and whose measured step bias (:attr:`LLCResult.step_bias`, ``ε E[Σ drift²] / (8 λ̂)``)
       is at most ``rtol``; a run that passes with a larger bias jumps straight to the rung
       that the bias's proportionality to ε predicts.
    2. Localization: γ runs down its ladder (largest first). At each γ, step 1 starts one rung
       above the ε accepted at the previous γ. Stop when the estimates at two consecutive γ
       agree within ``rtol · |λ̂|``: the estimate no longer depends on the prior's pull, and
       the smaller γ and its run are returned. Every run uses the same seed, so runs at two γ
       share their noise (common random numbers) and their difference is far less noisy than
       either estimate.

    Default ladders: ``step_sizes = 2^{-k} / nβ`` for k = 0..14 (ε·nβ·h is the step measured
    against a curvature h of the loss; Langevin is stable below 4), ``localizations = nβ ·
    10^{-k}`` for k = 1..4. Cost: each run is one :func:`llc` call, ``n_chains · (burn_in +
    n_draws)`` gradients (a diverging run stops early); typically 2 to 3 runs per γ.
    The precision of the returned estimate is its ``std / sqrt(n_chains)``; for a tighter
    number rerun :func:`llc` at the returned settings with more chains or draws.

    Args:
        loss_fn, params, batches, n_beta, n_chains, n_draws, seed, restrict, burn_in,
            preconditioner: as :func:`llc` (every run uses ``seed``).
        step_sizes: the ε ladder (> 0), tried largest first.
        localizations: the γ ladder (> 0), tried largest first.
        rtol: relative tolerance of every agreement test, in (0, 1).
    Returns:
        :class:`LLCCalibration` ``(step_size, localization, result, tried)``.
    Raises:
        ValueError: as :func:`llc`; if ``rtol`` is not in (0, 1) or a ladder is empty or not
            positive; "llc_calibrate: no step size passed ..." when no ε passes and agrees with
            its neighbour at the largest γ (the message gives the last run's failure: diverged,
            not stationary, chains disagree, or step sizes disagree); "llc_calibrate: the
            estimate still moved ..." when no two consecutive γ agree.
    References:
        Lau et al. (2023), arXiv 2308.12108, §4 and Appendix (choosing ε, γ from loss traces);
        Gelman & Rubin (1992), "Inference from iterative simulation using multiple sequences",
        Statistical Science 7(4) (R̂).
    """
    _check_positive("n_beta", n_beta)
    if not (isinstance(rtol, int | float) and 0 < rtol < 1):
        raise ValueError(f"rtol must be in (0, 1) (got rtol={rtol!r})")
    steps = _ladder("step_sizes", step_sizes, [2.0**-k / n_beta for k in range(15)])
    gammas = _ladder("localizations", localizations, [n_beta * 10.0**-k for k in range(1, 5)])
    tried: list[tuple[float, float, float, str]] = []

    def run(gamma: float, step: float) -> tuple[LLCResult, list[str]]:
        result = llc(
            loss_fn, params, batches, n_beta=n_beta, localization=gamma, step_size=step,
            n_chains=n_chains, n_draws=n_draws, seed=seed, restrict=restrict, burn_in=burn_in,
            preconditioner=preconditioner,
        )  # fmt: skip
        problems = diagnose(result.trace, rtol)
        if not problems and not result.step_bias <= rtol:
            problems = [f"step bias {result.step_bias:.3g} > rtol"]
        tried.append((gamma, step, result.mean, "; ".join(problems) or "ok"))
        return result, problems

    def settle(gamma: float, first: int) -> tuple[int, LLCResult] | None:
        k = first
        while k < len(steps):
            result, problems = run(gamma, steps[k])
            if not problems:
                return k, result
            if problems[0].startswith("step bias") and math.isfinite(result.step_bias):
                wanted = steps[k] * rtol / result.step_bias
                k = max(k + 1, next((j for j, s in enumerate(steps) if s <= wanted), len(steps)))
            else:
                k += 1
        return None

    accepted: list[tuple[float, int, LLCResult]] = []
    for gamma in gammas:
        first = 0 if not accepted else max(accepted[-1][1] - 1, 0)
        found = settle(gamma, first)
        if found is None:
            break
        accepted.append((gamma, *found))
        if len(accepted) >= 2:
            (_, _, before), (gamma, k, result) = accepted[-2], accepted[-1]
            if abs(before.mean - result.mean) <= rtol * abs(result.mean):
                return LLCCalibration(steps[k], gamma, result, tried)
    if not accepted:
        last = tried[-1]
        raise ValueError(
            f"llc_calibrate: no step size passed at localization {gammas[0]:.3g} (last run, "
            f"step {last[1]:.3g}: {last[3]}); try more n_draws, smaller step_sizes or data"
        )
    summary = ", ".join(f"{g:.3g}: {r.mean:.4g}" for g, _, r in accepted)
    raise ValueError(
        f"llc_calibrate: the estimate still moved by more than rtol={rtol} between "
        f"localizations ({summary}); try smaller localizations or more n_draws"
    )


@register_probe("llc")
class LLC(HessianProbe):
    """Probe: the LLC of the model at each reading, on the step axis, by full-batch SGLD.

    Samples the localized tempered posterior around the current weights with :func:`llc`,
    using the held batch (the ``batch`` given here, else the first ``ctx.batch``; n = its
    leading size) as one full batch, and the loss as the Hessian probes take it (``loss``, else
    ``ctx.loss``, else cross-entropy / mean squared error on targets ``y``). The model is read
    in eval mode and left as found. Keys (floats), with ``prefix = f"{label}.llc"`` or
    ``"llc"``: ``{prefix}.mean`` (λ̂), ``{prefix}.std`` (over chains), ``{prefix}.step_bias``,
    ``{prefix}.init_loss`` (``L_n(w*)``).

    The defaults ``step_size = 1/(16 nβ)`` and ``localization = nβ/100`` are where
    :func:`llc_calibrate`'s ladders settle for a loss of curvature about 1 per sample; for
    numbers to compare, run :func:`llc_calibrate` once on the model and data and pass its
    ``step_size`` and ``localization`` here, so every reading uses the same settings.

    Args:
        loss: ``loss(output, batch) -> scalar`` (mean negative log-likelihood per sample).
        batch: a held batch (name -> tensor, with ``input_key``) instead of the first ``ctx.batch``.
        include: parameter-name prefixes to sample (``None``: all), as :class:`Sharpness`.
        restrict: as :func:`llc`, over the included parameters' names (e.g.
            :func:`head_restriction`).
        n_beta: nβ; ``None``: ``default_n_beta(n)``.
        step_size, localization: ε and γ; ``None``: the defaults above.
        n_chains, n_draws, burn_in, preconditioner, seed: as :func:`llc`.
        label: key prefix, e.g. ``"L0.H2"`` for a per-head LLC.
        input_key: the batch entry passed as ``model(batch[input_key])``.
    Raises:
        ValueError: (call) as :func:`llc`; if no batch is held and ``ctx.batch`` lacks
            ``input_key``; if the held batch has fewer than 2 samples and ``n_beta`` is None.
    References:
        Lau et al. (2023), arXiv 2308.12108.
    """

    def __init__(
        self,
        *,
        loss: BatchLoss | None = None,
        batch: dict[str, Tensor] | None = None,
        include: Sequence[str] | None = None,
        restrict: Restriction = None,
        n_beta: float | None = None,
        step_size: float | None = None,
        localization: float | None = None,
        n_chains: int = 2,
        n_draws: int = 100,
        burn_in: int | None = None,
        preconditioner: Literal["rmsprop"] | None = None,
        label: str | None = None,
        input_key: str = "x",
        seed: int = 0,
    ) -> None:
        super().__init__(loss=loss, batch=batch, include=include, input_key=input_key, seed=seed)
        self.restrict = restrict
        self.n_beta, self.step_size, self.localization = n_beta, step_size, localization
        self.n_chains, self.n_draws, self.burn_in = n_chains, n_draws, burn_in
        self.preconditioner = preconditioner
        self.prefix = "llc" if label is None else f"{label}.llc"

    def measure(self, model: nn.Module, ctx: ProbeContext) -> dict[str, Tensor | float]:
        loss_fn, params = self.loss_closure(model, ctx)
        n = next(iter(self._held_batch(ctx).values())).shape[0]
        n_beta = default_n_beta(n) if self.n_beta is None else self.n_beta
        result = llc(
            lambda p, _: loss_fn(p), params, [None], n_beta=n_beta,
            localization=n_beta / 100 if self.localization is None else self.localization,
            step_size=1 / (16 * n_beta) if self.step_size is None else self.step_size,
            n_chains=self.n_chains, n_draws=self.n_draws, seed=self.seed,
            restrict=self.restrict, burn_in=self.burn_in, preconditioner=self.preconditioner,
        )  # fmt: skip
        return {
            f"{self.prefix}.mean": result.mean,
            f"{self.prefix}.std": result.std,
            f"{self.prefix}.step_bias": result.step_bias,
            f"{self.prefix}.init_loss": result.init_loss,
        }
