"""Study gated-rnn-attention: presets as S6 states them, ν_log's learning rate from the
parametrization, the smoke preset end to end (controls fail), and the per-seed verdict logic on
hand-written stores (known values in, known verdicts out)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from dynascope import studies
from dynascope.store import RunStore, load_run
from dynascope.studies.gated_rnn_attention import STUDY, ICLRun, build_runs
from dynascope.studies.gated_rnn_attention.analysis import _icl, _teacher, ratio_standard_error
from dynascope.studies.gated_rnn_attention.protocol import PROTOCOL
from dynascope.studies.gated_rnn_attention.runs import (
    UngatedLinearRNN,
    build_teacher_student,
    nu_learning_rate,
)
from dynascope.train import Loop, SeedStreams

G2_NMSE = PROTOCOL.claim("g2").threshold
G3_NMSE_CHANGE = PROTOCOL.claim("g3").threshold
SEEDS = 5


def test_presets_follow_s6():
    assert studies.get("gated-rnn-attention") is STUDY
    specs = build_runs(STUDY.preset("fast"))
    fast = {s.name: s.config for s in specs}
    assert sorted(n for n in fast if n.startswith("b_")) == [
        f"b_{arm}_h{h}_s{i}" for arm in ("teacher", "ungated") for h in (16, 32, 8)
        for i in range(5)
    ]  # fmt: skip
    assert PROTOCOL.seeds["fast"] == STUDY.preset("fast").seeds == 5
    # the ablation arms: the same runs with the gates removed, nothing else changed
    assert fast["b_teacher_h32_s0"].model_copy(update={"gating": False}) == fast["b_ungated_h32_s0"]
    assert (
        fast["c_icl_grnn_s0"].model_copy(update={"gating": False}) == fast["c_icl_grnn_ungated_s0"]
    )
    ts = fast["b_teacher_h32_s0"]
    assert (ts.d_model, ts.n_heads, ts.d_head, ts.n_ctx, ts.loop.steps, ts.batch_size, ts.lr) == (
        4, 1, 4, 12, 3000, 64, 1e-3,
    )  # fmt: skip
    assert ts.nu_lr == pytest.approx(nu_learning_rate(3000))
    icl = fast["c_icl_grnn_s0"]
    assert (icl.d_x, icl.n_points, icl.d_hidden, icl.loop.steps, icl.batch_size, icl.n_eval) == (
        4, 12, 64, 5000, 128, 10_000,
    )  # fmt: skip
    assert fast["c_icl_lsa_s0"].d_head == 5 and fast["c_icl_gd_s0"].model == "gd"
    groups = {s.name: s.group for s in specs}
    assert groups["b_teacher_h32_s1"] == "b_teacher_h32" and groups["c_icl_gd_s0"] is None
    assert groups["b_ungated_h8_s4"] == "b_ungated_h8"
    assert groups["c_icl_grnn_ungated_s2"] == "c_icl_grnn_ungated"
    assert [fast[f"a_construction_s{i}"].seed for i in range(3)] == [0, 1, 2]
    paper = build_runs(STUDY.preset("paper"), seed=3)
    models = {s.config.model for s in paper if s.name.startswith("c_")}
    assert models == {"grnn", "lsa", "gd", "lru", "lstm", "gru"}
    assert {s.config.seed for s in paper if s.name.startswith("c_")} == {3, 4, 5, 6, 7}
    with pytest.raises(ValueError, match="model"):
        ICLRun(model="transformer", loop=Loop(steps=1))


def test_nu_learning_rate_covers_the_polarization_distance_in_a_tenth_of_the_steps():
    travel = math.log(math.log(2.0)) - math.log(-math.log(0.95))  # |λ| = ½ -> 0.95
    assert travel == pytest.approx(2.6036, abs=1e-4)
    assert nu_learning_rate(3000) == pytest.approx(travel / 300)
    assert nu_learning_rate(3000) == pytest.approx(8.68e-3, abs=1e-5)


def test_smoke_preset_end_to_end(smoke_out):
    outcome, out = smoke_out
    data = json.loads((out / "verdict.json").read_text(), parse_constant=pytest.fail)
    assert [c["claim"].split(":")[0] for c in data["claims"]] == [
        "g1", "g1-f32", "g2", "g2-falls", "g3", "g4-lsa", "g4-gd",
    ]  # fmt: skip
    assert all(r["status"] == "finished" for r in data["runs"])
    g1 = data["claims"][0]
    assert g1["kind"] == "identity" and g1["control"] is None
    assert g1["measured"] < 1e-10  # the exact construction (3 seeds: inconclusive)
    for claim in data["claims"]:
        assert claim["legacy"] is False and claim["seeds"] == [0, 1, 2]
        assert claim["status"] == "inconclusive"  # fewer than 5 seeds
    assert data["protocol"]["sha256"] == PROTOCOL.sha256
    assert sorted(p.name for p in (out / "figures").glob("*.png")) == [
        "icl_weights.png",
        "lambda_histogram.png",
        "loss_vs_hidden.png",
        "prediction_agreement.png",
    ]
    grnn = load_run(out / "runs" / "c_icl_grnn_s0")
    assert grnn.tensors("eval.pred")[1].shape == (2, 200)  # untrained (step 0) and trained
    assert grnn.tensors("probe.r2")[1].shape == (2, 2)
    assert outcome.passed == all(c["passed"] for c in data["claims"])


def test_findings_read_their_controls_from_the_ungated_runs(smoke_out):
    outcome, out = smoke_out
    g1, g1_f32, g2, falls, g3, g4_lsa, g4_gd = outcome.claims
    assert g1.control is None and g1_f32.control is None  # identities
    assert "leaky construction" in g1.detail
    for verdict in (g2, falls, g3, g4_lsa, g4_gd):
        assert verdict.control.kind == "ablation" and verdict.control.n_seeds <= 3
    top = max(int(p.name.split("_h")[1].split("_")[0]) for p in (out / "runs").glob("b_ungated_*"))
    for i in range(3):
        ungated = load_run(out / "runs" / f"b_ungated_h{top}_s{i}")
        assert g2.control.per_seed[i] == pytest.approx(ungated.last("eval.nmse"))
        assert g2.control.per_seed[i] != g2.per_seed[i]
        grnn = load_run(out / "runs" / f"c_icl_grnn_ungated_s{i}")
        lsa = load_run(out / "runs" / f"c_icl_lsa_s{i}")
        assert g4_lsa.control.per_seed[i] == pytest.approx(
            grnn.last("eval.mse") / lsa.last("eval.mse")
        )


def test_the_ungated_rnn_is_linear_in_its_inputs():
    model = UngatedLinearRNN(3, 5).double()
    x, z = torch.randn(2, 4, 3, dtype=torch.float64), torch.randn(2, 4, 3, dtype=torch.float64)
    torch.testing.assert_close(model(2 * x + z), 2 * model(x) + model(z))
    assert model.W_in_g is None and model.W_out_x is None
    fast = {s.name: s.config for s in build_runs(STUDY.preset("fast"))}
    parts = build_teacher_student(fast["b_ungated_h8_s0"], SeedStreams(0))
    assert isinstance(parts.model, UngatedLinearRNN) and parts.model.d_hidden == 8


def test_g1_is_recomputed_from_the_stores(smoke_out):
    outcome, out = smoke_out
    per_seed = [
        load_run(out / "runs" / f"a_construction_s{i}").last("case0.float64.max_abs_err")
        for i in range(3)
    ]
    np.testing.assert_allclose(outcome.claims[0].per_seed, per_seed, rtol=1e-12)


def _teacher_run(path, hidden, seed, nmse, pruned, near1=1.0, untrained=None):
    untrained = 1.0 + 0.01 * seed + 0.001 * hidden if untrained is None else untrained
    with RunStore(path) as store:
        store.write_config({"seed": seed, "d_hidden": hidden, "n_heads": 1, "d_head": 4})
        store.log(0, {"eval.nmse": untrained})
        store.log(10, {"train.loss": 1.0, "eval.nmse": nmse, "eval.nmse_pruned": pruned,
                       "eval.nmse_pruned_near1": near1, "pruned.count": 2.0})  # fmt: skip
        store.log(10, {"lambda.near_0": 0.5, "lambda.near_1": 0.25, "lambda.mid": 0.25})
        store.set_status(10, "finished")
    return load_run(path)


def _teacher_runs(tmp_path, values):
    """``values``: hidden -> per seed (nmse, pruned)."""
    return {
        h: {s: _teacher_run(tmp_path / f"h{h}_s{s}", h, s, *v) for s, v in enumerate(vs)}
        for h, vs in values.items()
    }


def _ungated_runs(tmp_path, nmse=0.9):
    """The ablation: no size fits, the loss flat in size (trained: below step 0's 1.35)."""
    values = {h: [(nmse + 0.001 * s, nmse) for s in range(SEEDS)] for h in (8, 16, 32)}
    runs = _teacher_runs(tmp_path / "ungated", values)
    return runs


def test_teacher_verdicts_on_known_values(tmp_path):
    good = [(0.005, 0.006)] * SEEDS
    ungated = _ungated_runs(tmp_path)
    big = {8: [(0.5, 0.5)] * SEEDS, 16: [(0.1, 0.1)] * SEEDS}
    runs = _teacher_runs(tmp_path / "a", {**big, 32: good})
    (g2, falls, g3), rows = _teacher(runs, ungated, 16)
    assert g2.status == "held" and g2.measured == pytest.approx(0.005) and g2.threshold == G2_NMSE
    slope = np.polyfit(np.log([8, 16, 32]), np.log([0.5, 0.1, 0.005]), 1)[0]
    assert falls.status == "held" and falls.measured == pytest.approx(slope, rel=1e-9)
    assert g3.status == "held" and g3.measured == pytest.approx(0.001)
    assert g3.threshold == G3_NMSE_CHANGE and g3.direction == "<="
    for verdict in (g2, falls, g3):
        assert verdict.control.status == "not held", verdict.claim
    # the controls are the ungated students': their nmse at 2·n_c and their (flat) slope
    assert g2.control.per_seed == pytest.approx({s: 0.9 + 0.001 * s for s in range(SEEDS)})
    assert abs(falls.control.measured) < 1e-9
    assert {r["arm"] for r in rows} == {"gated", "ungated"}
    assert PROTOCOL.check([g2, falls, g3])
    # an ablation that fits as well as the gated student: the control holds, inconclusive
    (g2, _, _), _ = _teacher(runs, _ungated_runs(tmp_path / "fits", nmse=0.004), 16)
    assert g2.control.status == "held" and g2.status == "inconclusive"
    # the loss does not fall over the sizes: g2-falls fails (slope > -0.5)
    flat = _teacher_runs(tmp_path / "b", {8: [(0.006, 0.006)] * SEEDS,
                                          16: [(0.005, 0.005)] * SEEDS, 32: good})  # fmt: skip
    (_, falls, _), _ = _teacher(flat, ungated, 16)
    assert falls.status == "not held" and falls.measured > -0.5
    # a near-zero loss that pruning lifts to 0.03: the absolute change 0.03 fails g3
    bad = [(0.0005, 0.0305)] * SEEDS
    runs = _teacher_runs(tmp_path / "c", {**big, 32: bad})
    (_, _, g3), _ = _teacher(runs, ungated, 16)
    assert g3.status == "not held" and g3.measured == pytest.approx(0.03)
    # one seed's student does not fit its teacher: g3 is inconclusive, never held
    unfit = [(0.2, 0.2)] + good[1:]
    runs = _teacher_runs(tmp_path / "d", {**big, 32: unfit})
    (_, _, g3), _ = _teacher(runs, ungated, 16)
    assert g3.status == "inconclusive" and "precondition" in g3.reason
    # three seeds: inconclusive whatever the values
    three = {h: dict(list(v.items())[:3]) for h, v in _teacher_runs(
        tmp_path / "e", {**big, 32: good}).items()}  # fmt: skip
    (g2, _, _), _ = _teacher(three, ungated, 16)
    assert g2.status == "inconclusive"


def _icl_run(path, model, seed, pred, grad, mse, untrained=4.0, y_power=4.0):
    with RunStore(path) as store:
        store.write_config({"seed": seed, "model": model})
        store.log(0, {"eval.mse": untrained, "eval.y_power": y_power})
        store.log(5, {"eval.mse": mse, "eval.y_power": y_power, "eval.pred": torch.tensor(pred),
                      "eval.grad": torch.tensor(grad)})  # fmt: skip
        store.set_status(5, "finished")
    return load_run(path)


def test_icl_verdicts_and_agreement_on_known_values(tmp_path):
    ref = np.array([1.0, -1.0, 2.0, 0.5])
    grad = np.array([[1.0, 0.0], [0.0, 1.0]])
    by_seed = {
        s: {
            "grnn": _icl_run(tmp_path / f"g{s}", "grnn", s, 1.1 * ref, -grad, 1.02),
            "lsa": _icl_run(tmp_path / f"l{s}", "lsa", s, ref, grad, 1.0),
            "gd": _icl_run(tmp_path / f"d{s}", "gd", s, ref, grad, 0.9),
            "grnn_ungated": _icl_run(tmp_path / f"u{s}", "grnn", s, 0 * ref, grad, 3.0),
        }
        for s in range(SEEDS)
    }
    (lsa, gd), rows = _icl(by_seed)
    assert lsa.status == "held" and lsa.measured == pytest.approx(1.02)
    assert gd.status == "not held" and gd.measured == pytest.approx(1.02 / 0.9)
    # the control: the ungated RNN's MSE over the reference's, not the untrained GRNN's
    assert lsa.control.measured == pytest.approx(3.0) and lsa.control.status == "not held"
    assert lsa.precondition.met and lsa.precondition.measured == pytest.approx(0.255)
    row = next(r for r in rows if r["model"] == "grnn")
    assert row["gap_vs_lsa"] == pytest.approx(0.01)  # (0.1 ref)² / ref²
    assert row["grad_cos_vs_gd"] == pytest.approx(-1.0)
    assert math.isnan(row["probe.r2_mean"])  # not logged: NaN, not a crash
    assert "standard error" in gd.detail  # eval-set noise of the ratio (NaN here: no eval.y)
    # a reference that predicts no better than 0 cannot support the claim: inconclusive
    by_seed[0]["lsa"] = _icl_run(tmp_path / "l_bad", "lsa", 0, ref, grad, 1.0, y_power=1.5)
    (lsa, _), _ = _icl(by_seed)
    assert lsa.status == "inconclusive"
    # the gated RNN itself did not learn (MSE ~ the zero predictor's): inconclusive
    by_seed[0]["lsa"] = _icl_run(tmp_path / "l0", "lsa", 0, ref, grad, 1.0)
    by_seed[1]["grnn"] = _icl_run(tmp_path / "g_bad", "grnn", 1, ref, grad, 3.9)
    (lsa, _), _ = _icl(by_seed)
    assert lsa.status == "inconclusive" and not lsa.precondition.met


def test_ratio_standard_error_matches_the_spread_over_fresh_eval_sets():
    """Oracle: the standard deviation of the MSE ratio over 4000 independent eval sets of 500
    sequences (the model's errors correlated with the reference's, as for two predictors of one
    target); the delta-method standard error of one set agrees within 10 %."""
    rng = np.random.default_rng(0)
    n, sets = 500, 4000
    ref_err = rng.normal(0.0, 1.0, (sets, n))
    model_err = 0.9 * ref_err + rng.normal(0.0, 0.5, (sets, n))
    y = rng.normal(0.0, 1.0, (sets, n))
    ratios = (model_err**2).mean(1) / (ref_err**2).mean(1)
    errors = [ratio_standard_error(y[i] + model_err[i], y[i] + ref_err[i], y[i])
              for i in range(200)]  # fmt: skip
    assert np.mean(errors) == pytest.approx(np.std(ratios, ddof=1), rel=0.1)
    # identical predictors: the ratio is exactly 1 on every set
    assert ratio_standard_error(y[0] + ref_err[0], y[0] + ref_err[0], y[0]) == pytest.approx(
        0.0, abs=1e-12
    )
    assert math.isnan(ratio_standard_error(np.ones(1), np.zeros(1), np.zeros(1)))
