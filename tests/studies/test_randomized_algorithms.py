"""Study randomized-algorithms: verdicts and colouring tables on hand-built stores, smoke end to
end, tiny runners."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from dynascope.nn import MLP, MultiHeadAttention
from dynascope.store import RunStore, load_run
from dynascope.studies.randomized_algorithms import (
    STUDY,
    ColouringRun,
    GridWorldRun,
    analyze,
    build_colouring,
    build_grid_world,
    build_runs,
    fast_with_colouring,
    recall_loss_max,
)
from dynascope.studies.randomized_algorithms.analysis import _main_table, _verdicts
from dynascope.studies.randomized_algorithms.protocol import PROTOCOL
from dynascope.studies.randomized_algorithms.runs import colouring_model
from dynascope.studies.randomized_algorithms.study import FULL_STEPS
from dynascope.train import Loop, run_members


def _planted(tmp_path, values: dict[str, dict[str, float]], train_loss: float = 1.0, seed: int = 0):
    """Finished recall stores of the smoke configs at 5 replicates (the protocol's minimum)."""
    runs = {}
    preset = STUDY.preset("smoke").model_copy(update={"replicates": 5})
    for spec in build_runs(preset, seed):
        if not spec.name.startswith("recall_"):
            continue
        model = spec.name.removeprefix("recall_").rsplit("_s", 1)[0]
        with RunStore(tmp_path / spec.name) as store:
            store.write_config(spec.config.model_dump(mode="json"))
            store.log(1, {"train.success": 0.1, "train.mean_loss": train_loss})
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
    # the ablation (m = 1: no averaging over seeds) does not randomize
    "lq_m1": {
        "predictive_variance": 1e-5,
        "mean_success": 0.3,
        "p5_success": 0.0,
        "majority_success": 0.3,
    },
}


def test_planted_values_pass_and_the_measured_numbers_are_reported(tmp_path):
    analysis = analyze(_planted(tmp_path, _GOOD), tmp_path)
    assert [v.status for v in analysis.verdicts] == ["held"] * 3
    i, ii, iii = analysis.verdicts
    assert i.seeds == (0, 1, 2, 3, 4) and i.n_seeds == 5
    assert i.measured == pytest.approx(0.02 / 1e-3) and i.threshold == pytest.approx(1.0)
    assert [v.control.status for v in analysis.verdicts] == ["not held"] * 3
    assert all(v.precondition.met for v in analysis.verdicts)
    assert ii.measured == pytest.approx(0.2)
    assert iii.measured == pytest.approx(0.3)
    # i and ii read their control from the m = 1 arm, iii from A^E_R
    assert i.control.measured == pytest.approx(1e-5 / 1e-3)
    assert ii.control.measured == pytest.approx(0.0) and iii.control.measured == pytest.approx(0)
    assert all(v.control.kind == "ablation" for v in analysis.verdicts)
    for v in analysis.verdicts:
        spec = PROTOCOL.claim(v.claim_id)
        assert (v.threshold, v.direction, v.statistic) == (spec.threshold, spec.direction, "mean")
    assert all(p.exists() for p in analysis.figures)


def test_verdicts_record_the_runs_seeds_not_replicate_indices(tmp_path):
    analysis = analyze(_planted(tmp_path, _GOOD, seed=1000), tmp_path)
    seeds = (1000, 1001, 1002, 1003, 1004)
    assert all(v.seeds == seeds for v in analysis.verdicts)
    assert all(tuple(v.control.per_seed) == seeds for v in analysis.verdicts)


