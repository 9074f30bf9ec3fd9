"""Trainer: determinism, exact resume, L2 mode, divergence, evaluation."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
import torch

from dynascope.config import validate_config
from dynascope.store import load_run
from dynascope.train import SeedStreams, Trainer, build_registry, run_members


def _config(**train):
    return validate_config(
        {
            "model": {"n_layers": 2, "d_model": 12, "n_heads": 3, "d_mlp": 0, "use_ln": False},
            "task": {"name": "associative_recall", "n_keys": 6, "n_values": 5, "n_pairs": 3},
            "optimizer": {"name": "adamw", "lr": 1e-2, "weight_decay": {"attention": 0.1}},
            "train": {
                "steps": 40,
                "batch_size": 8,
                "log_every": 3,
                "eval_every": 7,
                "eval_batches": 2,
                "checkpoint_every": 10,
                **train,
            },
            "monitor": {
                "probes": ["qk_spectrum", "ov_spectrum", "parameter_norms"],
                "schedule": "every",
                "every": 4,
            },
        }
    )


def _scalars(path) -> pd.DataFrame:
    return load_run(path).scalars.sort_values(["step", "key"]).reset_index(drop=True)


def test_same_config_and_seed_give_identical_metrics(tmp_path):
    cfg = _config()
    Trainer(cfg, tmp_path / "a").run()
    Trainer(cfg, tmp_path / "b").run()
    pd.testing.assert_frame_equal(_scalars(tmp_path / "a"), _scalars(tmp_path / "b"))


def _crashing_build(config, streams):
    """The registry build whose 27th training batch raises (rows of steps 21..26 are then past
    checkpoint 20)."""
    parts = build_registry(config, streams)
    calls, data = {"n": 0}, parts.data

    def crashing_data(generator):
        calls["n"] += 1
        if calls["n"] == 27:
            raise RuntimeError("simulated crash")
        return data(generator)

    return dataclasses.replace(parts, data=crashing_data)


def test_resume_after_crash_reproduces_the_uninterrupted_run_exactly(tmp_path):
    cfg = _config()
    Trainer(cfg, tmp_path / "full").run()

    with pytest.raises(RuntimeError, match="simulated crash"):
        run_members(_crashing_build, cfg, tmp_path / "crashed")
    crashed = load_run(tmp_path / "crashed")
    assert crashed.scalars["step"].max() > 20  # rows after the checkpoint were committed
    assert crashed.status == "running"

    result = Trainer(cfg, tmp_path / "crashed").run(resume=True)
    assert result.status == "finished"
    resumed = _scalars(tmp_path / "crashed")
    assert not resumed.duplicated(["step", "key"]).any()
    pd.testing.assert_frame_equal(resumed, _scalars(tmp_path / "full"))
    events = load_run(tmp_path / "crashed").events
    assert "resumed" in set(events["kind"])


def test_l2_mode_adds_the_penalty_and_differs_from_decoupled(tmp_path):
    cfg = _config(steps=12)
    l2 = validate_config(cfg.model_dump(mode="json"), ["optimizer.mode=l2"])
    Trainer(cfg, tmp_path / "dec").run()
    parts = build_registry(l2, SeedStreams(l2.seed))
    parts.optimizer(parts.model)
    expected = (
        0.5
        * 0.1
        * sum(
            p.square().sum()
            for n, p in parts.model.named_parameters()
            if n.endswith(("W_Q", "W_K", "W_V", "W_O"))
        )
    )
    name, penalty = parts.extra_loss
    assert name == "l2_penalty"
    torch.testing.assert_close(penalty(), expected)
    Trainer(l2, tmp_path / "l2").run()
    run = load_run(tmp_path / "l2")
    assert run.last("train.l2_penalty") > 0
    assert run.last("val.loss") != load_run(tmp_path / "dec").last("val.loss")


def test_huge_learning_rate_is_recorded_as_divergence(tmp_path):
    cfg = validate_config(
        _config().model_dump(mode="json"), ["optimizer.lr=1e30", "optimizer.name=sgd"]
    )
    result = Trainer(cfg, tmp_path / "div").run()
    assert result.status == "diverged"
    run = load_run(tmp_path / "div")
    assert run.status == "diverged"
    row = run.events[run.events["kind"] == "diverged"].iloc[0]
    assert "not finite" in row["detail"]


@torch.no_grad()
def test_evaluation_uses_the_same_batches_every_time():
    cfg = _config()
    parts = build_registry(cfg, SeedStreams(cfg.seed))
    assert parts.evaluate(parts.model) == parts.evaluate(parts.model)
    state = torch.get_rng_state()
    parts.evaluate(parts.model)
    assert torch.equal(state, torch.get_rng_state())


def test_probe_keys_are_logged_on_schedule(tmp_path):
    Trainer(_config(steps=8), tmp_path / "p").run()
    run = load_run(tmp_path / "p")
    assert sorted(run.scalar("qk.mean.rank_1e-2").index) == [0, 4, 8]
    steps, spectra = run.tensors("qk.singular_values")
    assert spectra.shape == (3, 2, 3, 4)  # [probe steps, n_layers, n_heads, d_head]
