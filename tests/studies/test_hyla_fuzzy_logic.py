"""Study hyla-fuzzy-logic: presets, run names, smoke end to end, verdict from the stores."""

from __future__ import annotations

import json
import math

import pytest

from dynascope import studies
from dynascope.store import load_run
from dynascope.studies._hyla_sraven import SRavenRunConfig, analyze_sraven, run_sraven
from dynascope.studies._sequence_training import warmup_cosine
from dynascope.studies.hyla_fuzzy_logic import STUDY, FuzzyRunConfig, build_runs


def test_presets_and_runs():
    assert studies.get("hyla-fuzzy-logic") is STUDY
    fast = build_runs(STUDY.preset("fast"))
    assert sorted(s.name for s in fast) == [
        f"{m}_s{i}" for m in ("hyla", "linear") for i in range(3)
    ]
    base = STUDY.preset("fast").base
    assert (
        base.n_variables,
        base.n_terms,
        base.seq_len,
        base.d_model,
        base.n_heads,
        base.n_layers,
        base.qk_width,
    ) == (4, 2, 32, 64, 8, 2, 16)
    paper = build_runs(STUDY.preset("paper"))
    assert len(paper) == 7 * 3 + 3 * 3 and all(s.config.device == "cuda" for s in paper)
    sraven = [s for s in paper if s.name.startswith("sraven_")]
    assert {s.config.mixer for s in sraven} == {"hyla", "linear", "softmax"}
    assert (sraven[0].config.n_layers, sraven[0].config.n_heads, sraven[0].config.qk_width) == (
        4,
        16,
        64,
    )
    assert sraven[0].config.steps * sraven[0].config.batch_size == 20_000_000
    # seeds move values only; the mixers differ only in the mixer
    a, b = (s.config for s in fast if s.name in ("hyla_s0", "linear_s0"))
    assert a.model_copy(update={"mixer": "linear"}) == b


def test_warmup_cosine_schedule():
    assert warmup_cosine(0, 10, 100, 0.1) == 0.0
    assert math.isclose(warmup_cosine(10, 10, 100, 0.1), 1.0)
    assert math.isclose(warmup_cosine(100, 10, 100, 0.1), 0.1)
    assert math.isclose(warmup_cosine(55, 10, 100, 0.1), 0.55)
    # S3's schedule: no floor (cosine to 0), no warm-up; flat after the last step
    assert math.isclose(warmup_cosine(0, 0, 100), 1.0)
    assert math.isclose(warmup_cosine(50, 0, 100), 0.5)
    assert warmup_cosine(150, 0, 100) == 0.0


def test_smoke_end_to_end(tmp_path):
    outcome = STUDY.run(preset="smoke", out=tmp_path)
    data = json.loads((tmp_path / "verdict.json").read_text())
    assert [r["status"] for r in data["runs"]] == ["finished", "finished"]
    (claim,) = data["claims"]
    per_mixer = {r["mixer"]: r for r in data["tables"]["per mixer (seed mean ± std)"]}
    gap = per_mixer["hyla"]["test.r2.mean"] - per_mixer["linear"]["test.r2.mean"]
    assert math.isclose(claim["measured"], gap, rel_tol=1e-9)
    assert claim["passed"] == (gap >= claim["threshold"])
    assert outcome.passed == claim["passed"]
    best_id = max(per_mixer[m]["train.r2.mean"] for m in ("hyla", "linear"))
    assert ("undertrained" in claim["detail"]) == (not best_id >= 0.5)
    per_run = data["tables"]["per run"]
    assert all(math.isfinite(r["probe.id.r2_best_layer"]) for r in per_run)
    assert len(list((tmp_path / "figures").glob("*.png"))) == 2


def test_sraven_runner_and_verdict(tmp_path):
    """Tiny sRAVEN runs (K 2, 10 steps) write accuracies; the verdict orders the seed means."""
    runs = {}
    for mixer in ("hyla", "linear", "softmax"):
        cfg = SRavenRunConfig(
            mixer=mixer,
            n_features=2,
            d_model=16,
            n_layers=1,
            n_heads=2,
            qk_width=4,
            d_mlp=16,
            batch_size=8,
            steps=10,
            warmup_steps=2,
            log_every=5,
            eval_every=10,
            eval_sequences=32,
        )
        run_sraven(cfg, tmp_path / mixer)
        runs[f"sraven_{mixer}_s0"] = load_run(tmp_path / mixer)
    verdict, rows = analyze_sraven(runs)
    acc = {r["mixer"]: r["ood.acc"] for r in rows}
    assert all(0.0 <= a <= 1.0 for a in acc.values())
    assert math.isclose(verdict.measured, acc["hyla"] - max(acc["linear"], acc["softmax"]))
    assert verdict.passed == (verdict.measured > 0)


def test_config_rejects_widths_the_heads_do_not_divide():
    with pytest.raises(ValueError, match=r"n_heads must divide qk_width \(got qk_width=10"):
        FuzzyRunConfig(qk_width=10, n_heads=4)
    with pytest.raises(ValueError, match="n_heads must divide qk_width"):
        SRavenRunConfig(qk_width=10, n_heads=4)
    with pytest.raises(ValueError, match="mixer"):
        FuzzyRunConfig(mixer="hypa")
