"""The suite table: every study's measured verdicts, for the terminal and ``docs/studies.md``.

Glossary:
    suite directory:  where ``dynascope study run --all`` writes one study directory per study,
                      ``SUITE/NAME-PRESET/`` (``verdict.json`` inside, as for one study).
    row:              one claim of one study: study, claim (its id), status (``held`` |
                      ``not held`` | ``inconclusive``; ``None`` when not run), measured (the
                      aggregate over seeds), direction (``<=`` | ``>=``), threshold, spread
                      (``± std [min, max] over n seeds``, or ``no seeds`` for a legacy
                      verdict), control (``STATUS (value)``, or ``no control``), passed,
                      legacy, reason (why inconclusive), seconds (the study's wall-clock
                      seconds, on the first claim's row), text (the claim in words).

``docs/studies.md`` is generated from the stored ``verdict.json`` files
(``dynascope study table``), so the docs show what was measured, not what was promised; a
study with no ``verdict.json`` is listed as not run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from dynascope.studies.verdict import legacy_direction

__all__ = ["control_cell", "markdown_table", "spread_cell", "suite_rows"]


def _claim_id(claim: str) -> str:
    return claim.split(":")[0].strip()


def _number(value: Any) -> str:
    return "nan" if value is None or math.isnan(float(value)) else f"{float(value):.3g}"


def spread_cell(claim: dict[str, Any]) -> str:
    """A claim's spread over seeds as one cell: ``± std [min, max], n seeds`` (``no seeds``).

    ``claim`` is one entry of ``verdict.json``'s ``claims``. ``n`` counts the finite values;
    a legacy verdict (or one stored before the contract) has none.
    """
    if not claim.get("seeds"):
        return "no seeds"
    spread = claim.get("spread") or {}
    n, total = spread.get("n_finite", 0), len(claim["seeds"])
    seeds = f"{n} seeds" if n == total else f"{n} of {total} seeds finite"
    return (
        f"± {_number(spread.get('std'))} [{_number(spread.get('min'))}, "
        f"{_number(spread.get('max'))}], {seeds}"
    )


def control_cell(claim: dict[str, Any]) -> str:
    """A claim's negative control as one cell: ``STATUS (measured)``, or ``no control``."""
    control = claim.get("control")
    if not control:
        return "no control"
    return f"{control.get('status')} ({_number(control.get('measured'))})"


def suite_rows(suite_dir: Path, names: list[str], preset: str) -> list[dict[str, Any]]:
    """One row per claim of each study in ``names`` (read from ``suite_dir/NAME-PRESET``).

    A study without a readable ``verdict.json`` gives one row with ``claim = "(not run)"``.
    ``measured`` is ``nan`` where the verdict stored ``null`` (not measurable). A
    ``verdict.json`` written before the verdict contract reads as legacy verdicts.
    """
    rows: list[dict[str, Any]] = []
    for name in names:
        path = suite_dir / f"{name}-{preset}" / "verdict.json"
        try:
            info = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            rows.append(
                {
                    "study": name,
                    "claim": "(not run)",
                    "text": "",
                    "status": None,
                    "measured": math.nan,
                    "direction": "",
                    "threshold": math.nan,
                    "spread": "",
                    "control": "",
                    "passed": None,
                    "legacy": False,
                    "reason": "",
                    "seconds": math.nan,
                }
            )
            continue
        for i, claim in enumerate(info["claims"]):
            measured = claim["measured"]
            passed = bool(claim["passed"])
            rows.append(
                {
                    "study": name,
                    "claim": _claim_id(claim["claim"]),
                    "text": claim["claim"].partition(":")[2].strip() or claim["claim"],
                    "status": claim.get("status") or ("held" if passed else "not held"),
                    "measured": math.nan if measured is None else float(measured),
                    "direction": claim.get("direction")
                    or legacy_direction(claim.get("detail", "")),
                    "threshold": float(claim["threshold"]),
                    "spread": spread_cell(claim),
                    "control": control_cell(claim),
                    "passed": passed,
                    "legacy": bool(claim.get("legacy", "status" not in claim)),
                    "reason": claim.get("reason", ""),
                    "seconds": float(info["seconds"]) if i == 0 else math.nan,
                }
            )
    return rows


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.4g}"
    return str(value).replace("|", "\\|")


def markdown_table(rows: list[dict[str, Any]], *, preset: str, when: str) -> str:
    """``docs/studies.md``: a heading, how it was made, and the rows as a Markdown table."""
    n_claims = sum(r["status"] is not None for r in rows)
    counts = {s: sum(r["status"] == s for r in rows) for s in ("held", "not held", "inconclusive")}
    n_legacy = sum(bool(r["legacy"]) for r in rows)
    lines = [
        "# Studies: measured verdicts",
        "",
        f"Generated by `dynascope study table` from the `verdict.json` of each study run with "
        f"`dynascope study run --all --preset {preset}` ({when}). Do not edit by hand: rerun "
        "the suite and regenerate. A claim that did not hold is a measured result at this "
        "preset's scale; `measured` is empty where it could not be measured. `seconds` is "
        "the wall time of the study's runs and analysis as they were executed (executor, "
        "workers and the machine's other load change it); the README gives each study's CPU "
        "time on one thread.",
        "",
        "Each claim is judged over seeds (`measured` is the mean; `spread` the standard "
        "deviation, minimum and maximum over seeds) against its threshold in the stated "
        "direction, by the rule: the mean passes and at least 2/3 of the seeds pass. "
        "`inconclusive`: fewer than 3 seeds finished, a precondition failed, or the negative "
        "control (the same metric on a variant that must not show the effect) held too. "
        '"no seeds / no control" marks a verdict not yet ported to this contract '
        "(`src/dynascope/studies/verdict.py`).",
        "",
        f"{counts['held']} of {n_claims} claims held, {counts['not held']} not held, "
        f"{counts['inconclusive']} inconclusive; {n_legacy} without seeds or control.",
        "",
        "| study | claim | status | measured | threshold | spread over seeds | control "
        "| seconds | the claim |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        threshold = "" if math.isnan(r["threshold"]) else f"{r['direction']} {r['threshold']:.4g}"
        text = r["text"] + (f" (inconclusive: {r['reason']})" if r["reason"] else "")
        cells = [r["study"], r["claim"], r["status"], r["measured"], threshold, r["spread"]]
        cells += [r["control"], r["seconds"], text]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"
