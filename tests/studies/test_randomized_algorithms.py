"""Study randomized-algorithms: verdicts on hand-built stores, smoke end to end, tiny runners."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from dynascope.store import RunStore, load_run
from dynascope.studies._grid_world_run import run_grid_world
from dynascope.studies._randomized_runs import run_colouring
from dynascope.studies.randomized_algorithms import (
    STUDY,
    ColouringRunConfig,
    GridWorldRunConfig,
    _main_table,
    _verdicts,
    analyze,
    build_runs,
    fast_with_colouring,
)


def _planted(tmp_path, values: dict[str, dict[str, float]]):
    runs = {}
    for spec in build_runs(STUDY.preset("smoke")):
        model = spec.name.removeprefix("recall_").rsplit("_s", 1)[0]
        with RunStore(tmp_path / spec.name) as store:
            store.write_config(spec.config.model_dump(mode="json"))
            store.log(1, {"train.success": 0.1})
            row = {f"eval.{k}": v for k, v in values[model].items()}
            row["eval.per_input_success"] = torch.linspace(0, 1, 50)
            store.log(10, row)
            store.set_status(10, "finished")
        runs[spec.name] = load_run(tmp_path / spec.name)
    return runs


_GOOD = {
    "erm_random": {
        "predictive_variance": 1e-5,
        "mean_success": 0.3,
        "p5_success": 0.0,
        "majority_success": 0.3,
    },
    "lq_random": {
        "predictive_variance": 0.02,
        "mean_success": 0.3,
        "p5_success": 0.2,
        "majority_success": 0.6,
    },
    "lq_fixed": {
        "predictive_variance": 0.0,
        "mean_success": 0.3,
        "p5_success": 0.0,
        "majority_success": 0.3,
    },
}


def test_planted_values_pass_and_the_measured_numbers_are_reported(tmp_path):
    analysis = analyze(_planted(tmp_path, _GOOD), tmp_path)
    assert [v.passed for v in analysis.verdicts] == [True, True, True]
    i, ii, iii = analysis.verdicts
    assert i.measured == pytest.approx(0.02) and i.threshold == pytest.approx(1e-3)
    assert ii.measured == pytest.approx(0.2)
    assert iii.measured == pytest.approx(0.3)
    assert all(p.exists() for p in analysis.figures)


@pytest.mark.parametrize(
    ("model", "key", "value", "failing"),
    [
        ("erm_random", "predictive_variance", 5e-3, 0),  # ERM uses its seed: i fails
        ("lq_random", "predictive_variance", 5e-5, 0),  # below 10 x V(ERM) = 1e-4 floor 1e-3
        ("lq_random", "p5_success", 0.04, 1),  # gap 0.04 < 0.05
        ("lq_random", "majority_success", 0.34, 2),  # gain 0.04 < 0.05
    ],
)
def test_each_claim_fails_on_its_own_planted_counterexample(tmp_path, model, key, value, failing):
    values = {m: dict(v) for m, v in _GOOD.items()}
    values[model][key] = value
    passed = [v.passed for v in _verdicts(_main_table(_planted(tmp_path, values))[0])]
    assert passed == [k != failing for k in range(3)]


def test_missing_runs_give_nan_and_fail(tmp_path):
    analysis = analyze({}, tmp_path)
    assert all(math.isnan(v.measured) and not v.passed for v in analysis.verdicts)


def test_smoke_end_to_end(tmp_path):
    outcome = STUDY.run(preset="smoke", out=tmp_path)
    info = json.loads((tmp_path / "verdict.json").read_text())
    assert [r["status"] for r in info["runs"]] == ["finished"] * 3
    assert len(outcome.claims) == 3
    run = load_run(tmp_path / "runs" / "recall_lq_fixed_s0")
    assert run.config["random_seeds"] is False and run.config["m_seeds"] == 1
    # a fixed-seed model is deterministic: zero variance, per-input success in {0, 1}
    # (identical float32 probabilities: the variance is 0 up to rounding of their mean)
    assert run.last("eval.predictive_variance") == pytest.approx(0.0, abs=1e-12)
    s = run.tensors("eval.per_input_success")[1][-1]
    assert set(np.unique(s)) <= {0.0, 1.0}
    assert 0.0 <= run.last("eval.p5_success") <= run.last("eval.mean_success") <= 1.0


def test_colouring_and_grid_world_runners_finish_on_tiny_configs(tmp_path):
    cfg = ColouringRunConfig(
        n_vertices=5,
        d_model=8,
        key_size=4,
        d_mlp=8,
        m_seeds=2,
        batch_size=8,
        steps=5,
        warmup_steps=1,
        eval_seeds=3,
        q=10.0,
    )
    run_colouring(cfg, tmp_path / "c")
    run = load_run(tmp_path / "c")
    assert run.status == "finished"
    assert run.tensors("eval.per_input_success")[1][-1].shape == (12,)  # all (5-1)!/2 cycles
    grid = GridWorldRunConfig(
        size=3,
        steps_per_episode=3,
        d_seed=2,
        m_seeds=2,
        d_model=8,
        n_heads=2,
        key_size=4,
        d_mlp=8,
        n_layers=1,
        population=4,
        generations=2,
        eval_seeds=2,
        log_every=1,
    )
    run_grid_world(grid, tmp_path / "g")
    run = load_run(tmp_path / "g")
    assert run.status == "finished"
    assert run.tensors("eval.per_treasure_return")[1][-1].shape == (8,)


def test_opt_in_colouring_and_paper_presets_build_their_runs():
    names = [s.name for s in build_runs(fast_with_colouring())]
    assert names[:3] == ["recall_erm_random_s0", "recall_lq_random_s0", "recall_lq_fixed_s0"]
    assert "colour_q10_s0" in names
    paper = [s.name for s in build_runs(STUDY.preset("paper"))]
    assert "grid_s4" in paper and "sweep_N20_q100_s4" in paper and "msweep_m16_s0" in paper
