"""Study gradual-rank: the detectors, analyze on hand-built stores, presets, the toy runner, and
the smoke preset end to end."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from dynascope import studies
from dynascope.store import RunStore, load_run
from dynascope.studies.gradual_rank import (
    SGD_LR,
    SGD_MOMENTUM,
    STUDY,
    TOY_FULL_SEEDS,
    VIT_FULL_SEEDS,
    ToyRun,
    active_counts,
    analyze,
    build_runs,
    build_toy,
    find_drops,
    midpoint_rise,
    plateaus,
    rescaled_time,
    switched_on,
)
from dynascope.tasks import DiagonalAttentionTeacher
from dynascope.train import Loop, SeedStreams, run_members

CLAIMS = ["t1", "t2", "t3", "v1-rise", "v1-end"]


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


# -- detectors --------------------------------------------------------------------------------
def test_rescaled_time_is_lr_t_over_log_inverse_alpha():
    tau = rescaled_time(np.array([0, 100, 1000]), 0.05, 1e-2)
    np.testing.assert_allclose(tau, [0.0, 5 / math.log(100), 50 / math.log(100)], rtol=1e-15)
    with pytest.raises(ValueError, match=r"alpha must lie in \(0, 1\)"):
        rescaled_time(np.arange(3), 0.05, 1.0)


def test_find_drops_locates_sharp_drops_and_ignores_slow_decay():
    """Hand-built: log-loss = −2·Σ_k σ((τ − T_k)/0.2) with T = 10, 20, 30, plus a slow decay
    (1% per unit τ) that never falls 30% within 5% of τ."""
    tau = np.linspace(0, 40, 4001)
    log_loss = -2 * sum(_sigmoid((tau - t) / 0.2) for t in (10, 20, 30)) - 0.01 * tau
    drops = find_drops(tau, np.exp(log_loss))
    assert len(drops) == 3
    np.testing.assert_allclose([tau[s] for _, _, s in drops], [10, 20, 30], atol=0.02)
    spans = plateaus(len(tau), drops)
    assert len(spans) == 4 and spans[0][0] == 0 and spans[-1][1] == len(tau) - 1
    assert find_drops(tau, np.exp(-0.01 * tau)) == []
    # an absolute window of 0.05 is too short for these drops: a 2-nat drop spread over
    # Δτ ≈ 1 falls ~ 20% within 0.05 (S10's literal window; see the study docstring)
    assert find_drops(tau, np.exp(log_loss), rel_window=None, abs_window=0.05) == []
    with pytest.raises(ValueError, match="exactly one of rel_window, abs_window"):
        find_drops(tau, np.exp(log_loss), abs_window=0.05)
    with pytest.raises(ValueError, match="tau and loss must be 1-d of one length"):
        find_drops(tau, np.exp(log_loss)[:-1])


def test_a_drop_that_runs_to_the_end_leaves_no_empty_final_plateau():
    tau = np.linspace(0, 10, 1001)
    loss = np.exp(-2 * _sigmoid((tau - 5) / 0.2) - np.where(tau > 8, 3 * (tau - 8), 0))
    drops = find_drops(tau, loss)
    assert drops[-1][1] == len(tau) - 1
    assert len(plateaus(len(tau), drops)) == len(drops)


def test_active_counts_threshold_is_ten_alpha_from_the_initial_value():
    values = np.array([[0.001, 0.0, -0.002], [0.0115, 0.5, -0.002], [0.05, 0.5, 1.0]])
    np.testing.assert_array_equal(active_counts(values, 1e-3), [0, 2, 3])
    np.testing.assert_array_equal(active_counts(values, 1e-2), [0, 1, 2])


def test_switched_on_counts_entries_past_half_their_final_change():
    """Oracle by hand: entry 0 ends at Δ = 1 (on from 0.5), entry 1 at Δ = 0.2 (on from 0.1),
    entry 2 ends at Δ = 5e-3 <= 10 α (never counted), whatever its path; Δ is read from row 0."""
    delta = np.array([[0.0, 0.0, 0.0], [0.4, 0.12, 0.005], [0.6, 0.05, 0.0], [1.0, 0.2, 0.005]])
    values = delta + np.array([0.001, -0.002, 0.0])
    np.testing.assert_array_equal(switched_on(values, 1e-3), [0, 1, 1, 2])
    np.testing.assert_array_equal(switched_on(values, 0.05), [0, 0, 1, 1])  # 10α = 0.5 > 0.2


# -- analyze on hand-built stores -------------------------------------------------------------
STAGES = (10.0, 20.0, 30.0)


def _toy_store(
    path,
    *,
    ov_second_with_first: bool = False,
    seed: int = 0,
    control_stages: bool = False,
    control_fits: bool = True,
):
    """A toy run whose traces are smooth steps in τ at ``STAGES`` for α = 1e-2 and 1e-3: loss
    falls 2 nats at each stage; entry k of qk and ov switches on at stage k (ov entry 1 with
    entry 0 when ``ov_second_with_first``). α = 1 (the control) learns smoothly: no stages
    (unless ``control_stages``: then it learns in the same stages, in η t; ``control_fits``
    False: its loss stays at its start)."""
    loop = Loop(steps=6000, log_every=10, dtype="float64")
    cfg = ToyRun(seed=seed, loop=loop, n_ctx=4, d_model=4, n_seq=4, alphas=[1.0, 1e-2, 1e-3])
    c = np.array([2.0, 1.0, 0.5, 0.0])
    with RunStore(path) as store:
        store.write_config(cfg.model_dump(mode="json"))
        for step in range(0, loop.steps + 1, loop.log_every):
            tau = np.array(
                [cfg.lr * step] + [rescaled_time(np.array(step), cfg.lr, a) for a in (1e-2, 1e-3)]
            )
            on = np.stack([_sigmoid((tau - t) / 0.2) for t in STAGES], axis=1)  # [α, 3]
            if not control_stages:
                on[0] = 1 - np.exp(-tau[0] / 20)  # α = 1: every entry together, slowly
            loss = np.exp(-2 * on.sum(axis=1))
            if not control_fits:
                loss[0] = 1.0
            qk = np.zeros((3, 4))
            qk[:, :3] = c[:3] * on
            ov = qk.copy()
            if ov_second_with_first:
                ov[1:, 1] = c[1] * on[1:, 0]
            row = {"loss": torch.tensor(loss), "qk": torch.tensor(qk), "ov": torch.tensor(ov)}
            if step == 0:
                row["teacher"] = torch.tensor(c)
            store.log(step, row)
        store.set_status(loop.steps, "finished")
    return load_run(path)


def _toys(path, **kwargs):
    return {f"toy_s{k}": _toy_store(path / f"toy_s{k}", seed=k, **kwargs) for k in range(5)}


def _vit_store(path, srank_by_layer: list[list[float]], seed: int = 0, accuracy: float = 0.9):
    steps = [0, 1, 2, 4, 8, 16, 32, 64, 128, 256]
    optimizer = "sgd" if path.name.startswith("vit_sgd") else "adam"
    with RunStore(path) as store:
        store.write_config(
            {"name": path.name, "seed": seed, "optimizer": {"name": optimizer},
             "model": {"name": "vit", "n_layers": 2, "d_model": 32, "n_heads": 2,
                       "d_head": None}}
        )  # fmt: skip
        for k, step in enumerate(steps):
            row = {"val.accuracy": accuracy}
            for layer, sranks in enumerate(srank_by_layer):
                value = 0.0 if step == 0 else sranks[k - 1]
                for product in ("dqk", "dov"):
                    row[f"L{layer}.{product}.mean.stable_rank"] = value
                    row[f"L{layer}.{product}.std.stable_rank"] = 0.1
            store.log(step, row)
        store.set_status(steps[-1], "finished")
    return load_run(path)


RISING = [1.0, 1.2, 1.5, 1.7, 2.0, 2.2, 2.5, 2.8, 3.0]  # ends at 3 <= d_head/4 = 4
FLAT_HIGH = [9.0, 9.5, 9.0, 9.5, 9.0, 9.5, 9.0, 9.5, 9.0]  # no trend (ρ = 0), ends at 9 > 4


def _vits(path, sgd=(FLAT_HIGH, FLAT_HIGH), sgd_accuracy=0.9):
    """Five Adam ViTs whose Δ_QK srank rises and stays low, and five SGD controls (default:
    no rise, high rank)."""
    adam = {f"vit_s{k}": _vit_store(path / f"vit_s{k}", [RISING, RISING], k) for k in range(5)}
    control = {
        f"vit_sgd_s{k}": _vit_store(path / f"vit_sgd_s{k}", list(sgd), k, sgd_accuracy)
        for k in range(5)
    }
    return {**adam, **control}


def test_analyze_on_hand_built_stores_gives_the_known_verdicts(tmp_path):
    runs = {
        **_toys(tmp_path),
        **_vits(tmp_path),
        **{
            f"vit_s{k}": _vit_store(tmp_path / f"vit_s{k}", [RISING, [r / 2 for r in RISING]], k)
            for k in range(5)
        },
    }
    analysis = analyze(runs, tmp_path / "figures")
    by_name = {v.claim.split(":")[0]: v for v in analysis.verdicts}
    assert list(by_name) == CLAIMS
    assert by_name["t1"].measured == 4 and by_name["t1"].status == "held"  # 4 plateaus
    assert by_name["t1"].control.measured == 1  # α = 1: no drop, one plateau
    assert by_name["t1"].control.status == "not held"
    assert by_name["t2"].measured == 1 and by_name["t2"].status == "held"  # +1 at each stage
    # the control is the α = 1 arm: one plateau, so its one stage switches on all 3 entries
    assert by_name["t2"].control.measured == 3 and by_name["t2"].control.status == "not held"
    assert by_name["t2"].control.kind == "ablation" and by_name["t2"].n_seeds == 5
    assert by_name["t2"].interval == pytest.approx((1.0, 1.0))
    assert all(v.precondition.met for v in analysis.verdicts)
    assert by_name["t1"].precondition.measured == pytest.approx(np.exp(-6.0), rel=1e-3)
    assert by_name["t3"].measured < 0.01 and by_name["t3"].status == "held"  # same τ stages
    assert by_name["t3"].control.measured == pytest.approx(1 / 3)  # 1 − log 1e2 / log 1e3
    assert by_name["v1-rise"].measured == pytest.approx(1.0) and by_name["v1-rise"].passed
    # the SGD control: ρ(step, 9, 9.5, 9, …) over the 9 log-points, alternating ranks
    rho_flat = spearmanr(range(9), FLAT_HIGH).statistic
    assert by_name["v1-rise"].control.measured == pytest.approx(rho_flat)
    assert by_name["v1-rise"].control.status == "not held" and by_name["v1-rise"].status == "held"
    assert by_name["v1-end"].measured == pytest.approx(3.0 / 16) and by_name["v1-end"].passed
    assert by_name["v1-end"].control.measured == pytest.approx(9.0 / 16)  # the SGD arm's end
    assert by_name["v1-end"].control.n_seeds == 5
    assert by_name["v1-end"].control.status == "not held"
    assert list(by_name["v1-end"].seeds) == [0, 1, 2, 3, 4]
    assert all(p.is_file() for p in analysis.figures) and len(analysis.figures) == 4


def test_analyze_reports_a_double_switch_on_and_a_falling_rank_as_failures(tmp_path):
    falling = [9.0, 8.5, 8.0, 7.5, 7.0, 6.5, 6.0, 5.5, 5.0]  # ρ = −1, ends at 5 > 4
    runs = {
        **_toys(tmp_path, ov_second_with_first=True),
        **_vits(tmp_path),
        **{
            f"vit_s{k}": _vit_store(
                tmp_path / f"vit_s{k}", [[1, 2, 3, 3, 3, 3, 3, 3, 3], falling], k
            )
            for k in range(5)
        },
    }
    by_name = {v.claim.split(":")[0]: v for v in analyze(runs, tmp_path / "f").verdicts}
    assert by_name["t2"].measured == 2 and by_name["t2"].status == "not held"  # ov: +2 at once
    assert by_name["v1-rise"].measured == pytest.approx(-1.0) and not by_name["v1-rise"].passed
    assert by_name["v1-end"].measured == pytest.approx(5.0 / 16) and not by_name["v1-end"].passed
    assert by_name["t1"].passed and by_name["t3"].passed


def test_a_control_that_learns_in_stages_too_makes_t1_and_t2_inconclusive(tmp_path):
    """t1's and t2's control is the α = 1 arm of the same runs: if it staged like the small
    init, the claims could not tell the two apart."""
    by_name = {v.claim.split(":")[0]: v
               for v in analyze({**_toys(tmp_path, control_stages=True), **_vits(tmp_path)},
                                tmp_path / "f").verdicts
               if v.claim.startswith("t")}  # fmt: skip
    for claim in ("t1", "t2"):
        assert by_name[claim].control.status == "held"
        assert by_name[claim].status == "inconclusive"
    assert by_name["t2"].control.measured == 1


def test_an_sgd_control_that_also_ranks_low_and_rising_makes_v1_inconclusive(tmp_path):
    """v1's control is the same ViT trained by SGD: if its update's rank also rose and stayed
    low, the claims could not attribute it to Adam."""
    runs = {**_toys(tmp_path), **_vits(tmp_path, sgd=(RISING, RISING))}
    by_name = {v.claim.split(":")[0]: v for v in analyze(runs, tmp_path / "f").verdicts}
    for claim in ("v1-rise", "v1-end"):
        assert by_name[claim].precondition.met
        assert by_name[claim].control.status == "held"
        assert by_name[claim].status == "inconclusive"


def test_an_sgd_control_that_did_not_learn_fails_the_vit_precondition(tmp_path):
    runs = {**_toys(tmp_path), **_vits(tmp_path, sgd_accuracy=0.3)}
    by_name = {v.claim.split(":")[0]: v for v in analyze(runs, tmp_path / "f").verdicts}
    for claim in ("v1-rise", "v1-end"):
        assert not by_name[claim].precondition.met
        assert by_name[claim].precondition.measured == pytest.approx(0.3)
        assert by_name[claim].status == "inconclusive"


def test_an_alpha_that_does_not_fit_the_teacher_fails_the_toy_preconditions(tmp_path):
    """The control α = 1 never fits: t1 and t2 read it and are inconclusive; t3 reads only the
    two smallest α and is judged."""
    toys = {**_toys(tmp_path, control_fits=False), **_vits(tmp_path)}
    by_name = {v.claim.split(":")[0]: v for v in analyze(toys, tmp_path / "f").verdicts
               if v.claim.startswith("t")}  # fmt: skip
    for claim in ("t1", "t2"):
        assert not by_name[claim].precondition.met and by_name[claim].status == "inconclusive"
    assert by_name["t3"].precondition.met and by_name["t3"].status == "held"


def test_the_control_is_read_only_on_the_seeds_where_it_fits(tmp_path):
    """Six seeds, the α = 1 control stuck on one (its loss stays at its start, as at the
    spurious stationary point of calibration seeds 10000 and 10005): that seed reads NaN in
    t1's and t2's control, the other five are judged, and the precondition holds (5 >= 5
    control seeds fit). With a second stuck seed only 4 fit: the precondition fails."""
    runs = {**_toys(tmp_path), **_vits(tmp_path)}
    runs["toy_s5"] = _toy_store(tmp_path / "toy_s5", seed=5, control_fits=False)
    by_name = {v.claim.split(":")[0]: v for v in analyze(runs, tmp_path / "f").verdicts}
    for claim in ("t1", "t2"):
        verdict = by_name[claim]
        assert verdict.precondition.met and "fits on 5 of 6" in verdict.precondition.text
        assert math.isnan(verdict.control.per_seed[5]) and verdict.control.n_seeds == 5
        assert verdict.n_seeds == 6 and verdict.status == "held"
    assert by_name["t1"].control.measured == 1 and by_name["t2"].control.measured == 3
    runs["toy_s4"] = _toy_store(tmp_path / "toy_s4b", seed=4, control_fits=False)
    by_name = {v.claim.split(":")[0]: v for v in analyze(runs, tmp_path / "g").verdicts}
    for claim in ("t1", "t2"):
        assert not by_name[claim].precondition.met and by_name[claim].status == "inconclusive"
        assert "fits on 4 of 6" in by_name[claim].precondition.text


def test_midpoint_rise_counts_teacher_entries_between_plateau_midpoints():
    """Entries 0, 1, 2 cross ½ of their final |Δ| at rows 1, 3, 3; entry 3 is not the
    teacher's. Midpoints at rows 0, 2, 4 read 0, 1, 3: the largest rise is 2. With one
    plateau the run is one stage: 3 entries switch on."""
    values = np.array([
        [0.0, 0.0, 0.0, 0.0],
        [2.0, 0.1, 0.0, 5.0],
        [2.0, 0.2, 0.1, 5.0],
        [2.0, 1.0, 0.5, 5.0],
        [2.0, 1.0, 0.5, 5.0],
    ])  # fmt: skip
    support = np.array([True, True, True, False])
    assert midpoint_rise(values, support, [0, 2, 4]) == 2
    assert midpoint_rise(values, support, [0, 1, 4]) == 2  # rows 1 / 4 read 1 / 3
    assert midpoint_rise(values, support, [1]) == 3


# -- the runner, presets, smoke end to end ----------------------------------------------------
@pytest.mark.parametrize("log_every", [1, 3])
def test_toy_runner_logs_the_teachers_loss_and_gd_trajectory(tmp_path, log_every):
    """The engine's toy run equals plain GD with the teacher's gradient_step (float64), whether
    the step reuses the gradient the probe computed (every step at log_every 1, some at 3) or
    computes it itself."""
    loop = Loop(steps=7, log_every=log_every, dtype="float64")
    cfg = ToyRun(seed=4, loop=loop, n_ctx=3, d_model=4, n_seq=5, alphas=[0.5, 0.1])
    run_members(build_toy, cfg, tmp_path / "toy")
    run = load_run(tmp_path / "toy")
    assert run.status == "finished"
    steps, loss = run.tensors("loss")
    np.testing.assert_array_equal(steps, list(range(8)) if log_every == 1 else [0, 3, 6, 7])
    streams = SeedStreams(4)
    task = DiagonalAttentionTeacher(n_ctx=3, d_model=4, n_seq=5, seed=streams("teacher"))
    alphas = torch.tensor(cfg.alphas, dtype=torch.float64)
    w = task.init_weights(alphas, streams.generator("theta0"))
    expected = {}
    for step in range(8):
        expected[step] = (task.loss(w), w[:, 0] * w[:, 1])
        w, _ = task.gradient_step(w, cfg.lr)
    for k, step in enumerate(steps):
        np.testing.assert_allclose(loss[k], expected[step][0].numpy(), rtol=0, atol=1e-15)
        np.testing.assert_allclose(run.tensors("qk")[1][k], expected[step][1].numpy(), atol=1e-15)


def test_presets_validate_and_fast_matches_s10():
    assert "gradual-rank" in studies.names()
    assert studies.get("gradual-rank") is STUDY
    assert [s.name for s in build_runs(STUDY.preset("smoke"))] == [
        "toy_s0", "toy_s1", "toy_s2", "vit_s0", "vit_sgd_s0"]  # fmt: skip
    five = [*(f"toy_s{k}" for k in range(5)), *(f"vit_s{k}" for k in range(5)),
            *(f"vit_sgd_s{k}" for k in range(5))]  # fmt: skip
    for name in ("fast", "paper"):  # >= 5 seeds per arm; each ViT arm trains as one ensemble
        specs = build_runs(STUDY.preset(name))
        assert [s.name for s in specs] == five
        assert {s.group for s in specs if s.name.startswith("vit")} == {"vit", "vit_sgd"}
        assert {s.name for s in specs if s.group == "vit_sgd"} == {
            f"vit_sgd_s{k}" for k in range(5)
        }
        adam = [s.config for s in specs if s.group == "vit"]
        sgd = [s.config for s in specs if s.group == "vit_sgd"]
        assert [c.seed for c in sgd] == [c.seed for c in adam]  # same seeds, same steps
        assert {(c.optimizer.name, c.optimizer.lr, c.optimizer.momentum) for c in sgd} == {
            ("sgd", SGD_LR, SGD_MOMENTUM)}  # fmt: skip
        assert {c.train.steps for c in sgd} == {c.train.steps for c in adam}
    toy = STUDY.preset("fast").toy
    assert (toy.n_ctx, toy.d_model, toy.n_seq, toy.lr) == (8, 8, 256, 0.05)
    assert toy.alphas == [1.0, 1e-1, 1e-2, 1e-3] and toy.strengths == [2.0, 1.0, 0.5]
    assert toy.loop.steps <= 20_000 and toy.loop.dtype == "float64"
    vit = STUDY.preset("fast").vit
    assert (vit.model.name, vit.model.n_layers, vit.model.d_model, vit.model.n_heads) == (
        "vit", 2, 32, 2,
    )  # fmt: skip
    assert (vit.optimizer.name, vit.optimizer.lr, vit.train.batch_size) == ("adam", 1e-3, 128)
    assert vit.monitor.probes == ["delta_spectrum"] and vit.monitor.schedule == "log"
    assert [s.config.seed for s in build_runs(STUDY.preset("fast"), seed=3)][:5] == [3, 4, 5, 6, 7]
    assert 1.0 in toy.alphas  # the control arm of t1 and t2 (the standard init)
    with pytest.raises(ValueError, match=r"alphas must be non-empty, each in \(0, 1\]"):
        ToyRun(loop=Loop(steps=1), alphas=[1.5])


def test_full_preset_is_fast_with_more_seeds_per_arm():
    """full (sized on calibration seeds >= 10000, protocol.py): fast's toy and ViT sizes, 10
    toy seeds (>= 5 control seeds fit even at the calibration rate of 2 stuck in 8) and 5
    seeds in each ViT arm, one ensemble per arm; the protocol's seed count matches."""
    fast, full = STUDY.preset("fast"), STUDY.preset("full")
    assert full.toy == fast.toy and full.vit == fast.vit and full.sgd_lr == fast.sgd_lr
    assert (full.toy_seeds, full.vit_seeds) == (TOY_FULL_SEEDS, VIT_FULL_SEEDS) == (10, 5)
    specs = build_runs(full, seed=1000)
    arms = {arm: [s for s in specs if re.fullmatch(rf"{arm}_s\d+", s.name)]
            for arm in ("toy", "vit", "vit_sgd")}  # fmt: skip
    assert {arm: len(v) for arm, v in arms.items()} == {"toy": 10, "vit": 5, "vit_sgd": 5}
    assert len(specs) == 20
    for arm, n in (("toy", 10), ("vit", 5), ("vit_sgd", 5)):
        assert [s.config.seed for s in arms[arm]] == list(range(1000, 1000 + n))
    assert {s.group for s in arms["vit"]} == {"vit"}
    assert {s.group for s in arms["vit_sgd"]} == {"vit_sgd"}
    assert {s.config.optimizer.name for s in arms["vit_sgd"]} == {"sgd"}
    assert STUDY.protocol.seeds["full"] == 5 and "full" in STUDY.protocol.presets


def test_smoke_preset_end_to_end(smoke_out):
    """The shared smoke run; its SIGKILL-resume is test_resume_every_study's, whose kill (at
    half the store writes) lands in a toy run after its checkpoint at step 250, as the kill
    test here did (it compares every stored row, the toy's loss traces included)."""
    outcome, out = smoke_out
    data = json.loads((out / "verdict.json").read_text(), parse_constant=pytest.fail)
    assert data["study"] == "gradual-rank" and data["preset"] == "smoke"
    assert [c["claim"].split(":")[0] for c in data["claims"]] == CLAIMS
    for claim in data["claims"]:  # computed; null = not measurable at smoke size (one α: t3)
        assert claim["measured"] is None or isinstance(claim["measured"], float)
        assert isinstance(claim["passed"], bool)
    assert [r["status"] for r in data["runs"]] == ["finished"] * 5
    figures = sorted(p.name for p in (out / "figures").glob("*.png"))
    assert figures == ["toy_entries.png", "toy_loss.png", "vit_delta_spectra.png", "vit_srank.png"]
    assert (out / "report.html").read_text().count("data:image/png;base64") == 4
    assert outcome.passed == all(c["passed"] for c in data["claims"])
