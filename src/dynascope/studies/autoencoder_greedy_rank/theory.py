"""Balanced-stack mode dynamics (S15's mechanism): the theory that fixes the study's init scale
and step before any seed runs.

Glossary:
    L:          ``n_stack``, layers in the linear stack (>= 1).
    s:          each stack layer's singular value at orthogonal init; the stack product's is
                ``sigma0 = s^L``.
    sigma:      one mode's singular value of the stack product, ``sigma0 <= sigma < 1``.
    lambda:     the data variance along that mode.
    rho:        ``lambda_{k+1} / lambda_k`` of two adjacent data modes (< 1).

Under gradient flow with step ``eta`` each mode of a balanced L-layer product fitting a target
of 1 follows (Saxe et al. 2014; Arora et al. 2019, Theorem 3)::

    d sigma / dt = 2 eta L lambda sigma^(2 - 2/L) (1 - sigma)

so the time to reach ``sigma`` is ``G(sigma0, sigma; L) / (2 eta L lambda)`` with
``G(a, b; L) = int_a^b x^(2/L - 2) / (1 - x) dx`` (:func:`plateau_integral`). Every mode has
the same ``G``, so times scale as ``1 / lambda``; depth and a small ``sigma0`` make ``G``
large and the rise sharp, which is what makes learning greedy. The encoder and decoder
(default init, not small) only rescale time by a factor common to all depths.

References:
    Saxe, McClelland & Ganguli (2014), "Exact solutions to the nonlinear dynamics of learning in
    deep linear neural networks", ICLR, arXiv 1312.6120 (mode-wise dynamics, eq. 7).
    Arora, Cohen, Golowich & Hu (2019), "A convergence analysis of gradient descent for deep
    linear neural networks", ICLR, arXiv 1810.02281; Arora, Cohen, Hu & Luo (2019), "Implicit
    regularization in deep matrix factorization", NeurIPS, arXiv 1905.13655 (Theorem 3: the
    singular values' flow ``sigma^(2 - 2/N)``).
    Sun, Thilak, Littwin, Saremi & Susskind (2021), arXiv 2107.01301 (greedy rank learning;
    orthogonal init and a depth-aware step make it depend less on s and L).
"""

from __future__ import annotations

import math

from scipy.integrate import quad
from scipy.optimize import brentq

__all__ = ["equal_time_lr", "greedy_init_scale", "plateau_integral", "predicted_overlap"]


def _check_stack(n_stack: int) -> None:
    if isinstance(n_stack, bool) or not isinstance(n_stack, int) or n_stack < 1:
        raise ValueError(f"n_stack must be an integer >= 1 (got n_stack={n_stack!r})")


def plateau_integral(sigma0: float, sigma: float, n_stack: int) -> float:
    """``G(sigma0, sigma; L) = int_sigma0^sigma x^(2/L - 2) / (1 - x) dx`` (module docstring).

    Integrated in ``u = log x`` (smooth for any ``sigma0 > 0``). Closed forms used by the tests:
    ``L = 1``: ``log((1 - sigma0) / (1 - sigma))``; ``L = 2``: ``logit(sigma) - logit(sigma0)``.

    Args:
        sigma0: start, ``0 < sigma0 <= sigma``.
        sigma: end, ``< 1``.
        n_stack: L (>= 1).
    Returns:
        G, dimensionless (time in units of ``1 / (2 eta L lambda)``).
    Raises:
        ValueError: if not ``0 < sigma0 <= sigma < 1`` or ``n_stack < 1``.
    """
    _check_stack(n_stack)
    if not (0 < sigma0 <= sigma < 1):
        raise ValueError(f"need 0 < sigma0 <= sigma < 1 (got sigma0={sigma0!r}, sigma={sigma!r})")
    a = 2.0 / n_stack - 1.0  # x^(2/L - 2) dx = e^(a u) du with x = e^u

    def integrand(u: float) -> float:
        return math.exp(a * u) / -math.expm1(u)

    value, _ = quad(integrand, math.log(sigma0), math.log(sigma), limit=200, epsrel=1e-10)
    return value


