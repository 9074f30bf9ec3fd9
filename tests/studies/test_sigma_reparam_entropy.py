"""Study sigma-reparam-entropy: verdicts on hand-built stores, presets, smoke end to end."""

from __future__ import annotations

import json
import math

import pytest

from dynascope import studies
from dynascope.store import RunStore, load_run
from dynascope.studies.sigma_reparam_entropy import (
    STUDY,
    UnitCheckConfig,
    analyze,
    build_runs,
    run_unit_checks,
)

STEPS = 100


def _fake_run(root, method, lr, entropy, loss, accuracy, status="finished", seed=0):
    """A run store as the Trainer writes it: config, entropy every 10 steps, loss every 10."""
    name = f"{method}_lr{lr:g}_s{seed}"
    with RunStore(root / "runs" / name) as store:
        store.write_config(
            {
                "name": name,
                "seed": seed,
                "model": {"name": "vit", "sigma_reparam": method == "sigma"},
                "optimizer": {"name": "adam", "lr": lr},
                "train": {"steps": STEPS},
            }
        )
        last = 0
        for i, (h, ell) in enumerate(zip(entropy, loss)):
            step = 10 * i
            store.log(
                step,
                {
                    "attn.mean.entropy_normalized": h,
                    "attn.min.entropy_normalized": h / 2,
                    "train.loss": ell,
                },
            )
            last = step
        store.log(last, {"val.accuracy": accuracy})
        if status == "diverged":
            store.event(last + 10, "diverged", "train.loss is not finite")
        store.set_status(last, status)
    return name


def _units(root):
    run_unit_checks(UnitCheckConfig(), root / "runs" / "u_unit_checks")


def _runs(root):
    return {p.name: load_run(p) for p in sorted((root / "runs").iterdir())}


STABLE = [2.3, 1.0, 0.6, 0.4, 0.3, 0.25, 0.2, 0.2, 0.2, 0.2, 0.2]
OSCILLATING = [2.3, 0.8, 0.5, 0.4, 0.6, 1.2, 1.9, 2.2, 2.1, 2.3, 2.2]  # tail/min = 5.5
HIGH = [0.99, 0.9, 0.85, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8]
COLLAPSING = [0.99, 0.6, 0.3, 0.1, 0.05, 0.04, 0.03, 0.03, 0.03, 0.03, 0.05]


def _verdicts(tmp_path):
    analysis = analyze(_runs(tmp_path), tmp_path / "figures")
    return {v.claim.split(":")[0]: v for v in analysis.verdicts}, analysis


def test_collapse_at_the_high_lr_and_sigma_reparam_holding_pass(tmp_path):
    _units(tmp_path)
    _fake_run(tmp_path, "baseline", 1e-3, HIGH, STABLE, 0.95)
    _fake_run(tmp_path, "sigma", 1e-3, HIGH, STABLE, 0.94)
    _fake_run(tmp_path, "baseline", 3e-2, COLLAPSING, OSCILLATING, 0.3)
    _fake_run(tmp_path, "sigma", 3e-2, HIGH, STABLE, 0.93)
    verdicts, analysis = _verdicts(tmp_path)
    assert list(verdicts) == ["e1", "e2", "u1", "u2"]
    assert verdicts["e1"].passed and verdicts["e1"].measured == pytest.approx(0.05)
    assert "LR* = 0.03" in verdicts["e1"].detail
    assert verdicts["e2"].passed and verdicts["e2"].measured == pytest.approx(0.8)
    assert verdicts["u1"].passed and verdicts["u2"].passed
    assert len(analysis.figures) == 3 and all(p.is_file() for p in analysis.figures)
    (rows,) = analysis.tables.values()
    assert [(r["method"], r["lr"], r["collapsed"]) for r in rows] == [
        ("baseline", 1e-3, False),
        ("sigma", 1e-3, False),
        ("baseline", 3e-2, True),
        ("sigma", 3e-2, False),
    ]


def test_lr_star_is_the_smallest_collapsing_lr_and_a_diverged_run_is_data(tmp_path):
    _fake_run(tmp_path, "baseline", 1e-2, COLLAPSING[:5], OSCILLATING[:5], 0.4, "diverged")
    _fake_run(tmp_path, "sigma", 1e-2, HIGH, STABLE, 0.91)
    _fake_run(tmp_path, "baseline", 3e-2, COLLAPSING, OSCILLATING, 0.1)
    _fake_run(tmp_path, "sigma", 3e-2, HIGH[:4], STABLE[:4], 0.5, "diverged")
    verdicts, analysis = _verdicts(tmp_path)
    assert verdicts["e1"].passed and "LR* = 0.01" in verdicts["e1"].detail
    assert verdicts["e1"].measured == pytest.approx(0.05)  # last finite entropy before it diverged
    assert verdicts["e2"].passed  # judged at LR* = 0.01, not at 0.03 where σReparam diverged
    (rows,) = analysis.tables.values()
    assert rows[0]["status"] == "diverged" and rows[0]["diverged_at"] == 50
    assert math.isinf(rows[0]["loss_tail/min"])


