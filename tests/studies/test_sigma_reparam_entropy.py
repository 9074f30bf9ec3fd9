"""Study sigma-reparam-entropy: verdicts on hand-built stores, presets, smoke end to end."""

from __future__ import annotations

import json
import math
from unittest import mock

import pytest
from helpers import Killed, stored_rows

from dynascope import studies
from dynascope.store import RunStore, load_run
from dynascope.studies.sigma_reparam_entropy import (
    STUDY,
    analyze,
    build_runs,
    build_units,
)
from dynascope.studies.sigma_reparam_entropy import analysis as sre_analysis
from dynascope.train import run_members

CLAIMS = ["e1-collapse", "e1-instability", "e2-entropy", "e2-accuracy", "u1", "u2"]

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


N_SEEDS = 5  # the contract's minimum for a verdict


def _units(root):
    units = STUDY.preset("smoke").units
    for seed in range(N_SEEDS):
        config = units.model_copy(update={"seed": seed})
        run_members(build_units, config, root / "runs" / f"u_unit_checks_s{seed}")


def _runs(root):
    return {p.name: load_run(p) for p in sorted((root / "runs").iterdir())}


STABLE = [2.3, 1.0, 0.6, 0.4, 0.3, 0.25, 0.2, 0.2, 0.2, 0.2, 0.2]
OSCILLATING = [2.3, 0.8, 0.5, 0.4, 0.6, 1.2, 1.9, 2.2, 2.1, 2.3, 2.2]  # tail/min = 5.5
HIGH = [0.99, 0.9, 0.85, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8]
COLLAPSING = [0.99, 0.6, 0.3, 0.1, 0.05, 0.04, 0.03, 0.03, 0.03, 0.03, 0.05]


def _verdicts(tmp_path, *, draw=False):
    """Verdicts and analysis; ``draw=False`` stubs the figures (matplotlib is most of
    ``analyze``'s time): the two tests that pass ``draw=True`` draw them, one checks them."""
    if draw:
        analysis = analyze(_runs(tmp_path), tmp_path / "figures")
    else:
        with mock.patch.object(sre_analysis, "sweep_figures", lambda *args: []):
            analysis = analyze(_runs(tmp_path), tmp_path / "figures")
    return {v.claim.split(":")[0]: v for v in analysis.verdicts}, analysis


def _seeds(root, method, lr, entropy, loss, accuracy, status="finished"):
    for seed in range(N_SEEDS):
        _fake_run(root, method, lr, entropy, loss, accuracy, status, seed=seed)


def test_collapse_at_the_high_lr_and_sigma_reparam_holding_pass(tmp_path):
    _units(tmp_path)
    _seeds(tmp_path, "baseline", 1e-3, HIGH, STABLE, 0.95)
    _seeds(tmp_path, "sigma", 1e-3, HIGH, STABLE, 0.94)
    _seeds(tmp_path, "baseline", 3e-2, COLLAPSING, OSCILLATING, 0.3)
    _seeds(tmp_path, "sigma", 3e-2, HIGH, STABLE, 0.93)
    verdicts, analysis = _verdicts(tmp_path, draw=True)
    assert list(verdicts) == CLAIMS
    e1 = verdicts["e1-collapse"]
    assert e1.status == "held" and e1.measured == pytest.approx(0.05)
    assert "LR* = 0.03" in e1.detail and e1.control.status == "not held"
    unstable = verdicts["e1-instability"]
    assert unstable.status == "held" and unstable.measured == pytest.approx(2.2 / 0.4)
    e2 = verdicts["e2-entropy"]
    assert e2.status == "held" and e2.measured == pytest.approx(0.8)
    assert e2.control.status == "not held"  # the baseline's entropy fell
    accuracy = verdicts["e2-accuracy"]
    assert accuracy.status == "held" and accuracy.measured == pytest.approx(0.93)
    assert accuracy.control.status == "not held"  # the collapsed baseline's accuracy: 0.3
    assert all(v.precondition.met for v in verdicts.values())
    assert "σReparam at lr=0.03 trains" in e2.precondition.text
    for unit in ("u1", "u2"):  # implementation checks: identities, no control
        assert verdicts[unit].seeds == (0, 1, 2, 3, 4) and verdicts[unit].n_seeds == 5
        assert verdicts[unit].kind == "identity" and verdicts[unit].control is None
    assert verdicts["u2"].status == "held"
    # u1 is float32 rounding at ~1e-6: seed 1 reads 1.07e-6, so its interval may touch 1e-6
    assert verdicts["u1"].status in ("held", "inconclusive") and verdicts["u1"].measured < 1e-6
    assert STUDY.protocol.check(list(verdicts.values()))
    assert len(analysis.figures) == 3 and all(p.is_file() for p in analysis.figures)
    (rows,) = analysis.tables.values()
    assert [(r["method"], r["lr"], r["collapsed"]) for r in rows][::N_SEEDS] == [
        ("baseline", 1e-3, False),
        ("sigma", 1e-3, False),
        ("baseline", 3e-2, True),
        ("sigma", 3e-2, False),
    ]