@pytest.mark.parametrize(
    ("model", "key", "value", "expected"),
    [
        ("erm_random", "predictive_variance", 5e-3, ["not held", "held", "held"]),  # ERM uses it
        # below the 1e-3 floor: i fails, and ii/iii lose their precondition (the seed is used)
        ("lq_random", "predictive_variance", 5e-5, ["not held", "inconclusive", "inconclusive"]),
        ("lq_random", "p5_success", 0.04, ["held", "not held", "held"]),  # gap 0.04 < 0.05
        ("lq_random", "majority_success", 0.34, ["held", "held", "not held"]),  # gain 0.04
        # the m = 1 ablation randomizes too: i's and ii's controls hold, so they cannot tell
        ("lq_m1", "predictive_variance", 0.02, ["inconclusive", "held", "held"]),
        ("lq_m1", "p5_success", 0.2, ["held", "inconclusive", "held"]),
        # A^E_R's vote gains as much: iii's control holds
        ("erm_random", "majority_success", 0.6, ["held", "held", "inconclusive"]),
    ],
)
def test_each_claim_fails_on_its_own_planted_counterexample(tmp_path, model, key, value, expected):
    values = {m: dict(v) for m, v in _GOOD.items()}
    values[model][key] = value
    statuses = [v.status for v in _verdicts(_main_table(_planted(tmp_path, values))[1])]
    assert statuses == expected


def test_unlearned_recall_makes_every_claim_inconclusive(tmp_path):
    # smoke: N = 6, key size 2, b = 5: the bound is (1 - 2/12)·5·ln 2 = 2.888 nats
    verdicts = _verdicts(_main_table(_planted(tmp_path, _GOOD, train_loss=3.0))[1])
    assert [v.status for v in verdicts] == ["inconclusive"] * 3
    assert verdicts[0].precondition.measured == pytest.approx(3.0)
    assert "recall learned" in verdicts[0].reason


def test_recall_loss_bound_is_the_half_capacity_reduction_of_chance():
    assert recall_loss_max(12, 4, 5) == pytest.approx((1 - 4 / 24) * 5 * math.log(2))
    assert recall_loss_max(4, 8, 5) == pytest.approx(0.5 * 5 * math.log(2))


def test_missing_runs_give_nan_and_fail(tmp_path):
    analysis = analyze({}, tmp_path)
    assert all(math.isnan(v.measured) and v.status == "inconclusive" for v in analysis.verdicts)


def test_smoke_end_to_end(smoke_out):
    outcome, out = smoke_out
    info = json.loads((out / "verdict.json").read_text())
    assert [r["status"] for r in info["runs"]] == ["finished"] * 14  # 4 recall arms × 3, 2 colour
    for claim in info["claims"]:
        assert len(claim["per_seed"]) == 3 and claim["control"]["status"] is not None
        # smoke has 3 seeds (< 5): plumbing only, never held or not held
        assert claim["status"] == "inconclusive" and claim["control"]["kind"] == "ablation"
    assert info["protocol"]["sha256"] == PROTOCOL.sha256
    assert len(outcome.claims) == 3
    ablation = load_run(out / "runs" / "recall_lq_m1_s0").config
    assert (ablation["random_seeds"], ablation["m_seeds"], ablation["q"]) == (True, 1, 32.0)
    run = load_run(out / "runs" / "recall_lq_fixed_s0")
    assert run.config["random_seeds"] is False and run.config["m_seeds"] == 1
    # a fixed-seed model is deterministic: zero variance, per-input success in {0, 1}
    # (identical float32 probabilities: the variance is 0 up to rounding of their mean)
    assert run.last("eval.predictive_variance") == pytest.approx(0.0, abs=1e-12)
    s = run.tensors("eval.per_input_success")[1][-1]
    assert set(np.unique(s)) <= {0.0, 1.0}
    assert 0.0 <= run.last("eval.p5_success") <= run.last("eval.mean_success") <= 1.0
    # colouring arm: C_5, q in {1, 10}, every one of the (5-1)!/2 = 12 cycles, 4 eval seeds
    (per_q,) = [
        rows for name, rows in outcome.tables.items() if name.startswith("cycle colouring C")
    ]
    assert [(r["n"], r["q"], r["cycles"]) for r in per_q] == [(5, 1.0, 12), (5, 10.0, 12)]
    for row in per_q:
        # oracle: recompute both rates from the stored per-cycle success over the 4 seeds
        s = load_run(out / "runs" / row["runs"]).tensors("eval.per_input_success")[1][-1]
        assert set(np.unique(s * 4)) <= {0.0, 1.0, 2.0, 3.0, 4.0}
        assert row["single_seed"] == pytest.approx(float(s.mean()), abs=1e-6)
        assert row["majority"] == pytest.approx(float(np.mean(s > 0.5)), abs=1e-6)
        assert row["never_solved"] == pytest.approx(float(np.mean(s == 0)), abs=1e-6)
    (trend,) = [
        rows for name, rows in outcome.tables.items() if name.startswith("cycle colouring trend")
    ]
    assert trend[0]["delta_majority"] == pytest.approx(per_q[1]["majority"] - per_q[0]["majority"])
    assert (out / "figures" / "colouring_trend.png").exists()


