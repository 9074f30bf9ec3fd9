"""The verdict contract: a claim judged over seeds, against a stated precondition and control.

Glossary:
    status:        ``held`` | ``not held`` | ``inconclusive``. ``passed`` is
                   ``status == "held"``; ``inconclusive`` is never ``held``.
    direction:     ``<=`` (the claim holds when the measured value is at most the threshold)
                   or ``>=`` (at least). Equality passes in both directions: the symbol says so.
    per_seed:      the claim's metric measured once per seed (one value per seed of one arm, or
                   a per-seed statistic over several arms, e.g. a slope across widths).
    measured:      the aggregate over seeds: the mean of the finite per-seed values (NaN when
                   none is finite).
    spread:        over the finite per-seed values: ``std`` (sample standard deviation,
                   ``ddof = 1``; NaN below two values), ``min``, ``max`` and ``n_finite``.
    rule:          how the seeds combine into pass/fail (:data:`RULES`):
                   ``mean_and_2of3`` (default): the mean passes AND at least two thirds of all
                   seeds pass (``3 * n_pass >= 2 * n_seeds``; 2 of 3, 4 of 5, 7 of 10);
                   ``all_seeds``: the mean passes and every seed passes.
                   A NaN (or infinite) seed value counts as failing.
    precondition:  what the claim presupposes (the models fit, there is something to count, the
                   sweep spans enough width); ``met`` is measured, ``measured`` is its value
                   when there is one.
    control:       the same metric on a variant that must not show the effect (the mechanism
                   removed, a shuffled target, an untrained model, the other parametrization).
                   Judged by the same rule, threshold and direction as the claim.
    legacy:        a verdict built the old way, ``Verdict(claim, metric, measured, threshold,
                   passed, detail)``: no seeds, no control, status taken from ``passed``,
                   direction read from ``detail``. Kept for the studies not ported yet; the
                   tables mark it "no seeds / no control".

Rules of :func:`judge`, in order (every reason that applies is recorded in ``reason``):

1. fewer than :data:`MIN_SEEDS` (3) finite per-seed values -> ``inconclusive``;
2. the precondition is not met -> ``inconclusive``;
3. the control holds as well -> ``inconclusive`` (the metric cannot tell the variants apart);
4. otherwise the rule decides ``held`` or ``not held``; a claim that would hold while its
   control could not be judged (itself inconclusive) is ``inconclusive``.

Thresholds are fixed before the study's seeds run (from theory or calibration seeds); each
study's docstring records how (``shared/DESIGN.md``, Study).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "DIRECTIONS",
    "MIN_SEEDS",
    "RULES",
    "STATUSES",
    "Control",
    "Precondition",
    "Verdict",
    "judge",
    "legacy_direction",
    "seed_passes",
]

STATUSES = ("held", "not held", "inconclusive")
DIRECTIONS = ("<=", ">=")
MIN_SEEDS = 3
RULES = {
    "mean_and_2of3": "the mean over seeds passes and at least 2/3 of the seeds pass",
    "all_seeds": "the mean over seeds passes and every seed passes",
}
# how legacy details write their comparison ("measured <= threshold; ...")
_LEGACY_DIRECTION = re.compile(r"measured\s*(<=|>=|==|<|>)\s*threshold")


def legacy_direction(detail: str) -> str:
    """The comparison a legacy verdict's ``detail`` states (``measured <= threshold`` ...):
    ``<=``, ``>=``, ``==``, ``<`` or ``>``; ``unknown`` when it states none."""
    found = _LEGACY_DIRECTION.search(detail)
    return found.group(1) if found else "unknown"


def _floats(values: Any) -> tuple[float, ...]:
    return tuple(float(v) for v in values)


def seed_passes(value: float, threshold: float, direction: str) -> bool:
    """Whether one value passes: ``value <= threshold`` or ``value >= threshold``; NaN fails.

    Raises:
        ValueError: if ``direction`` is not ``<=`` or ``>=``.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of <=, >= (got {direction!r})")
    if not math.isfinite(value):
        return False
    return value <= threshold if direction == "<=" else value >= threshold


def _spread(values: tuple[float, ...]) -> dict[str, float | int]:
    finite = np.array([v for v in values if math.isfinite(v)], dtype=float)
    n = len(finite)
    return {
        "std": float(finite.std(ddof=1)) if n >= 2 else math.nan,
        "min": float(finite.min()) if n else math.nan,
        "max": float(finite.max()) if n else math.nan,
        "n_finite": n,
    }


