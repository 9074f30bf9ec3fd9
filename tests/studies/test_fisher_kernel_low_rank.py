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
from dynascope.studies.fisher_kernel_low_rank import (
    STUDY,
    FisherKernelRun,
    build_fisher,
    build_runs,
    measure_run,
    verdicts_from_rows,
)
from dynascope.studies.fisher_kernel_low_rank.protocol import PROTOCOL
from dynascope.train import Loop, run_members


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


def row(seed, f1=0.95, f2=0.999, nfk=0.97, pen=0.96, acc=0.97, shuffled=False, loss=0.01):
    return {"run": f"r{seed}", "model": "mlp", "k": 32, "seed": seed, "status": "finished",
            "shuffled": shuffled, "f1.energy_fraction": f1, "init.f1.energy_fraction": 0.5,
            "f2.captured_energy": f2, "control.random_energy": 0.08,
            "probe.nfk.accuracy": nfk, "probe.penultimate.accuracy": pen,
            "probe gap": nfk - pen, "shuffled gap": 0.1 - pen, "test.accuracy": acc,
            "train.loss": loss, "fisher.share_rare": 0.1}  # fmt: skip


def arms(task=None, ablation=None, n=5):
    """n seeds of the task arm and of the shuffled-label arm (keyword overrides per arm)."""
    ablation = {"f1": 0.7, "nfk": 0.5, "acc": 0.1, "loss": 0.5, **(ablation or {})}
    return [row(s, **(task or {})) for s in range(n)] + [
        row(s, shuffled=True, **ablation) for s in range(n)
    ]


def by_id(verdicts):
    return {x.claim_id: x for x in verdicts}


def test_verdicts_on_hand_built_rows_have_known_values():
    v = by_id(verdicts_from_rows(arms()))
    assert [x.status for x in v.values()] == ["held"] * 3
    assert v["f1"].per_seed == (0.95,) * 5
    # f1's control is read on the shuffled-label arm, not the task arm's step 0
    assert v["f1"].control.kind == "ablation" and v["f1"].control.measured == pytest.approx(0.7)
    assert v["f1"].control.status == "not held"
    assert v["f2"].kind == "identity" and v["f2"].control is None
    assert v["f3"].per_seed == pytest.approx((0.01,) * 5)
    # f3's control: the shuffled arm's NFK probe against the task arm's penultimate probe
    assert v["f3"].control.measured == pytest.approx(0.5 - 0.96)
    assert v["f3"].control.status == "not held"
    assert PROTOCOL.check(list(v.values()))  # thresholds, directions, kinds as registered


def test_f1_below_threshold_and_a_control_that_also_holds():
    low = by_id(verdicts_from_rows(arms(task={"f1": 0.8})))
    assert low["f1"].status == "not held" and low["f1"].measured == pytest.approx(0.8)
    same = by_id(verdicts_from_rows(arms(ablation={"f1": 0.95, "nfk": 0.97})))
    assert same["f1"].status == "inconclusive" and same["f1"].control.status == "held"
    assert same["f3"].status == "inconclusive"  # the shuffled NFK probes as well


def test_every_arm_must_have_trained():
    unfit = by_id(verdicts_from_rows(arms(task={"acc": 0.5})))
    assert all(x.status == "inconclusive" for x in unfit.values())
    assert math.isclose(unfit["f1"].precondition.measured, 0.5)
    # the shuffled-label arm did not learn its labels: f1 and f3 inconclusive, f2 unaffected
    lazy = by_id(verdicts_from_rows(arms(ablation={"loss": 2.2})))
    assert lazy["f1"].status == lazy["f3"].status == "inconclusive"
    assert lazy["f1"].precondition.measured == pytest.approx(2.2)
    assert lazy["f2"].status == "held"


def test_fewer_than_five_seeds_are_inconclusive():
    few = verdicts_from_rows(arms(n=3))
    assert all(x.status == "inconclusive" for x in few)


