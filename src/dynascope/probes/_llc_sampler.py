"""Private helpers of :mod:`dynascope.probes.llc`: the sampled parameter subset, one SGLD chain,
and the diagnostics that :func:`~dynascope.probes.llc.llc_calibrate` reads.

Glossary:
    params:   name -> tensor, the point w* (one floating dtype and device).
    masks:    name -> bool tensor of ``params[name]``'s shape, True where an entry is sampled;
              names without a mask stay at w*.
    trace:    ``[n_chains, n_draws]`` per-draw estimates ``nβ (L_b(w_t) − L_b(w*))``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["DiagnosticLimits", "chain", "diagnose", "restriction_masks", "step_bias"]

BatchLossFn = Callable[[dict[str, Tensor], Any], Tensor]
Restriction = Mapping[str, Any] | Callable[[str, Tensor], Any] | None

RMSPROP_ALPHA = 0.99
"""Decay of the running mean of squared gradients (devinterp's RMSpropSGLD default)."""
RMSPROP_EPS = 0.1
"""Added to ``sqrt(V)`` before inverting; bounds the preconditioner by ``1 / RMSPROP_EPS``."""


def _mask_of(name: str, p: Tensor, spec: Any) -> Tensor | None:
    """The bool mask that ``spec`` selects in ``p`` (None: nothing sampled)."""
    if spec is None or spec is False:
        return None
    if spec is True:
        return torch.ones_like(p, dtype=torch.bool)
    if isinstance(spec, Tensor) and spec.dtype == torch.bool:
        if spec.shape != p.shape:
            raise ValueError(
                f"restrict[{name!r}] mask must have the parameter's shape {tuple(p.shape)} "
                f"(got {tuple(spec.shape)})"
            )
        return spec.to(p.device)
    mask = torch.zeros_like(p, dtype=torch.bool)
    try:
        mask[spec] = True
    except (IndexError, TypeError, ValueError) as error:
        raise ValueError(
            f"restrict[{name!r}] must be True, a bool mask or an index into shape "
            f"{tuple(p.shape)} (got {spec!r}: {error})"
        ) from None
    return mask


def restriction_masks(params: dict[str, Tensor], restrict: Restriction) -> dict[str, Tensor]:
    """name -> bool mask of the sampled entries, only for names with at least one.

    Raises:
        ValueError: if ``restrict`` names a parameter that ``params`` lacks, a mask or index
            does not fit its parameter, or nothing at all is selected.
    """
    if restrict is None:
        specs: dict[str, Any] = dict.fromkeys(params, True)
    elif callable(restrict):
        specs = {name: restrict(name, p) for name, p in params.items()}
    elif isinstance(restrict, Mapping):
        unknown = sorted(set(restrict) - set(params))
        if unknown:
            raise ValueError(
                f"restrict names parameters not in params: {unknown} (params: {sorted(params)})"
            )
        specs = dict(restrict)
    else:
        raise ValueError(
            f"restrict must be None, a dict name -> mask/index or a callable "
            f"(got {type(restrict).__name__})"
        )
    masks = {}
    for name, spec in specs.items():
        mask = _mask_of(name, params[name], spec)
        if mask is not None and bool(mask.any()):
            masks[name] = mask
    if not masks:
        raise ValueError("restrict selects no parameter entry to sample")
    return masks


def chain(
    loss_fn: BatchLossFn,
    params: dict[str, Tensor],
    masks: dict[str, Tensor],
    batches: Sequence[Any],
    init_losses: Tensor,
    *,
    n_beta: float,
    localization: float,
    step_size: float,
    n_steps: int,
    burn_in: int,
    use_rmsprop: bool,
    generator: torch.Generator,
) -> tuple[Tensor, float]:
    """One SGLD chain from w*: its ``[n_steps - burn_in]`` per-draw estimates and its mean
    drift energy ``E[Σ_i G_i drift_i²]`` over the draws (see :func:`step_bias`).

    Each step draws a batch index uniformly (with replacement), records
    ``nβ (L_b(w_t) − L_b(w*))`` at the current point, then moves the sampled entries by
    ``Δw = (ε/2) G (−nβ ∇L_b(w_t) − γ (w_t − w*)) + sqrt(ε G) ξ``, ξ ~ N(0, I), with G = 1 or the
    RMSProp preconditioner ``G = 1 / (sqrt(V) + eps)``, ``V ← α V + (1 − α) (∇L_b)²``. The
    sampled tensors live in one flat vector (one gradient, one noise draw per step). A chain
    whose loss or parameters stop being finite ends there: the rest of its draws are NaN.
    """
    frozen = {name: p for name, p in params.items() if name not in masks}
    shapes = {name: params[name].shape for name in masks}
    sizes = [params[name].numel() for name in masks]
    anchor = torch.cat([params[name].reshape(-1) for name in masks])
    gate = torch.cat([masks[name].reshape(-1) for name in masks]).to(anchor.dtype)
    w = anchor.clone()
    square_avg = torch.zeros_like(anchor)
    draws = torch.full((n_steps - burn_in,), math.nan, dtype=torch.float64)
    picks = torch.randint(
        len(batches), (n_steps,), generator=generator, device=generator.device
    ).tolist()
    energy = 0.0
    for step, pick in enumerate(picks):
        with torch.enable_grad():  # probes run under no_grad: the split must be recorded too
            leaf = w.detach().requires_grad_(True)
            views = dict(zip(shapes, leaf.split(sizes), strict=True))
            loss = loss_fn(
                {**frozen, **{n: v.view(shapes[n]) for n, v in views.items()}}, batches[pick]
            )
            (grad,) = torch.autograd.grad(loss, leaf, allow_unused=True)
        value = float(loss.detach())
        if not math.isfinite(value):
            break
        if step >= burn_in:
            draws[step - burn_in] = n_beta * (value - float(init_losses[pick]))
        grad = torch.zeros_like(anchor) if grad is None else grad
        noise = torch.randn(
            anchor.shape, generator=generator, dtype=anchor.dtype, device=anchor.device
        )
        drift = -n_beta * grad - localization * (w - anchor)
        if use_rmsprop:
            square_avg.mul_(RMSPROP_ALPHA).addcmul_(grad, grad, value=1 - RMSPROP_ALPHA)
            gain = gate / (square_avg.sqrt() + RMSPROP_EPS)
        else:
            gain = gate
        if step >= burn_in:
            energy += float((gain * drift * drift).sum())
        if use_rmsprop:
            w = w + 0.5 * step_size * gain * drift + (step_size * gain).sqrt() * noise
        else:
            w = w + gate * (0.5 * step_size * drift + math.sqrt(step_size) * noise)
    return draws, energy / max(n_steps - burn_in, 1)


def step_bias(step_size: float, energy: float, estimate: float) -> float:
    """The relative bias of λ̂ that Langevin's step causes, ``ε E[Σ_i G_i drift_i²] / (8 λ̂)``.

    For a Gaussian posterior of precisions p_i, Langevin with step ε samples variances
    ``1 / (p_i (1 − ε p_i / 4))``, so ``λ̂ = ½ Σ_i 1/(1 − ε p_i/4) ≈ λ + Σ_i ε p_i / 8``; and
    ``E[drift_i²] = p_i`` (equipartition), so the sum is measured by the drift energy without
    knowing the p_i. Minibatch gradient noise adds to the energy, and to the bias alike.
    Infinite when ``λ̂ <= 0``.
    """
    if not estimate > 0:
        return math.inf
    return step_size * energy / (8 * estimate)


class DiagnosticLimits:
    """Thresholds of :func:`diagnose` (see :func:`~dynascope.probes.llc.llc_calibrate`)."""

    R_HAT = 1.1
    """Most Gelman–Rubin potential scale reduction of the per-draw trace (chains agree)."""
    DRIFT_Z = 2.0
    """Standard errors by which the drift between the trace's halves may exceed the tolerance."""


def diagnose(trace: Tensor, rtol: float) -> list[str]:
    """What is wrong with a ``[n_chains, n_draws]`` trace, as short phrases; [] when nothing.

    - ``diverged``: a draw is not finite (the chain left every finite region);
    - ``not stationary``: the mean over chains of (second-half mean − first-half mean) exceeds
      ``rtol · |λ̂|`` by more than ``DRIFT_Z`` standard errors (over chains);
    - ``chains disagree``: the Gelman–Rubin R̂ of the trace exceeds ``R_HAT`` (needs >= 2 chains).
    """
    if not bool(torch.isfinite(trace).all()):
        return ["diverged"]
    problems = []
    n_chains, n_draws = trace.shape
    estimate = float(trace.mean())
    half = n_draws // 2
    drift = trace[:, n_draws - half :].mean(dim=1) - trace[:, :half].mean(dim=1)
    drift_se = float(drift.std()) / math.sqrt(n_chains) if n_chains > 1 else 0.0
    if abs(float(drift.mean())) - DiagnosticLimits.DRIFT_Z * drift_se > rtol * abs(estimate):
        problems.append(f"not stationary (drift {float(drift.mean()):.3g})")
    if n_chains > 1:
        r_hat = gelman_rubin(trace)
        if not r_hat <= DiagnosticLimits.R_HAT:
            problems.append(f"chains disagree (R-hat {r_hat:.3g})")
    return problems


def gelman_rubin(trace: Tensor) -> float:
    """Potential scale reduction R̂ of a ``[n_chains, n_draws]`` trace (Gelman & Rubin 1992).

    ``R̂ = sqrt(((n − 1)/n · W + B/n) / W)``, W the mean within-chain variance, B/n the variance
    of the chain means. 1 when every chain has the same mean; inf when W = 0 < B.
    """
    n = trace.shape[1]
    within = float(trace.var(dim=1).mean())
    between_over_n = float(trace.mean(dim=1).var())
    if within == 0.0:
        return 1.0 if between_over_n == 0.0 else math.inf
    return math.sqrt(((n - 1) / n * within + between_over_n) / within)
