"""Study hyper-ut-pvr: presets, the smoke preset end to end on the engine, verdicts (per seed,
with controls) recomputed from the stores, and the paper preset's loss step on the CPU."""

from __future__ import annotations

import json
import math

import pytest
import torch
from scipy.stats import spearmanr

from dynascope import studies
from dynascope.store import load_run
from dynascope.studies.hyper_ut_pvr import STUDY, build_runs
from dynascope.studies.hyper_ut_pvr.analysis import gap_standard_error
from dynascope.studies.hyper_ut_pvr.protocol import PROTOCOL
from dynascope.studies.hyper_ut_pvr.runs import build_hop_pvr
from dynascope.train import SeedStreams


def test_presets_build_five_seeds_per_model_with_fixed_depth_seeds_as_one_ensemble():
    assert studies.get("hyper-ut-pvr") is STUDY
    specs = build_runs(STUDY.preset("fast"))
    assert [s.name for s in specs] == [
        f"{m}_s{k}" for m in ("fixed", "ut_act", "hyper_ut", "ut_act_shuffled") for k in range(5)
    ]
    assert [s.group for s in specs] == ["fixed"] * 5 + [None] * 15  # ACT: lone runs
    assert PROTOCOL.seeds["fast"] == STUDY.preset("fast").seeds == 5
    fast = {s.name: s.config for s in specs}
    assert fast["ut_act_s0"].model_copy(update={"model": "hyper_ut"}) == fast["hyper_ut_s0"]
    # u1's ablation: the same UT-ACT run with its training labels shuffled, nothing else
    assert (
        fast["ut_act_s0"].model_copy(update={"shuffle_labels": True}) == fast["ut_act_shuffled_s0"]
    )
    assert [fast[f"ut_act_s{k}"].seed for k in range(5)] == [0, 1, 2, 3, 4]
    assert [s.config.seed for s in build_runs(STUDY.preset("fast"), 1000)][:3] == [
        1000, 1001, 1002,
    ]  # fmt: skip
    cfg = fast["ut_act_s0"]
    assert (cfg.length, cfg.train_hops, cfg.eval_hops) == (5, [1, 2, 3], [1, 2, 3, 4])
    assert cfg.multiply_embedding_mode == "sqrt_depth"


def test_gap_unit_is_the_binomial_standard_error_of_a_difference():
    assert gap_standard_error(2000) == pytest.approx(math.sqrt(0.5 / 2000))
    assert PROTOCOL.claim("u3").threshold * gap_standard_error(2000) == pytest.approx(
        0.0474, abs=1e-4
    )  # the earlier δ = 3·SE at 2000 examples
    with pytest.raises(ValueError, match="eval_size"):
        gap_standard_error(0)


def test_shuffled_labels_change_only_the_training_labels():
    cfg = STUDY.preset("smoke").base.model_copy(update={"n_train": 200, "eval_size": 16})
    plain = build_hop_pvr(cfg, SeedStreams(3))
    shuffled = build_hop_pvr(cfg.model_copy(update={"shuffle_labels": True}), SeedStreams(3))
    a = plain.data(torch.Generator().manual_seed(0))
    b = shuffled.data(torch.Generator().manual_seed(0))
    assert torch.equal(a["x"], b["x"]) and not torch.equal(a["y"], b["y"])


def test_smoke_preset_end_to_end(smoke_out):
    outcome, out = smoke_out
    data = json.loads((out / "verdict.json").read_text())
    assert [c["claim"].split(":")[0] for c in data["claims"]] == ["u1", "u2", "u3"]
    assert all(r["status"] == "finished" for r in data["runs"])
    assert (out / "figures" / "pvr_hops.png").is_file()
    for claim in data["claims"]:
        assert claim["seeds"] == [0, 1, 2] and claim["control"]["kind"] == "ablation"
        assert claim["direction"] == ">=" and not claim["legacy"]
        assert claim["status"] == "inconclusive"  # 3 seeds, and nothing fits in 20 steps
    assert data["protocol"]["sha256"] == PROTOCOL.sha256
    for k in range(3):  # every run on the engine: runner.json, checkpoints
        assert (out / "runs" / f"ut_act_s{k}" / "runner.json").is_file()