def predicted_overlap(sigma0: float, n_stack: int, rho: float) -> float:
    """The next mode's ``sigma`` when a mode reaches 1/2, both from ``sigma0`` (theory).

    Solves ``G(sigma0, sigma; L) = rho G(sigma0, 1/2; L)``: the smaller, the more "one at a
    time". ``L = 2`` has the closed form ``1 / (1 + ((1 - sigma0) / sigma0)^(1 - rho))``.

    Args:
        sigma0: the stack product's initial singular value, ``0 < sigma0 < 1/2``.
        n_stack: L (>= 1).
        rho: ``lambda_{k+1} / lambda_k``, ``0 < rho < 1``.
    Returns:
        ``sigma`` of mode k+1, in ``(sigma0, 1/2)``.
    Raises:
        ValueError: if ``sigma0`` or ``rho`` is out of range, or ``n_stack < 1``.
    """
    if not (0 < sigma0 < 0.5):
        raise ValueError(f"sigma0 must be in (0, 0.5) (got sigma0={sigma0!r})")
    if not (0 < rho < 1):
        raise ValueError(f"rho must be in (0, 1) (got rho={rho!r})")
    target = rho * plateau_integral(sigma0, 0.5, n_stack)

    def gap(log_sigma: float) -> float:
        sigma = min(max(math.exp(log_sigma), sigma0), 0.5)  # exp(log) may round outside
        return plateau_integral(sigma0, sigma, n_stack) - target

    return math.exp(brentq(gap, math.log(sigma0), math.log(0.5), xtol=1e-12))


def greedy_init_scale(n_stack: int, rho: float, overlap: float, s_min: float = 1e-4) -> float:
    """The largest per-layer ``s`` whose predicted overlap is at most ``overlap``.

    The smallest spectral prior is not chosen: a smaller ``s`` only lengthens the plateau.
    ``L = 1`` has no plateau (the overlap is ``1 - 2^(-rho)`` whatever ``s``), so no ``s``
    qualifies; ``s_min`` is returned then.

    Args:
        n_stack: L (>= 1).
        rho: the largest ``lambda_{k+1} / lambda_k`` of the data (the closest pair).
        overlap: the predicted overlap to reach, in ``(0, 1/2)``.
        s_min: the search's lower bound, in ``(0, 1)``.
    Returns:
        ``s`` in ``[s_min, 0.5^(1/L))``.
    Raises:
        ValueError: for ``n_stack < 1``, ``rho`` or ``overlap`` out of range, or ``s_min``
            outside ``(0, 1)``.
    """
    _check_stack(n_stack)
    if not (0 < overlap < 0.5):
        raise ValueError(f"overlap must be in (0, 0.5) (got overlap={overlap!r})")
    if not (0 < s_min < 1):
        raise ValueError(f"s_min must be in (0, 1) (got s_min={s_min!r})")
    s_max = 0.5 ** (1.0 / n_stack) * (1 - 1e-9)

    def excess(log_s: float) -> float:
        return predicted_overlap(math.exp(log_s) ** n_stack, n_stack, rho) - overlap

    if excess(math.log(s_min)) > 0:
        return s_min
    return math.exp(brentq(excess, math.log(s_min), math.log(s_max), xtol=1e-10))


def equal_time_lr(n_stack: int, init_scale: float, mode_time: float, lr_max: float) -> float:
    """The step that puts a unit-variance mode's rise to 1/2 at ``mode_time`` (theory units).

    ``eta_L = min(lr_max, G(s^L, 1/2; L) / (2 L mode_time))``: the depth-aware step S15 asks
    for, cancelling the whole plateau ``G`` (not only its start, as ``s^(2(L-1))`` does), so
    that every depth and spectral prior learns a mode of a given variance at about the same
    step; ``lr_max`` keeps the step stable once modes are learnt.

    Args:
        n_stack: L (>= 1).
        init_scale: s, in ``(0, 0.5^(1/L))``.
        mode_time: target time, steps in the balanced theory (> 0).
        lr_max: stability cap (> 0).
    Returns:
        The step ``eta_L``.
    Raises:
        ValueError: for ``n_stack < 1``, ``init_scale`` with ``s^L`` outside ``(0, 1/2)``, or
            a ``mode_time`` or ``lr_max`` that is not > 0.
    """
    _check_stack(n_stack)
    for name, value in (("mode_time", mode_time), ("lr_max", lr_max)):
        if not value > 0:
            raise ValueError(f"{name} must be > 0 (got {name}={value!r})")
    sigma0 = init_scale**n_stack if init_scale > 0 else 0.0
    if not (0 < sigma0 < 0.5):
        raise ValueError(
            f"init_scale must give 0 < s^L < 0.5 (got init_scale={init_scale!r}, L={n_stack})"
        )
    return min(lr_max, plateau_integral(sigma0, 0.5, n_stack) / (2 * n_stack * mode_time))