def test_lr_star_is_the_smallest_collapsing_lr_and_a_diverged_run_is_data(tmp_path):
    _seeds(tmp_path, "baseline", 1e-3, HIGH, STABLE, 0.95)
    _seeds(tmp_path, "sigma", 1e-3, HIGH, STABLE, 0.95)
    _seeds(tmp_path, "baseline", 1e-2, COLLAPSING[:5], OSCILLATING[:5], 0.4, "diverged")
    _seeds(tmp_path, "sigma", 1e-2, HIGH, STABLE, 0.91)
    _seeds(tmp_path, "baseline", 3e-2, COLLAPSING, OSCILLATING, 0.1)
    _seeds(tmp_path, "sigma", 3e-2, HIGH[:4], STABLE[:4], 0.5, "diverged")
    verdicts, analysis = _verdicts(tmp_path, draw=True)
    assert verdicts["e1-collapse"].status == "held"
    assert "LR* = 0.01" in verdicts["e1-collapse"].detail
    assert verdicts["e1-instability"].status == "held"
    assert verdicts["e1-instability"].per_seed[0] == 1e6  # diverged
    assert verdicts["e2-entropy"].status == "held"  # at LR* = 0.01, not at 0.03 (diverged)
    assert verdicts["e2-accuracy"].status == "held"
    rows = [r for r in analysis.tables[next(iter(analysis.tables))] if r["status"] == "diverged"]
    assert rows[0]["diverged_at"] == 50 and math.isinf(rows[0]["loss_tail/min"])


def test_collapse_and_instability_are_judged_apart(tmp_path):
    _seeds(tmp_path, "baseline", 1e-3, HIGH, STABLE, 0.95)
    _seeds(tmp_path, "baseline", 3e-2, COLLAPSING, STABLE, 0.97)
    _seeds(tmp_path, "sigma", 3e-2, HIGH, STABLE, 0.97)
    verdicts, _ = _verdicts(tmp_path)
    assert verdicts["e1-collapse"].status == "held"  # the entropy collapsed
    unstable = verdicts["e1-instability"]
    assert unstable.status == "not held" and unstable.measured == pytest.approx(1.0)
    assert verdicts["e2-entropy"].status == "held"
    # the collapsed baseline still reaches 0.97: the accuracy control holds too
    assert verdicts["e2-accuracy"].status == "inconclusive"


def test_no_collapse_leaves_instability_and_e2_inconclusive(tmp_path):
    _seeds(tmp_path, "baseline", 1e-3, HIGH, STABLE, 0.95)
    _seeds(tmp_path, "baseline", 3e-2, HIGH, OSCILLATING, 0.5)
    _seeds(tmp_path, "sigma", 3e-2, HIGH, STABLE, 0.97)
    verdicts, _ = _verdicts(tmp_path)
    e1 = verdicts["e1-collapse"]
    assert e1.status == "not held" and e1.measured == pytest.approx(0.8)
    assert "no swept LR collapses" in e1.detail
    assert verdicts["e1-instability"].status == "inconclusive"
    assert verdicts["e2-entropy"].status == "inconclusive"
    assert verdicts["e2-accuracy"].status == "inconclusive"


def test_a_control_that_collapses_too_makes_the_collapse_inconclusive(tmp_path):
    for lr in (1e-3, 3e-2):
        _seeds(tmp_path, "baseline", lr, COLLAPSING, OSCILLATING, 0.3)
        _seeds(tmp_path, "sigma", lr, HIGH, STABLE, 0.95)
    verdicts, _ = _verdicts(tmp_path)
    e1 = verdicts["e1-collapse"]
    assert e1.status == "inconclusive" and e1.control.status == "held"


