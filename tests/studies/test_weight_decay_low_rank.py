"""Study weight-decay-low-rank: the toy against theory, presets, and the smoke preset end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from dynascope import studies
from dynascope.store import load_run
from dynascope.studies.weight_decay_low_rank import (
    STUDY,
    ToyConfig,
    _analyze_toy,
    _fit_log_slope,
    _settled_step,
    build_runs,
    run_factor_toy,
)
from dynascope.tasks import MatrixFactorization


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("toy") / "a_toy"
    run_factor_toy(ToyConfig(fine_lambdas=0), path)
    return load_run(path)


def test_toy_balancedness_rate_matches_theory(toy_run):
    """Fitted log-slope within 5% of gradient flow's −2ηλ and within 0.5% of GD's log(1 − 2ηλ)."""
    cfg = ToyConfig()
    lambdas = toy_run.tensors("lambdas")[1][0]
    _, bal = toy_run.tensors("balancedness")
    _, loss = toy_run.tensors("loss")
    for j, lam in enumerate(lambdas):
        if lam == 0:
            assert bal[-1, j] / bal[0, j] > 0.5
            continue
        slope = _fit_log_slope(bal[:, j], _settled_step(loss[:, j], 1e-6), 1e-12)
        assert abs(slope / (-2 * cfg.lr * lam) - 1) < 0.05
        assert abs(slope / math.log(1 - 2 * cfg.lr * lam) - 1) < 5e-3


def test_one_gd_step_obeys_the_exact_imbalance_identity():
    """M' = (1 − 2ηλ) M + η² (XᵀX − YᵀY) with X, Y the gradients (derivation in the module)."""
    task = MatrixFactorization()
    A, B = task.init_factors(3, torch.Generator().manual_seed(1))
    lam = torch.tensor([0.0, 0.3, 0.9], dtype=torch.float64)
    eta = 0.05
    X, Y = task.gradients(A, B, lam)
    A1, B1 = task.gradient_step(A, B, lam, eta)
    M = A.mT @ A - B.mT @ B
    M1 = A1.mT @ A1 - B1.mT @ B1
    expected = (1 - 2 * eta * lam)[:, None, None] * M + eta**2 * (X.mT @ X - Y.mT @ Y)
    torch.testing.assert_close(M1, expected, rtol=0, atol=1e-12)


def test_toy_verdicts_pass_on_the_full_toy(toy_run, tmp_path):
    verdicts, figures, rows = _analyze_toy(toy_run, tmp_path)
    assert [v.passed for v in verdicts] == [True, True, True]
    assert all(p.is_file() for p in figures)


def test_fit_is_nan_without_enough_points():
    assert math.isnan(_fit_log_slope(np.ones(5), 0, 1e-12))


def test_presets_validate_and_match_the_registry():
    assert "weight-decay-low-rank" in studies.names()
    assert studies.get("weight-decay-low-rank") is STUDY
    for name in ("smoke", "fast", "paper"):
        specs = build_runs(STUDY.preset(name))
        assert specs[0].name == "a_toy"
        assert {s.name for s in specs} >= {"c_lm_uniform", "c_lm_decoupled"}
    with pytest.raises(ValueError, match="preset must be one of smoke, fast, paper"):
        STUDY.preset("huge")
    with pytest.raises(ValueError, match="unknown study 'nope'"):
        studies.get("nope")


def test_fast_preset_conditions_differ_only_in_what_they_study():
    specs = {s.name: s.config for s in build_runs(STUDY.preset("fast"))}
    uniform, decoupled = specs["c_lm_uniform"], specs["c_lm_decoupled"]
    assert uniform.optimizer.weight_decay.attention == 1.0
    assert decoupled.optimizer.weight_decay.attention == 0.0
    assert uniform.model_copy(update={"name": "x", "optimizer": None}) == decoupled.model_copy(
        update={"name": "x", "optimizer": None}
    )
    lambdas = [specs[n].optimizer.weight_decay.attention for n in specs if n.startswith("b_")]
    assert lambdas == [0.0, 0.01, 0.1, 1.0]


def test_smoke_preset_end_to_end(tmp_path):
    (tmp_path / "runs" / "stale_run").mkdir(parents=True)  # a re-run replaces old runs
    outcome = STUDY.run(preset="smoke", out=tmp_path)
    assert not (tmp_path / "runs" / "stale_run").exists()
    data = json.loads((tmp_path / "verdict.json").read_text())
    assert data["study"] == "weight-decay-low-rank" and data["preset"] == "smoke"
    assert [c["claim"].split(":")[0] for c in data["claims"]] == [
        "a1",
        "a2",
        "a3",
        "b-qk",
        "b-ov",
        "c",
    ]
    json.loads((tmp_path / "verdict.json").read_text(), parse_constant=pytest.fail)  # strict
    for claim in data["claims"]:  # every verdict is computed (null = not measurable at smoke size)
        assert claim["measured"] is None or isinstance(claim["measured"], float)
        assert isinstance(claim["passed"], bool)
    assert all(r["status"] == "finished" for r in data["runs"])
    assert (tmp_path / "report.html").read_text().count("data:image/png;base64") == 5
    assert len(list((tmp_path / "figures").glob("*.png"))) == 5
    assert outcome.passed == all(c["passed"] for c in data["claims"])


def test_a_run_directory_is_refused_as_study_directory(tmp_path):
    (tmp_path / "metrics.sqlite").touch()
    with pytest.raises(ValueError, match="is a run directory"):
        STUDY.run(preset="smoke", out=tmp_path)
