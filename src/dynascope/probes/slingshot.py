"""Slingshot detector (S13): last-layer norm growth, then a training-loss spike, then a plateau.

Thilak et al. (2022) see adaptive optimizers, long after the training set is fit, enter cycles:
the norm of the last layer grows fast, the training loss spikes, the norm levels off. S13 turns
that description into a detector on logged series; its constants are proposals (S13, "Open
details"), to be calibrated once on measured runs and then frozen, never tuned to a verdict.
Pure functions on 1-D series; the series come from the ``last_layer_norm`` probe
(:class:`dynascope.probes.LastLayerNorm`) and the training loss, both logged every step (spikes
last a few steps; a log schedule would miss them).

Glossary:

    t        a logged training step (optimizer steps), strictly increasing; index i in the arrays.
    N_t      last-layer norm ``||W_last||_F`` (bias excluded), > 0, any unit.
    l_t      training loss, >= 0, any unit.
    k        spike factor: ``l_t > k * min_{s<t} l_s`` is a spike step.
    w        window, in steps.
    g_t      trailing growth rate of log N over ``w`` steps, per step:
             ``g_t = (log N_t - log N_a) / (t - a)``, ``a`` the last logged step ``<= t - w``
             (undefined while ``t - w`` precedes the first logged step).
    tau      growth threshold on ``g`` (1/step); tau' plateau threshold on ``|g|`` (1/step).

Both criteria are relative: multiplying ``N`` or ``l`` by a positive constant, or shifting every
step by a constant, changes no detected cycle (only its norm and loss values, by that factor).
Multiplying the steps by a constant does change them (``w``, tau and tau' are per step).

References:
    Thilak, Littwin, Zhai, Saremi, Paiss & Susskind (2022), "The Slingshot Mechanism: An
    Empirical Study of Adaptive Optimizers and the Grokking Phenomenon", arXiv 2206.04817,
    Fig. 1 and its caption (a cycle: rapid growth of the last layer's norm, an ensuing training
    loss spike, a norm plateau). The detector and its constants: dynascope SYSTEMS S13, "Build:
    Slingshot detector".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from torch import Tensor

__all__ = ["SlingshotCycle", "detect_slingshots", "grok_step", "onset_distance"]

Series = Sequence[float] | np.ndarray | Tensor


@dataclass(frozen=True)
class SlingshotCycle:
    """One slingshot cycle: growth -> spike -> plateau. Steps are logged training steps.

    Attributes:
        start_step: growth onset, the first step of the uninterrupted run of steps, ending at the
            spike, whose trailing growth rate ``g_t`` exceeds tau. For a norm that bends from flat
            to growth at rate ``r > tau`` this lags the bend by about ``w * tau / r`` steps.
        spike_step: the first spike step (``l_t > k * min_{s<t} l_s``).
        spike_end_step: the last spike step before the plateau (spike steps after the first
            event but before the plateau belong to this cycle; see ``spike_events``).
        end_step: the first step after ``spike_end_step`` whose whole trailing window
            (``(t - w, t]``) is spike-free, after the last spike and has ``|g_t| < tau'``: the norm
            has levelled off.
        norm_start, norm_spike, norm_end: ``N`` at ``start_step``, ``spike_step``, ``end_step``.
        loss_baseline: ``min_{s < spike_step} l_s``, the loss the spike is measured against.
        loss_peak: the largest loss over the cycle's spike steps.
        spike_events: the number of spike events (runs of consecutive spike steps) in the cycle.
    """

    start_step: int
    spike_step: int
    spike_end_step: int
    end_step: int
    norm_start: float
    norm_spike: float
    norm_end: float
    loss_baseline: float
    loss_peak: float
    spike_events: int

    @property
    def growth_factor(self) -> float:
        """``N(spike_step) / N(start_step)``: the norm growth of the growth phase."""
        return self.norm_spike / self.norm_start

    @property
    def norm_ratio(self) -> float:
        """``N(end_step) / N(start_step)``: the norm ratio across the cycle (S13's output)."""
        return self.norm_end / self.norm_start

    @property
    def spike_magnitude(self) -> float:
        """``loss_peak / loss_baseline`` (> k); ``inf`` for a zero baseline."""
        return self.loss_peak / self.loss_baseline if self.loss_baseline > 0 else math.inf

    @property
    def length(self) -> int:
        """``end_step - start_step``, in steps."""
        return self.end_step - self.start_step


def _series(name: str, values: Series) -> np.ndarray:
    """A 1-D float64 array of finite values, or a one-line ValueError naming ``name``."""
    if isinstance(values, Tensor):
        values = values.detach().cpu().numpy()
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be a 1-D sequence of numbers ({err})") from None
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D (got shape {tuple(array.shape)})")
    bad = np.flatnonzero(~np.isfinite(array))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{name} must be finite (got {array[i]} at index {i})")
    return array


def _steps(steps: Series) -> np.ndarray:
    array = _series("steps", steps)
    fractional = np.flatnonzero(array != np.round(array))
    if fractional.size:
        i = int(fractional[0])
        raise ValueError(f"steps must be integers (got {array[i]} at index {i})")
    back = np.flatnonzero(np.diff(array) <= 0)
    if back.size:
        i = int(back[0]) + 1
        raise ValueError(
            f"steps must be strictly increasing (got steps[{i}]={int(array[i])} after "
            f"steps[{i - 1}]={int(array[i - 1])})"
        )
    return array.astype(np.int64)


def _same_length(name: str, array: np.ndarray, n: int) -> None:
    if array.size != n:
        raise ValueError(f"{name} must have the same length as steps (got {array.size}, not {n})")


def detect_slingshots(
    steps: Series,
    norm: Series,
    loss: Series,
    *,
    accuracy: Series | None = None,
    arm_accuracy: float = 0.99,
    spike_factor: float = 10.0,
    growth_rate: float = 1e-3,
    plateau_rate: float = 2e-4,
    window: int = 100,
) -> list[SlingshotCycle]:
    """Slingshot cycles in logged series of the last-layer norm and the training loss (S13).

    Criteria (S13, "Build: Slingshot detector"):

    1. armed from the first step at which ``accuracy >= arm_accuracy`` (from the first step when
       ``accuracy`` is ``None``); only spikes from there on count;
    2. spike at ``t``: ``l_t > k * min_{s<t} l_s`` (the minimum over all earlier logged steps, armed
       or not); consecutive spike steps merge into one event, whose first step is the spike step;
    3. growth: at the spike step, ``g_t > tau``, i.e. log N grew faster than tau per step over the
       ``w`` steps just before (and including) the spike step. The growth phase starts at the
       first step of the uninterrupted run of steps with ``g > tau`` that ends there (not before
       the previous cycle's end). A spike without growth is not a cycle;
    4. plateau: the cycle ends at the first step after the spike whose trailing window holds no
       spike step and starts at or after the last spike, with ``|g_t| < tau'``. Spike events
       before that step belong to the same cycle. A spike without a later plateau ends the search
       (an unfinished cycle is not reported).

    Args:
        steps: ``[T]`` logged training steps, integers, strictly increasing.
        norm: ``[T]`` last-layer norm ``N_t`` per step, finite and > 0 (any unit).
        loss: ``[T]`` training loss ``l_t`` per step, finite and >= 0 (any unit). A zero minimum
            makes every later positive loss a spike step.
        accuracy: ``[T]`` training accuracy per step, a fraction in [0, 1], or ``None``.
        arm_accuracy: the accuracy that arms the detector (S13: 0.99).
        spike_factor: ``k`` (S13: in [10, 100], default 10); dimensionless, > 1.
        growth_rate: ``tau``, in 1/step, > 0. S13 leaves it open; 1e-3 (log N up by 0.1 over 100
            steps, a ~10 % rise per window) is our proposal, not yet calibrated on measured runs.
        plateau_rate: ``tau'``, in 1/step, > 0. S13 leaves it open; 2e-4 (log N moves by less
            than 0.02, about 2 %, over 100 steps) is our proposal, not yet calibrated.
        window: ``w``, in steps, >= 1. S13 leaves it open; 100 is our proposal.
    Returns:
        The cycles, in order of ``start_step``; empty if the detector is never armed.
    Raises:
        ValueError: if a series is not 1-D, has a NaN or infinite entry, or differs in length
            from ``steps``; if ``steps`` are not integers or not strictly increasing; if ``norm``
            has an entry <= 0 or ``loss`` one < 0; if ``spike_factor <= 1``, ``growth_rate <= 0``,
            ``plateau_rate <= 0`` or ``window < 1``.
    References:
        Thilak et al. (2022), arXiv 2206.04817, Fig. 1 (growth, loss spike, norm plateau);
        dynascope SYSTEMS S13 for the criteria and constants.
    """
    for name, value, ok, allowed in (
        ("spike_factor", spike_factor, spike_factor > 1, "> 1"),
        ("growth_rate", growth_rate, growth_rate > 0, "> 0"),
        ("plateau_rate", plateau_rate, plateau_rate > 0, "> 0"),
        ("window", window, window >= 1, ">= 1"),
    ):
        if not ok:
            raise ValueError(f"{name} must be {allowed} (got {value})")
    t = _steps(steps)
    n = t.size
    N = _series("norm", norm)
    l = _series("loss", loss)
    _same_length("norm", N, n)
    _same_length("loss", l, n)
    if (N <= 0).any():
        i = int(np.flatnonzero(N <= 0)[0])
        raise ValueError(f"norm must be > 0 (got {N[i]} at index {i})")
    if (l < 0).any():
        i = int(np.flatnonzero(l < 0)[0])
        raise ValueError(f"loss must be >= 0 (got {l[i]} at index {i})")
    armed_from = 0
    if accuracy is not None:
        acc = _series("accuracy", accuracy)
        _same_length("accuracy", acc, n)
        reached = np.flatnonzero(acc >= arm_accuracy)
        if reached.size == 0:
            return []
        armed_from = int(reached[0])
    if n < 2:
        return []

    index = np.arange(n)
    # spikes: l_t > k * min_{s<t} l_s, from the arming step on
    previous_min = np.concatenate([[np.inf], np.minimum.accumulate(l)[:-1]])
    spike = (l > spike_factor * previous_min) & (index >= armed_from)
    onsets = np.flatnonzero(spike & ~np.concatenate([[False], spike[:-1]]))
    last_spike = np.maximum.accumulate(np.where(spike, index, -1))  # latest spike index <= i

    # trailing growth rate of log N over w steps
    log_n = np.log(N)
    a = np.searchsorted(t, t - window, side="right") - 1  # last index with t_a <= t_i - w
    has_window = a >= 0
    a_safe = np.where(has_window, a, 0)
    g = np.where(has_window, (log_n - log_n[a_safe]) / np.maximum(t - t[a_safe], 1), np.nan)
    growing = has_window & (g > growth_rate)
    run_start = np.maximum.accumulate(
        np.where(growing & ~np.concatenate([[False], growing[:-1]]), index, 0)
    )
    level = has_window & (np.abs(g) < plateau_rate) & ~spike & (a_safe >= last_spike)
    level_at = np.flatnonzero(level)

    cycles: list[SlingshotCycle] = []
    previous_end = -1
    for s in onsets:
        if s <= previous_end or not growing[s]:
            continue
        start = max(int(run_start[s]), previous_end + 1)
        k = np.searchsorted(level_at, s, side="right")
        if k == level_at.size:
            break  # no plateau after this spike, hence none after a later one
        end = int(level_at[k])
        spike_end = int(last_spike[end])
        in_cycle = spike[s : spike_end + 1]
        cycles.append(
            SlingshotCycle(
                start_step=int(t[start]),
                spike_step=int(t[s]),
                spike_end_step=int(t[spike_end]),
                end_step=int(t[end]),
                norm_start=float(N[start]),
                norm_spike=float(N[s]),
                norm_end=float(N[end]),
                loss_baseline=float(previous_min[s]),
                loss_peak=float(l[s : spike_end + 1][in_cycle].max()),
                spike_events=int(np.count_nonzero((onsets >= s) & (onsets <= spike_end))),
            )
        )
        previous_end = end
    return cycles


def grok_step(steps: Series, val_accuracy: Series, *, threshold: float = 0.95) -> int | None:
    """The grok step (S13): the first logged step with ``val_accuracy >= threshold``.

    Args:
        steps: ``[T]`` logged steps, integers, strictly increasing.
        val_accuracy: ``[T]`` validation accuracy, a fraction in [0, 1].
        threshold: S13: 0.95.
    Returns:
        The step, or ``None`` if the threshold is never reached.
    Raises:
        ValueError: as :func:`detect_slingshots` for ``steps``; if ``val_accuracy`` is not 1-D,
            not finite, or differs in length from ``steps``.
    """
    t = _steps(steps)
    acc = _series("val_accuracy", val_accuracy)
    _same_length("val_accuracy", acc, t.size)
    reached = np.flatnonzero(acc >= threshold)
    return int(t[reached[0]]) if reached.size else None


def onset_distance(step: int, cycles: Sequence[SlingshotCycle]) -> int | None:
    """``min_c |step - c.start_step|``: distance in steps from ``step`` (e.g. the grok step) to
    the nearest cycle onset; ``None`` without cycles (S13, check g1)."""
    if not cycles:
        return None
    return min(abs(step - c.start_step) for c in cycles)
