"""Study weight-decay-low-rank: the toy against theory, presets, and the smoke preset end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from dynascope import studies
from dynascope.store import load_run
from dynascope.studies.weight_decay_low_rank import STUDY, ToyRun, build_runs
from dynascope.studies.weight_decay_low_rank.analysis import (
    _toy,
    fit_log_slope,
    settled_step,
)
from dynascope.studies.weight_decay_low_rank.runs import build_toy
from dynascope.tasks import MatrixFactorization
from dynascope.train import Loop
from dynascope.train.runs import run_members


def _toy_config(seed: int = 0, **fields) -> ToyRun:
    return ToyRun(seed=seed, loop=Loop(steps=1000, dtype="float64", checkpoint_every=1000),
                  **fields)  # fmt: skip


def _train_toys(root, penalty: str) -> list:
    runs = []
    for seed in range(5):  # the contract's five seeds
        config = _toy_config(seed, fine_lambdas=0 if seed else 41, penalty=penalty)
        run_members(build_toy, config, root / f"{penalty}_s{seed}")
        runs.append(load_run(root / f"{penalty}_s{seed}"))
    return runs


@pytest.fixture(scope="module")
def toy_runs(tmp_path_factory):
    return _train_toys(tmp_path_factory.mktemp("toy"), "factors")


@pytest.fixture(scope="module")
def product_runs(tmp_path_factory):
    """The ablation: the same λ on the product ABᵀ instead of the factors."""
    return _train_toys(tmp_path_factory.mktemp("product"), "product")


@pytest.fixture(scope="module")
def toy_run(toy_runs):
    return toy_runs[1]


def test_engine_toy_equals_the_closed_form_gd_loop(toy_run):
    """The engine's custom step reproduces plain GD on the task (same initial factors) exactly."""
    cfg = _toy_config(1, fine_lambdas=0)
    task = MatrixFactorization()
    lam = torch.tensor(cfg.lambdas, dtype=torch.float64)
    from dynascope.train import SeedStreams

    A0, B0 = task.init_factors(1, SeedStreams(cfg.seed).generator("factors"), std=cfg.init_std)
    A, B = A0.expand(len(lam), -1, -1).clone(), B0.expand(len(lam), -1, -1).clone()
    for _ in range(cfg.loop.steps):
        A, B = task.gradient_step(A, B, lam, cfg.lr)
    from dynascope.probes.spectral import balancedness, factor_singular_values

    torch.testing.assert_close(
        torch.from_numpy(toy_run.tensors("balancedness")[1][-1]), balancedness(A, B),
        rtol=1e-12, atol=1e-300)  # fmt: skip
    torch.testing.assert_close(
        torch.from_numpy(toy_run.tensors("sigma")[1][-1]), factor_singular_values(A, B),
        rtol=0, atol=1e-12)  # fmt: skip


def test_toy_balancedness_rate_matches_theory(toy_run):
    """Fitted log-slope within 5% of gradient flow's −2ηλ and within 0.5% of GD's log(1 − 2ηλ)."""
    cfg = _toy_config()
    lambdas = toy_run.tensors("lambdas")[1][0]
    _, bal = toy_run.tensors("balancedness")
    _, loss = toy_run.tensors("loss")
    for j, lam in enumerate(lambdas):
        if lam == 0:
            assert bal[-1, j] / bal[0, j] > 0.5
            continue
        slope = fit_log_slope(bal[:, j], settled_step(loss[:, j], 1e-6), 1e-12)
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


def test_toy_verdicts_hold_over_five_seeds_and_their_ablations_fail(
    toy_runs, product_runs, tmp_path
):
    verdicts, figures, rows = _toy(toy_runs, product_runs, tmp_path)
    assert [v.status for v in verdicts] == ["held"] * 3
    assert [v.control.status for v in verdicts] == ["not held"] * 3
    assert all(len(v.per_seed) == 5 and v.n_seeds == 5 for v in verdicts)
    assert all(v.control.kind == "ablation" and v.control.n_seeds == 5 for v in verdicts)
    assert all(p.is_file() for p in figures)
    # the product penalty: balancedness conserved (rate ratio ~1 away), gap open, shrinkage
    # d/(1 + cλ) instead of the soft threshold (>= 0.02 off for the gated modes of the grid)
    for v, bound in zip(verdicts, (0.5, 1e-3, 0.02), strict=True):
        assert min(v.control.per_seed.values()) > bound


def test_product_penalty_conserves_balancedness_and_shrinks(product_runs):
    """Theory of the ablation (tasks/matrix_factorization.py): with λ on ABᵀ the loss depends on
    ABᵀ alone, so gradient flow conserves AᵀA − BᵀB (GD drifts by O(η²)), and σ_i ends at
    d_i / (1 + cλ)."""
    run = product_runs[0]
    lambdas = run.tensors("lambdas")[1][0]
    _, bal = run.tensors("balancedness")
    _, sigma = run.tensors("sigma")
    np.testing.assert_allclose(bal[-1] / bal[0], 1.0, rtol=0.2)  # vs e^{-2ηλT} ≈ 0 at λ = 0.8
    d = np.array(sorted(MatrixFactorization().diag, reverse=True))
    expected = d[None, :] / (1 + 0.5 * lambdas[:, None])
    np.testing.assert_allclose(sigma[-1], expected, atol=1e-6)


