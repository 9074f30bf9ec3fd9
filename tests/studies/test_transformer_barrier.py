"""The permuted-initialisations study's transformer-barrier runs (issue 20, item 3), end to end
on a tiny configuration: two nets trained side by side by the engine, matched both ways,
interpolated.

Oracles: the aligned nets compute net b's function, so every path ends at the same two losses
(float32 forward passes of permuted weights: 1e-5 nats); a barrier is never negative; the
study's preset builds one run per seed pair with the pair's seed, the pairs one ensemble.
"""

from __future__ import annotations

import math

import torch

from dynascope import load_run
from dynascope.studies.permuted_initialisations import STUDY, build_runs
from dynascope.studies.permuted_initialisations.analysis import analyze
from dynascope.studies.permuted_initialisations.transformer import (
    TransformerBarrierRun,
    barrier_tables,
    build_transformer_pair,
    split_runs,
)
from dynascope.train import Loop, run_members

TINY = TransformerBarrierRun(
    seed=1,
    d_model=8,
    n_heads=2,
    d_mlp=6,
    batch_size=16,
    n_match=32,
    n_eval=64,
    n_alphas=3,
    loop=Loop(steps=4, log_every=2),
)


def test_a_tiny_pair_end_to_end(tmp_path):
    run_members(build_transformer_pair, TINY, tmp_path / "transformer_recall_p0")
    run = load_run(tmp_path / "transformer_recall_p0")
    assert run.status == "finished" and run.config["group"] == "transformer"
    paths = {m: run.tensors(f"path.{m}.loss")[1][-1] for m in ("vanilla", "activation", "weight")}
    for method in ("activation", "weight"):
        torch.testing.assert_close(
            torch.as_tensor(paths[method])[[0, -1]],
            torch.as_tensor(paths["vanilla"])[[0, -1]],
            rtol=0,
            atol=1e-5,
        )
        assert run.last(f"barrier.{method}.loss") >= 0
    assert run.last("barrier.vanilla.error") >= 0
    assert "train.net0.loss" in set(run.scalars["key"])  # each net's own training loss
    others, mine = split_runs({"transformer_recall_p0": run})
    assert not others and list(mine) == ["transformer_recall_p0"]
    [(title, rows)] = barrier_tables(mine).items()
    assert "before/after matching" in title and rows[0]["seed"] == 1
    assert not math.isnan(rows[0]["NLL barrier activation (nats)"])
    assert barrier_tables({}) == {}
    # the study's analysis sets the run aside from the MLP/CNN runs and reports its table
    (tmp_path / "figures").mkdir()
    analysis = analyze({"transformer_recall_p0": run}, tmp_path / "figures")
    assert analysis.tables[title] == rows


def test_the_pairs_of_a_preset_are_one_ensemble_of_consecutive_seeds():
    specs = [s for s in build_runs(STUDY.preset("fast")) if s.config.group == "transformer"]
    assert [s.name for s in specs] == [f"transformer_recall_p{k}" for k in range(3)]
    assert [s.config.seed for s in specs] == [0, 1, 2]
    assert {s.group for s in specs} == {"transformer"}
    smoke = [s for s in build_runs(STUDY.preset("smoke")) if s.config.group == "transformer"]
    assert [s.config.loop.steps for s in smoke] == [4]
