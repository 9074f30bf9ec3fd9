"""The suite table: every study's measured verdicts, for the terminal and ``docs/studies.md``.

Glossary:
    suite directory:  where ``dynascope study run --all`` writes one study directory per study,
                      ``SUITE/NAME-PRESET/`` (``verdict.json`` inside, as for one study).
    row:              one claim of one study: study, claim (its id), status (``held`` |
                      ``not held`` | ``inconclusive``; ``None`` when not run), measured (the
                      aggregate over seeds), direction (``<=`` | ``>=``), threshold, interval
                      (``[lo, hi], n = N``: the 95 % interval the status is read from),
                      spread (``± std [min, max] over n seeds``, or ``no seeds`` for a legacy
                      verdict), control (``STATUS (value [lo, hi])``, ``identity`` for an
                      implementation check, or ``no control``), passed, legacy, amended (the
                      protocol logs a change to the claim, marked ``†``), kind (``finding``
                      | ``identity``), reason (why inconclusive), seconds (the study's
                      wall-clock seconds, on the first claim's row), text (the claim in words).

``docs/studies.md`` is generated from the stored ``verdict.json`` files
(``dynascope study table``), so the docs show what was measured, not what was promised; a
study with no ``verdict.json`` is listed as not run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = ["claim_cell", "control_cell", "interval_cell", "markdown_table", "spread_cell",
           "suite_rows"]  # fmt: skip


def _claim_parts(claim: str) -> tuple[str, str]:
    """``(id, words)`` of a stored claim ``"id: the claim in words"`` (the form of
    ``Verdict.claim``); the words are the whole text when it has no ``:``."""
    claim_id, _, words = claim.partition(":")
    return claim_id.strip(), words.strip() or claim


def _number(value: Any) -> str:
    return "nan" if value is None or math.isnan(float(value)) else f"{float(value):.3g}"


def spread_cell(claim: dict[str, Any]) -> str:
    """A claim's spread over seeds as one cell: ``± std [min, max], n seeds`` (``no seeds``).

    ``claim`` is one entry of ``verdict.json``'s ``claims``. ``n`` counts the finite values;
    a legacy verdict has none.
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


def _interval(value: Any) -> str:
    if not value or any(v is None for v in value):
        return "no interval"
    return f"[{_number(value[0])}, {_number(value[1])}]"


def interval_cell(claim: dict[str, Any]) -> str:
    """A claim's 95 % interval and seed count as one cell: ``[lo, hi], n = N``.

    ``claim`` is one entry of ``verdict.json``'s ``claims``; a legacy verdict has none (``no
    interval``).
    """
    if claim.get("legacy"):
        return "no interval"
    return f"{_interval(claim['interval'])}, n = {claim.get('n_seeds', 0)}"


def claim_cell(claim: dict[str, Any]) -> str:
    """A claim's id, with ``†`` when its protocol logs an amendment to it and ``(identity)``
    for an implementation check."""
    cell = _claim_parts(claim["claim"])[0]
    if claim.get("amended"):
        cell += " †"
    if claim.get("kind") == "identity":
        cell += " (identity)"
    return cell


def control_cell(claim: dict[str, Any]) -> str:
    """A claim's ablation control as one cell: ``STATUS (measured [lo, hi])``; ``identity``
    for an implementation check; ``no control`` for a legacy verdict."""
    control = claim.get("control")
    if not control:
        return "identity" if claim.get("kind") == "identity" else "no control"
    cell = f"{control.get('status')} ({_number(control.get('measured'))}"
    if "interval" in control:
        cell += f" {_interval(control['interval'])}"
    return cell + ")"


