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
    expected = l1[-1].mean(0)[-1] / l1[-1].mean(0)[0]
    assert outcome.claims[0].measured == pytest.approx(float(expected))
    records = load_records(run)
    assert {r.t for r in records} == set(int(t) for t in steps)
    assert np.isclose(
        np.mean([r.l1 for r in records if r.module == "logits" and r.t == steps[-1]]),
        l1[-1].mean(),
    )
