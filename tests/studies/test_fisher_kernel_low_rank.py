"""Study fisher-kernel-low-rank (S14): the runner's oracles, verdict logic on hand-built stores,
presets, and the smoke preset end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError

from dynascope import studies
from dynascope.store import RunStore, load_run
from dynascope.studies.fisher_kernel_low_rank import (
    STUDY,
    FisherKernelRunConfig,
    analyze,
    build_runs,
    run_fisher_kernel,
)


def test_a_sketch_covering_the_scored_set_reproduces_the_exact_spectrum(tmp_path):
    """k + p ≥ N ≥ rank(Φ): randomized σ² = exact top-k eigenvalues, cosines 1, and the scored
    points re-embedded by JVPs equal U_k Σ_k (S14 smoke oracles). float64: 1e-8 relative."""
    cfg = FisherKernelRunConfig(
        hidden=[8], steps=20, log_every=5, n_scored=12, k=4, oversampling=8, chunk_size=5
    )
    run_fisher_kernel(cfg, tmp_path / "run")
    run = load_run(tmp_path / "run")
    assert run.status == "finished"
    evals = run.tensors("nfk.eigenvalues")[1][-1]
    sq = run.tensors("nfk.randomized_sq_sv")[1][-1]
    np.testing.assert_allclose(sq, evals[:4], rtol=1e-8)
    np.testing.assert_allclose(run.tensors("nfk.cosines")[1][-1], np.ones(4), rtol=0, atol=1e-8)
    assert run.last("nystrom.max_error") < 1e-8
    assert np.all(np.diff(evals) <= 1e-12)  # descending
    assert run.last("f1.energy_fraction") == pytest.approx(evals[:4].sum() / evals.sum())
    assert run.last("n_params") == 64 * 8 + 8 + 8 * 10 + 10


def test_the_cnn_runs_through_the_same_matrix_free_path(tmp_path):
    """SimpleCNN (paper preset's second model): the covering-sketch oracle holds as for the MLP."""
    cfg = FisherKernelRunConfig(
        model="cnn", cnn_arch="3-avg-4", steps=5, n_scored=8, k=3, oversampling=5
    )
    run_fisher_kernel(cfg, tmp_path / "cnn")
    run = load_run(tmp_path / "cnn")
    assert run.status == "finished"
    np.testing.assert_allclose(run.tensors("nfk.cosines")[1][-1], np.ones(3), rtol=0, atol=1e-8)
    assert run.last("n_params") == 9 * 3 + 9 * 3 * 4 + 4 * 10  # bias-free
    assert run.last("nystrom.max_error") < 1e-8


def test_conditional_score_with_sampled_labels_and_identity_fisher(tmp_path):
    """score='conditional' (y ~ p(.|x)), no centring, D = I: the same exactness oracle."""
    cfg = FisherKernelRunConfig(
        hidden=[6],
        steps=5,
        n_scored=9,
        k=2,
        oversampling=7,
        score="conditional",
        center=False,
        fisher="identity",
    )
    run_fisher_kernel(cfg, tmp_path / "cond")
    run = load_run(tmp_path / "cond")
    assert run.status == "finished"
    evals = run.tensors("nfk.eigenvalues")[1][-1]
    np.testing.assert_allclose(run.tensors("nfk.randomized_sq_sv")[1][-1], evals[:2], rtol=1e-8)
    assert run.last("nystrom.max_error") < 1e-8


def _fake_run(path, k, energy, cosine, acc_nfk, acc_pen):
    cfg = FisherKernelRunConfig(k=k)
    with RunStore(path) as store:
        store.write_config(cfg.model_dump(mode="json"))
        store.log(1, {"train.loss": 1.0})
        store.log(
            2,
            {
                "f1.energy_fraction": energy,
                "f2.mean_cosine": cosine,
                "probe.nfk.accuracy": acc_nfk,
                "probe.penultimate.accuracy": acc_pen,
            },
        )
        store.set_status(2, "finished")
    return load_run(path)


def test_verdicts_read_the_k32_runs_and_compare_with_the_frozen_thresholds(tmp_path):
    runs = {
        "nfk_mlp_k16": _fake_run(tmp_path / "a", 16, 0.5, 0.5, 0.1, 0.9),  # not gated: k != 32
        "nfk_mlp_k32": _fake_run(tmp_path / "b", 32, 0.91, 0.989, 0.95, 0.97),
    }
    out = analyze(runs, tmp_path / "figures")
    f1, f2, f3 = out.verdicts
    assert (f1.measured, f1.threshold, f1.passed) == (0.91, 0.9, True)
    assert (f2.measured, f2.threshold, f2.passed) == (0.989, 0.99, False)
    assert f3.measured == pytest.approx(-0.02) and f3.threshold == -0.02
    assert all(p.is_file() for p in out.figures)
    runs["nfk_mlp_k32"] = _fake_run(tmp_path / "c", 32, 0.89, 0.995, 0.90, 0.97)
    f1, f2, f3 = analyze(runs, tmp_path / "figures").verdicts
    assert (f1.passed, f2.passed, f3.passed) == (False, True, False)


def test_config_rejects_more_scored_points_than_training_images():
    with pytest.raises(ValidationError, match="n_scored must be <= n_train"):
        FisherKernelRunConfig(n_train=100, n_scored=200)
    with pytest.raises(ValidationError, match="k must be <= n_scored"):
        FisherKernelRunConfig(n_scored=10, k=11)
    with pytest.raises(ValidationError, match="score"):
        FisherKernelRunConfig(score="elbo")


def test_presets_validate_and_match_the_registry():
    assert studies.get("fisher-kernel-low-rank") is STUDY
    fast = build_runs(STUDY.preset("fast"))
    assert [s.name for s in fast] == ["nfk_mlp_k32"]
    cfg = fast[0].config
    assert (cfg.hidden, cfg.n_scored, cfg.k, cfg.oversampling, cfg.power_iters) == (
        [64, 64],
        500,
        32,
        10,
        2,
    )
    paper = build_runs(STUDY.preset("paper"))
    assert [(s.config.model, s.config.k) for s in paper] == [
        (m, k) for m in ("mlp", "cnn") for k in (16, 32, 64, 128)
    ]


def test_smoke_preset_end_to_end(tmp_path):
    outcome = STUDY.run(preset="smoke", out=tmp_path)
    data = json.loads((tmp_path / "verdict.json").read_text(), parse_constant=pytest.fail)
    assert [c["claim"].split(":")[0] for c in data["claims"]] == ["f1", "f2", "f3"]
    assert all(r["status"] == "finished" for r in data["runs"])
    for claim in data["claims"]:
        assert isinstance(claim["measured"], float) and isinstance(claim["passed"], bool)
    assert len(list((tmp_path / "figures").glob("*.png"))) == 2
    assert outcome.passed == all(c["passed"] for c in data["claims"])
