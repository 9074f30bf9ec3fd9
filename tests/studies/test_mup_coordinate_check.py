"""Study mup-coordinate-check: presets, the smoke preset end to end, verdicts from the stores."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dynascope import studies
from dynascope.store import load_run
from dynascope.studies.mup_coordinate_check import STUDY, build_runs, load_records


def test_presets_validate_and_build_the_expected_runs():
    assert studies.get("mup-coordinate-check") is STUDY
    names = [s.name for s in build_runs(STUDY.preset("fast"))]
    assert names == [
        "coord_standard_adam",
        "coord_mup_adam",
        "coord_ntk_signsgd_c3",
        "coord_mup_signsgd_c3",
    ]
    fast = STUDY.preset("fast")
    assert fast.sp.model_copy(update={"parametrization": "mup"}) == fast.mup  # one difference
    paper = {s.name for s in build_runs(STUDY.preset("paper"))}
    assert {"coord_standard_sgd", "coord_mup_adam_eps-width", "lr_transfer_mup_adam"} <= paper


@pytest.fixture(scope="module")
def smoke_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("mup")
    return STUDY.run(preset="smoke", out=out), out


def test_smoke_preset_end_to_end(smoke_out):
    outcome, out = smoke_out
    data = json.loads((out / "verdict.json").read_text())
    assert [c["claim"].split(":")[0] for c in data["claims"]] == ["c1", "c2"]
    assert all(r["status"] == "finished" for r in data["runs"])
    assert len(list((out / "figures").glob("*.png"))) == 3
    assert outcome.passed == all(c["passed"] for c in data["claims"])


def test_c1_is_recomputed_from_the_stored_tensors(smoke_out):
    outcome, out = smoke_out
    run = load_run(out / "runs" / "coord_standard_adam")
    steps, l1 = run.tensors("l1.logits")  # [T, nseeds, n_widths]
    per_seed = l1[-1][:, -1] / l1[-1][:, 0]  # one growth ratio per seed
    c1 = outcome.claims[0]
    assert c1.seeds == (0, 1, 2)
    np.testing.assert_allclose(c1.per_seed, per_seed, rtol=1e-12)
    assert c1.measured == pytest.approx(float(per_seed.mean()))
    records = load_records(run)
    assert {r.t for r in records} == set(int(t) for t in steps)
    assert np.isclose(
        np.mean([r.l1 for r in records if r.module == "logits" and r.t == steps[-1]]),
        l1[-1].mean(),
    )


def test_c2_is_the_worst_per_seed_spread_recomputed_from_the_stores(smoke_out):
    outcome, out = smoke_out
    run = load_run(out / "runs" / "coord_mup_adam")
    worst = np.zeros(3)
    for module in ("W1", "relu1", "W2", "relu2", "logits"):
        steps, l1 = run.tensors(f"l1.{module}")
        for t, table in zip(steps, l1):
            if t in (2, 3):
                worst = np.maximum(worst, table.max(1) / table.min(1))
    np.testing.assert_allclose(outcome.claims[1].per_seed, worst, rtol=1e-12)


def test_each_control_fails_its_claim_at_smoke_scale(smoke_out):
    """SP is c2's control and muP is c1's: each must fail the other's claim."""
    outcome, out = smoke_out
    data = json.loads((out / "verdict.json").read_text(), parse_constant=pytest.fail)
    for claim in data["claims"]:
        assert claim["legacy"] is False and claim["seeds"] == [0, 1, 2]
        assert claim["control"]["status"] == "not held", claim["control"]
        assert claim["precondition"]["met"] is True and claim["precondition"]["measured"] == 8.0
    c1, c2 = outcome.claims
    assert c1.direction == ">=" and c2.direction == "<="
    assert c1.control.measured < 4.0 < c2.control.measured
    assert data["seed"] == 0
    report = (out / "report.html").read_text()
    assert "muP + Adam, the same logits ratio" in report and "not held (" in report
    assert "the widths span w_max / w_min &gt;= 8" in report


def test_a_narrow_width_sweep_fails_the_precondition(tmp_path):
    """Widths {64, 128} cannot show a 4x growth: both claims are inconclusive, never held."""
    preset = STUDY.preset("smoke")
    narrow = {"widths": [64, 128]}
    specs = build_runs(
        preset.model_copy(
            update={
                "sp": preset.sp.model_copy(update=narrow),
                "mup": preset.mup.model_copy(update=narrow),
                "c3": [],
            }
        )
    )
    runs = {}
    for spec in specs:
        spec.runner(spec.config, tmp_path / spec.name)
        runs[spec.name] = load_run(tmp_path / spec.name)
    analysis = STUDY.analyze(runs, tmp_path)
    for verdict in analysis.verdicts:
        assert verdict.status == "inconclusive" and "precondition not met" in verdict.reason