def _mean(values: tuple[float, ...]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


def _rule_passes(values: tuple[float, ...], threshold: float, direction: str, rule: str) -> bool:
    """The aggregation rule (see the module docstring); NaN seeds fail."""
    if not values or not seed_passes(_mean(values), threshold, direction):
        return False
    n_pass = sum(seed_passes(v, threshold, direction) for v in values)
    if rule == "all_seeds":
        return n_pass == len(values)
    return 3 * n_pass >= 2 * len(values)


def _check_per_seed(per_seed: Mapping[int, float], name: str) -> tuple[tuple[int, ...], tuple]:
    if not isinstance(per_seed, Mapping):
        raise ValueError(f"{name}: must map seed -> value (got {type(per_seed).__name__})")
    seeds = tuple(int(s) for s in per_seed)
    return seeds, _floats(per_seed.values())


@dataclass(frozen=True)
class Precondition:
    """What a claim presupposes, and whether the runs met it.

    Attributes:
        text: the condition in words, with its bound ("every run reaches train R² >= 0.9").
        met: whether it was met.
        measured: the measured quantity the condition bounds, when there is one (NaN: none).
    """

    text: str
    met: bool
    measured: float = math.nan

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "met": bool(self.met), "measured": float(self.measured)}


@dataclass(frozen=True)
class Control:
    """A negative control: the claim's metric on a variant that must not show the effect.

    Give either ``per_seed`` (seed -> value, judged by the claim's rule, threshold and
    direction, including the three-seed minimum) or one ``measured`` value (a deterministic
    control, compared with the threshold directly). :func:`judge` fills ``status`` and, from
    ``per_seed``, ``measured`` (the mean of the finite values).

    Attributes:
        text: the variant in words ("SP + Adam, the same metric").
        per_seed: seed -> the control's value.
        measured: the control's aggregate (or its only) value.
        status: ``held`` | ``not held`` | ``inconclusive`` once judged, else ``None``.
    """

    text: str
    per_seed: Mapping[int, float] | None = None
    measured: float = math.nan
    status: str | None = None

    def to_json(self) -> dict[str, Any]:
        values = _floats((self.per_seed or {}).values())
        return {
            "text": self.text,
            "measured": float(self.measured),
            "status": self.status,
            "seeds": [int(s) for s in (self.per_seed or {})],
            "per_seed": list(values),
            "spread": _spread(values) if values else None,
        }


@dataclass(frozen=True)
class Verdict:
    """One claim checked against measured runs (see the module docstring for every rule).

    Build it with :func:`judge`. The legacy form ``Verdict(claim, metric, measured, threshold,
    passed, detail)`` still works (``legacy`` is then true): its status comes from ``passed``,
    its direction from ``detail`` (``measured <= threshold`` ...; ``unknown`` when absent).

    Attributes:
        claim: the claim in words, ``"id: text"``.
        metric: what was measured, with its definition in a few words.
        measured: the aggregate over seeds (NaN when it could not be measured; ``null`` in
            ``verdict.json``).
        threshold: the frozen threshold it is compared with.
        passed: ``status == "held"``.
        detail: notes (legacy verdicts: how the comparison reads).
        status: ``held`` | ``not held`` | ``inconclusive``.
        direction: ``<=`` | ``>=`` (legacy: as read from ``detail``, or ``unknown``).
        seeds: the seeds judged, in order; ``per_seed``: the metric per seed.
        aggregation: the rule in words.
        precondition: what the claim presupposes (``None``: legacy).
        control: the negative control, judged (``None``: legacy).
        reason: why the status is ``inconclusive`` (empty otherwise).
        legacy: built without a status (no seeds, no control).

    Raises:
        ValueError: neither ``status`` nor ``passed`` given; an unknown ``status`` or
            ``direction``; ``passed`` contradicting ``status``; ``seeds`` and ``per_seed`` of
            different lengths.
    """

    claim: str
    metric: str
    measured: float
    threshold: float
    passed: bool | None = None
    detail: str = ""
    _: KW_ONLY
    status: str | None = None
    direction: str | None = None
    seeds: tuple[int, ...] = ()
    per_seed: tuple[float, ...] = ()
    aggregation: str = ""
    precondition: Precondition | None = None
    control: Control | None = None
    reason: str = ""
    legacy: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        put = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        if self.status is None:
            if self.passed is None:
                raise ValueError(f"{self.claim!r}: a Verdict needs status or passed (got neither)")
            put("legacy", True)
            put("status", "held" if self.passed else "not held")
            if self.direction is None:
                put("direction", legacy_direction(self.detail))
        else:
            if self.status not in STATUSES:
                raise ValueError(
                    f"status must be one of {', '.join(STATUSES)} (got {self.status!r})"
                )
            if self.direction not in DIRECTIONS:
                raise ValueError(f"direction must be one of <=, >= (got {self.direction!r})")
            if self.passed is not None and bool(self.passed) != (self.status == "held"):
                raise ValueError(
                    f"passed={self.passed} contradicts status={self.status!r} "
                    "(passed is status == 'held')"
                )
        put("passed", self.status == "held")
        put("seeds", tuple(int(s) for s in self.seeds))
        put("per_seed", _floats(self.per_seed))
        if len(self.seeds) != len(self.per_seed):
            raise ValueError(
                f"seeds and per_seed must have one value per seed (got {len(self.seeds)} seeds "
                f"and {len(self.per_seed)} values)"
            )

    @property
    def spread(self) -> dict[str, float | int]:
        """``std`` (ddof = 1), ``min``, ``max`` and ``n_finite`` of the finite per-seed values."""
        return _spread(self.per_seed)

    def to_json(self) -> dict[str, Any]:
        """The verdict as ``verdict.json`` stores it (NaN becomes ``null`` when dumped)."""
        return {
            "claim": self.claim,
            "status": self.status,
            "passed": self.passed,
            "metric": self.metric,
            "measured": float(self.measured),
            "direction": self.direction,
            "threshold": float(self.threshold),
            "aggregation": self.aggregation,
            "seeds": list(self.seeds),
            "per_seed": list(self.per_seed),
            "spread": self.spread if self.per_seed else None,
            "precondition": self.precondition.to_json() if self.precondition else None,
            "control": self.control.to_json() if self.control else None,
            "reason": self.reason,
            "legacy": self.legacy,
            "detail": self.detail,
        }


