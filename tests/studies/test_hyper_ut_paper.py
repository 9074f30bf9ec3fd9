"""hyper-ut-pvr's paper-only runs: vector-PVR sweep, digits compute comparison, visual PVR.

The runners run at a tiny size (10 steps) through the study machinery; the stored metrics are
checked against independent recomputations (brute-force labels, the configs, seed means).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter

import numpy as np
import pytest
import torch

from dynascope.nn.universal import HyperUT, UniversalTransformer
from dynascope.store import load_run
from dynascope.studies.hyper_ut_pvr import STUDY, HyperUTPresets, analyze, build_runs
from dynascope.studies.hyper_ut_pvr.analysis import gap_standard_error
from dynascope.studies.hyper_ut_pvr.runs import DigitsRun, VectorPVRRun, effective_holdout
from dynascope.studies.hyper_ut_pvr.study import DigitsComparison, VectorSweep, VisualPVRSweep
from dynascope.tasks.digits_pvr import DigitsPVR
from dynascope.tasks.pvr import VectorPVR
from dynascope.train import Loop, SeedStreams

TINY = dict(d_model=16, n_heads=2, d_mlp=32, act_max_steps=3, loop=Loop(steps=10, log_every=5))


def _tiny() -> HyperUTPresets:
    vector = VectorSweep(
        base=VectorPVRRun(
            model="fixed", n_layers=1, holdout=1, n_train=256, batch_size=16, eval_size=64, **TINY
        ),
        complexities=[0, 1],
        aggregations=["sum", "mode"],
    )
    digits = DigitsComparison(
        base=DigitsRun(model="vit", patch_size=4, n_layers=2, batch_size=32, **TINY)
    )
    visual = VisualPVRSweep(
        base=digits.base.model_copy(
            update={"task": "visual_pvr", "grid": 2, "n_examples": 128, "eval_size": 64}
        ),
        complexities=[0, 1],
        models=["vit", "hyper_ut"],
    )
    update = {"vector": vector, "digits": digits, "visual": visual}
    return STUDY.preset("smoke").model_copy(update=update | {"seeds": 1})


@pytest.fixture(scope="module")
def tiny_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("hut_paper")
    study = dataclasses.replace(STUDY, presets={"smoke": _tiny})
    outcome = study.run(preset="smoke", out=out)
    return outcome, out, json.loads((out / "verdict.json").read_text())


def _brute(window: list[int], agg: str) -> int:
    if agg == "sum":
        return sum(window) % 10
    counts = Counter(window)  # mode; ties go to the smallest value
    return min(v for v, c in counts.items() if c == max(counts.values()))


def test_paper_preset_validates_and_builds_every_run():
    preset = STUDY.preset("paper")
    assert HyperUTPresets.model_validate(preset.model_dump()) == preset
    specs = build_runs(preset)
    names = [s.name for s in specs]
    # 5 seeds: hop-PVR (3 models + the shuffled-label UT-ACT), vector PVR (3 models x 4 m x
    # 5 aggregations), digits (3 models), visual PVR (3 models x 3 m)
    assert len(set(names)) == len(names) == 4 * 5 + 3 * 4 * 5 * 5 + 3 * 5 + 3 * 3 * 5
    assert {s.group for s in specs if s.config.model in ("fixed", "vit")} >= {"fixed", "digits_vit"}
    assert all(s.group is None for s in specs if s.config.model in ("ut_act", "hyper_ut"))
    vec = [s for s in specs if s.name.startswith("vec_")]
    assert {s.config.agg for s in vec} == {"sum", "min", "max", "median", "mode"}
    assert {s.config.complexity for s in vec} == {1, 2, 3, 4}
    for s in vec:  # effective holdout leaves some orderings trainable
        assert s.config.holdout == min(3, math.factorial(s.config.complexity + 1) - 1)
        VectorPVR(complexity=s.config.complexity, agg=s.config.agg, holdout=s.config.holdout)
    digits = [s.config for s in specs if s.name.startswith("digits_")]
    assert {c.model for c in digits} == {"vit", "ut_act", "hyper_ut"}
    assert all(c.act_max_steps == 2 * c.n_layers for c in digits)  # S8: T = 2 · num_layers
    visual = [s.config for s in specs if s.name.startswith("vpvr_")]
    assert {(c.task, c.grid, c.complexity) for c in visual} == {
        ("visual_pvr", 3, m) for m in (0, 1, 2)
    }
    with pytest.raises(ValueError, match=r"complexity must be <= grid² − 2 = 2"):
        DigitsRun(model="vit", task="visual_pvr", grid=2, complexity=3, loop=Loop(steps=1))


def test_effective_holdout_caps_at_all_but_one_permutation():
    assert [effective_holdout(3, m) for m in (0, 1, 2, 5)] == [0, 1, 3, 3]


def test_act_state_matches_act_on_embedded_tokens():
    x = torch.randint(7, (2, 5))
    for cls in (UniversalTransformer, HyperUT):
        torch.manual_seed(0)
        model = cls(d_vocab=7, d_out=3, n_ctx=5, d_model=6, n_heads=2, d_mlp=11, act_max_steps=4)
        a, b = model.act(x), model.act_state(model.embed(x))
        torch.testing.assert_close(a.output, b.output, rtol=0, atol=0)  # same computation
        torch.testing.assert_close(a.n_updates, b.n_updates, rtol=0, atol=0)
    assert model.last_mix_entropy.shape == (b.steps, 2)
    with pytest.raises(ValueError, match=r"state must have shape \[batch, pos <= 5, d_model=6\]"):
        model.act_state(torch.zeros(2, 6, 6))


def test_vector_runner_stores_accuracies_and_brute_force_majority(tiny_out):
    _, out, _ = tiny_out
    names = sorted(p.name for p in (out / "runs").iterdir() if p.name.startswith("vec_"))
    assert len(names) == 3 * 2 * 2
    for name in names:
        run = load_run(out / "runs" / name)
        cfg = VectorPVRRun.model_validate(run.config)
        assert run.status == "finished"
        assert list(run.scalar("train.loss").index) == [5, 10]
        task = VectorPVR(complexity=cfg.complexity, agg=cfg.agg, holdout=cfg.holdout)
        batch = task.batch("val", 64, SeedStreams(cfg.seed).generator("eval_standard"))
        labels = [
            _brute(x[1:][x[0] : x[0] + cfg.complexity + 1], cfg.agg) for x in batch["x"].tolist()
        ]
        majority = max(Counter(labels).values()) / 64
        assert run.last("eval.standard.majority") == pytest.approx(majority, abs=1e-6)
        assert 0.0 <= run.last("eval.standard.accuracy") <= 1.0
        if cfg.complexity == 0:  # holdout capped at 0: no adversarial set
            assert cfg.holdout == 0
            with pytest.raises(KeyError):
                run.last("eval.adversarial.accuracy")
        else:
            assert cfg.holdout == 1 and 0.0 <= run.last("eval.adversarial.accuracy") <= 1.0
        if cfg.model != "fixed":
            assert 1.0 <= run.last("eval.standard.ponder") <= 3.0 + 1e-6  # T = 3
            assert run.last("eval.standard.steps") <= 3.0


def test_digits_runner_stores_accuracy_and_layers(tiny_out):
    _, out, _ = tiny_out
    for model in ("vit", "ut_act", "hyper_ut"):
        run = load_run(out / "runs" / f"digits_{model}_s0")
        assert run.status == "finished"
        assert 0.0 <= run.last("eval.accuracy") <= 1.0
        assert list(run.scalar("train.loss").index) == [5, 10]
        if model == "vit":
            assert run.last("eval.layers") == 2.0
        else:
            assert run.last("eval.layers") == run.last("eval.ponder")
            assert 1.0 <= run.last("eval.layers") <= 3.0 + 1e-6
            assert 0.0 <= run.last("eval.at_max") <= 1.0
    with pytest.raises(KeyError):
        load_run(out / "runs" / "digits_ut_act_s0").last("eval.mix_entropy")
    assert load_run(out / "runs" / "digits_hyper_ut_s0").last("eval.mix_entropy") >= 0.0


def test_visual_pvr_runner_stores_accuracy_majority_and_layers(tiny_out):
    _, out, _ = tiny_out
    task = DigitsPVR(grid=2, complexity=1, patch_size=4)
    y = task.batch("val", 64, SeedStreams(0).generator("val"))["y"]
    majority = max(Counter(y.tolist()).values()) / 64
    for model in ("vit", "hyper_ut"):
        run = load_run(out / "runs" / f"vpvr_{model}_m1_s0")
        assert run.status == "finished" and run.config["task"] == "visual_pvr"
        assert run.last("eval.majority") == pytest.approx(majority, abs=1e-6)
        assert 0.0 <= run.last("eval.accuracy") <= 1.0
    assert 1.0 <= load_run(out / "runs" / "vpvr_hyper_ut_m1_s0").last("eval.layers") <= 3.0 + 1e-6


def test_paper_tables_are_seed_means_of_the_stores(tiny_out):
    outcome, out, data = tiny_out
    assert [c["claim"].split(":")[0] for c in data["claims"]] == ["u1", "u2", "u3"]
    hop = {n: load_run(out / "runs" / n) for n in ("ut_act_s0", "hyper_ut_s0")}
    gap = hop["hyper_ut_s0"].last("eval.h3.accuracy") - hop["ut_act_s0"].last("eval.h3.accuracy")
    se = gap_standard_error(hop["ut_act_s0"].config["eval_size"])  # u3 reads gaps in SE units
    assert outcome.claims[2].measured == pytest.approx(gap / se)  # paper runs do not enter u1-u3
    vector = data["tables"]["vector PVR per m and aggregation (seed means)"]
    assert [(r["m"], r["agg"]) for r in vector] == [
        (0, "sum"),
        (0, "mode"),
        (1, "sum"),
        (1, "mode"),
    ]
    for row in vector:
        for model in ("fixed", "ut_act", "hyper_ut"):
            run = load_run(out / "runs" / f"vec_{model}_m{row['m']}_{row['agg']}_s0")
            assert row[f"{model}.standard"] == pytest.approx(run.last("eval.standard.accuracy"))
            if row["m"] == 0:
                assert row[f"{model}.adversarial"] is None  # NaN -> null in verdict.json
    digits = {r["model"]: r for r in data["tables"]["digits: ViT vs adaptive depth (seed means)"]}
    vit = load_run(out / "runs" / "digits_vit_s0").last("eval.accuracy")
    for model in ("ut_act", "hyper_ut"):
        run = load_run(out / "runs" / f"digits_{model}_s0")
        assert digits[model]["accuracy − ViT"] == pytest.approx(run.last("eval.accuracy") - vit)
        saving = 1.0 - run.last("eval.layers") / 2.0
        assert digits[model]["layer saving vs ViT"] == pytest.approx(saving)
        by_n = 1.0 - run.last("eval.steps") / 2.0
        assert digits[model]["saving by n alone"] == pytest.approx(by_n)
    assert digits["vit"]["layer saving vs ViT"] == 0.0
    visual = data["tables"]["visual PVR on digit tiles (seed means)"]
    assert [r["m"] for r in visual] == [0, 1]
    for row in visual:
        vit = load_run(out / "runs" / f"vpvr_vit_m{row['m']}_s0")
        assert row["vit.accuracy"] == pytest.approx(vit.last("eval.accuracy"))
        assert row["vit.layers"] == 2.0 and row["ut_act.accuracy"] is None  # not in this sweep
    for name in ("pvr_hops.png", "vector_pvr.png", "digits_compute.png", "visual_pvr.png"):
        assert (out / "figures" / name).is_file()


def test_analysis_without_paper_runs_has_only_the_hop_table(tiny_out, tmp_path):
    _, out, _ = tiny_out
    runs = {n: load_run(out / "runs" / n) for n in ("fixed_s0", "ut_act_s0", "hyper_ut_s0")}
    analysis = analyze(runs, tmp_path)
    assert list(analysis.tables) == ["per hop count", "per seed"]
    assert [p.name for p in analysis.figures] == ["pvr_hops.png"]
    assert np.isfinite(analysis.verdicts[2].measured)