def _planted_colouring(tmp_path, values: dict[str, tuple[int, float, float, list[float]]]):
    """Colouring stores: name -> (n, q, majority as logged, per-cycle success)."""
    runs = {}
    for name, (n, q, majority, success) in values.items():
        with RunStore(tmp_path / name) as store:
            store.write_config({"n_vertices": n, "q": q, "steps": 10, "eval_seeds": 4})
            store.log(1, {"train.mean_loss": 1.0})
            s = torch.tensor(success)
            row = {"eval.mean_success": s.mean(), "eval.majority_success": majority}
            row |= {"eval.min_success": s.min(), "eval.per_input_success": s}
            store.log(10, row)
            store.set_status(10, "finished")
        runs[name] = load_run(tmp_path / name)
    return runs


def test_colouring_tables_average_replicates_and_give_the_trend(tmp_path):
    runs = _planted_colouring(
        tmp_path,
        {
            "colour_n8_q1_s0": (8, 1.0, 0.50, [0.0, 1.0, 1.0, 0.0]),
            "colour_n8_q1_s1": (8, 1.0, 0.75, [0.0, 1.0, 1.0, 1.0]),
            "colour_n8_q10_s0": (8, 10.0, 1.00, [0.75, 0.75, 1.0, 0.75]),
        },
    )
    analysis = analyze(runs, tmp_path)
    per_q = analysis.tables[next(k for k in analysis.tables if k.startswith("cycle colouring C"))]
    q1, q10 = per_q
    assert (q1["q"], q10["q"]) == (1.0, 10.0) and q1["cycles"] == 4
    assert q1["single_seed"] == pytest.approx((0.5 + 0.75) / 2)  # mean over the 2 replicates
    assert q1["majority"] == pytest.approx(0.625) and q10["majority"] == pytest.approx(1.0)
    assert q1["never_solved"] == pytest.approx((0.5 + 0.25) / 2) and q10["never_solved"] == 0.0
    (trend,) = analysis.tables[next(k for k in analysis.tables if "trend" in k)]
    assert (trend["q_low"], trend["q_high"]) == (1.0, 10.0)
    assert trend["delta_single_seed"] == pytest.approx(0.8125 - 0.625)
    assert trend["delta_majority"] == pytest.approx(0.375)
    assert trend["delta_min"] == pytest.approx(0.75)
    assert trend["delta_never_solved"] == pytest.approx(-0.375)
    assert "not gated" in next(k for k in analysis.tables if k.startswith("cycle colouring C"))
    assert len(analysis.verdicts) == 3  # the colouring arm adds no verdict
    assert tmp_path / "colouring_trend.png" in analysis.figures


def test_colouring_and_grid_world_runners_finish_on_tiny_configs(tmp_path):
    cfg = ColouringRun(
        n_vertices=5,
        d_model=8,
        d_head=4,
        d_mlp=8,
        m_seeds=2,
        batch_size=8,
        eval_seeds=3,
        q=10.0,
        loop=Loop(steps=5),
    )
    run_members(build_colouring, cfg, tmp_path / "c")
    run = load_run(tmp_path / "c")
    assert run.status == "finished"
    assert run.tensors("eval.per_input_success")[1][-1].shape == (12,)  # all (5-1)!/2 cycles
    run_members(build_grid_world, _tiny_grid(2), tmp_path / "g")
    run = load_run(tmp_path / "g")
    assert run.status == "finished"
    assert run.tensors("eval.per_treasure_return")[1][-1].shape == (8,)