def test_config_and_presets():
    with pytest.raises(ValidationError, match="n_scored must be <= n_train"):
        FisherKernelRun(loop=loop(1), n_train=100, n_scored=200)
    assert studies.get("fisher-kernel-low-rank") is STUDY
    assert STUDY.protocol is PROTOCOL
    fast = build_runs(STUDY.preset("fast"))
    assert [s.name for s in fast] == [f"nfk_mlp_k32_seed{s}" for s in range(5)] + [
        f"nfk_mlp_k32_shuffled_seed{s}" for s in range(5)
    ]
    assert [s.group for s in fast] == ["mlp_k32"] * 5 + ["mlp_k32_shuffled"] * 5
    assert [s.config.shuffle_labels for s in fast] == [False] * 5 + [True] * 5
    assert fast[0].config.fisher_points == "train"
    # the arms differ only in shuffle_labels; member s of both arms has the same seed
    for a, b in zip(fast[:5], fast[5:], strict=True):
        assert a.config.model_copy(update={"shuffle_labels": True}) == b.config
    assert {s.config.seed for s in build_runs(STUDY.preset("fast"), seed=1000)} == set(
        range(1000, 1005)
    )
    assert len(build_runs(STUDY.preset("paper"))) == 2 * 4 * 2 * 5


def test_full_preset_is_fast_system_at_the_registered_budget():
    """full = fast's system (same run config but the step budget), 8 seeds per arm, 10,000
    steps (the protocol's text), seeds base + 0..7 in both arms."""
    fast, full = STUDY.preset("fast"), STUDY.preset("full")
    assert full.seeds == PROTOCOL.seeds["full"] == 8
    assert full.base.loop.steps == 10_000 and "10,000 Adam steps" in PROTOCOL.presets["full"]
    assert full.base.model_copy(update={"loop": fast.base.loop}) == fast.base
    assert (full.ks, full.models) == (fast.ks, fast.models) == ([32], ["mlp"])
    specs = build_runs(full, seed=1000)
    assert [s.name for s in specs] == [f"nfk_mlp_k32_seed{s}" for s in range(8)] + [
        f"nfk_mlp_k32_shuffled_seed{s}" for s in range(8)
    ]
    assert [s.config.seed for s in specs] == [1000 + s for s in range(8)] * 2
    assert [s.config.shuffle_labels for s in specs] == [False] * 8 + [True] * 8


def test_the_shuffled_arm_trains_on_permuted_labels(tmp_path):
    base = FisherKernelRun(loop=loop(10), hidden=[8], n_scored=12, k=3, oversampling=4)
    run_members(build_fisher, [base, base.model_copy(update={"shuffle_labels": True})],
                [tmp_path / "task", tmp_path / "shuffled"])  # fmt: skip
    task, shuffled = load_run(tmp_path / "task"), load_run(tmp_path / "shuffled")
    # same init: the step-0 kernels agree; different labels: the training losses differ
    np.testing.assert_allclose(
        task.tensors("nfk.eigenvalues")[1][0], shuffled.tensors("nfk.eigenvalues")[1][0]
    )
    assert task.last("train.loss") != shuffled.last("train.loss")
    rows = [measure_run("task", task), measure_run("shuffled", shuffled)]
    assert [r["shuffled"] for r in rows] == [False, True]


def test_smoke_preset_end_to_end(smoke_out):
    """The shared smoke run; its SIGKILL-resume is test_resume_every_study's, whose kill (at
    half the store writes) lands where the kill test here did: the first ensemble's final
    probe at step 50, after its checkpoint at step 48 (it compares every stored tensor)."""
    _, out = smoke_out
    data = json.loads((out / "verdict.json").read_text())
    assert [c["claim"].split(":")[0] for c in data["claims"]] == ["f1", "f2", "f3"]
    assert all(r["status"] == "finished" for r in data["runs"])
    assert len(list((out / "runs").iterdir())) == 6