def _judge_control(control: Control, threshold: float, direction: str, rule: str) -> Control:
    if control.per_seed is not None:
        _, values = _check_per_seed(control.per_seed, "control.per_seed")
        if sum(math.isfinite(v) for v in values) < MIN_SEEDS:
            status = "inconclusive"
        else:
            status = "held" if _rule_passes(values, threshold, direction, rule) else "not held"
        return Control(control.text, dict(control.per_seed), _mean(values), status)
    if math.isnan(control.measured):
        raise ValueError(f"control {control.text!r}: give per_seed or a measured value")
    status = "held" if seed_passes(control.measured, threshold, direction) else "not held"
    return Control(control.text, None, float(control.measured), status)


def judge(
    *,
    claim: str,
    metric: str,
    per_seed: Mapping[int, float],
    threshold: float,
    direction: str,
    precondition: Precondition,
    control: Control,
    rule: str = "mean_and_2of3",
    detail: str = "",
) -> Verdict:
    """Judge a claim over seeds: aggregate, spread, control and status (module docstring).

    Args:
        claim: ``"id: the claim in words"``.
        metric: the metric's definition in a few words.
        per_seed: seed -> the metric for that seed (NaN: not measurable; counts as failing).
        threshold: the pre-registered threshold (finite).
        direction: ``<=`` or ``>=``; equality passes.
        precondition: what the claim presupposes and whether it was met.
        control: the negative control, unjudged (``status`` is filled here).
        rule: a key of :data:`RULES` (default ``mean_and_2of3``).
        detail: free notes (e.g. the per-width seed means).

    Returns:
        The :class:`Verdict`; ``measured`` is the mean of the finite per-seed values.

    Raises:
        ValueError: an unknown ``direction`` or ``rule``, a non-finite ``threshold``,
            ``per_seed`` not a mapping, or a control with neither ``per_seed`` nor
            ``measured``.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of <=, >= (got {direction!r})")
    if rule not in RULES:
        raise ValueError(f"rule must be one of {', '.join(RULES)} (got {rule!r})")
    if not math.isfinite(threshold):
        raise ValueError(f"threshold must be finite (got {threshold})")
    seeds, values = _check_per_seed(per_seed, "per_seed")
    judged = _judge_control(control, threshold, direction, rule)
    n_finite = sum(math.isfinite(v) for v in values)
    reasons = []
    if n_finite < MIN_SEEDS:
        reasons.append(f"only {n_finite} of {len(values)} seeds finite (need {MIN_SEEDS})")
    if not precondition.met:
        value = precondition.measured
        shown = f" [measured {value:.4g}]" if math.isfinite(value) else ""
        reasons.append(f"precondition not met: {precondition.text}{shown}")
    if judged.status == "held":
        reasons.append(f"the control also holds: {judged.text}")
    holds = _rule_passes(values, threshold, direction, rule)
    if not reasons and holds and judged.status == "inconclusive":
        reasons.append(f"the control could not be judged: {judged.text}")
    status = "inconclusive" if reasons else ("held" if holds else "not held")
    return Verdict(
        claim,
        metric,
        _mean(values),
        float(threshold),
        detail=detail,
        status=status,
        direction=direction,
        seeds=seeds,
        per_seed=values,
        aggregation=RULES[rule],
        precondition=precondition,
        control=judged,
        reason="; ".join(reasons),
    )