def test_the_colouring_policy_keeps_the_validated_initialisation_order():
    """Oracle: the draws of the study's validated runs written out (W_in, then each block's
    attention and MLP, then W_U, from the global RNG); the same bits and the same RNG use."""
    cfg = ColouringRun(
        n_vertices=5, d_model=8, d_head=4, n_heads=2, d_mlp=6, n_layers=2, loop=Loop(steps=1)
    )
    torch.manual_seed(0)
    net = colouring_model(cfg).model
    next_draw = torch.rand(3)
    torch.manual_seed(0)
    d_in = cfg.n_vertices + cfg.d_seed
    W_in = torch.randn(d_in, cfg.d_model) / math.sqrt(d_in)
    blocks = [(MultiHeadAttention(8, 2, 4), MLP(8, 6)) for _ in range(cfg.n_layers)]
    W_U = torch.randn(cfg.d_model, 3) / math.sqrt(cfg.d_model)
    assert torch.equal(torch.rand(3), next_draw)
    assert torch.equal(net.W_in, W_in) and torch.equal(net.W_U, W_U)
    for block, (attn, mlp) in zip(net.blocks, blocks, strict=True):
        for mine, want in ((block.attn, attn), (block.mlp, mlp)):
            for (name, got), (_, expected) in zip(
                mine.named_parameters(), want.named_parameters(), strict=True
            ):
                assert torch.equal(got, expected), name
    assert net.W_pos is None and not net.blocks[0].attn.is_causal


def test_fast_trains_each_arm_as_one_ensemble_and_the_opt_in_and_paper_presets_build():
    fast = STUDY.preset("fast")
    specs = build_runs(fast)
    assert [s.name for s in specs[:5]] == [f"recall_erm_random_s{k}" for k in range(5)]
    assert len(specs) == 20 and {s.group for s in specs} == {
        "recall_erm_random",
        "recall_lq_random",
        "recall_lq_fixed",
        "recall_lq_m1",
    }
    assert fast.replicates == PROTOCOL.seeds["fast"] == 5 and STUDY.protocol is PROTOCOL
    assert [s.config.seed for s in build_runs(fast, 1000)[:3]] == [1000, 1001, 1002]
    # the ablation arm: A^q_R's config with m = 1 (same q, steps, batch)
    lq, m1 = (
        next(s.config for s in specs if s.name == f"recall_{m}_s0") for m in ("lq_random", "lq_m1")
    )
    assert m1 == lq.model_copy(update={"m_seeds": 1})
    assert fast.recall.d_head < fast.recall.n_keys  # the capacity limit the claims need
    names = [s.name for s in build_runs(fast_with_colouring())]
    assert names[20:] == ["colour_n10_q1_s0", "colour_n10_q3_s0", "colour_n10_q10_s0"]
    paper = [s.name for s in build_runs(STUDY.preset("paper"))]
    assert "grid_s4" in paper and "sweep_N20_q100_s4" in paper and "msweep_m16_s0" in paper
    assert "colour_n10_q5_s4" in paper


def test_full_is_fast_trained_for_the_protocols_step_count_with_five_seeds_per_arm():
    """full: fast's task, arms and seeds per arm, at FULL_STEPS (10 % warm-up), as the
    protocol's presets["full"] text says; 4 arms x 5 seeds, one ensemble per arm."""
    fast, full = STUDY.preset("fast"), STUDY.preset("full")
    specs = build_runs(full, 1000)
    assert PROTOCOL.seeds["full"] == full.replicates == 5 and len(specs) == 4 * 5
    for arm in ("erm_random", "lq_random", "lq_fixed", "lq_m1"):
        group = [s for s in specs if s.group == f"recall_{arm}"]
        assert [s.config.seed for s in group] == [1000, 1001, 1002, 1003, 1004]
    loop = full.recall.loop
    assert loop.steps == FULL_STEPS == 4000 and loop.schedule.warmup_steps == 400
    assert f"at {FULL_STEPS} steps (400 warm-up" in PROTOCOL.presets["full"]
    # everything but the step count and warm-up is fast's: same task, bound and arms
    assert full.recall.model_copy(update={"loop": fast.recall.loop}) == fast.recall
    assert full.models == fast.models and full.q_large == fast.q_large == 32.0
    r = full.recall
    assert recall_loss_max(r.n_keys, r.d_head, r.n_value_bits) == pytest.approx(2.599, abs=1e-3)
    assert all(s >= 10_000 for s in PROTOCOL.calibration_seeds)


