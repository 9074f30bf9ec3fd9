"""The suite table (``report/suite.py``): status, direction, spread and control per claim, from
``verdict.json`` files written by the contract and by older versions (legacy rows)."""

from __future__ import annotations

import json
import math

from dynascope.report.suite import markdown_table, suite_rows
from dynascope.studies.base import StudyOutcome, dump_json
from dynascope.studies.verdict import Control, Precondition, judge


def _write(path, data):
    path.mkdir(parents=True)
    (path / "verdict.json").write_text(data)


def test_rows_show_status_direction_spread_and_control(tmp_path):
    verdict = judge(
        claim="c2: flat in width",
        metric="m",
        per_seed={0: 1.2, 1: 1.3, 2: math.nan},
        threshold=1.5,
        direction="<=",
        precondition=Precondition("wide enough", met=True),
        control=Control("SP", per_seed={0: 60.0, 1: 70.0, 2: 65.0}),
    )
    outcome = StudyOutcome("new", "fast", [verdict], [], 12.0, out=tmp_path, seed=1000)
    _write(tmp_path / "new-fast", dump_json(outcome.to_json()))
    old = {  # a verdict.json from before the contract: no status, no seeds
        "study": "old",
        "preset": "fast",
        "passed": False,
        "claims": [
            {
                "claim": "a1: x",
                "metric": "m",
                "measured": None,
                "threshold": 0.1,
                "passed": False,
                "detail": "measured <= threshold; note",
            }
        ],  # fmt: skip
        "runs": [],
        "seconds": 3.0,
    }
    _write(tmp_path / "old-fast", json.dumps(old))
    rows = suite_rows(tmp_path, ["new", "old", "missing"], "fast")
    new, legacy, missing = rows
    assert new["status"] == "inconclusive"  # 2 finite seeds
    assert new["direction"] == "<=" and new["legacy"] is False
    assert new["spread"] == "± 0.0707 [1.2, 1.3], 2 of 3 seeds finite"
    assert new["control"] == "not held (65)"
    assert "seeds finite" in new["reason"]
    assert legacy["status"] == "not held" and legacy["direction"] == "<=" and legacy["legacy"]
    assert legacy["spread"] == "no seeds" and legacy["control"] == "no control"
    assert missing["claim"] == "(not run)" and missing["status"] is None
    text = markdown_table(rows, preset="fast", when="today")
    assert (
        "| new | c2 | inconclusive | 1.25 | <= 1.5 | ± 0.0707 [1.2, 1.3], 2 of 3 seeds finite"
        in text
    )
    assert "| old | a1 | not held |  | <= 0.1 | no seeds | no control | 3 | x |" in text
    assert "0 of 2 claims held, 1 not held, 1 inconclusive; 1 without seeds or control." in text
