"""Reading the stages of the gradual-rank toy: rescaled time, loss drops and plateaus, which
entries of W_QK and W_OV are switched on, and when a curve rises to its midpoint. Pure
functions on arrays, re-exported by :mod:`.analysis`; the thresholds and windows are explained
in ``docs/studies/gradual-rank.md``.
"""

from __future__ import annotations

import math

import numpy as np

# The metrics' fixed parts; thresholds, directions and statistics live in .protocol (PROTOCOL).
DROP_FALL = 0.3  # a drop: the loss falls by >= 30% ...
DROP_REL_WINDOW = 0.05  # ... between tau and (1 + 0.05) * tau
DROP_ABS_WINDOW = 0.05  # S10's literal window (absolute), reported beside t1
T2_ACTIVE_FACTOR = 10.0  # active: |Δ entry| > 10 α (t2's end count)


def rescaled_time(steps: np.ndarray, lr: float, alpha: float) -> np.ndarray:
    """τ = η·t / log(1/α): gradient-flow time in units of log(1/α).

    Args:
        steps: ``[n]`` GD steps t.
        lr: step size η.
        alpha: init scale in (0, 1).
    Returns:
        ``[n]`` float64, dimensionless.
    Raises:
        ValueError: if ``alpha`` is not in (0, 1).
    References:
        Abbe et al. (2023), arXiv 2306.07042, Sec. 4 and Fig. 2 (time rescaled by log(1/α)).
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1) (got alpha={alpha})")
    return lr * np.asarray(steps, dtype=np.float64) / math.log(1.0 / alpha)


def _tau(steps: np.ndarray, lr: float, alpha: float) -> np.ndarray:
    """τ for every α of the grid: :func:`rescaled_time` for α < 1; η·t for the α = 1 control,
    which has no log(1/α) unit (the drop detector's window is relative to τ, so its count does
    not depend on τ's unit)."""
    return rescaled_time(steps, lr, alpha) if alpha < 1 else lr * np.asarray(steps, np.float64)


def find_drops(
    tau: np.ndarray,
    loss: np.ndarray,
    *,
    fall: float = DROP_FALL,
    rel_window: float | None = DROP_REL_WINDOW,
    abs_window: float | None = None,
) -> list[tuple[int, int, int]]:
    """Sharp loss drops: runs of indices where the loss falls by ≥ ``fall`` within a window.

    Index ``i`` is flagged when ``loss[j] <= (1 − fall)·loss[i]`` for ``j`` the last index with
    ``tau[j] <= tau[i]·(1 + rel_window)`` (or ``tau[i] + abs_window``). A drop runs from the
    first to the last ``j`` of a run of consecutive flagged indices; drops that overlap merge.

    Args:
        tau: ``[n]`` rescaled times, increasing.
        loss: ``[n]`` losses (> 0).
        fall: fractional fall that makes a drop, in (0, 1).
        rel_window: window relative to τ (exclusive with ``abs_window``).
        abs_window: absolute window in τ units.
    Returns:
        ``(start, end, steepest)`` indices per drop, in order; ``steepest`` is where log-loss
        falls fastest per unit τ inside the drop.
    Raises:
        ValueError: if not exactly one of ``rel_window``, ``abs_window`` is given, or ``tau``
            and ``loss`` differ in length.
    """
    if (rel_window is None) == (abs_window is None):
        raise ValueError("give exactly one of rel_window, abs_window (got both or neither)")
    tau, loss = np.asarray(tau, dtype=np.float64), np.asarray(loss, dtype=np.float64)
    if tau.shape != loss.shape or tau.ndim != 1:
        raise ValueError(f"tau and loss must be 1-d of one length (got {tau.shape}, {loss.shape})")
    if len(tau) < 2:
        return []
    limit = tau * (1 + rel_window) if rel_window is not None else tau + abs_window
    j = np.searchsorted(tau, limit, side="right") - 1  # last index inside each window
    flagged = (j > np.arange(len(tau))) & (loss[j] <= (1 - fall) * loss)
    drops: list[list[int]] = []
    i = 0
    while i < len(tau):
        if not flagged[i]:
            i += 1
            continue
        k = i
        while k + 1 < len(tau) and flagged[k + 1]:
            k += 1
        start, end = i, int(j[k])
        if drops and start <= drops[-1][1]:
            drops[-1][1] = max(drops[-1][1], end)
        else:
            drops.append([start, end])
        i = k + 1
    log_loss = np.log(np.maximum(loss, 1e-300))
    slope = np.diff(log_loss) / np.maximum(np.diff(tau), 1e-300)  # slope[i]: i -> i + 1
    out = []
    for start, end in drops:
        steepest = start + int(np.argmin(slope[start:end])) if end > start else start
        out.append((start, end, steepest))
    return out


def plateaus(n: int, drops: list[tuple[int, int, int]]) -> list[tuple[int, int]]:
    """Index intervals ``(first, last)`` around the drops of a length-``n`` trace: before the
    first drop, between drops, after the last; an empty one (a drop that runs to the end of
    the trace) is left out, so there are ``len(drops) + 1`` or ``len(drops)`` of them."""
    edges = [0]
    for start, end, _ in drops:
        edges += [start, end]
    edges.append(n - 1)
    spans = [(edges[2 * k], edges[2 * k + 1]) for k in range(len(edges) // 2)]
    return [(a, b) for a, b in spans if b > a]


def active_counts(values: np.ndarray, alpha: float, factor: float = T2_ACTIVE_FACTOR) -> np.ndarray:
    """Active entries ``#{i : |values[t, i] − values[0, i]| > factor·α}`` per logged step.

    Args:
        values: ``[n_steps, d_model]`` a diagonal (``w_Q⊙w_K`` or ``w_V⊙w_O``) over time; row 0
            is the initialisation.
        alpha: init scale.
        factor: threshold in units of α (S10: 10, ≫ the α² scale of the initial products).
    Returns:
        ``[n_steps]`` int counts (the rank of the diagonal Δ above the threshold).
    """
    return (np.abs(values - values[:1]) > factor * alpha).sum(axis=-1)


def switch_on_index(
    values: np.ndarray, alpha: float, factor: float = T2_ACTIVE_FACTOR
) -> list[int]:
    """For each entry active at the end (``|Δ| > factor·α``), the first logged index where its
    ``|Δ|`` reaches half of its final value (a reading of "switches on" that does not depend on
    α; reported beside t2, not gated).

    Args:
        values: ``[n_steps, d_model]`` a diagonal over time, row 0 the initialisation.
        alpha: init scale.
        factor: activity threshold in units of α.
    Returns:
        Indices, sorted ascending (one per entry active at the end).
    """
    delta = np.abs(values - values[:1])
    final = delta[-1]
    out = [
        int(np.argmax(delta[:, i] >= final[i] / 2)) for i in np.flatnonzero(final > factor * alpha)
    ]
    return sorted(out)


def switched_on(values: np.ndarray, alpha: float, factor: float = T2_ACTIVE_FACTOR) -> np.ndarray:
    """Entries switched on at each logged step: active at the end (``|Δ| > factor·α``) and
    with ``|Δ|`` at least ½ of its final value (the α-free reading of t2).

    Args:
        values: ``[n_steps, d_model]`` a diagonal over time, row 0 the initialisation.
        alpha: init scale.
        factor: activity threshold in units of α (only selects the entries that count).
    Returns:
        ``[n_steps]`` int counts.
    """
    delta = np.abs(values - values[:1])
    final = delta[-1]
    return ((delta >= final / 2) & (final > factor * alpha)).sum(axis=-1)


def midpoint_rise(values: np.ndarray, support: np.ndarray, mids: list[int]) -> int:
    """t2's reading: the largest rise, between consecutive plateau midpoints, of the number of
    teacher entries switched on (past ½ of their final |Δ| for the first time).

    With fewer than two plateaus the stages are not resolved: the whole run is one stage and
    the rise is the number of teacher entries that switch on at all.

    Args:
        values: ``[n_steps, d_model]`` a diagonal (``w_Q⊙w_K`` or ``w_V⊙w_O``) over time, row 0
            the initialisation.
        support: ``[d_model]`` bool, the teacher's nonzero entries (the entries to switch on).
        mids: the plateaus' midpoint indices, in order.
    Returns:
        The rise, an entry count.
    References:
        Abbe et al. (2023), arXiv 2306.07042, Sec. 4 (each stage raises the rank by at most
        one); SYSTEMS.md S10, t2 (counts read at each plateau's midpoint).
    """
    delta = np.abs(values - values[:1])[:, support]
    final = delta[-1]
    on = [int(np.argmax(delta[:, i] >= final[i] / 2)) for i in np.flatnonzero(final > 0)]
    if len(mids) < 2:
        return len(on)
    counts = [sum(i <= m for i in on) for m in mids]
    return max(b - a for a, b in zip(counts, counts[1:]))
