"""Study hyper-ut-pvr: presets, the smoke preset end to end, verdicts from the stores."""

from __future__ import annotations

import json

import pytest
from scipy.stats import spearmanr

from dynascope import studies
from dynascope.store import load_run
from dynascope.studies.hyper_ut_pvr import STUDY, build_runs


def test_presets_build_one_run_per_model_and_seed():
    assert studies.get("hyper-ut-pvr") is STUDY
    assert [s.name for s in build_runs(STUDY.preset("fast"))] == [
        "fixed_s0",
        "ut_act_s0",
        "hyper_ut_s0",
    ]
    specs = build_runs(STUDY.preset("paper"))
    hop = [s for s in specs if not s.name.startswith(("vec_", "digits_", "vpvr_"))]
    assert len(hop) == 9 and hop[-1].name == "hyper_ut_s2"  # paper extras: test_hyper_ut_paper
    fast = {s.name: s.config for s in build_runs(STUDY.preset("fast"))}
    assert fast["ut_act_s0"].model_copy(update={"model": "hyper_ut"}) == fast["hyper_ut_s0"]


@pytest.fixture(scope="module")
def smoke_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("hut")
    return STUDY.run(preset="smoke", out=out), out


def test_smoke_preset_end_to_end(smoke_out):
    outcome, out = smoke_out
    data = json.loads((out / "verdict.json").read_text())
    assert [c["claim"].split(":")[0] for c in data["claims"]] == ["u1", "u2", "u3"]
    assert all(r["status"] == "finished" for r in data["runs"])
    assert (out / "figures" / "pvr_hops.png").is_file()
    for claim in data["claims"]:
        assert claim["measured"] is None or isinstance(claim["measured"], float)


def test_verdicts_are_recomputed_from_the_stored_evaluations(smoke_out):
    outcome, out = smoke_out
    ut = load_run(out / "runs" / "ut_act_s0")
    hyper = load_run(out / "runs" / "hyper_ut_s0")
    hops = [1, 2, 3]
    gap = hyper.last("eval.h3.accuracy") - ut.last("eval.h3.accuracy")
    assert outcome.claims[2].measured == pytest.approx(gap)
    worst = min(r.last(f"eval.h{h}.accuracy") for r in (ut, hyper) for h in (1, 2))
    assert outcome.claims[1].measured == pytest.approx(worst)
    ponder = [ut.last(f"eval.h{h}.ponder") for h in hops]
    if len(set(ponder)) > 1:
        assert outcome.claims[0].measured == pytest.approx(spearmanr(hops, ponder).statistic)
    for h in hops:
        assert 1.0 <= ut.last(f"eval.h{h}.ponder") <= 3.0 + 1e-6  # T = 3 in smoke
