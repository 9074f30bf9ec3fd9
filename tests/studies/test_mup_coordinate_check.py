"""Study mup-coordinate-check: presets, the smoke preset end to end, verdicts from the stores."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dynascope import studies
from dynascope.store import load_run
from dynascope.studies.mup_coordinate_check import STUDY, build_runs, load_records
from dynascope.studies.mup_coordinate_check.analysis import fit_per_seed
from dynascope.studies.mup_coordinate_check.protocol import PROTOCOL
from dynascope.train import run_members


def test_presets_validate_and_build_the_expected_runs():
    assert studies.get("mup-coordinate-check") is STUDY
    specs = build_runs(STUDY.preset("fast"))
    sweeps = [
        "coord_standard_adam",
        "coord_mup_adam",
        "coord_ntk_signsgd_c3",
        "coord_mup_signsgd_c3",
    ]
    widths = [64, 128, 256, 512, 1024, 2048]
    assert [s.name for s in specs] == [
        f"{sweep}_w{w}_s{i}" for sweep in sweeps for w in widths for i in range(5)
    ]
    assert [s.group for s in specs[:5]] == ["coord_standard_adam_w64"] * 5  # seeds: one ensemble
    assert [s.config.seed for s in specs[:5]] == [0, 1, 2, 3, 4]
    assert [s.config.seed for s in build_runs(STUDY.preset("fast"), 1000)[:3]] == [1000, 1001, 1002]
    assert specs[0].config.loop.steps == 2 and specs[-1].config.loop.steps == 10
    fast = STUDY.preset("fast")
    assert fast.sp.model_copy(update={"parametrization": "mup"}) == fast.mup  # one difference
    paper = {s.name.rsplit("_w", 1)[0] for s in build_runs(STUDY.preset("paper"))}
    assert {"coord_standard_sgd", "coord_mup_adam_eps-width", "lr_transfer_mup_adam"} <= paper


def test_smoke_preset_end_to_end(smoke_out):
    outcome, out = smoke_out
    data = json.loads((out / "verdict.json").read_text())
    assert [c["claim"].split(":")[0] for c in data["claims"]] == ["c1", "c2"]
    assert all(r["status"] == "finished" for r in data["runs"])
    assert len(data["runs"]) == 4 * 2 * 3  # sweeps x widths x seeds
    assert len(list((out / "figures").glob("*.png"))) == 3
    assert outcome.passed == all(c["passed"] for c in data["claims"])


def _sweep(out, name):
    return [load_run(out / "runs" / f"{name}_w{w}_s{i}") for w in (32, 256) for i in range(3)]


def test_c1_is_recomputed_from_the_stored_scalars(smoke_out):
    outcome, out = smoke_out
    runs = {
        (int(r.config["width"]), r.config["seed"]): r for r in _sweep(out, "coord_standard_adam")
    }
    per_seed = [runs[256, s].last("l1.logits") / runs[32, s].last("l1.logits") for s in range(3)]
    c1 = outcome.claims[0]
    assert c1.seeds == (0, 1, 2)
    np.testing.assert_allclose(c1.per_seed, per_seed, rtol=1e-12)
    assert c1.measured == pytest.approx(float(np.mean(per_seed)))
    records = load_records(list(runs.values()))
    assert {r.t for r in records} == {1, 2, 3}  # engine steps 0, 1, 2
    assert all(r.rel_change == 0.0 for r in records if r.t == 1 and r.module != "logits")


def test_c2_is_the_worst_per_seed_spread_recomputed_from_the_stores(smoke_out):
    outcome, out = smoke_out
    runs = _sweep(out, "coord_mup_adam")
    worst = np.zeros(3)
    for module in ("W1", "relu1", "W2", "relu2", "logits"):
        for step in (1, 2):  # t = 2, 3
            table = np.zeros((3, 2))  # [seed, width]
            for run in runs:
                j = 0 if run.config["width"] == 32 else 1
                table[run.config["seed"], j] = run.scalar(f"l1.{module}")[step]
            worst = np.maximum(worst, table.max(1) / table.min(1))
    np.testing.assert_allclose(outcome.claims[1].per_seed, worst, rtol=1e-12)


def test_each_control_is_the_other_arm_and_fails_its_claim_at_smoke_scale(smoke_out):
    """SP is c2's control and muP is c1's: each control's per-seed values are the claim's
    metric read on the other arm's runs, and each falls on the other side of its threshold
    (at smoke's 3 seeds every status is inconclusive: fewer than 5 seeds)."""
    outcome, out = smoke_out
    data = json.loads((out / "verdict.json").read_text(), parse_constant=pytest.fail)
    assert data["protocol"]["sha256"] == PROTOCOL.sha256
    for claim in data["claims"]:
        assert claim["legacy"] is False and claim["seeds"] == [0, 1, 2]
        assert claim["status"] == "inconclusive" and claim["n_seeds"] == 3
        assert claim["control"]["kind"] == "ablation" and claim["control"]["seeds"] == [0, 1, 2]
        assert claim["precondition"]["met"] is True and claim["precondition"]["measured"] == 8.0
    c1, c2 = outcome.claims
    assert c1.direction == ">=" and c2.direction == "<="
    assert c1.threshold == PROTOCOL.claim("c1").threshold == 4.0
    assert max(c1.control.per_seed.values()) < 4.0 < min(c1.per_seed)
    assert min(c2.control.per_seed.values()) > 1.5 > max(c2.per_seed)
    mup = {(int(r.config["width"]), r.config["seed"]): r for r in _sweep(out, "coord_mup_adam")}
    expected = [mup[256, s].last("l1.logits") / mup[32, s].last("l1.logits") for s in range(3)]
    np.testing.assert_allclose(list(c1.control.per_seed.values()), expected, rtol=1e-12)
    assert data["seed"] == 0
    report = (out / "report.html").read_text()
    assert "muP + Adam (the other parametrization" in report
    assert "the widths span w_max / w_min &gt;= 8" in report


def test_the_fit_precondition_reads_every_arm_and_seed(smoke_out):
    """The fit bar: finite losses in every run, and the update lowers the base-width loss."""
    _, out = smoke_out
    sp = _sweep(out, "coord_standard_adam")
    assert fit_per_seed(sp) == {0: True, 1: True, 2: True}
    assert fit_per_seed(_sweep(out, "coord_mup_adam")) == {0: True, 1: True, 2: True}

    class Diverged:  # one SP run whose loss went non-finite
        def __init__(self, run):
            self.run, self.config, self.status = run, run.config, run.status

        def scalar(self, key):
            return self.run.scalar(key) * float("nan")

    broken = [Diverged(r) if r.config["seed"] == 1 and r.config["width"] == 256 else r for r in sp]
    assert fit_per_seed(broken) == {0: True, 1: False, 2: True}


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
    for group in dict.fromkeys(spec.group for spec in specs):
        members = [spec for spec in specs if spec.group == group]
        run_members(
            members[0].build, [m.config for m in members], [tmp_path / m.name for m in members]
        )
        runs.update({m.name: load_run(tmp_path / m.name) for m in members})
    analysis = STUDY.analyze(runs, tmp_path)
    for verdict in analysis.verdicts:
        assert verdict.status == "inconclusive" and "precondition not met" in verdict.reason