def suite_rows(suite_dir: Path, names: list[str], preset: str) -> list[dict[str, Any]]:
    """One row per claim of each study in ``names`` (read from ``suite_dir/NAME-PRESET``).

    A study without a readable ``verdict.json`` gives one row with ``claim = "(not run)"``.
    ``measured`` is ``nan`` where the verdict stored ``null`` (not measurable).
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
                    "interval": "",
                    "control": "",
                    "amended": False,
                    "kind": "",
                    "passed": None,
                    "legacy": False,
                    "reason": "",
                    "seconds": math.nan,
                }
            )
            continue
        for i, claim in enumerate(info["claims"]):
            measured = claim["measured"]
            rows.append(
                {
                    "study": name,
                    "claim": claim_cell(claim),
                    "text": _claim_parts(claim["claim"])[1],
                    "status": claim["status"],
                    "measured": math.nan if measured is None else float(measured),
                    "direction": claim["direction"],
                    "threshold": float(claim["threshold"]),
                    "spread": spread_cell(claim),
                    "interval": interval_cell(claim),
                    "control": control_cell(claim),
                    "amended": bool(claim.get("amended")),
                    "kind": claim.get("kind", "finding"),
                    "passed": bool(claim["passed"]),
                    "legacy": bool(claim["legacy"]),
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


def reproduction_lines(preset: str) -> list[str]:
    """A Markdown table of every registered study: the preset its protocol expects to
    reproduce the finding (the opening clause of ``reproduces``), and the measured cost of
    ``preset`` and of that preset (``studies/preset_costs.json``)."""
    from dynascope.catalog import read_catalog
    from dynascope.presets import cost_text, preset_costs, reproducing_preset

    costs = preset_costs()
    lines = [
        "Which preset reproduces each finding (the study's protocol, `reproduces`), and what "
        f"`{preset}` and that preset cost as measured:",
        "",
        f"| study | reproduces | cost of `{preset}` | cost of the reproducing preset |",
        "|---|---|---|---|",
    ]
    for name, _presets, _claim, reproduces in read_catalog():
        own = costs.get(name, {})
        target = reproducing_preset(reproduces)
        target_cost = "" if target in (None, preset) else cost_text(own.get(target))
        cells = [name, reproduces or "none yet", cost_text(own.get(preset)), target_cost]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def markdown_table(rows: list[dict[str, Any]], *, preset: str, when: str) -> str:
    """``docs/studies.md``: a heading, how it was made, and the rows as a Markdown table."""
    n_claims = sum(r["status"] is not None for r in rows)
    counts = {s: sum(r["status"] == s for r in rows) for s in ("held", "not held", "inconclusive")}
    n_identity = sum(r["kind"] == "identity" for r in rows)
    n_amended = sum(bool(r["amended"]) for r in rows)
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
        "Each claim is judged over seeds from its study's protocol (fixed before the "
        "evaluation seeds ran; `docs/studies/NAME.md`, Protocol): `measured` is the mean over "
        "seeds (or, for a rate, the fraction of seeds that pass their bar) and `interval` its "
        "95 % interval (Student-t for a mean, Wilson for a rate) over `n` seeds. `held`: the "
        "interval lies on the claimed side of the threshold and the ablation control (the "
        "same experiment with the claimed cause removed, same budget) does not hold; `not "
        "held`: the interval lies on the other side; `inconclusive`: fewer than 5 seeds, a "
        "precondition failed (every arm the claim reads must have trained), the interval "
        "straddles the threshold, or the control held too. † marks a claim whose protocol "
        "logs an amendment (a change made after evaluation results were seen); `identity` "
        "marks an implementation check, listed apart from findings "
        "(`src/dynascope/studies/verdict.py`).",
        "",
        f"{counts['held']} of {n_claims} claims held, {counts['not held']} not held, "
        f"{counts['inconclusive']} inconclusive; {n_identity} of them identity checks; "
        f"{n_amended} amended.",
        "",
        *reproduction_lines(preset),
        "",
        "| study | claim | status | measured | threshold | interval (95 %) | control "
        "| seconds | the claim |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        threshold = "" if math.isnan(r["threshold"]) else f"{r['direction']} {r['threshold']:.4g}"
        text = r["text"] + (f" (inconclusive: {r['reason']})" if r["reason"] else "")
        cells = [r["study"], r["claim"], r["status"], r["measured"], threshold, r["interval"]]
        cells += [r["control"], r["seconds"], text]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"
