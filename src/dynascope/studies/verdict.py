"""The verdict contract: a claim judged over seeds by an interval, against a precondition and
an ablation control.

Glossary:
    status:        ``held`` | ``not held`` | ``inconclusive``. ``passed`` is
                   ``status == "held"``; ``inconclusive`` is never ``held``.
    kind:          ``finding`` (a claim of the paper, judged against an ablation control) or
                   ``identity`` (a check of the implementation, e.g. the RNN equals attention
                   to 1e-14; listed apart from findings, with no control).
    direction:     ``<=`` (the claim holds when the statistic is at most the threshold) or
                   ``>=`` (at least). Equality passes in both directions.
    per_seed:      the claim's metric measured once per seed (one value per seed of one arm, or
                   a per-seed statistic over several arms, e.g. a slope across widths).
    statistic:     how the seeds combine (:data:`STATISTICS`):
                   ``mean``: ``measured`` is the mean of the finite per-seed values, with a 95 %
                   Student-t interval of the mean (``t_{0.975, n-1} · s / √n``);
                   ``rate``: each seed passes or fails its own bar (``seed_threshold`` in
                   ``seed_direction``; a NaN seed fails), ``measured`` is the fraction of seeds
                   that pass, with a 95 % Wilson score interval; ``threshold`` is then a rate.
    interval:      ``[lo, hi]``, the 95 % interval above (NaN with fewer than two finite seeds).
    n_seeds:       the number of finite per-seed values (``mean``) or of seeds (``rate``).
    spread:        over the finite per-seed values: ``std`` (``ddof = 1``), ``min``, ``max`` and
                   ``n_finite``.
    precondition:  what the claim presupposes: every arm the claim reads trained (accuracy or
                   loss against a stated bar, per arm and per seed), there is something to
                   count. ``met`` is measured, ``measured`` its value when there is one.
    control:       kind ``ablation``: the same experiment with the claimed cause removed or
                   reversed (λ = 0, SGD for Adam, no bottleneck, the baseline architecture), at
                   the same budget, judged with the same statistic, threshold and direction. It
                   is never an untrained model, a constant or a value fixed by the design.
    amended:       the study's protocol logs an amendment to this claim
                   (:mod:`dynascope.studies.protocol`).

Rules of :func:`judge`, in order (every reason that applies is recorded in ``reason``):

1. fewer than :data:`MIN_SEEDS` (5) finite per-seed values -> ``inconclusive``;
2. the precondition is not met -> ``inconclusive``;
3. the interval straddles the threshold -> ``inconclusive``;
4. a finding whose control also holds -> ``inconclusive``, and so is a finding that would
   hold while its control is itself inconclusive (the metric cannot tell the claim from its
   ablation);
5. otherwise ``held`` when the interval lies on the claimed side of the threshold (touching it
   counts), ``not held`` when it lies strictly on the other side.

Thresholds are fixed in the study's protocol before its evaluation seeds run (from theory or
calibration seeds >= 10,000); ``shared/DESIGN.md``, Study and Protocol.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from ._conditions import Control as Control
from ._conditions import Precondition as Precondition
from ._statistics import _NAN_INTERVAL, _check_direction, _floats, _spread, _summary
from ._statistics import CONFIDENCE as CONFIDENCE
from ._statistics import DIRECTIONS as DIRECTIONS
from ._statistics import interval_status as interval_status
from ._statistics import mean_interval as mean_interval
from ._statistics import seed_passes as seed_passes
from ._statistics import wilson_interval as wilson_interval

__all__ = [
    "CONFIDENCE",
    "DIRECTIONS",
    "KINDS",
    "MIN_SEEDS",
    "STATISTICS",
    "STATUSES",
    "Control",
    "Precondition",
    "Verdict",
    "claim_id",
    "interval_status",
    "judge",
    "legacy_direction",
    "mean_interval",
    "seed_passes",
    "wilson_interval",
]

STATUSES = ("held", "not held", "inconclusive")
KINDS = ("finding", "identity")
MIN_SEEDS = 5
STATISTICS = {
    "mean": "mean over seeds, 95 % Student-t interval",
    "rate": "fraction of seeds that pass their bar, 95 % Wilson interval",
}
# how legacy details write their comparison ("measured <= threshold; ...")
_LEGACY_DIRECTION = re.compile(r"measured\s*(<=|>=|==|<|>)\s*threshold")


def legacy_direction(detail: str) -> str:
    """The comparison a legacy verdict's ``detail`` states (``measured <= threshold`` ...):
    ``<=``, ``>=``, ``==``, ``<`` or ``>``; ``unknown`` when it states none."""
    found = _LEGACY_DIRECTION.search(detail)
    return found.group(1) if found else "unknown"


def claim_id(claim: str) -> str:
    """A claim's id: the text of ``"id: the claim in words"`` before the first ``:``."""
    return claim.split(":")[0].strip()


