"""The statistics behind a verdict (:mod:`dynascope.studies.verdict`, whose glossary and rules
these implement): a seed against its bar, the 95 % Student-t interval of a mean, the Wilson
interval of a rate, an interval's status against a threshold, and the spread over seeds.
Public names are re-exported by :mod:`dynascope.studies.verdict`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats

DIRECTIONS = ("<=", ">=")


CONFIDENCE = 0.95


_NAN_INTERVAL = (math.nan, math.nan)


def _floats(values: Any) -> tuple[float, ...]:
    return tuple(float(v) for v in values)


def _check_direction(direction: str, name: str = "direction") -> None:
    if direction not in DIRECTIONS:
        raise ValueError(f"{name} must be one of <=, >= (got {direction!r})")


def seed_passes(value: float, threshold: float, direction: str) -> bool:
    """Whether one value passes: ``value <= threshold`` or ``value >= threshold``; NaN fails.

    Raises:
        ValueError: if ``direction`` is not ``<=`` or ``>=``.
    """
    _check_direction(direction)
    if not math.isfinite(value):
        return False
    return value <= threshold if direction == "<=" else value >= threshold


def mean_interval(values: Any, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Two-sided Student-t interval of the mean of the finite ``values``.

    ``mean ± t_{(1+confidence)/2, n-1} · s / √n`` with ``s`` the sample standard deviation
    (``ddof = 1``) of the ``n`` finite values; equal values give a point interval.

    Args:
        values: per-seed values; NaN and ±inf are left out.
        confidence: the interval's coverage, in (0, 1).

    Returns:
        ``(lo, hi)``; ``(nan, nan)`` with fewer than two finite values.

    Raises:
        ValueError: if ``confidence`` is not in (0, 1).

    References:
        Student (1908), "The probable error of a mean", Biometrika 6(1).
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1) (got {confidence})")
    finite = np.array([v for v in _floats(values) if math.isfinite(v)], dtype=np.float64)
    n = len(finite)
    if n < 2:
        return _NAN_INTERVAL
    with np.errstate(over="ignore", invalid="ignore"):  # huge values: an infinite spread
        mean = float(finite.mean())
        half = float(stats.t.ppf((1 + confidence) / 2, n - 1) * finite.std(ddof=1) / math.sqrt(n))
    if not (math.isfinite(half) and math.isfinite(mean)):  # the spread overflows
        return (-math.inf, math.inf)
    return (mean - half, mean + half)


def wilson_interval(k: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Wilson score interval of a binomial rate ``k / n``.

    ``(p + z²/2n ± z √(p(1−p)/n + z²/4n²)) / (1 + z²/n)``, ``z`` the normal quantile at
    ``(1+confidence)/2``; it stays inside [0, 1] and is not degenerate at k = 0 or k = n.

    Args:
        k: successes, ``0 <= k <= n``.
        n: trials.
        confidence: the interval's coverage, in (0, 1).

    Returns:
        ``(lo, hi)``; ``(nan, nan)`` when ``n == 0``.

    Raises:
        ValueError: if ``k`` is not in ``[0, n]`` or ``confidence`` is not in (0, 1).

    References:
        Wilson (1927), "Probable inference, the law of succession, and statistical inference",
        JASA 22(158); Brown, Cai & DasGupta (2001), Statistical Science 16(2), eq. (4).
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1) (got {confidence})")
    if not 0 <= k <= n:
        raise ValueError(f"k must be in [0, n] (got k={k}, n={n})")
    if n == 0:
        return _NAN_INTERVAL
    z = float(stats.norm.ppf((1 + confidence) / 2))
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def interval_status(interval: tuple[float, float], threshold: float, direction: str) -> str:
    """``held`` when the interval lies on the claimed side of ``threshold`` (touching it
    counts), ``not held`` when it lies strictly on the other side, else ``inconclusive`` (it
    straddles, or it is NaN).

    Raises:
        ValueError: if ``direction`` is not ``<=`` or ``>=``.
    """
    _check_direction(direction)
    lo, hi = interval
    if math.isnan(lo) or math.isnan(hi):
        return "inconclusive"
    if direction == ">=":
        return "held" if lo >= threshold else ("not held" if hi < threshold else "inconclusive")
    return "held" if hi <= threshold else ("not held" if lo > threshold else "inconclusive")


def _spread(values: tuple[float, ...]) -> dict[str, float | int]:
    finite = np.array([v for v in values if math.isfinite(v)], dtype=float)
    n = len(finite)
    return {
        "std": float(finite.std(ddof=1)) if n >= 2 else math.nan,
        "min": float(finite.min()) if n else math.nan,
        "max": float(finite.max()) if n else math.nan,
        "n_finite": n,
    }


def _summary(
    values: tuple[float, ...], statistic: str, seed_bar: tuple[float, str] | None
) -> tuple[float, tuple[float, float], int]:
    """``(measured, interval, n_seeds)`` of per-seed ``values`` under ``statistic``."""
    if statistic == "rate":
        bar, direction = seed_bar  # type: ignore[misc]
        n = len(values)
        k = sum(seed_passes(v, bar, direction) for v in values)
        return (k / n if n else math.nan), wilson_interval(k, n), n
    finite = [v for v in values if math.isfinite(v)]
    mean = float(np.mean(finite)) if finite else math.nan
    return mean, mean_interval(values), len(finite)