def test_sigma_reparam_failing_at_lr_star_fails_e2(tmp_path):
    _seeds(tmp_path, "baseline", 1e-3, HIGH, STABLE, 0.95)
    _seeds(tmp_path, "baseline", 3e-2, COLLAPSING, OSCILLATING, 0.2)
    _seeds(tmp_path, "sigma", 3e-2, [0.99, 0.7, 0.45, 0.6], STABLE[:4], 0.95)
    verdicts, _ = _verdicts(tmp_path)
    assert verdicts["e1-collapse"].status == "held"
    assert verdicts["e2-entropy"].status == "not held"
    assert verdicts["e2-entropy"].measured == pytest.approx(0.45)
    other = tmp_path / "other"
    _seeds(other, "baseline", 1e-3, HIGH, STABLE, 0.95)
    _seeds(other, "baseline", 3e-2, COLLAPSING, OSCILLATING, 0.2)
    _seeds(other, "sigma", 3e-2, HIGH, STABLE, 0.85)  # entropy fine, accuracy too low
    verdicts, _ = _verdicts(other)
    # σReparam did not reach S12's 0.90: its high entropy is not read as kept (precondition)
    assert verdicts["e2-entropy"].status == "inconclusive"
    assert verdicts["e2-entropy"].precondition.measured == pytest.approx(0.85)
    accuracy = verdicts["e2-accuracy"]
    assert accuracy.status == "not held" and accuracy.measured == pytest.approx(0.85)
    short = tmp_path / "short"  # nothing fits at the control LR: the steps are too few
    _seeds(short, "baseline", 1e-3, HIGH, STABLE, 0.6)
    _seeds(short, "baseline", 3e-2, COLLAPSING, OSCILLATING, 0.2)
    _seeds(short, "sigma", 3e-2, HIGH, STABLE, 0.85)
    verdicts, _ = _verdicts(short)
    accuracy = verdicts["e2-accuracy"]
    assert accuracy.status == "inconclusive" and accuracy.precondition.measured == 0.6
    assert "seed 0: 0.6" in accuracy.detail


def test_the_interval_over_seeds_decides_a_collapse(tmp_path):
    _seeds(tmp_path, "baseline", 1e-3, HIGH, STABLE, 0.95)
    _fake_run(tmp_path, "baseline", 3e-2, COLLAPSING, OSCILLATING, 0.2, seed=0)
    for seed in range(1, N_SEEDS):
        _fake_run(tmp_path, "baseline", 3e-2, HIGH, STABLE, 0.9, seed=seed)
    _seeds(tmp_path, "sigma", 3e-2, HIGH, STABLE, 0.95)
    verdicts, _ = _verdicts(tmp_path)
    e1 = verdicts["e1-collapse"]
    assert e1.per_seed == pytest.approx((0.05, 0.8, 0.8, 0.8, 0.8))
    assert e1.status == "not held" and e1.interval[0] > 0.2  # t interval of the mean
    assert "no swept LR collapses" in e1.detail  # so no LR*: e2 inconclusive
    assert verdicts["e2-entropy"].status == "inconclusive"


def test_sigma_reparam_that_learnt_nothing_does_not_hold_e2_entropy(tmp_path):
    """Issue 27: σReparam at chance accuracy keeps its entropy high; e2-entropy must not hold."""
    _seeds(tmp_path, "baseline", 1e-3, HIGH, STABLE, 0.95)
    _seeds(tmp_path, "baseline", 3e-2, COLLAPSING, OSCILLATING, 0.1)
    _seeds(tmp_path, "sigma", 3e-2, HIGH, STABLE, 0.15)
    verdicts, _ = _verdicts(tmp_path)
    e2 = verdicts["e2-entropy"]
    assert e2.measured == pytest.approx(0.8) and e2.interval[0] >= 0.5  # on the claimed side
    assert e2.status == "inconclusive" and not e2.precondition.met
    assert e2.precondition.measured == pytest.approx(0.15)
    assert "(lowest 0.15) [NOT MET]" in e2.precondition.text  # the part that failed, named
    assert "interval lies <= 0.2·log T; σReparam" in e2.precondition.text  # LR* met
    assert e2.control.kind == "ablation" and e2.control.status == "not held"
    # the control is read on the baseline's runs at LR*, not on σReparam's
    assert e2.control.measured == pytest.approx(min(COLLAPSING))
    # the control-LR baseline short of 0.90 makes every e-claim inconclusive
    short = tmp_path / "short"
    _seeds(short, "baseline", 1e-3, HIGH, STABLE, 0.85)
    _seeds(short, "baseline", 3e-2, COLLAPSING, OSCILLATING, 0.1)
    _seeds(short, "sigma", 3e-2, HIGH, STABLE, 0.95)
    verdicts, _ = _verdicts(short)
    assert [verdicts[c].status for c in CLAIMS[:4]] == ["inconclusive"] * 4


