"""Study gated-rnn-attention: presets as S6 states them, the smoke preset end to end, and the
verdict logic on hand-written stores (known values in, known verdicts out)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from dynascope import studies
from dynascope.store import RunStore, load_run
from dynascope.studies.gated_rnn_attention import (
    G2_NMSE,
    G3_PRUNE_RATIO,
    STUDY,
    ICLConfig,
    TeacherStudentConfig,
    _analyze_icl,
    _analyze_teacher,
    build_runs,
)


def test_presets_follow_s6():
    assert studies.get("gated-rnn-attention") is STUDY
    fast = {s.name: s.config for s in build_runs(STUDY.preset("fast"))}
    assert sorted(n for n in fast if n.startswith("b_")) == [
        "b_teacher_h16_s0",
        "b_teacher_h32_s0",
        "b_teacher_h8_s0",
    ]
    ts = fast["b_teacher_h32_s0"]
    assert (ts.d_model, ts.n_heads, ts.d_head, ts.n_ctx, ts.steps, ts.batch_size, ts.lr) == (
        4,
        1,
        4,
        12,
        3000,
        64,
        1e-3,
    )
    icl = fast["c_icl_grnn_s0"]
    assert (icl.d_x, icl.n_points, icl.d_hidden, icl.steps, icl.batch_size, icl.n_eval) == (
        4,
        12,
        64,
        5000,
        128,
        10_000,
    )
    assert fast["c_icl_lsa_s0"].d_head == 5 and fast["c_icl_gd_s0"].model == "gd"
    paper = build_runs(STUDY.preset("paper"), seed=3)
    assert {s.config.model for s in paper if s.name.startswith("c_")} == {
        "grnn",
        "lsa",
        "gd",
        "lru",
        "lstm",
        "gru",
    }
    assert {s.config.seed for s in paper if s.name.startswith("c_")} == {3, 4, 5, 6, 7}
    with pytest.raises(ValueError, match="model"):
        ICLConfig(model="transformer")


def test_smoke_preset_end_to_end(tmp_path):
    outcome = STUDY.run(preset="smoke", out=tmp_path)
    data = json.loads((tmp_path / "verdict.json").read_text(), parse_constant=pytest.fail)
    assert [c["claim"].split(":")[0] for c in data["claims"]] == [
        "g1",
        "g1-f32",
        "g2",
        "g3",
        "g4-lsa",
        "g4-gd",
    ]
    assert all(r["status"] == "finished" for r in data["runs"])
    assert (
        data["claims"][0]["passed"] and data["claims"][0]["measured"] < 1e-10
    )  # exact construction
    for claim in data["claims"]:
        assert isinstance(claim["measured"], float) and isinstance(claim["passed"], bool)
    assert sorted(p.name for p in (tmp_path / "figures").glob("*.png")) == [
        "icl_weights.png",
        "lambda_histogram.png",
        "loss_vs_hidden.png",
        "prediction_agreement.png",
    ]
    grnn = load_run(tmp_path / "runs" / "c_icl_grnn_s0")
    assert grnn.tensors("eval.pred")[1].shape == (1, 200)
    assert grnn.tensors("probe.r2")[1].shape == (1, 2)
    assert outcome.passed == all(c["passed"] for c in data["claims"])


def _teacher_run(path, hidden, nmse, pruned):
    with RunStore(path) as store:
        store.write_config(TeacherStudentConfig(d_hidden=hidden).model_dump(mode="json"))
        store.log(
            10,
            {"train.nmse": 1.0, "eval.nmse": nmse, "eval.nmse_pruned": pruned, "pruned.count": 2.0},
        )
        store.log(10, {"lambda.near_0": 0.5, "lambda.near_1": 0.25, "lambda.mid": 0.25})
        store.set_status(10, "finished")
    return load_run(path)


def test_teacher_verdicts_on_known_values(tmp_path):
    runs = {
        h: [_teacher_run(tmp_path / f"h{h}", h, n, n * r)]
        for h, n, r in ((8, 0.5, 1.0), (16, 0.1, 1.0), (32, 0.005, 1.05))
    }
    mult = {8: 0.5, 16: 1.0, 32: 2.0}
    (g2, g3), rows = _analyze_teacher(runs, mult)
    assert g2.passed and g2.measured == pytest.approx(0.005) and g2.threshold == G2_NMSE
    assert g3.passed and g3.measured == pytest.approx(1.05) and g3.threshold == G3_PRUNE_RATIO
    runs[16] = [_teacher_run(tmp_path / "h16b", 16, 0.001, 1.0)]  # not falling: 0.5, 0.001, 0.005
    (g2, _), _ = _analyze_teacher(runs, mult)
    assert not g2.passed and "falling: False" in g2.detail
    runs[32] = [_teacher_run(tmp_path / "h32b", 32, 0.0005, 2.0 / 0.0005)]
    (_, g3), _ = _analyze_teacher(runs, mult)
    assert not g3.passed


def _icl_run(path, model, pred, grad, mse):
    with RunStore(path) as store:
        store.write_config(ICLConfig(model=model).model_dump(mode="json"))
        store.log(
            5, {"eval.mse": mse, "eval.pred": torch.tensor(pred), "eval.grad": torch.tensor(grad)}
        )
        store.set_status(5, "finished")
    return load_run(path)


def test_icl_verdicts_and_agreement_on_known_values(tmp_path):
    ref = np.array([1.0, -1.0, 2.0, 0.5])
    grad = np.array([[1.0, 0.0], [0.0, 1.0]])
    runs = {
        "grnn": _icl_run(tmp_path / "g", "grnn", 1.1 * ref, -grad, 1.02),
        "lsa": _icl_run(tmp_path / "l", "lsa", ref, grad, 1.0),
        "gd": _icl_run(tmp_path / "d", "gd", ref, grad, 0.9),
    }
    (lsa, gd), rows = _analyze_icl([runs])
    assert lsa.passed and lsa.measured == pytest.approx(1.02)
    assert not gd.passed and gd.measured == pytest.approx(1.02 / 0.9)
    row = next(r for r in rows if r["model"] == "grnn")
    assert row["gap_vs_lsa"] == pytest.approx(0.01)  # (0.1 ref)² / ref²
    assert row["grad_cos_vs_gd"] == pytest.approx(-1.0)
    assert math.isnan(row["probe.r2_mean"])  # not logged: NaN, not a crash