def _check_per_seed(per_seed: Mapping[int, float], name: str) -> tuple[tuple[int, ...], tuple]:
    if not isinstance(per_seed, Mapping):
        raise ValueError(f"{name}: must map seed -> value (got {type(per_seed).__name__})")
    seeds = tuple(int(s) for s in per_seed)
    return seeds, _floats(per_seed.values())


@dataclass(frozen=True)
class Verdict:
    """One claim checked against measured runs (see the module docstring for every rule).

    Build it with :func:`judge`. The legacy form ``Verdict(claim, metric, measured, threshold,
    passed, detail)`` still reads old ``verdict.json`` files (``legacy`` is then true): its
    status comes from ``passed``, its direction from ``detail``.

    Attributes:
        claim: the claim in words, ``"id: text"``.
        metric: what was measured, with its definition in a few words.
        measured: the aggregate over seeds (NaN when it could not be measured; ``null`` in
            ``verdict.json``).
        threshold: the protocol's threshold.
        passed: ``status == "held"``.
        detail: notes.
        status: ``held`` | ``not held`` | ``inconclusive``.
        kind: ``finding`` | ``identity``.
        direction: ``<=`` | ``>=`` (legacy: as read from ``detail``, or ``unknown``).
        statistic: ``mean`` | ``rate`` (:data:`STATISTICS`).
        seed_threshold, seed_direction: a ``rate`` claim's per-seed bar.
        interval: the 95 % interval of ``measured``; ``n_seeds``: the seeds behind it.
        seeds: the seeds judged, in order; ``per_seed``: the metric per seed.
        aggregation: the statistic in words.
        precondition: what the claim presupposes (``None``: legacy).
        control: the ablation control, judged (``None``: legacy or an identity).
        reason: why the status is ``inconclusive`` (empty otherwise).
        amended: the study's protocol logs an amendment to this claim.
        legacy: built without a status (no seeds, no control).

    Raises:
        ValueError: neither ``status`` nor ``passed`` given; an unknown ``status``, ``kind``
            or ``direction``; ``passed`` contradicting ``status``; ``seeds`` and ``per_seed``
            of different lengths.
    """

    claim: str
    metric: str
    measured: float
    threshold: float
    passed: bool | None = None
    detail: str = ""
    _: KW_ONLY
    status: str | None = None
    kind: str = "finding"
    direction: str | None = None
    statistic: str = "mean"
    seed_threshold: float | None = None
    seed_direction: str | None = None
    interval: tuple[float, float] = _NAN_INTERVAL
    n_seeds: int = 0
    seeds: tuple[int, ...] = ()
    per_seed: tuple[float, ...] = ()
    aggregation: str = ""
    precondition: Precondition | None = None
    control: Control | None = None
    reason: str = ""
    amended: bool = False
    legacy: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        put = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)} (got {self.kind!r})")
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
            _check_direction(self.direction)  # type: ignore[arg-type]
            if self.passed is not None and bool(self.passed) != (self.status == "held"):
                raise ValueError(
                    f"passed={self.passed} contradicts status={self.status!r} "
                    "(passed is status == 'held')"
                )
        put("passed", self.status == "held")
        put("seeds", tuple(int(s) for s in self.seeds))
        put("per_seed", _floats(self.per_seed))
        put("interval", tuple(float(x) for x in self.interval))
        if len(self.seeds) != len(self.per_seed):
            raise ValueError(
                f"seeds and per_seed must have one value per seed (got {len(self.seeds)} seeds "
                f"and {len(self.per_seed)} values)"
            )

    @property
    def claim_id(self) -> str:
        """The claim's id (:func:`claim_id`)."""
        return claim_id(self.claim)

    @property
    def spread(self) -> dict[str, float | int]:
        """``std`` (ddof = 1), ``min``, ``max`` and ``n_finite`` of the finite per-seed values."""
        return _spread(self.per_seed)

    def to_json(self) -> dict[str, Any]:
        """The verdict as ``verdict.json`` stores it (NaN becomes ``null`` when dumped)."""
        return {
            "claim": self.claim,
            "kind": self.kind,
            "status": self.status,
            "passed": self.passed,
            "amended": self.amended,
            "metric": self.metric,
            "measured": float(self.measured),
            "direction": self.direction,
            "threshold": float(self.threshold),
            "statistic": self.statistic,
            "seed_threshold": self.seed_threshold,
            "seed_direction": self.seed_direction,
            "interval": [float(x) for x in self.interval],
            "n_seeds": int(self.n_seeds),
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


def _judge_control(
    control: Control, threshold: float, direction: str, statistic: str, seed_bar
) -> Control:
    if control.per_seed is None:
        raise ValueError(f"control {control.text!r}: give per_seed (seed -> value)")
    _, values = _check_per_seed(control.per_seed, "control.per_seed")
    measured, interval, n = _summary(values, statistic, seed_bar)
    n_finite = sum(math.isfinite(v) for v in values)
    status = (
        "inconclusive" if n_finite < MIN_SEEDS else interval_status(interval, threshold, direction)
    )
    return Control(
        control.text, dict(control.per_seed), control.kind, measured, interval, n, status
    )


def judge(
    *,
    claim: str,
    metric: str,
    per_seed: Mapping[int, float],
    threshold: float,
    direction: str,
    precondition: Precondition,
    control: Control | None,
    statistic: str = "mean",
    seed_threshold: float | None = None,
    seed_direction: str | None = None,
    kind: str = "finding",
    detail: str = "",
) -> Verdict:
    """Judge a claim over seeds: statistic, interval, control and status (module docstring).

    Args:
        claim: ``"id: the claim in words"``.
        metric: the metric's definition in a few words.
        per_seed: seed -> the metric for that seed (NaN: not measurable; a ``rate`` counts it
            as failing, a ``mean`` leaves it out of the mean and the interval).
        threshold: the protocol's threshold (finite; a rate in [0, 1] for ``rate``).
        direction: ``<=`` or ``>=``; equality passes.
        precondition: what the claim presupposes and whether it was met.
        control: the ablation control, unjudged (filled here); ``None`` only for an identity.
        statistic: ``mean`` or ``rate`` (:data:`STATISTICS`).
        seed_threshold, seed_direction: a ``rate`` claim's per-seed bar (required for it).
        kind: ``finding`` or ``identity``.
        detail: free notes (e.g. the per-width seed means).

    Returns:
        The :class:`Verdict`.

    Raises:
        ValueError: an unknown ``direction``, ``statistic`` or ``kind``; a non-finite
            ``threshold``; a ``rate`` without its per-seed bar or with a threshold outside
            [0, 1]; ``per_seed`` not a mapping; a finding without a control, or a control
            without ``per_seed``.
    """
    _check_direction(direction)
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {', '.join(STATISTICS)} (got {statistic!r})")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)} (got {kind!r})")
    if not math.isfinite(threshold):
        raise ValueError(f"threshold must be finite (got {threshold})")
    seed_bar = None
    if statistic == "rate":
        if seed_threshold is None or seed_direction is None:
            raise ValueError("statistic 'rate' needs seed_threshold and seed_direction")
        _check_direction(seed_direction, "seed_direction")
        if not 0 <= threshold <= 1:
            raise ValueError(f"threshold of a rate must be in [0, 1] (got {threshold})")
        seed_bar = (float(seed_threshold), seed_direction)
    if control is None and kind == "finding":
        raise ValueError(f"{claim!r}: a finding needs an ablation control (got None)")
    seeds, values = _check_per_seed(per_seed, "per_seed")
    measured, interval, n_seeds = _summary(values, statistic, seed_bar)
    judged = (
        None
        if control is None
        else _judge_control(control, threshold, direction, statistic, seed_bar)
    )
    n_finite = sum(math.isfinite(v) for v in values)
    side = interval_status(interval, threshold, direction)
    reasons = []
    if n_finite < MIN_SEEDS:
        reasons.append(f"only {n_finite} of {len(values)} seeds finite (need {MIN_SEEDS})")
    if not precondition.met:
        value = precondition.measured
        shown = f" [measured {value:.4g}]" if math.isfinite(value) else ""
        reasons.append(f"precondition not met: {precondition.text}{shown}")
    if side == "inconclusive" and n_finite >= 2:
        lo, hi = interval
        reasons.append(f"the interval [{lo:.4g}, {hi:.4g}] straddles the threshold {threshold:g}")
    if judged is not None and judged.status == "held":
        reasons.append(f"the control also holds: {judged.text}")
    elif judged is not None and judged.status == "inconclusive" and side == "held":
        reasons.append(f"the control could not be told from the threshold: {judged.text}")
    status = "inconclusive" if reasons else side
    return Verdict(
        claim,
        metric,
        measured,
        float(threshold),
        detail=detail,
        status=status,
        kind=kind,
        direction=direction,
        statistic=statistic,
        seed_threshold=None if seed_bar is None else seed_bar[0],
        seed_direction=None if seed_bar is None else seed_bar[1],
        interval=interval,
        n_seeds=n_seeds,
        seeds=seeds,
        per_seed=values,
        aggregation=STATISTICS[statistic],
        precondition=precondition,
        control=judged,
        reason="; ".join(reasons),
    )
