"""Study permuted-initialisations: presets, config errors, verdict arithmetic, smoke end to end."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from dynascope import studies
from dynascope.studies._permuted_initialisations_analysis import (
    P1_MIN_ACCURACY,
    P2_MAX_ACCURACY,
    _verdicts,
)
from dynascope.studies.permuted_initialisations import (
    STUDY,
    PermutedInitRunConfig,
    build_runs,
)


def test_presets_validate_and_fast_matches_s7():
    assert studies.get("permuted-initialisations") is STUDY
    specs = {s.name: s.config for s in build_runs(STUDY.preset("fast"))}
    pairs = [c for c in specs.values() if c.group == "pairs"]
    assert sorted({tuple(c.hidden) for c in pairs}) == [(512, 512), (1024,)]
    assert len(pairs) == 6 and len({(tuple(c.hidden), c.seed) for c in pairs}) == 6
    assert all(c.match_steps == [10, 50, 100] and c.n_updates == 130 for c in pairs)
    widths = sorted(c.hidden[0] for c in specs.values() if c.group == "width")
    assert widths == [32, 128, 512, 2048]
    assert specs["nway_mlp_1024"].n_nets == 10
    assert specs["cnn_32-32-avg-64-64_adamw0.001_p0"].arch == "32-32-avg-64-64"
    paper = build_runs(STUDY.preset("paper"))
    assert {c.config.optimizer for c in paper if c.config.group == "cnn"} == {"adamw", "sgd"}
    assert max(c.config.hidden[0] for c in paper if c.config.group == "width") == 8192


def test_config_errors_name_the_field():
    with pytest.raises(ValidationError, match=r"match_steps must lie in \[0, n_updates=10\]"):
        PermutedInitRunConfig(n_updates=10, match_steps=[20])
    with pytest.raises(ValidationError, match="token 'pool'"):
        PermutedInitRunConfig(model="cnn", arch="8-pool")
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        PermutedInitRunConfig(widht=3)
    with pytest.raises(ValidationError, match="Input should be 'adamw' or 'sgd'"):
        PermutedInitRunConfig(optimizer="adam")


def _row(init_perm, init_vanilla, mid_perm, mid_vanilla, bar_perm, bar_vanilla):
    return {
        "init_avg.activation.accuracy": init_perm,
        "init_avg.vanilla.accuracy": init_vanilla,
        "init_avg.weight.accuracy": 0.1,
        "midpoint.activation.accuracy": mid_perm,
        "midpoint.vanilla.accuracy": mid_vanilla,
        "barrier.activation.loss": bar_perm,
        "barrier.vanilla.loss": bar_vanilla,
        "net0.init.accuracy": 0.1,
        "net0.test.accuracy": 0.9,
    }


def test_verdicts_are_means_over_pairs_and_can_fail():
    rows = [_row(0.5, 0.1, 0.9, 0.8, 0.1, 0.5), _row(0.2, 0.3, 0.8, 0.8, 0.2, 0.4)]
    p1, p2, p3 = _verdicts("MLP", rows)
    assert p1.measured == pytest.approx(0.35) and p1.passed and p1.threshold == P1_MIN_ACCURACY
    assert p2.measured == pytest.approx(0.2) and p2.passed and p2.threshold == P2_MAX_ACCURACY
    assert p3.measured == pytest.approx(0.3) and p3.passed
    bad = [_row(0.25, 0.25, 0.7, 0.8, 0.1, 0.5)]
    p1, p2, p3 = _verdicts("MLP", bad)
    assert not p1.passed and not p2.passed
    assert not p3.passed and p3.measured == pytest.approx(0.4)  # barrier fell, midpoint did not


def test_smoke_preset_end_to_end(tmp_path):
    outcome = STUDY.run(preset="smoke", out=tmp_path)
    data = json.loads((tmp_path / "verdict.json").read_text(), parse_constant=pytest.fail)
    assert [c["claim"].split(" ")[0] for c in data["claims"]] == ["p1", "p2", "p3"]
    assert all(r["status"] == "finished" for r in data["runs"])
    assert len(data["runs"]) == 4
    for claim in data["claims"]:
        assert isinstance(claim["measured"], float) and isinstance(claim["passed"], bool)
    # S7's smoke oracles, measured on every run's net 0: a random permutation changes no
    # output (float32 rounding), matching recovers it by weights exactly and by activations on
    # every live unit, the barrier of a net with itself is 0
    for row in next(v for k, v in data["tables"].items() if k.startswith("self-checks")):
        assert row["max |f(x) − f_perm(x)|"] < 1e-5
        assert row["self-match recovered (weight)"] == 1.0
        assert row["self-match recovered (activation)"] >= 1.0 - row["dead units"]
        assert abs(row["self barrier (nats)"]) < 1e-6
    assert len(list((tmp_path / "figures").glob("*.png"))) == 3
    assert outcome.passed == all(c["passed"] for c in data["claims"])