def test_low_entropy_with_a_stable_loss_is_not_a_collapse(tmp_path):
    _fake_run(tmp_path, "baseline", 3e-2, COLLAPSING, STABLE, 0.97)
    _fake_run(tmp_path, "sigma", 3e-2, HIGH, STABLE, 0.97)
    verdicts, _ = _verdicts(tmp_path)
    e1 = verdicts["e1"]
    assert not e1.passed and "no collapse at this scale" in e1.detail
    assert e1.measured == pytest.approx(0.05)  # the lowest final entropy, reported anyway
    assert verdicts["e2"].passed and "no LR*: the largest swept LR" in verdicts["e2"].detail


def test_sigma_reparam_failing_at_lr_star_fails_e2(tmp_path):
    _fake_run(tmp_path, "baseline", 3e-2, COLLAPSING, OSCILLATING, 0.2)
    _fake_run(tmp_path, "sigma", 3e-2, [0.99, 0.7, 0.45, 0.6], STABLE[:4], 0.95)
    verdicts, _ = _verdicts(tmp_path)
    assert verdicts["e1"].passed
    assert not verdicts["e2"].passed and verdicts["e2"].measured == pytest.approx(0.45)
    other = tmp_path / "other"
    _fake_run(other, "baseline", 3e-2, COLLAPSING, OSCILLATING, 0.2)
    _fake_run(other, "sigma", 3e-2, HIGH, STABLE, 0.85)  # entropy fine, accuracy too low
    verdicts, _ = _verdicts(other)
    assert not verdicts["e2"].passed and "val accuracy 0.850" in verdicts["e2"].detail


def test_a_majority_of_seeds_decides_a_collapse(tmp_path):
    _fake_run(tmp_path, "baseline", 3e-2, COLLAPSING, OSCILLATING, 0.2, seed=0)
    _fake_run(tmp_path, "baseline", 3e-2, HIGH, STABLE, 0.9, seed=1)
    _fake_run(tmp_path, "baseline", 3e-2, HIGH, STABLE, 0.9, seed=2)
    for seed in range(3):
        _fake_run(tmp_path, "sigma", 3e-2, HIGH, STABLE, 0.95, seed=seed)
    verdicts, _ = _verdicts(tmp_path)
    assert not verdicts["e1"].passed  # one seed of three collapsed


def test_presets_validate_and_vary_only_lr_and_method():
    assert "sigma-reparam-entropy" in studies.names()
    assert studies.get("sigma-reparam-entropy") is STUDY
    for preset in ("smoke", "fast", "paper"):
        config = STUDY.preset(preset)
        specs = build_runs(config)
        assert specs[0].name == "u_unit_checks"
        assert len(specs) == 1 + 2 * len(config.lrs) * config.seeds
    fast = {s.name: s.config for s in build_runs(STUDY.preset("fast"))}
    assert len(fast) == 9 and STUDY.preset("fast").lrs == [1e-3, 3e-3, 1e-2, 3e-2]
    base, sigma = fast["baseline_lr0.03_s0"], fast["sigma_lr0.03_s0"]
    assert base.model.use_ln and not base.model.sigma_reparam
    assert sigma.model.sigma_reparam and not sigma.model.use_ln
    assert base.optimizer.name == "adam" and base.optimizer.warmup_steps == 0
    assert base.model.pooling == "mean" and base.task.patch_size == 2  # T = 16 keys
    assert base.model_copy(update={"name": "x", "model": None}) == sigma.model_copy(
        update={"name": "x", "model": None}
    )
    paper = build_runs(STUDY.preset("paper"), seed=10)
    assert {s.config.seed for s in paper[1:]} == {10, 11, 12}


def test_smoke_preset_end_to_end(tmp_path):
    outcome = STUDY.run(preset="smoke", out=tmp_path)
    data = json.loads((tmp_path / "verdict.json").read_text(), parse_constant=pytest.fail)
    assert data["study"] == "sigma-reparam-entropy" and data["preset"] == "smoke"
    assert [c["claim"].split(":")[0] for c in data["claims"]] == ["e1", "e2", "u1", "u2"]
    for claim in data["claims"]:
        assert claim["measured"] is None or isinstance(claim["measured"], float)
        assert isinstance(claim["passed"], bool)
    assert data["claims"][2]["passed"] and data["claims"][3]["passed"]  # the unit checks
    assert [r["name"] for r in data["runs"]] == [
        "u_unit_checks",
        "baseline_lr0.001_s0",
        "sigma_lr0.001_s0",
        "baseline_lr0.03_s0",
        "sigma_lr0.03_s0",
    ]
    assert all(r["status"] in ("finished", "diverged") for r in data["runs"])
    assert sorted(p.name for p in (tmp_path / "figures").glob("*.png")) == [
        "entropy_loss_over_steps.png",
        "lr_sweep.png",
        "qk_sigma_over_steps.png",
    ]
    assert (tmp_path / "report.html").read_text().count("data:image/png;base64") == 3
    assert outcome.passed == all(c["passed"] for c in data["claims"])
    sigma_run = load_run(tmp_path / "runs" / "sigma_lr0.03_s0")
    assert sigma_run.config["model"]["sigma_reparam"] is True
    assert not sigma_run.scalar("attn.mean.entropy_normalized").empty
