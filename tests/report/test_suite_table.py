"""The suite table (``report/suite.py``): status, direction, interval, spread and control per
claim, from ``verdict.json`` files of judged verdicts and of legacy ones (no seeds, no control).

Oracle for the intervals: t_{0.975,1} = 12.706 and t_{0.975,2} = 4.303 from the t table."""

from __future__ import annotations

import json
import math

from dynascope.report.suite import markdown_table, suite_rows
from dynascope.studies.base import StudyOutcome, dump_json
from dynascope.studies.protocol import Amendment, ClaimSpec, Protocol
from dynascope.studies.verdict import Control, Precondition, Verdict, judge


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
    # a legacy verdict (built without a status: no seeds, no control), as the test stubs write it
    old = Verdict("a1: x", "m", math.nan, 0.1, False, "measured <= threshold; note")
    legacy_outcome = StudyOutcome("old", "fast", [old], [], 3.0, out=tmp_path, seed=0)
    _write(tmp_path / "old-fast", dump_json(legacy_outcome.to_json()))
    rows = suite_rows(tmp_path, ["new", "old", "missing"], "fast")
    new, legacy, missing = rows
    assert new["status"] == "inconclusive"  # 2 finite seeds
    assert new["direction"] == "<=" and new["legacy"] is False
    assert new["spread"] == "± 0.0707 [1.2, 1.3], 2 of 3 seeds finite"
    # [1.2, 1.3]: mean 1.25 ± 12.706 · 0.0707 / √2 = ± 0.635; control 65 ± 4.303 · 5 / √3
    assert new["interval"] == "[0.615, 1.89], n = 2"
    assert new["control"] == "inconclusive (65 [52.6, 77.4])"  # three seeds: not judged
    assert new["kind"] == "finding" and not new["amended"] and new["claim"] == "c2"
    assert "seeds finite" in new["reason"]
    assert legacy["status"] == "not held" and legacy["direction"] == "<=" and legacy["legacy"]
    assert legacy["spread"] == "no seeds" and legacy["control"] == "no control"
    assert legacy["interval"] == "no interval"
    assert missing["claim"] == "(not run)" and missing["status"] is None
    text = markdown_table(rows, preset="fast", when="today")
    assert (
        "| new | c2 | inconclusive | 1.25 | <= 1.5 | [0.615, 1.89], n = 2 | inconclusive (65 "
        "[52.6, 77.4]) | 12 |" in text
    )
    assert "| old | a1 | not held |  | <= 0.1 | no interval | no control | 3 | x |" in text
    assert "0 of 2 claims held, 1 not held, 1 inconclusive; 0 of them identity checks" in text


def test_amended_claims_and_identity_checks_are_marked(tmp_path):
    spec = ClaimSpec(id="g1", claim="rnn = attention", statement="s", citation="c",
                     metric="max |Δ|", threshold=1e-10, direction="<=",
                     threshold_source="float64 rounding", kind="identity")  # fmt: skip
    protocol = Protocol(study="p", claims=(spec,), seeds={"fast": 5}, calibration_seeds=(),
                        presets={}, reproduces="fast", registered="2026-12-07: test",
                        amendments=(Amendment("2026-12-07", ("g1",), "x", "y", "z"),))  # fmt: skip
    verdict = spec.judge({i: 1e-15 for i in range(5)}, precondition=Precondition("-", True),
                         control=None)  # fmt: skip
    (verdict,) = protocol.check([verdict])
    outcome = StudyOutcome("p", "fast", [verdict], [], 1.0, out=tmp_path, protocol=protocol)
    _write(tmp_path / "p-fast", dump_json(outcome.to_json()))
    (row,) = suite_rows(tmp_path, ["p"], "fast")
    assert row["claim"] == "g1 † (identity)" and row["control"] == "identity"
    assert row["status"] == "held" and row["interval"] == "[1e-15, 1e-15], n = 5"
    data = json.loads((tmp_path / "p-fast" / "verdict.json").read_text())
    assert data["protocol"] == {"sha256": protocol.sha256,
                                "amendments": [protocol.amendments[0].to_json()]}  # fmt: skip


def test_docs_table_states_which_preset_reproduces_each_study_and_its_measured_cost(
    tmp_path, monkeypatch
):

    from dynascope import presets
    from dynascope.catalog import read_catalog
    from dynascope.report.suite import reproduction_lines

    costs = {
        "mup-coordinate-check": {"fast": {"wall_s": 100.0, "cpu_s": 150.0, "measured": "test"}}
    }
    (tmp_path / "costs.json").write_text(json.dumps(costs))
    monkeypatch.setattr(presets, "COSTS_FILE", tmp_path / "costs.json")
    lines = reproduction_lines("fast")
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lines[4:]}
    assert list(rows) == [entry.name for entry in read_catalog()]  # every registered study
    # mup-coordinate-check's protocol names fast: its fast cost, no second cost
    assert rows["mup-coordinate-check"].endswith("| 100 s wall, 150 CPU s (test) |  |")
    # a study reproduced at paper: fast's cost and paper's (not measured)
    assert rows["hyla-fuzzy-logic"] == "| hyla-fuzzy-logic | paper | not measured | not measured |"
