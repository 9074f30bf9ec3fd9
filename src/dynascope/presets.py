"""Study preset tiers and their measured costs, importable without torch.

Glossary:
    preset:      a named size of a study (:data:`PRESETS`, cheapest first): ``smoke`` (a
                 plumbing check, seconds), ``fast`` (a demo, <= 3 min on 2 cores), ``full``
                 (where the finding needs it: <= 20 min on 2 idle cores, sized on calibration
                 seeds), ``paper`` (the paper's scale, GPU). Every study has the
                 :data:`REQUIRED_PRESETS`; ``full`` is optional.
    reproduces:  a study's ``protocol.reproduces``, prose that opens with the preset expected to
                 reproduce the finding (or ``none yet``); :func:`reproduces_clause` cuts that
                 opening clause out for ``dynascope study list``.
    cost:        measured wall and CPU seconds of a study at a preset, kept by hand in
                 ``studies/preset_costs.json`` (:data:`COSTS_FILE`) and read by
                 :func:`preset_costs`.

``dynascope.studies.base`` re-exports :data:`PRESETS` and :data:`REQUIRED_PRESETS`; they live
here so that the command's help and ``dynascope study list`` start without importing torch.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

__all__ = [
    "COSTS_FILE",
    "PRESETS",
    "REQUIRED_PRESETS",
    "cost_text",
    "preset_costs",
    "reproduces_clause",
    "reproducing_preset",
]

PRESETS = ("smoke", "fast", "full", "paper")
REQUIRED_PRESETS = ("smoke", "fast", "paper")

COSTS_FILE = Path(__file__).parent / "studies" / "preset_costs.json"
"""``{study: {preset: {"wall_s": float, "cpu_s": float, "measured": "date, cores, load"}}}``."""

_CLAUSE_END = re.compile(r" \(|:|;")


def reproduces_clause(reproduces: str) -> str:
    """The opening clause of a protocol's ``reproduces`` prose: the text before the first
    ``" ("``, ``":"`` or ``";"``, without backticks, stripped.

    ``"fast (all modes ...)"`` -> ``"fast"``; ``"none yet: ..."`` -> ``"none yet"``;
    ``"a1–a3 at `fast` (seconds); ..."`` -> ``"a1–a3 at fast"``; ``""`` -> ``""``.
    """
    return _CLAUSE_END.split(reproduces, maxsplit=1)[0].replace("`", "").strip()


def reproducing_preset(clause: str) -> str | None:
    """The first preset named (as a word) in ``clause``, or ``None`` (``"none yet"``)."""
    match = re.search(rf"\b({'|'.join(PRESETS)})\b", clause)
    return match.group(1) if match else None


def preset_costs() -> dict[str, dict[str, dict[str, Any]]]:
    """The measured costs in :data:`COSTS_FILE`; ``{}`` when the file does not exist.

    Returns:
        ``{study: {preset: {"wall_s": seconds, "cpu_s": seconds, "measured": note}}}``, as
        stored (entries may be missing: not every study is measured at every preset).
    Raises:
        ValueError: if the file is not JSON or not an object of objects; the message names
            the file.
    """
    try:
        text = COSTS_FILE.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    try:
        costs = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{COSTS_FILE}: not valid JSON ({err})") from None
    if not isinstance(costs, dict) or not all(isinstance(v, dict) for v in costs.values()):
        raise ValueError(f"{COSTS_FILE}: must map study names to {{preset: cost}} objects")
    return costs


def cost_text(cost: dict[str, Any] | None) -> str:
    """One preset's measured cost in words, for the study pages: ``"612 s wall, 480 CPU s
    (how it was measured)"``; ``"not measured"`` for ``None``.

    Args:
        cost: an entry of :func:`preset_costs` (``wall_s``, ``cpu_s``, ``measured``; any may
            be missing).
    """
    if not cost:
        return "not measured"
    parts = [f"{cost['wall_s']:.0f} s wall"] if "wall_s" in cost else []
    parts += [f"{cost['cpu_s']:.0f} CPU s"] if "cpu_s" in cost else []
    text = ", ".join(parts) or "not measured"
    return f"{text} ({cost['measured']})" if cost.get("measured") else text
