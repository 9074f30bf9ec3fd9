"""Study hyla-fuzzy-logic: presets, run names and groups, smoke end to end, claim s4 recomputed
from the stores under the verdict contract, sRAVEN build and claim."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from dynascope import studies
from dynascope.store import load_run
from dynascope.studies.hyla_fuzzy_logic.protocol import ID_FIT, PROTOCOL
from dynascope.studies.hyla_fuzzy_logic.runs import FuzzyRunConfig
from dynascope.studies.hyla_fuzzy_logic.sraven import (
    SRavenRunConfig,
    analyze_sraven,
    build_sraven,
)
from dynascope.studies.hyla_fuzzy_logic.study import STUDY, build_runs
from dynascope.train import Loop, run_members


def test_presets_and_runs():
    assert studies.get("hyla-fuzzy-logic") is STUDY
    fast = build_runs(STUDY.preset("fast"))
    names = [f"{m}_s{i}" for m in ("hyla", "linear") for i in range(5)]
    assert [s.name for s in fast] == names + [f"linear_twin_s{i}" for i in range(5)]
    assert [s.group for s in fast] == ["hyla"] * 5 + ["linear"] * 10
    assert [s.config.seed for s in fast] == [0, 1, 2, 3, 4] * 2 + [100, 101, 102, 103, 104]
    assert PROTOCOL.seeds["fast"] == 5 and STUDY.protocol is PROTOCOL
    base = STUDY.preset("fast").base
    sizes = (base.n_variables, base.n_terms, base.seq_len, base.d_model, base.n_heads)
    assert sizes + (base.n_layers, base.d_head, base.batch_size) == (4, 2, 32, 64, 8, 2, 2, 128)
    paper = build_runs(STUDY.preset("paper"))
    assert len(paper) == 7 * 5 + 5 + 3 * 5
    assert all(s.config.loop.device == "cuda" for s in paper)
    sraven = [s for s in paper if s.name.startswith("sraven_")]
    assert {s.config.attention for s in sraven} == {"hyla", "linear", "softmax"}
    cfg = sraven[0].config
    assert (cfg.n_layers, cfg.n_heads, cfg.n_heads * cfg.d_head) == (4, 16, 64)
    assert cfg.loop.steps * cfg.batch_size == 20_000_000
    fuzzy = next(s.config for s in paper if s.name == "hyla_s0")
    assert (fuzzy.loop.steps, fuzzy.d_model, fuzzy.d_mlp, fuzzy.relative_position_buckets) == (
        50_000,
        128,
        256,
        128,
    )
    # the kinds differ only in the attention; --seed shifts every seed
    a, b = (s.config for s in fast if s.name in ("hyla_s0", "linear_s0"))
    assert a.model_copy(update={"attention": "linear"}) == b
    assert {s.config.seed for s in build_runs(STUDY.preset("fast"), 1000)}.isdisjoint(
        {s.config.seed for s in fast}
    )


def test_smoke_end_to_end(smoke_out):
    outcome, out = smoke_out
    data = json.loads((out / "verdict.json").read_text())
    assert [r["status"] for r in data["runs"]] == ["finished"] * 9
    (claim,) = data["claims"]
    test = {r["run"]: r["test.r2"] for r in data["tables"]["per run"]}
    train = {r["run"]: r["train.r2"] for r in data["tables"]["per run"]}
    gaps = [test[f"hyla_s{i}"] - test[f"linear_s{i}"] for i in range(3)]
    twins = [test[f"linear_twin_s{i}"] - test[f"linear_s{i}"] for i in range(3)]
    np.testing.assert_allclose(claim["per_seed"], gaps, rtol=1e-12)
    assert claim["seeds"] == [0, 1, 2]
    # the control is the ablation (linear twins in HYLA's place), read from the twin runs
    assert claim["control"]["kind"] == "ablation" and claim["control"]["seeds"] == [100, 101, 102]
    np.testing.assert_allclose(claim["control"]["per_seed"], twins, rtol=1e-12)
    assert claim["control"]["per_seed"] != claim["per_seed"]
    assert math.isclose(claim["measured"], float(np.mean(gaps)), rel_tol=1e-12)
    spec = PROTOCOL.claim("s4")
    assert (claim["threshold"], claim["direction"]) == (spec.threshold, spec.direction)
    assert data["protocol"]["sha256"] == PROTOCOL.sha256
    fit = min(train.values())  # every run, the twins included
    assert math.isclose(claim["precondition"]["measured"], fit, rel_tol=1e-12)
    assert claim["precondition"]["met"] == (fit >= ID_FIT)
    # smoke has 3 seeds (< 5) and models that fit nothing: never held or not held
    assert claim["status"] == "inconclusive" and claim["n_seeds"] == 3
    assert outcome.passed is False
    per_run = data["tables"]["per run"]
    assert all(math.isfinite(r["probe.id.r2_best_layer"]) for r in per_run)
    assert len(list((out / "figures").glob("*.png"))) == 3


def test_sraven_build_and_claim(tmp_path):
    """Tiny sRAVEN ensembles (K 2, 10 steps, 3 seeds) write accuracies; the claim takes per seed
    HYLA − max(linear, softmax), and its control linear − max(HYLA, softmax)."""
    loop = Loop(steps=10, log_every=5, eval_every=10)
    runs = {}
    for kind in ("hyla", "linear", "softmax"):
        cfgs = [
            SRavenRunConfig(
                loop=loop,
                attention=kind,
                seed=s,
                n_features=2,
                d_model=16,
                n_layers=1,
                n_heads=2,
                d_head=2,
                d_mlp=16,
                batch_size=8,
                eval_sequences=32,
            )  # fmt: skip
            for s in range(3)
        ]
        dirs = [tmp_path / f"sraven_{kind}_s{s}" for s in range(3)]
        run_members(build_sraven, cfgs, dirs)
        runs.update({d.name: load_run(d) for d in dirs})
    verdict, rows = analyze_sraven(runs)
    acc = {r["run"]: r["ood.acc"] for r in rows}
    assert all(0.0 <= a <= 1.0 for a in acc.values())
    expect = [acc[f"sraven_hyla_s{i}"] - max(acc[f"sraven_{k}_s{i}"] for k in ("linear", "softmax"))
              for i in range(3)]  # fmt: skip
    np.testing.assert_allclose(verdict.per_seed, expect, rtol=1e-12)
    assert verdict.status in ("held", "not held", "inconclusive")
    if not verdict.precondition.met:
        assert verdict.status == "inconclusive"


def test_config_rejects_an_unknown_attention():
    loop = Loop(steps=1)
    with pytest.raises(ValueError, match="attention"):
        FuzzyRunConfig(loop=loop, attention="hypa")
    with pytest.raises(ValueError, match="d_head"):
        FuzzyRunConfig(loop=loop, d_head=0)


def test_paper_runs_build_and_step():
    """Every distinct paper model (7 attention kinds at d_model 128; sRAVEN at 4 layers, 16
    heads) builds from its config and takes one loss step (small eval sets, on the CPU)."""
    from dynascope.studies.hyla_fuzzy_logic.runs import build_fuzzy
    from dynascope.train import SeedStreams

    seen = set()
    for spec in build_runs(STUDY.preset("paper")):
        if spec.group in seen:
            continue
        seen.add(spec.group)
        small = {"eval_sequences": 8, "batch_size": 4}
        if "n_features" not in spec.config.model_dump():
            small["probe_sequences"] = 8
        cfg = spec.config.model_copy(update=small)
        build = build_sraven if spec.group.startswith("sraven") else build_fuzzy
        parts = build(cfg, SeedStreams(0))
        loss = parts.loss(parts.model, parts.data(torch.Generator().manual_seed(0)))
        loss.backward()
        assert loss.ndim == 0 and torch.isfinite(loss)
    assert len(seen) == 7 + 3


def _fake_runs(tmp_path, test_r2, train_r2):
    """Stores of finished runs with given final ``test.r2``/``train.r2`` (by run name)."""
    from dynascope.store import RunStore

    runs = {}
    for name, test in test_r2.items():
        attention = "hyla" if name.startswith("hyla") else "linear"
        with RunStore(tmp_path / name) as store:
            seed = int(name[-1]) + (100 if name.startswith("linear_twin") else 0)
            store.write_config({"attention": attention, "seed": seed, "n_layers": 1})
            store.log(10, {"test.r2": test, "train.r2": train_r2[name], "ood.r2": -1.0})
            store.set_status(10, "finished")
        runs[name] = load_run(tmp_path / name)
    return runs


@pytest.mark.parametrize(
    ("hyla", "twin", "fit", "unfit", "status"),
    [
        (0.5, 0.3, 0.6, None, "held"),  # gap 0.2 per seed, twins within noise, all fit
        (0.32, 0.3, 0.6, None, "not held"),  # gap 0.02 < 0.05
        (0.5, 0.3, 0.3, None, "inconclusive"),  # nothing fits: precondition fails
        (0.5, 0.3, 0.6, "linear_twin_s2", "inconclusive"),  # one control run did not fit
        (0.5, 0.3, 0.6, "hyla_s4", "inconclusive"),  # one treated run did not fit
        (0.5, 0.5, 0.6, None, "inconclusive"),  # the twins differ as much: the control holds
    ],
)
def test_claim_status_on_hand_built_stores(tmp_path, hyla, twin, fit, unfit, status):
    """Five seeds per arm; the precondition reads every run (treated, baseline and twins)."""
    from dynascope.studies.hyla_fuzzy_logic.analysis import analyze

    names = [f"{k}_s{i}" for k in ("hyla", "linear", "linear_twin") for i in range(5)]
    base = {"hyla": hyla, "linear": 0.3, "linear_twin": twin}
    test = {n: base[n.rsplit("_s", 1)[0]] + 0.001 * int(n[-1]) for n in names}
    train = {n: 0.2 if n == unfit else fit for n in names}
    runs = _fake_runs(tmp_path / "runs", test, train)
    (verdict,) = analyze(runs, tmp_path / "figures").verdicts
    assert verdict.status == status, verdict.reason
    np.testing.assert_allclose(verdict.per_seed, [hyla - 0.3] * 5, atol=1e-12)
    assert list(verdict.control.per_seed) == [100, 101, 102, 103, 104]
    assert verdict.precondition.met == (unfit is None and fit >= ID_FIT)


def test_table_a1_side_by_side_on_hand_built_stores(tmp_path):
    """The Table A1 rows: numpy's seed mean and std (ddof 1) of the stored test R² per kind,
    next to the paper's 81.13 ± 7.77 vs 59.89 ± 5.22 (twins excluded); the verdict's detail
    carries both."""
    from dynascope.studies.hyla_fuzzy_logic.analysis import PAPER_TABLE_A1, analyze

    names = [f"{k}_s{i}" for k in ("hyla", "linear", "linear_twin") for i in range(5)]
    rng = np.random.default_rng(0)
    test = {n: float(rng.uniform(0.2, 0.8)) for n in names}
    runs = _fake_runs(tmp_path / "runs", test, dict.fromkeys(names, 0.6))
    analysis = analyze(runs, tmp_path / "figures")
    rows = analysis.tables["Table A1 side by side (test R², the paper's 'OOD R²')"]
    assert [r["attention"] for r in rows] == ["hyla", "linear"]
    for row in rows:
        vals = [test[f"{row['attention']}_s{i}"] for i in range(5)]
        assert math.isclose(row["test.r2 here (mean)"], np.mean(vals), rel_tol=1e-12)
        assert math.isclose(row["test.r2 here (std)"], np.std(vals, ddof=1), rel_tol=1e-12)
        assert row["seeds here"] == 5 and row["paper seeds"] == 3
    assert PAPER_TABLE_A1 == {"hyla": (0.8113, 0.0777), "linear": (0.5989, 0.0522)}
    detail = analysis.verdicts[0].detail
    assert "0.811 ± 0.078 vs 0.599 ± 0.052" in detail
    assert f"hyla {rows[0]['test.r2 here (mean)']:.3f}" in detail


def test_ensemble_members_equal_lone_runs_in_float64(tmp_path):
    """HYLA under the engine's vmapped ensemble: member 1 of K = 2 ends with the metrics of its
    lone run to 1e-10 (float64; the oracle is the lone run)."""
    from dynascope.studies.hyla_fuzzy_logic.runs import build_fuzzy

    base = STUDY.preset("smoke").base
    loop = base.loop.model_copy(update={"steps": 6, "eval_every": 3, "dtype": "float64"})
    cfgs = [base.model_copy(update={"loop": loop, "seed": s}) for s in (0, 1)]
    run_members(build_fuzzy, cfgs, [tmp_path / "e0", tmp_path / "e1"])
    run_members(build_fuzzy, cfgs[1], tmp_path / "lone")
    ens, lone = load_run(tmp_path / "e1").scalars, load_run(tmp_path / "lone").scalars
    assert list(ens.key) == list(lone.key) and list(ens.step) == list(lone.step)
    np.testing.assert_allclose(ens.value.to_numpy(), lone.value.to_numpy(), rtol=1e-10, atol=1e-10)