def test_presets_validate_and_vary_only_lr_and_method():
    assert "sigma-reparam-entropy" in studies.names()
    assert studies.get("sigma-reparam-entropy") is STUDY
    for preset in ("smoke", "fast", "paper"):
        config = STUDY.preset(preset)
        specs = build_runs(config)
        assert [s.name for s in specs[:3]] == [f"u_unit_checks_s{k}" for k in range(3)]
        # the baseline at every LR, σReparam at every LR but the control LR
        assert len(specs) == config.seeds * 2 * len(config.lrs)
    assert STUDY.preset("fast").seeds == 5 and STUDY.preset("paper").seeds == 5
    fast = {s.name: s.config for s in build_runs(STUDY.preset("fast"))}
    assert len(fast) == 20 and STUDY.preset("fast").lrs == [1e-3, 3e-2]
    assert "sigma_lr0.001_s0" not in fast and "baseline_lr0.001_s0" in fast
    base, sigma = fast["baseline_lr0.03_s0"], fast["sigma_lr0.03_s0"]
    assert not base.model.use_ln and not base.model.sigma_reparam  # the LN-free baseline
    assert sigma.model.sigma_reparam and not sigma.model.use_ln
    assert base.optimizer.name == "adam" and base.optimizer.warmup_steps == 0
    assert base.model.pooling == "mean" and base.task.patch_size == 2  # T = 16 keys
    assert base.model_copy(update={"name": "x", "model": None}) == sigma.model_copy(
        update={"name": "x", "model": None}
    )
    paper = build_runs(STUDY.preset("paper"), seed=10)
    assert {s.config.seed for s in paper} == {10, 11, 12, 13, 14}
    pre_ln = STUDY.preset("fast").model_copy(update={"baseline_ln": True})
    pre_ln_runs = {s.name: s.config for s in build_runs(pre_ln)}
    assert pre_ln_runs["baseline_lr0.03_s0"].model.use_ln  # S12's pre-LN baseline
    assert not pre_ln_runs["sigma_lr0.03_s0"].model.use_ln


def test_smoke_preset_end_to_end(smoke_out):
    outcome, out = smoke_out
    data = json.loads((out / "verdict.json").read_text(), parse_constant=pytest.fail)
    assert data["study"] == "sigma-reparam-entropy" and data["preset"] == "smoke"
    assert [c["claim"].split(":")[0] for c in data["claims"]] == CLAIMS
    for claim in data["claims"]:
        assert claim["measured"] is None or isinstance(claim["measured"], float)
        assert isinstance(claim["passed"], bool)
    for unit in data["claims"][4:]:  # identities over 3 smoke seeds: too few for a verdict
        assert unit["kind"] == "identity" and unit["control"] is None
        assert unit["status"] == "inconclusive" and unit["seeds"] == [0, 1, 2]
    assert data["protocol"]["sha256"] == STUDY.protocol.sha256
    assert [r["name"] for r in data["runs"]] == [f"u_unit_checks_s{k}" for k in range(3)] + [
        f"{method}_lr{lr}_s{k}"
        for lr in ("0.001", "0.03")
        for k in range(3)
        for method in ("baseline", "sigma")
        if (method, lr) != ("sigma", "0.001")
    ]
    assert all(r["status"] in ("finished", "diverged") for r in data["runs"])
    assert sorted(p.name for p in (out / "figures").glob("*.png")) == [
        "entropy_loss_over_steps.png",
        "lr_sweep.png",
        "qk_sigma_over_steps.png",
    ]
    assert (out / "report.html").read_text().count("data:image/png;base64") == 3
    assert outcome.passed == all(c["passed"] for c in data["claims"])
    sigma_run = load_run(out / "runs" / "sigma_lr0.03_s0")
    assert sigma_run.config["model"]["sigma_reparam"] is True
    assert not sigma_run.scalar("attn.mean.entropy_normalized").empty


def test_smoke_unit_run_killed_mid_way_resumes_to_identical_metrics(
    smoke_run, tmp_path, monkeypatch
):
    """Kept beside test_resume_every_study: it kills the unit-check run (its own step), where
    the shared test's kill, at half the store writes, lands in a ViT run (baseline_lr0.001_s2).
    One seed; its runs' configs are the shared smoke run's, which is the reference."""
    from dynascope.studies.sigma_reparam_entropy import runs as runs_module

    preset = STUDY.preset("smoke").model_copy(update={"seeds": 1})
    study = STUDY.__class__(**{**STUDY.__dict__, "presets": {"smoke": lambda: preset}})
    whole = smoke_run(STUDY.name)
    real, calls = runs_module._DriftStep.__call__, {"n": 0}

    def dying(self, model, batch, ctx):
        calls["n"] += 1
        if calls["n"] == 30:  # after the checkpoint at step 25
            raise Killed
        return real(self, model, batch, ctx)

    monkeypatch.setattr(runs_module._DriftStep, "__call__", dying)
    with pytest.raises(Killed):
        study.run(preset="smoke", out=tmp_path / "killed")
    assert load_run(tmp_path / "killed" / "runs" / "u_unit_checks_s0").status == "running"
    monkeypatch.setattr(runs_module._DriftStep, "__call__", real)
    actions = {}
    study.run(
        preset="smoke",
        out=tmp_path / "killed",
        on_run=lambda name, status, seconds, action: actions.__setitem__(name, action),
    )
    assert actions["u_unit_checks_s0"] == "resumed" and "restarted" not in actions.values()
    assert len(actions) == 4
    for name in actions:
        killed = tmp_path / "killed" / "runs" / name
        assert stored_rows(killed) == stored_rows(whole / "runs" / name), name