def _per_seed(out, k: int, step: int | None) -> dict:
    ut = load_run(out / "runs" / f"ut_act_s{k}")
    hyper = load_run(out / "runs" / f"hyper_ut_s{k}")
    shuffled = load_run(out / "runs" / f"ut_act_shuffled_s{k}")
    fixed = load_run(out / "runs" / f"fixed_s{k}")

    def at(run, key):
        series = run.scalar(key)
        return float(series.iloc[-1] if step is None else series.loc[step])

    ponder = [at(ut, f"eval.h{h}.ponder") for h in (1, 2, 3)]
    rho = spearmanr([1, 2, 3], ponder).statistic if len(set(ponder)) > 1 else float("nan")
    fit = min(at(r, f"eval.h{h}.accuracy") for r in (ut, hyper) for h in (1, 2))
    gap = at(hyper, "eval.h3.accuracy") - at(ut, "eval.h3.accuracy")
    gap_trained = at(hyper, "eval.h2.accuracy") - at(ut, "eval.h2.accuracy")
    ponder_shuffled = [at(shuffled, f"eval.h{h}.ponder") for h in (1, 2, 3)]
    rho_shuffled = (
        spearmanr([1, 2, 3], ponder_shuffled).statistic
        if len(set(ponder_shuffled)) > 1
        else float("nan")
    )
    fit_fixed = min(at(fixed, f"eval.h{h}.accuracy") for h in (1, 2))
    return {"rho": rho, "fit": fit, "gap": gap, "gap_trained": gap_trained, "ponder": ponder,
            "rho_shuffled": rho_shuffled, "fit_fixed": fit_fixed}  # fmt: skip


def test_verdicts_and_controls_are_recomputed_from_the_stored_evaluations(smoke_out):
    outcome, out = smoke_out
    u1, u2, u3 = outcome.claims
    se = gap_standard_error(64)
    for k in range(3):
        final, init = _per_seed(out, k, None), _per_seed(out, k, 0)
        torch.testing.assert_close(u1.per_seed[k], final["rho"], equal_nan=True)
        # the controls come from the ablation runs, not from the claim's own runs
        torch.testing.assert_close(u1.control.per_seed[k], final["rho_shuffled"], equal_nan=True)
        assert u2.per_seed[k] == pytest.approx(final["fit"])
        assert u2.control.per_seed[k] == pytest.approx(final["fit_fixed"])
        assert u3.per_seed[k] == pytest.approx(final["gap"] / se)
        assert u3.control.per_seed[k] == pytest.approx(final["gap_trained"] / se)
        for p in final["ponder"] + init["ponder"]:
            assert 1.0 <= p <= 3.0 + 1e-6  # T = 3 in smoke
    assert u3.threshold == PROTOCOL.claim("u3").threshold == 3.0
    assert [v.control.status for v in (u1, u2, u3)] == ["inconclusive"] * 3  # 3 seeds


def test_paper_preset_builds_and_one_loss_step_runs_on_the_cpu():
    preset = STUDY.preset("paper")
    config = next(s.config for s in build_runs(preset) if s.name == "hyper_ut_s0")
    assert config.loop.device == "cpu"  # `--device cuda` overrides it (run_members)
    assert (config.d_model, config.act_max_steps, config.length) == (256, 12, 10)
    small = config.model_copy(update={"n_train": 64, "eval_size": 8})  # sizes kept, data cut
    parts = build_hop_pvr(small, SeedStreams(0))
    batch = parts.data(torch.Generator().manual_seed(0))
    loss, metrics = parts.loss(parts.model, batch)
    loss.backward()
    assert math.isfinite(float(loss.detach())) and 1.0 <= float(metrics["ponder"]) <= 12.0 + 1.0
    assert parts.model.halt.weight.grad is not None