def test_fit_is_nan_without_enough_points():
    assert math.isnan(fit_log_slope(np.ones(5), 0, 1e-12))


def test_presets_validate_and_match_the_registry():
    assert "weight-decay-low-rank" in studies.names()
    assert studies.get("weight-decay-low-rank") is STUDY
    for name in ("smoke", "fast", "paper"):
        specs = build_runs(STUDY.preset(name))
        assert specs[0].name == "a_toy_s0"
        assert {s.name for s in specs} >= {"c_lm_uniform_s0", "c_lm_decoupled_s2",
                                           "c_lm_control_s2", "a_product_s2"}  # fmt: skip
    with pytest.raises(ValueError, match="preset must be one of smoke, fast, paper"):
        STUDY.preset("huge")
    with pytest.raises(ValueError, match="unknown study 'nope'"):
        studies.get("nope")


def test_fast_preset_conditions_differ_only_in_what_they_study():
    specs = {s.name: s for s in build_runs(STUDY.preset("fast"))}
    runs = {name: spec.config for name, spec in specs.items() if not name.startswith("a_")}
    uniform, decoupled = runs["c_lm_uniform_s0"], runs["c_lm_decoupled_s0"]
    assert uniform.optimizer.weight_decay.attention == 1.0
    assert decoupled.optimizer.weight_decay.attention == 0.0
    assert uniform.model_copy(update={"name": "x", "optimizer": None}) == decoupled.model_copy(
        update={"name": "x", "optimizer": None}
    )
    decay = {n: (r.optimizer.weight_decay.attention, r.optimizer.weight_decay.matrices)
             for n, r in runs.items() if n.startswith("b_") and n.endswith("_s0")}  # fmt: skip
    assert decay == {"b_recall_wd0_s0": (0.0, 0.01), "b_recall_wd1_s0": (1.0, 0.01),
                     "b_recall_control_s0": (0.0, 1.0)}  # fmt: skip
    control = runs["c_lm_control_s0"].optimizer.weight_decay
    assert (control.attention, control.matrices) == (1.0, 0.0)  # decay lifted off the others
    # five seeds per arm, one ensemble per arm, the same seeds in every arm
    groups = {}
    for spec in specs.values():
        groups.setdefault(spec.group or spec.name, []).append(spec.config.seed)
    assert all(seeds == list(range(5)) for name, seeds in groups.items()
               if not name.startswith("a_"))  # fmt: skip
    for arm in ("a_toy", "a_product"):
        toys = [s.config for s in specs.values() if s.name.startswith(arm)]
        assert sorted(c.seed for c in toys) == list(range(5))
    assert {s.config.penalty for s in specs.values() if s.name.startswith("a_product")} == {
        "product"
    }


def test_smoke_preset_end_to_end(smoke_out):
    outcome, out = smoke_out
    data = json.loads((out / "verdict.json").read_text())
    assert data["study"] == "weight-decay-low-rank" and data["preset"] == "smoke"
    assert [c["claim"].split(":")[0] for c in data["claims"]] == [
        "a1",
        "a2",
        "a3",
        "b-qk",
        "b-ov",
        "c",
    ]
    json.loads((out / "verdict.json").read_text(), parse_constant=pytest.fail)  # strict
    for claim in data["claims"]:  # every verdict is computed (null = not measurable at smoke size)
        assert claim["measured"] is None or isinstance(claim["measured"], float)
        assert isinstance(claim["passed"], bool)
        assert claim["status"] in ("held", "not held", "inconclusive") and not claim["legacy"]
        assert len(claim["seeds"]) == 3 and claim["control"]["status"] is not None
        assert claim["control"]["kind"] == "ablation" and claim["n_seeds"] <= 3
        assert claim["status"] == "inconclusive"  # three smoke seeds: below the contract's five
    assert data["protocol"]["sha256"] == STUDY.protocol.sha256
    assert len(data["protocol"]["amendments"]) == len(STUDY.protocol.amendments)
    assert all(r["status"] == "finished" for r in data["runs"])
    assert (out / "report.html").read_text().count("data:image/png;base64") == 5
    assert len(list((out / "figures").glob("*.png"))) == 5
    assert outcome.passed == all(c["passed"] for c in data["claims"])


def test_a_run_directory_is_refused_as_study_directory(tmp_path):
    (tmp_path / "metrics.sqlite").touch()
    with pytest.raises(ValueError, match="is a run directory"):
        STUDY.run(preset="smoke", out=tmp_path)
