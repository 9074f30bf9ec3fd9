"""Study slingshot: analysis on hand-built stores with planted cycles, presets, smoke end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dynascope import studies
from dynascope.config import validate_config
from dynascope.store import RunStore, load_run
from dynascope.studies.slingshot import (
    FAST_STEPS,
    GROK_STEPS,
    STUDY,
    DetectorConfig,
    analyze,
    build_runs,
    run_cycles,
)
from dynascope.studies.slingshot.runs import NORM_KEY
from dynascope.train import run_training

N_TRAIN = 50  # the smoke preset's training set: armed once loss < ln 2 / 50 ≈ 0.0139


def _planted(steps: int, onsets: list[int], *, growth=3e-3, rise=300, spike=5):
    """Loss and last-layer norm with a slingshot cycle planted at each onset.

    The loss falls from 2.3 to 1e-6 by step 200 and stays there; at each onset the norm grows
    at ``growth`` per step for ``rise`` steps, then the loss jumps to 1.0 for ``spike`` steps and
    the norm stays flat (the plateau).
    """
    t = np.arange(steps + 1)
    loss = np.maximum(2.3 * np.exp(-t / 14.0), 1e-6)
    log_norm = np.zeros(steps + 1)
    for onset in onsets:
        ramp = np.clip(t - onset, 0, rise) * growth
        log_norm += ramp
        loss[onset + rise : onset + rise + spike] = 1.0
    return t, loss, 2.0 * np.exp(log_norm)


def _write_run(root, spec, loss, norm, val=None, status="finished"):
    with RunStore(root / spec.name) as store:
        store.write_config(spec.config.model_dump(mode="json"))
        for step in range(len(loss)):
            key = "last_layer.norm" if spec.name.startswith("grok") else NORM_KEY
            row = {key: float(norm[step])}
            if step > 0:
                row["train.loss"] = float(loss[step])
            if val is not None and step % 100 == 0:
                row["val.accuracy"] = float(val[step])
            store.log(step, row)
        store.set_status(len(loss) - 1, status)
    return load_run(root / spec.name)


def _store(tmp_path, plant: dict[str, list[int]], val=None, steps=4000, seeds=5, floor=None):
    """Hand-built stores of the smoke preset's runs with ``seeds`` seeds per condition; a run
    named in ``floor`` keeps its loss above that value (it never fits its training set)."""
    specs = build_runs(STUDY.preset("smoke").model_copy(update={"seeds": seeds}))
    runs = {}
    for spec in specs:
        _, loss, norm = _planted(steps, plant.get(spec.name, []))
        if floor and spec.name in floor:
            loss = np.maximum(loss, floor[spec.name])
        run_val = val.get(spec.name) if isinstance(val, dict) else val
        runs[spec.name] = _write_run(tmp_path / "runs", spec, loss, norm, run_val)
    return runs


THREE = {f"adam_eps1e-08_s{k}": [500, 1500, 2500] for k in range(5)}
PLANTED = {**THREE, "adam_eps0.0001_s0": [1000]}


@pytest.fixture(scope="module")
def planted_fcn(tmp_path_factory):
    """``_store(PLANTED)``, built once for the module (read only: analyses write elsewhere)."""
    return _store(tmp_path_factory.mktemp("planted_fcn"), PLANTED)


def _stub_figures(monkeypatch) -> None:
    """``analyze`` without drawing (matplotlib is most of its time)."""
    import dynascope.studies.slingshot.analysis as slingshot_analysis

    monkeypatch.setattr(
        slingshot_analysis, "run_figures", lambda measured, figures: [figures / "norm_loss.png"]
    )
    monkeypatch.setattr(
        slingshot_analysis, "grokking_figure", lambda grokking, figures: figures / "grokking.png"
    )


@pytest.fixture
def no_figures(monkeypatch):
    """For tests that check only verdicts and tables; test_planted_cycles_are_counted_and_the_
    verdicts_follow and test_grokking_run_near_an_onset_passes_g1_and_leaves_s1_to_s3_alone
    draw the figures and check them."""
    _stub_figures(monkeypatch)


def test_planted_cycles_are_counted_and_the_verdicts_follow(tmp_path, planted_fcn):
    runs = planted_fcn
    cycles, series = run_cycles(runs["adam_eps1e-08_s0"])
    assert len(cycles) == 3
    assert [c.spike_step for c in cycles] == [800, 1800, 2800]
    for i, (c, onset) in enumerate(zip(cycles, (500, 1500, 2500), strict=True)):
        assert onset <= c.start_step < c.spike_step < c.end_step < onset + 1000
        # the ramp is complete at the spike and the norm flat after: 2 e^{0.9 (i + 1)}
        assert c.norm_spike == pytest.approx(2.0 * math.exp(0.9 * (i + 1)), rel=1e-6)
        assert c.norm_end == pytest.approx(c.norm_spike, rel=1e-6)
        assert c.norm_ratio > 1.5 and c.spike_magnitude == pytest.approx(1e6, rel=1e-6)
    assert series["steps"][0] == 1  # step 0 has a norm but no training loss
    analysis = analyze(runs, tmp_path)
    by_id = {v.claim.split(":")[0]: v for v in analysis.verdicts}
    assert list(by_id) == ["s1", "s2", "s3"]  # no grokking, no g1
    s1 = by_id["s1"]  # a rate: every seed has >= 2 cycles
    assert (s1.statistic, s1.measured, s1.status, s1.n_seeds) == ("rate", 1.0, "held", 5)
    assert s1.per_seed == (3.0,) * 5 and s1.interval[0] > 0.5
    assert s1.control.kind == "ablation" and list(s1.control.per_seed.values()) == [
        1.0,
        0.0,
        0.0,
        0.0,
        0.0,
    ]
    assert s1.control.measured == 0.0 and s1.control.status == "not held"  # ε = 1e-4
    assert (by_id["s2"].measured, by_id["s2"].status) == (0.0, "held")
    assert by_id["s3"].measured == pytest.approx(2.8) and by_id["s3"].status == "held"
    assert by_id["s3"].per_seed == (2.0, 3.0, 3.0, 3.0, 3.0) and by_id["s3"].seeds == (
        0,
        1,
        2,
        3,
        4,
    )
    assert by_id["s3"].control.status == "not held"  # cycles(SGD) - cycles(ε = 1e-4)
    assert all(v.precondition.met for v in analysis.verdicts)
    assert all(p.is_file() for p in analysis.figures)
    assert len(analysis.tables["detected cycles"]) == 16


def test_s1_is_the_rate_of_seeds_with_two_cycles_and_four_of_five_is_inconclusive(
    tmp_path, no_figures
):
    plant = {
        "adam_eps1e-08_s0": [500, 1500, 2500],
        "adam_eps1e-08_s1": [1500],
        **{f"adam_eps1e-08_s{k}": [500, 2500] for k in (2, 3, 4)},
        "adam_eps0.0001_s0": [1000],
    }
    runs = _store(tmp_path, plant, steps=3500)
    assert {r.config["seed"] for r in runs.values()} == {0, 1, 2, 3, 4}
    verdicts = {v.claim.split(":")[0]: v for v in analyze(runs, tmp_path).verdicts}
    s1 = verdicts["s1"]
    assert s1.per_seed == (3.0, 1.0, 2.0, 2.0, 2.0) and s1.measured == pytest.approx(0.8)
    lo, hi = s1.interval  # Wilson 95 % interval of 4 / 5 straddles the registered 0.5
    assert lo == pytest.approx(0.3755, abs=1e-3) and hi == pytest.approx(0.9638, abs=1e-3)
    assert s1.status == "inconclusive" and "straddles" in s1.reason
    assert verdicts["s2"].measured == 0.0
    assert verdicts["s3"].measured == pytest.approx(1.8)  # 3 - 1, 1 - 0, 2 - 0, 2 - 0, 2 - 0


def test_an_arm_that_never_fits_makes_its_claims_inconclusive(tmp_path, no_figures):
    """SGD that never fits its training set never arms the detector: its 0 cycles say nothing."""
    floor = {f"sgd_lr0.1_s{k}": 0.1 for k in (1, 3)}  # above ln 2 / 50: never fits
    runs = _store(tmp_path, THREE, floor=floor)
    verdicts = {v.claim.split(":")[0]: v for v in analyze(runs, tmp_path).verdicts}
    assert verdicts["s2"].measured == 0.0 and verdicts["s2"].status == "inconclusive"
    assert "not fitted: SGD seed 1, SGD seed 3" in verdicts["s2"].precondition.text
    assert verdicts["s3"].status == "inconclusive"  # s3 reads SGD in its control
    assert verdicts["s1"].status == "held"  # s1 does not read SGD


def test_flat_series_have_no_cycle_and_sgd_cycles_fail_s2(tmp_path, no_figures):
    runs = _store(tmp_path, {f"sgd_lr0.1_s{k}": [1000] for k in range(5)})
    verdicts = {v.claim.split(":")[0]: v for v in analyze(runs, tmp_path).verdicts}
    assert verdicts["s1"].measured == 0.0 and verdicts["s1"].status == "inconclusive"
    assert verdicts["s2"].measured == 1.0 and verdicts["s2"].status == "inconclusive"
    assert verdicts["s3"].measured == 0.0 and verdicts["s3"].status == "inconclusive"
    assert not verdicts["s2"].precondition.met  # nothing cycles: SGD's cycles say nothing


def test_spikes_before_the_training_set_is_fit_do_not_count(tmp_path):
    """Armed only once loss < ln 2 / n_train (100 % training accuracy certified)."""
    specs = build_runs(STUDY.preset("smoke"))
    t, loss, norm = _planted(3000, [1000])
    loss = np.maximum(loss, 0.1)  # never below ln 2 / 50: never armed
    run = _write_run(tmp_path, specs[0], loss, norm)
    assert run_cycles(run)[0] == []
    assert len(run_cycles(run, DetectorConfig(arm_loss_factor=1.0))[0]) == 0


def test_losses_below_float32_resolution_are_not_spikes(tmp_path):
    """A float32 loss that reaches exact 0 and jitters at 1e-9 plants no cycle."""
    specs = build_runs(STUDY.preset("smoke"))
    t, loss, norm = _planted(3000, [])
    loss[1000:] = np.where(np.arange(2001) % 7 == 0, 6e-10, 0.0)
    norm = norm * np.exp(2e-3 * np.clip(t - 900, 0, 200))  # growth, yet no real spike
    run = _write_run(tmp_path, specs[0], loss, norm)
    assert run_cycles(run)[0] == []


def _slingshot_val(grok: int) -> dict[str, np.ndarray]:
    """Validation accuracy reaching 0.97 at ``grok`` for the slingshot FCN arm only."""
    val = np.where(np.arange(4001) >= grok, 0.97, 0.8)
    return {f"adam_eps1e-08_s{k}": val for k in range(5)}


def test_grokking_near_an_onset_adds_g1(tmp_path, no_figures):
    runs = _store(tmp_path, THREE, val=_slingshot_val(1600))  # onset of cycle 2 ~1500
    verdicts = {v.claim.split(":")[0]: v for v in analyze(runs, tmp_path).verdicts}
    g1 = verdicts["g1"]
    assert g1.passed and 0 < g1.measured < 1
    # the control: the ε = 1e-4 arm never groks (censored at step 4000), far from the onsets
    assert g1.control.kind == "ablation" and g1.control.measured > 1
    assert g1.control.status == "not held"


def test_g1_is_inconclusive_when_the_larger_eps_run_groks_at_the_same_step(tmp_path, no_figures):
    """Grokking at the same step without cycles: its timing is not tied to the cycles."""
    val = np.where(np.arange(4001) >= 1600, 0.97, 0.8)
    runs = _store(tmp_path, THREE, val=val)  # every arm groks at 1600
    g1 = {v.claim.split(":")[0]: v for v in analyze(runs, tmp_path).verdicts}["g1"]
    assert g1.control.status == "held" and g1.status == "inconclusive"


def test_grokking_without_a_cycle_fails_g1(tmp_path, no_figures):
    runs = _store(tmp_path, {}, val=_slingshot_val(1600))
    g1 = {v.claim.split(":")[0]: v for v in analyze(runs, tmp_path).verdicts}["g1"]
    assert math.isnan(g1.measured) and not g1.passed


def test_presets_validate_and_conditions_differ_only_in_the_optimizer():
    assert "slingshot" in studies.names()
    assert studies.get("slingshot") is STUDY
    assert STUDY.protocol.study == "slingshot"
    # paper: 5 seeds x (ε 1e-8, 1e-6, 1e-5, 1e-4, SGD, ε 1e-8 in float64) + 5 x 2 grokking
    # runs (ε 1e-8 and its ablation at ε 1e-4)
    for name, n_runs in (("smoke", 9), ("fast", 15), ("paper", 40)):
        specs = build_runs(STUDY.preset(name))
        assert len(specs) == n_runs
        assert len({s.name for s in specs}) == n_runs
    paper = build_runs(STUDY.preset("paper"), seed=5)  # --seed moves the seeds, not the names
    assert {s.config.seed for s in paper} == {5, 6, 7, 8, 9}
    assert {s.name.rsplit("_", 1)[1] for s in paper} == {f"s{k}" for k in range(5)}
    fcn = [s for s in paper if s.group is not None]
    assert sorted({s.config.eps for s in fcn if s.config.optimizer == "adam"}) == [
        1e-8,
        1e-6,
        1e-5,
        1e-4,
    ]
    assert len(fcn) == 30 and {s.config.loop.steps for s in fcn} == {60_000}
    assert {s.config.loop.dtype for s in fcn if "f64" in s.name} == {"float64"}
    assert len({s.group for s in fcn}) == 6  # one ensemble per condition
    specs = {s.name: s for s in build_runs(STUDY.preset("fast"), seed=2)}
    assert sorted(specs) == [
        f"{c}_s{k}" for c in ("adam_eps0.0001", "adam_eps1e-08", "sgd_lr0.1") for k in range(5)
    ]
    assert {s.group for s in specs.values() if s.name.startswith("adam_eps1e-08")} == {
        "adam_eps1e-08"
    }
    adam, control, sgd = (
        specs[n].config for n in ("adam_eps1e-08_s0", "adam_eps0.0001_s0", "sgd_lr0.1_s0")
    )
    assert (adam.optimizer, adam.lr, adam.eps) == ("adam", 1e-3, 1e-8)
    assert (control.optimizer, control.eps) == ("adam", 1e-4)
    assert (sgd.optimizer, sgd.lr) == ("sgd", 0.1)
    strip = {"optimizer": "adam", "lr": 1e-3, "eps": 1e-8}
    assert adam == control.model_copy(update=strip) == sgd.model_copy(update=strip)
    assert adam.seed == 2 and adam.loop.steps == FAST_STEPS and adam.loop.log_every == 10
    assert adam.hidden == (64, 64) and adam.n_train == 200


def test_smoke_preset_end_to_end(smoke_out):
    """The shared smoke run; its SIGKILL-resume is test_resume_every_study's, whose kill (at
    half the store writes) lands mid-way through an Adam ensemble, as the kill test here did
    (it compares every stored row, the norm and accuracy traces included)."""
    outcome, out = smoke_out
    data = json.loads((out / "verdict.json").read_text(), parse_constant=pytest.fail)
    assert data["study"] == "slingshot" and data["preset"] == "smoke"
    assert [c["claim"].split(":")[0] for c in data["claims"]][:3] == ["s1", "s2", "s3"]
    for claim in data["claims"]:
        assert claim["measured"] is None or isinstance(claim["measured"], float)
        assert isinstance(claim["passed"], bool)
    assert all(r["status"] == "finished" for r in data["runs"])
    assert sorted(p.name for p in (out / "figures").glob("*.png")) == [
        "norm_loss.png",
        "val_accuracy.png",
    ]
    assert (out / "report.html").read_text().count("data:image/png;base64") == 2
    run = load_run(out / "runs" / "adam_eps1e-08_s0")
    assert len(run.scalar("train.loss")) == 50 and len(run.scalar(NORM_KEY)) == 50
    assert outcome.passed == all(c["passed"] for c in data["claims"])


# -- the grokking run (paper preset) -----------------------------------------------------------
def test_paper_preset_adds_one_grokking_run_per_seed_and_smoke_fast_none():
    assert STUDY.preset("smoke").grokking is None and STUDY.preset("fast").grokking is None
    specs = {s.name: s.config for s in build_runs(STUDY.preset("paper"), seed=4)}
    grok = {name: cfg for name, cfg in specs.items() if name.startswith("grok")}
    assert sorted(grok) == [f"grok_adam_eps0.0001_s{k}" for k in range(5)] + [
        f"grok_adam_s{k}" for k in range(5)
    ]
    assert [grok[f"grok_adam_s{k}"].seed for k in range(5)] == [4, 5, 6, 7, 8]
    ablation = grok["grok_adam_eps0.0001_s0"]  # g1's control: only ε differs
    assert ablation.optimizer.eps == 1e-4 and grok["grok_adam_s0"].optimizer.eps == 1e-8
    assert ablation.seed == grok["grok_adam_s0"].seed
    strip = {"name": "x", "optimizer": None}
    assert ablation.model_copy(update=strip) == grok["grok_adam_s0"].model_copy(update=strip)
    cfg = grok["grok_adam_s0"]
    assert (cfg.task.p, cfg.task.op, cfg.task.train_fraction, cfg.task.split_seed) == (
        53,
        "+",
        0.5,
        0,
    )
    model = cfg.model
    assert (model.name, model.n_layers, model.d_model, model.n_heads) == ("transformer", 1, 128, 4)
    assert model.is_causal
    opt = cfg.optimizer
    assert (opt.name, opt.lr, opt.betas, opt.eps) == ("adam", 1e-3, (0.9, 0.98), 1e-8)
    assert opt.weight_decay.model_dump() == {"attention": 0.0, "matrices": 0.0, "vectors": 0.0}
    assert (opt.warmup_steps, opt.lr_schedule) == (10, "constant")
    n_train = round(53 * 53 * 0.5)
    assert cfg.train.batch_size == min(512, math.ceil(n_train / 2)) == 512
    assert cfg.train.steps == GROK_STEPS == 100_000 and cfg.train.log_every == 1
    assert cfg.train.eval_every == 50  # grok step to 50 steps
    assert cfg.monitor.probes == ["last_layer_norm"]
    assert (cfg.monitor.schedule, cfg.monitor.every) == ("every", 1)


def _grok_spec(k: int = 0, prefix: str = "grok_adam"):
    return next(s for s in build_runs(STUDY.preset("paper")) if s.name == f"{prefix}_s{k}")


def _grok_val(steps: int, grok: int | None) -> np.ndarray:
    t = np.arange(steps + 1)
    return np.where(t >= grok, 0.99, 0.3) if grok is not None else np.full(steps + 1, 0.3)


@pytest.fixture(scope="module")
def grok_ablation(tmp_path_factory):
    """The grokking ablation runs (ε = 1e-4), 5 seeds: no cycle, never grok (censored at their
    last step); built once for the module (read only)."""
    root = tmp_path_factory.mktemp("grok_ablation")
    runs = {}
    for k in range(5):
        spec = _grok_spec(k, "grok_adam_eps0.0001")
        _, loss, norm = _planted(4000, [])
        runs[spec.name] = _write_run(root, spec, loss, norm, _grok_val(4000, None))
    return runs


def _with_grokking(tmp_path, fcn, ablation, onsets, grok):
    """The FCN runs ``fcn`` (the smoke runs of ``PLANTED``: 5 seeds; Adam ε = 1e-8 with 3
    cycles, ε = 1e-4 with 1 in seed 0), the ablation runs and 5 grokking runs with cycles
    planted at ``onsets`` and validation accuracy reaching 0.99 at step ``grok``."""
    grok_runs = {}
    for k in range(5):
        spec = _grok_spec(k)
        _, loss, norm = _planted(4000, onsets)
        grok_runs[spec.name] = _write_run(
            tmp_path / "runs", spec, loss, norm, _grok_val(4000, grok)
        )
    return fcn, {**fcn, **ablation, **grok_runs}


def _verdicts(runs, figures):
    analysis = analyze(runs, figures)
    return analysis, {v.claim.split(":")[0]: v for v in analysis.verdicts}


def _fcn_verdicts(verdicts):
    return [(verdicts[k].measured, verdicts[k].passed) for k in ("s1", "s2", "s3")]


def test_grokking_run_near_an_onset_passes_g1_and_leaves_s1_to_s3_alone(
    tmp_path, planted_fcn, grok_ablation, monkeypatch
):
    fcn, runs = _with_grokking(tmp_path, planted_fcn, grok_ablation, [500, 1500, 2500], grok=1600)
    cycles, _ = run_cycles(runs["grok_adam_s0"])  # minibatch arming: loss < ln 2 / 512
    assert len(cycles) == 3 and 1500 <= cycles[1].start_step < 1600
    mean_length = float(np.mean([c.length for c in cycles]))
    expected = (1600 - cycles[1].start_step) / mean_length
    assert 0 < expected < 1
    with monkeypatch.context() as patch:  # the figures are drawn and checked below
        _stub_figures(patch)
        _, without = _verdicts(fcn, tmp_path / "without")
    analysis, verdicts = _verdicts(runs, tmp_path / "with")
    assert list(verdicts) == ["s1", "s2", "s3", "g1"]
    assert (
        _fcn_verdicts(verdicts)
        == _fcn_verdicts(without)
        == [
            (1.0, True),
            (0.0, True),
            (pytest.approx(2.8), True),
        ]
    )
    assert verdicts["g1"].measured == pytest.approx(expected) and verdicts["g1"].passed
    assert "5 of 5 run(s) grokked" in verdicts["g1"].detail
    assert verdicts["g1"].control.status == "not held"  # ε = 1e-4 never groks: censored, far
    rows = {r["run"]: r for r in analysis.tables["runs: cycles, final values, grok step"]}
    assert (
        rows["grok_adam_s0"]["system"] == "grokking" and rows["grok_adam_s0"]["grok step"] == 1600
    )
    assert rows["grok_adam_s0"]["cycles"] == 3 and rows["adam_eps1e-08_s0"]["system"] == "fcn"
    assert sum(r["run"] == "grok_adam_s0" for r in analysis.tables["detected cycles"]) == 3
    assert sorted(p.name for p in analysis.figures) == [
        "grokking.png",
        "norm_loss.png",
        "val_accuracy.png",
    ]
    assert all(p.is_file() for p in analysis.figures)


def test_grokking_far_from_any_onset_fails_g1_even_if_the_fcn_groks_near_one(
    tmp_path, grok_ablation, no_figures
):
    """With a grokking run present, g1 is measured on it, not on the FCN runs."""
    fcn_val = _slingshot_val(1600)  # the slingshot FCN arm groks near its onset 1500
    fcn = _store(tmp_path, PLANTED, fcn_val)
    fcn, runs = _with_grokking(tmp_path, fcn, grok_ablation, [500], grok=3500)
    (cycle,), _ = run_cycles(runs["grok_adam_s0"])  # the same in every grokking run
    expected = (3500 - cycle.start_step) / cycle.length
    assert expected > 1
    _, without = _verdicts(fcn, tmp_path / "without")
    assert without["g1"].passed  # the FCN alone passes g1
    _, verdicts = _verdicts(runs, tmp_path / "with")
    assert _fcn_verdicts(verdicts) == _fcn_verdicts(without)
    assert verdicts["g1"].measured == pytest.approx(expected) and not verdicts["g1"].passed


def test_grokking_run_that_never_groks_reports_g1_unmeasurable(
    tmp_path, planted_fcn, grok_ablation, no_figures
):
    fcn, runs = _with_grokking(tmp_path, planted_fcn, grok_ablation, [500, 1500], grok=None)
    _, without = _verdicts(fcn, tmp_path / "without")
    _, verdicts = _verdicts(runs, tmp_path / "with")
    assert "g1" not in without
    assert _fcn_verdicts(verdicts) == _fcn_verdicts(without)
    assert math.isnan(verdicts["g1"].measured) and verdicts["g1"].status == "inconclusive"
    assert not verdicts["g1"].precondition.met


def test_tiny_real_grokking_run_trains_and_is_analyzed(tmp_path, no_figures):
    spec = _grok_spec()
    overrides = [
        "train.steps=20",
        "device=cpu",
        "task.p=11",
        "model.d_model=16",
        "model.n_heads=2",
        "model.d_mlp=32",
        "train.batch_size=16",
        "train.eval_every=10",
        "train.eval_batches=1",
        "train.checkpoint_every=20",
    ]
    cfg = validate_config(spec.config.model_dump(mode="json"), overrides)
    run_dir = tmp_path / "runs" / spec.name
    run_training(cfg, run_dir)
    run = load_run(run_dir)
    assert run.status == "finished"
    assert len(run.scalar("train.loss")) == 20 and len(run.scalar("last_layer.norm")) == 21
    assert len(run.scalar("val.accuracy")) == 3  # steps 0, 10, 20
    fcn = _store(tmp_path, THREE)
    _, without = _verdicts(fcn, tmp_path / "without")
    analysis, verdicts = _verdicts({**fcn, spec.name: run}, tmp_path / "with")
    assert _fcn_verdicts(verdicts) == _fcn_verdicts(without)
    assert "g1" in verdicts and isinstance(verdicts["g1"].passed, bool)
    rows = {r["run"]: r for r in analysis.tables["runs: cycles, final values, grok step"]}
    assert rows[spec.name]["system"] == "grokking" and rows[spec.name]["status"] == "finished"
    alone = analyze({spec.name: run}, tmp_path / "alone")  # no FCN run: s1–s3 not measurable
    assert [v.claim.split(":")[0] for v in alone.verdicts] == ["s1", "s2", "s3", "g1"]


def test_full_splits_each_condition_into_ensembles_of_twelve_with_the_same_runs():
    full = STUDY.preset("full")
    split = build_runs(full, seed=7)
    whole = build_runs(full.model_copy(update={"ensemble_size": None}), seed=7)
    assert [(s.name, s.config) for s in split] == [(s.name, s.config) for s in whole]
    groups = {}
    for spec in split:
        groups.setdefault(spec.group, []).append(spec.config.seed)
    assert sorted(groups) == [f"{c}_e{i}" for c in ("adam_eps0.0001", "adam_eps1e-08", "sgd_lr0.1")
                              for i in (0, 1)]  # fmt: skip
    assert all(seeds == list(range(7, 19)) or seeds == list(range(19, 31))
               for seeds in groups.values())  # fmt: skip
    assert {s.group for s in whole} == {"adam_eps1e-08", "adam_eps0.0001", "sgd_lr0.1"}
