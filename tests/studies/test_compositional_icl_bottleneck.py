"""Study compositional-icl-bottleneck: presets, smoke end to end, verdicts from the stores."""

from __future__ import annotations

import json
import math

import pytest

from dynascope import studies
from dynascope.studies.compositional_icl_bottleneck import STUDY, CompositionalRunConfig, build_runs


def test_presets():
    assert studies.get("compositional-icl-bottleneck") is STUDY
    assert [s.name for s in build_runs(STUDY.preset("fast"))] == [
        "vanilla_connectedplus_s0",
        "hyper_connectedplus_s0",
    ]
    paper = build_runs(STUDY.preset("paper"))
    assert len(paper) == 3 * 2 * 3 + 2 * 3
    cfgs = {s.name: s.config for s in paper}
    assert cfgs["vanilla_connected_s0"].d_model == 128 and cfgs["hyper_connected_s0"].d_model == 64
    assert cfgs["vanilla_connected_s0"].weight_decay == 0.1
    assert cfgs["hyper_connected_s0"].weight_decay == 0.0


def test_smoke_end_to_end(tmp_path):
    STUDY.run(preset="smoke", out=tmp_path)
    data = json.loads((tmp_path / "verdict.json").read_text())
    assert [c["claim"][:2] for c in data["claims"]] == ["1:", "1b"]
    rows = {r["model"]: r for r in data["tables"]["per run"]}
    gap = rows["hyper"]["ood.r2"] - rows["vanilla"]["ood.r2"]
    assert math.isclose(data["claims"][0]["measured"], gap, rel_tol=1e-9)
    assert data["claims"][0]["passed"] == (
        gap >= 0.2 and abs(rows["hyper"]["id.r2"] - rows["vanilla"]["id.r2"]) <= 0.1
    )
    low = min(rows["hyper"]["probe.ood.r2_best_layer"], rows["vanilla"]["probe.ood.r2_best_layer"])
    assert math.isclose(data["claims"][1]["measured"], low, rel_tol=1e-9)
    assert data["tables"]["not run"][0]["claim"].startswith("2:")
    assert all(r["status"] == "finished" for r in data["runs"])
    assert len(list((tmp_path / "figures").glob("*.png"))) == 1


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match=r"n_heads must divide d_model \(got d_model=30"):
        CompositionalRunConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="support"):
        CompositionalRunConfig(support="ring")
