"""A study's protocol: what decides each claim's verdict, fixed before the evaluation seeds run.

Glossary:
    claim spec:        one claim's protocol (:class:`ClaimSpec`): the paper's statement and
                       citation, the per-seed metric, the statistic over seeds (``mean`` or
                       ``rate``), the direction and threshold and where the threshold came
                       from, the preconditions (every arm the claim reads trained), the
                       ablation control, and the claim's kind (``finding`` | ``identity``).
    seeds per preset:  how many seeds each arm runs at each preset (``seed + k``, k < n, with
                       ``seed`` the base seed of ``study run --seed``).
    calibration seeds: base seeds (>= 10,000) on which thresholds and sizes were chosen; their
                       results may be seen before the protocol is fixed.
    evaluation seeds:  base seeds (< 10,000) whose verdicts are published (docs/studies.md);
                       a change made after any of their results was seen is an amendment.
    amendment:         a logged change (date, claims, what changed, why, which results had
                       been seen). Amended claims are marked in every verdict table.
    sha256:            the hash of the protocol's canonical JSON, amendments included; every
                       ``verdict.json`` carries it, so a verdict names the protocol it was
                       judged by.

A study's analysis judges a claim through its spec (``PROTOCOL.claim("a1").judge(...)``), so
the threshold, direction and statistic in ``verdict.json`` are the protocol's; the study
refuses to write a verdict whose claim is not in its protocol or disagrees with it.
``shared/DESIGN.md`` (Protocol) states the contract.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .verdict import (
    DIRECTIONS,
    KINDS,
    MIN_SEEDS,
    STATISTICS,
    Control,
    Precondition,
    Verdict,
    judge,
)

__all__ = ["CALIBRATION_MIN", "EDITORIAL_REWORDING", "Amendment", "ClaimSpec", "Protocol"]

CALIBRATION_MIN = 10_000


@dataclass(frozen=True)
class ClaimSpec:
    """One claim's protocol (module glossary).

    Attributes:
        id: the claim's id (``a1``), unique in the study.
        claim: the claim as the verdict states it (``"id: claim"`` in ``verdict.json``).
        statement: the paper's statement, quoted or closely paraphrased.
        citation: where the paper says it (section, figure, equation).
        metric: the per-seed metric, defined in a few words.
        threshold: the threshold the statistic is compared with (a rate for ``rate``).
        direction: ``<=`` | ``>=``.
        threshold_source: how the threshold was fixed (theory, or which calibration seeds).
        preconditions: what the claim presupposes, each with its bar.
        control: the ablation control in words ("" only for an identity).
        statistic: ``mean`` | ``rate``.
        seed_threshold, seed_direction: a ``rate`` claim's per-seed bar.
        kind: ``finding`` | ``identity``.

    Raises:
        ValueError: an unknown direction, statistic or kind; a non-finite threshold; a rate
            without its per-seed bar; a finding without a control.
    """

    id: str
    claim: str
    statement: str
    citation: str
    metric: str
    threshold: float
    direction: str
    threshold_source: str
    preconditions: tuple[str, ...] = ()
    control: str = ""
    statistic: str = "mean"
    seed_threshold: float | None = None
    seed_direction: str | None = None
    kind: str = "finding"

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(f"{self.id}: direction must be one of <=, >= (got {self.direction!r})")
        if self.statistic not in STATISTICS:
            raise ValueError(
                f"{self.id}: statistic must be one of {', '.join(STATISTICS)} "
                f"(got {self.statistic!r})"
            )
        if self.kind not in KINDS:
            raise ValueError(
                f"{self.id}: kind must be one of {', '.join(KINDS)} (got {self.kind!r})"
            )
        if not math.isfinite(self.threshold):
            raise ValueError(f"{self.id}: threshold must be finite (got {self.threshold})")
        unbarred = self.seed_threshold is None or self.seed_direction is None
        if self.statistic == "rate" and unbarred:
            raise ValueError(f"{self.id}: statistic 'rate' needs seed_threshold and seed_direction")
        if self.kind == "finding" and not self.control:
            raise ValueError(f"{self.id}: a finding needs an ablation control (got none)")
        object.__setattr__(self, "preconditions", tuple(self.preconditions))

    def judge(
        self,
        per_seed: Mapping[int, float],
        *,
        precondition: Precondition,
        control: Mapping[int, float] | Control | None,
        detail: str = "",
    ) -> Verdict:
        """Judge this claim on measured values with the protocol's statistic and threshold.

        Args:
            per_seed: seed -> the metric.
            precondition: whether the preconditions were met (its text should state them).
            control: seed -> the metric on the ablation (the spec's ``control`` text is used),
                or a :class:`Control`; ``None`` only for an identity.
            detail: free notes.

        Raises:
            ValueError: as :func:`~dynascope.studies.verdict.judge`.
        """
        if isinstance(control, Mapping):
            control = Control(self.control, dict(control))
        return judge(
            claim=f"{self.id}: {self.claim}",
            metric=self.metric,
            per_seed=per_seed,
            threshold=self.threshold,
            direction=self.direction,
            precondition=precondition,
            control=control,
            statistic=self.statistic,
            seed_threshold=self.seed_threshold,
            seed_direction=self.seed_direction,
            kind=self.kind,
            detail=detail,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "claim": self.claim,
            "kind": self.kind,
            "statement": self.statement,
            "citation": self.citation,
            "metric": self.metric,
            "statistic": self.statistic,
            "direction": self.direction,
            "threshold": float(self.threshold),
            "seed_threshold": self.seed_threshold,
            "seed_direction": self.seed_direction,
            "threshold_source": self.threshold_source,
            "preconditions": list(self.preconditions),
            "control": self.control,
        }


@dataclass(frozen=True)
class Amendment:
    """A change made after evaluation-seed results were seen.

    Attributes:
        date: ISO date (``2026-12-07``) the change was made.
        claims: the ids of the claims it touches (``"*"``: every claim).
        change: what changed (metric, threshold, preset, seeds, control ...).
        reason: why.
        seen: which evaluation results had been seen when it was made.

    Raises:
        ValueError: a date that is not ISO ``YYYY-MM-DD``, or no claims.
    """

    date: str
    claims: tuple[str, ...]
    change: str
    reason: str
    seen: str

    def __post_init__(self) -> None:
        try:
            datetime.date.fromisoformat(self.date)
        except ValueError:
            raise ValueError(f"amendment date must be YYYY-MM-DD (got {self.date!r})") from None
        object.__setattr__(self, "claims", tuple(self.claims))
        if not self.claims:
            raise ValueError(f"amendment of {self.date}: claims must name at least one claim")

    def to_json(self) -> dict[str, Any]:
        return {
            "date": self.date,
            "claims": list(self.claims),
            "change": self.change,
            "reason": self.reason,
            "seen": self.seen,
        }


EDITORIAL_REWORDING = Amendment(
    date="2026-12-07",
    claims=("*",),
    change="editorial: the amendment log, registered text and threshold sources name "
    "the audits by date ('the fit audit', 'the 2026-12-02 audit') instead of internal "
    "tracker numbers; no statement, statistic, threshold, step count, seed count, "
    "precondition or control changed",
    reason="user-facing text carries no internal issue numbers; the wording change moves "
    "the protocol's sha256, so it is logged here",
    seen="every fast verdict at seeds 0 and 1000 (docs/studies.md, "
    "docs/studies-seed1000.md), unchanged by this entry",
)
"""The amendment entry of the 2026-12-07 editorial rewording, shared by the protocols whose
text it changed (the same entry, so the same hash contribution)."""


@dataclass(frozen=True)
class Protocol:
    """A study's protocol (module glossary).

    Attributes:
        study: the study's name.
        claims: the claim specs, in verdict order.
        seeds: preset name -> seeds per arm.
        calibration_seeds: base seeds (>= 10,000) thresholds and sizes were chosen on; empty
            when every threshold comes from theory and no size was calibrated.
        evaluation_seeds: base seeds (< 10,000) whose verdicts are published.
        presets: preset name -> its sizes and how they were chosen.
        reproduces: the cheapest preset at which the protocol expects every precondition met
            (``fast``, ``full`` or ``paper``), with its cost, in words.
        registered: when and on what knowledge this version was fixed (ISO date first,
            then what had been seen: e.g. the earlier contract's verdicts at seeds 0 and 1000).
        amendments: the amendment log, oldest first.

    Raises:
        ValueError: duplicate claim ids; a calibration seed below 10,000 or an evaluation seed
            at or above it; fewer than 5 seeds per arm at ``fast`` or ``full``; an amendment
            naming an unknown claim.
    """

    study: str
    claims: tuple[ClaimSpec, ...]
    seeds: Mapping[str, int]
    calibration_seeds: tuple[int, ...]
    presets: Mapping[str, str]
    reproduces: str
    registered: str
    evaluation_seeds: tuple[int, ...] = (0, 1000)
    amendments: tuple[Amendment, ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "claims", tuple(self.claims))
        object.__setattr__(self, "amendments", tuple(self.amendments))
        ids = [c.id for c in self.claims]
        if len(set(ids)) != len(ids):
            raise ValueError(f"{self.study}: claim ids must be unique (got {ids})")
        low = [s for s in self.calibration_seeds if s < CALIBRATION_MIN]
        if low:
            raise ValueError(
                f"{self.study}: calibration seeds must be >= {CALIBRATION_MIN} (got "
                f"{list(self.calibration_seeds)})"
            )
        high = [s for s in self.evaluation_seeds if s >= CALIBRATION_MIN]
        if high:
            raise ValueError(
                f"{self.study}: evaluation_seeds must be < {CALIBRATION_MIN} (got {high})"
            )
        for preset in ("fast", "full"):
            n = self.seeds.get(preset)
            if n is not None and n < MIN_SEEDS:
                raise ValueError(
                    f"{self.study}: seeds[{preset!r}] must be >= {MIN_SEEDS} (got {n})"
                )
        for amendment in self.amendments:
            unknown = set(amendment.claims) - set(ids) - {"*"}
            if unknown:
                raise ValueError(
                    f"{self.study}: amendment of {amendment.date} names unknown claims "
                    f"{sorted(unknown)} (claims: {', '.join(ids)})"
                )

    def claim(self, claim_id: str) -> ClaimSpec:
        """The spec of claim ``claim_id``.

        Raises:
            KeyError: if the protocol has no such claim.
        """
        for spec in self.claims:
            if spec.id == claim_id:
                return spec
        raise KeyError(f"{self.study}: no claim {claim_id!r} (claims: {self.claim_ids()})")

    def claim_ids(self) -> str:
        return ", ".join(c.id for c in self.claims)

    def amended_ids(self) -> set[str]:
        """The ids of the claims any amendment touches."""
        ids = {i for a in self.amendments for i in a.claims}
        return {c.id for c in self.claims} if "*" in ids else ids

    def to_json(self) -> dict[str, Any]:
        return {
            "study": self.study,
            "claims": [c.to_json() for c in self.claims],
            "seeds": dict(self.seeds),
            "calibration_seeds": list(self.calibration_seeds),
            "evaluation_seeds": list(self.evaluation_seeds),
            "presets": dict(self.presets),
            "reproduces": self.reproduces,
            "registered": self.registered,
            "amendments": [a.to_json() for a in self.amendments],
        }

    @property
    def sha256(self) -> str:
        """SHA-256 of the canonical JSON (sorted keys, no spaces) of :meth:`to_json`."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def check(self, verdicts: list[Verdict]) -> list[Verdict]:
        """``verdicts`` with ``amended`` set from the log, after checking each against its spec.

        Raises:
            ValueError: a verdict whose claim is not in the protocol, or whose threshold,
                direction, statistic or kind differs from its spec.
        """
        amended = self.amended_ids()
        specs = {c.id: c for c in self.claims}
        checked = []
        for verdict in verdicts:
            spec = specs.get(verdict.claim_id)
            if spec is None:
                raise ValueError(
                    f"{self.study}: verdict {verdict.claim_id!r} is not in the protocol "
                    f"(claims: {self.claim_ids()})"
                )
            ours = (float(verdict.threshold), verdict.direction, verdict.statistic, verdict.kind)
            theirs = (float(spec.threshold), spec.direction, spec.statistic, spec.kind)
            if ours != theirs:
                raise ValueError(
                    f"{self.study}: verdict {spec.id} was judged with (threshold, direction, "
                    f"statistic, kind) = {ours}, the protocol says {theirs}"
                )
            checked.append(replace(verdict, amended=spec.id in amended))
        return checked

    def markdown(self) -> str:
        """``## Protocol`` and ``## Amendments`` sections for the study's docs page."""
        lines = [
            "## Protocol",
            "",
            f"Protocol sha256 `{self.sha256[:16]}…`. Evaluation seeds: base "
            f"{', '.join(map(str, self.evaluation_seeds))}; calibration seeds: base "
            f"{', '.join(map(str, self.calibration_seeds))}. Seeds per arm: "
            + ", ".join(f"{p} {n}" for p, n in self.seeds.items())
            + f". Reproduces the finding: {self.reproduces}.",
            "",
            f"Registered: {self.registered}",
            "",
        ]
        lines += [f"- `{p}`: {text}" for p, text in self.presets.items()]
        lines += [""]
        for c in self.claims:
            bar = (
                f"fraction of seeds with metric {c.seed_direction} {c.seed_threshold:g}"
                if c.statistic == "rate"
                else "mean over seeds"
            )
            lines += [
                f"### {c.id} ({c.kind}): {c.claim}",
                "",
                f"- Paper: {c.statement} ({c.citation})",
                f"- Metric: {c.metric}; statistic: {bar} ({STATISTICS[c.statistic]}); "
                f"held when the interval is {c.direction} {c.threshold:g}.",
                f"- Threshold from: {c.threshold_source}",
                "- Preconditions: " + ("; ".join(c.preconditions) or "none"),
                f"- Control (ablation): {c.control or 'none (identity check)'}",
                "",
            ]
        lines += ["## Amendments", ""]
        if not self.amendments:
            lines += ["None: the protocol is as registered.", ""]
        for a in self.amendments:
            lines += [
                f"- **{a.date}**, claims {', '.join(a.claims)}: {a.change} Reason: {a.reason} "
                f"Seen before the change: {a.seen}",
            ]
        return "\n".join(lines).rstrip() + "\n"
