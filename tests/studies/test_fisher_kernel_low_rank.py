"""Study fisher-kernel-low-rank (S14): the engine run's oracles (a sketch covering the scored set
reproduces the exact spectrum), verdicts on hand-built rows, presets, and the smoke preset end
to end, killed and resumed."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from pydantic import ValidationError

from dynascope import studies
from dynascope.store import load_run
from dynascope.studies.engine_runs import run_members
from dynascope.studies.fisher_kernel_low_rank import (
    STUDY,
    FisherKernelRun,
    build_fisher,
    build_runs,
    verdicts_from_rows,
)
from dynascope.studies.fisher_kernel_low_rank import runs as runs_module
from dynascope.train import Loop


def loop(steps: int) -> Loop:
    return Loop(steps=steps, log_every=5)


def covered(run, k: int) -> None:
    """k + p >= N >= rank(Phi): randomized sigma^2 = exact top-k eigenvalues, cosines 1, the
    scored points re-embedded by JVPs equal U_k Sigma_k, captured energy 1 (float64: 1e-8),
    at step 0 (untrained) and at the end."""
    evals = run.tensors("nfk.eigenvalues")[1]
    sq = run.tensors("nfk.randomized_sq_sv")[1]
    for i in (0, -1):
        np.testing.assert_allclose(sq[i], evals[i, :k], rtol=1e-8)
        np.testing.assert_allclose(run.tensors("nfk.cosines")[1][i], np.ones(k), atol=1e-8)
        assert np.all(np.diff(evals[i]) <= 1e-12)  # descending
    assert run.last("nystrom.max_error") < 1e-8
    assert run.last("f2.captured_energy") == pytest.approx(1.0, abs=1e-8)
    assert run.last("f1.energy_fraction") == pytest.approx(evals[-1, :k].sum() / evals[-1].sum())


def test_a_sketch_covering_the_scored_set_reproduces_the_exact_spectrum(tmp_path):
    cfg = FisherKernelRun(loop=loop(20), hidden=[8], n_scored=12, k=4, oversampling=8,
                          chunk_size=5)  # fmt: skip
    run_members(build_fisher, cfg, tmp_path / "run")
    run = load_run(tmp_path / "run")
    assert run.status == "finished"
    covered(run, 4)
    assert run.last("n_params") == 64 * 8 + 8 + 8 * 10 + 10
    assert 0 <= run.last("control.random_energy") <= 1


def test_the_cnn_runs_through_the_same_matrix_free_path(tmp_path):
    cfg = FisherKernelRun(loop=loop(5), model="cnn", cnn_arch="3-avg-4", n_scored=8, k=3,
                          oversampling=5)  # fmt: skip
    run_members(build_fisher, cfg, tmp_path / "cnn")
    run = load_run(tmp_path / "cnn")
    covered(run, 3)
    assert run.last("n_params") == 9 * 3 + 9 * 3 * 4 + 4 * 10  # bias-free


def test_conditional_score_with_sampled_labels_and_identity_fisher(tmp_path):
    cfg = FisherKernelRun(loop=loop(5), hidden=[6], n_scored=9, k=2, oversampling=7,
                          score="conditional", center=False, fisher="identity")  # fmt: skip
    run_members(build_fisher, cfg, tmp_path / "cond")
    run = load_run(tmp_path / "cond")
    covered(run, 2)
    # with D = I the f1 diagnostic "without whitening" is f1 itself (two computations)
    assert run.last("f1.energy_fraction_identity") == pytest.approx(
        run.last("f1.energy_fraction"), rel=1e-10
    )
    assert 0 <= run.last("fisher.share_few_examples") <= 1


def row(seed, f1=0.95, f2=0.999, nfk=0.97, pen=0.96, init_f1=0.5, acc=0.97):
    return {"run": f"r{seed}", "model": "mlp", "k": 32, "seed": seed, "status": "finished",
            "f1.energy_fraction": f1, "init.f1.energy_fraction": init_f1,
            "f2.captured_energy": f2, "control.random_energy": 0.08,
            "probe gap": nfk - pen, "shuffled gap": 0.1 - pen, "test.accuracy": acc,
            "fisher.share_rare": 0.1}  # fmt: skip


def test_verdicts_on_hand_built_rows_have_known_values():
    v = {x.claim.split(":")[0]: x for x in verdicts_from_rows([row(s) for s in range(3)])}
    assert [x.status for x in v.values()] == ["held"] * 3
    assert v["f1"].per_seed == (0.95,) * 3 and v["f1"].control.measured == 0.5
    assert v["f2"].control.status == "not held"
    assert v["f3"].per_seed == pytest.approx((0.01,) * 3)
    low = {x.claim.split(":")[0]: x for x in verdicts_from_rows(
        [row(0, f1=0.8), row(1, f1=0.85), row(2, f1=0.95)])}  # fmt: skip
    assert low["f1"].status == "not held" and low["f1"].measured == pytest.approx(0.8667, 1e-3)
    same = verdicts_from_rows([row(s, init_f1=0.95) for s in range(3)])[0]
    assert same.status == "inconclusive"  # the untrained NFK is as low-rank: cannot tell
    unfit = verdicts_from_rows([row(s, acc=0.5) for s in range(3)])
    assert all(x.status == "inconclusive" for x in unfit)
    assert math.isclose(unfit[0].precondition.measured, 0.5)


def test_config_and_presets():
    with pytest.raises(ValidationError, match="n_scored must be <= n_train"):
        FisherKernelRun(loop=loop(1), n_train=100, n_scored=200)
    assert studies.get("fisher-kernel-low-rank") is STUDY
    fast = build_runs(STUDY.preset("fast"))
    assert [s.name for s in fast] == [f"nfk_mlp_k32_seed{s}" for s in range(3)]
    assert {s.group for s in fast} == {"mlp_k32"} and fast[0].config.fisher_points == "train"
    assert {s.config.seed for s in build_runs(STUDY.preset("fast"), seed=1000)} == {
        1000, 1001, 1002}  # fmt: skip
    assert len(build_runs(STUDY.preset("paper"))) == 2 * 4 * 3


class Killed(BaseException):
    """Stands in for SIGKILL: no handler of the engine or the study catches it."""


def test_smoke_killed_midway_resumes_and_ends_as_an_uninterrupted_run(tmp_path, monkeypatch):
    whole = STUDY.run(preset="smoke", out=tmp_path / "whole")
    data = json.loads((tmp_path / "whole" / "verdict.json").read_text())
    assert [c["claim"].split(":")[0] for c in data["claims"]] == ["f1", "f2", "f3"]
    real, calls = runs_module.measure_nfk, {"n": 0}

    def dies_at_the_end(*args):
        calls["n"] += 1
        if calls["n"] == 4:  # first member's final probe, after the checkpoint at step 48
            raise Killed
        return real(*args)

    monkeypatch.setattr(runs_module, "measure_nfk", dies_at_the_end)
    with pytest.raises(Killed):
        STUDY.run(preset="smoke", out=tmp_path / "cut")
    monkeypatch.setattr(runs_module, "measure_nfk", real)
    done: dict[str, str] = {}

    def on_run(name, status, seconds, action):
        done[name] = action

    cut = STUDY.run(preset="smoke", out=tmp_path / "cut", on_run=on_run)
    assert "resumed" in done.values() and "restarted" not in done.values()
    for name in done:
        a, b = (load_run(tmp_path / d / "runs" / name) for d in ("whole", "cut"))
        np.testing.assert_array_equal(
            b.tensors("nfk.eigenvalues")[1], a.tensors("nfk.eigenvalues")[1]
        )
    assert [c.per_seed for c in cut.claims] == [c.per_seed for c in whole.claims]
