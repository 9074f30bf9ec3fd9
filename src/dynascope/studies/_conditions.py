"""What a claim is judged against besides its own seeds: the :class:`Precondition` the runs
must meet and the ablation :class:`Control` (glossary and rules in
:mod:`dynascope.studies.verdict`, which re-exports both).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._statistics import _NAN_INTERVAL, _floats, _spread


@dataclass(frozen=True)
class Precondition:
    """What a claim presupposes, and whether the runs met it.

    Attributes:
        text: the condition in words, with its bound ("every arm, every seed: recall
            accuracy >= 0.9").
        met: whether it was met.
        measured: the measured quantity the condition bounds, when there is one (NaN: none),
            e.g. the worst arm's accuracy.
    """

    text: str
    met: bool
    measured: float = math.nan

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "met": bool(self.met), "measured": float(self.measured)}


@dataclass(frozen=True)
class Control:
    """An ablation control: the claim's experiment with its cause removed, same budget.

    Give ``per_seed`` (seed -> the claim's metric on the ablation); :func:`judge` fills
    ``measured``, ``interval``, ``n_seeds`` and ``status`` with the claim's statistic, threshold
    and direction.

    Attributes:
        text: the ablation in words ("λ_attn = 0, the same budget and statistic").
        per_seed: seed -> the control's value.
        kind: ``ablation`` (the only kind a finding accepts).
        measured: the control's aggregate (mean, or rate for a ``rate`` claim).
        interval: its 95 % interval.
        n_seeds: its finite seeds (``mean``) or seeds (``rate``).
        status: ``held`` | ``not held`` | ``inconclusive`` once judged, else ``None``.

    Raises:
        ValueError: if ``kind`` is not ``ablation``.
    """

    text: str
    per_seed: Mapping[int, float] | None = None
    kind: str = "ablation"
    measured: float = math.nan
    interval: tuple[float, float] = _NAN_INTERVAL
    n_seeds: int = 0
    status: str | None = None

    def __post_init__(self) -> None:
        if self.kind != "ablation":
            raise ValueError(f"control kind must be ablation (got {self.kind!r})")

    def to_json(self) -> dict[str, Any]:
        values = _floats((self.per_seed or {}).values())
        return {
            "text": self.text,
            "kind": self.kind,
            "measured": float(self.measured),
            "interval": [float(x) for x in self.interval],
            "n_seeds": int(self.n_seeds),
            "status": self.status,
            "seeds": [int(s) for s in (self.per_seed or {})],
            "per_seed": list(values),
            "spread": _spread(values) if values else None,
        }