def test_recall_must_be_learned_by_the_lq_model_too(tmp_path):
    # fast, replicate 0 (measured): A^E_R 1.55 nats, A^q_R 2.98, A^q_r0 2.52 against 2.888
    rows = _main_table(_planted(tmp_path, _GOOD))[1]
    for row in rows:
        row["train_loss"] = 2.98 if row["model"] == "lq_random" else 1.55
    verdicts = _verdicts(rows)
    assert [v.status for v in verdicts] == ["inconclusive"] * 3
    assert verdicts[0].precondition.measured == pytest.approx(2.98)


def test_the_fit_bar_reads_every_run_of_the_arms_a_claim_and_its_control_use(tmp_path):
    """One unfit run of the m = 1 ablation (read by i's and ii's controls) stops i and ii;
    iii reads A^q_R and A^E_R only."""
    rows = _main_table(_planted(tmp_path, _GOOD))[1]
    for row in rows:
        if (row["model"], row["seed"]) == ("lq_m1", 3):
            row["train_loss"] = 3.2
    assert [v.status for v in _verdicts(rows)] == ["inconclusive", "inconclusive", "held"]


def _tiny_grid(steps: int) -> GridWorldRun:
    return GridWorldRun(
        size=3,
        steps_per_episode=3,
        d_seed=2,
        m_seeds=2,
        d_model=8,
        n_heads=2,
        d_head=4,
        d_mlp=8,
        n_layers=1,
        population=4,
        eval_seeds=2,
        loop=Loop(steps=steps, log_every=1, checkpoint_every=2),
    )


def test_pgpe_step_resumes_bitwise_after_a_crash(tmp_path, monkeypatch):
    from dynascope.studies.randomized_algorithms import PGPEStep

    cfg = _tiny_grid(5)
    run_members(build_grid_world, cfg, tmp_path / "full")
    original = PGPEStep.__call__

    def crash_at_3(self, model, batch, ctx):
        if ctx.step == 3:
            raise RuntimeError("planted crash")
        return original(self, model, batch, ctx)

    monkeypatch.setattr(PGPEStep, "__call__", crash_at_3)
    with pytest.raises(RuntimeError, match="planted crash"):
        run_members(build_grid_world, cfg, tmp_path / "cut")
    monkeypatch.setattr(PGPEStep, "__call__", original)
    result = run_members(build_grid_world, cfg, tmp_path / "cut", resume=True)
    assert result.status == "finished"
    full, cut = load_run(tmp_path / "full"), load_run(tmp_path / "cut")
    assert "resumed" in set(cut.events["kind"])
    key = ["step", "key"]
    a, b = full.scalars.sort_values(key), cut.scalars.sort_values(key)
    np.testing.assert_array_equal(a["value"].to_numpy(), b["value"].to_numpy())
    np.testing.assert_array_equal(
        full.tensors("eval.per_treasure_return")[1][-1],
        cut.tensors("eval.per_treasure_return")[1][-1],
    )


def test_paper_configs_build_and_take_a_loss_step_on_the_cpu():
    from dynascope.studies.randomized_algorithms import build_recall
    from dynascope.train import SeedStreams

    paper = STUDY.preset("paper")
    assert paper.recall.loop.device == "cuda" and paper.colouring.loop.device == "cuda"
    assert paper.grid_world.loop.device == "cuda"
    for cfg, build in ((paper.recall, build_recall), (paper.colouring, build_colouring)):
        cpu = cfg.model_copy(update={"loop": cfg.loop.model_copy(update={"device": "cpu"})})
        parts = build(cpu, SeedStreams(0))
        batch = parts.data(torch.Generator().manual_seed(0))
        loss, metrics = parts.loss(parts.model, batch)
        loss.backward()
        assert math.isfinite(float(loss.detach())) and set(metrics) == {"mean_loss", "success"}
        assert all(p.grad is not None for p in parts.model.parameters())
