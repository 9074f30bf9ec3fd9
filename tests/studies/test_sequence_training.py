"""Shared training pieces of the S3/S4 studies: schedule, optimizer groups, loop, config check."""

from __future__ import annotations

import math

import pytest
import torch

from dynascope.store import load_run
from dynascope.studies._run_values import last_or_nan
from dynascope.studies._sequence_training import (
    MixerTransformerConfig,
    SequenceTrainingConfig,
    adamw_warmup_cosine,
    open_run,
    train_steps,
    warmup_cosine,
)


def test_adamw_groups_and_lr_follow_the_closed_form():
    """>= 2-D parameters decay, 1-D do not; lr after each step = lr * warmup_cosine(step)."""
    model = torch.nn.Linear(3, 2)
    cfg = SequenceTrainingConfig(lr=0.5, weight_decay=0.3, warmup_steps=2, steps=6)
    opt, sched = adamw_warmup_cosine(model, cfg, final_lr_frac=0.1)
    decay, no_decay = opt.param_groups
    assert [p.shape for p in decay["params"]] == [torch.Size([2, 3])]
    assert [p.shape for p in no_decay["params"]] == [torch.Size([2])]
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.3, 0.0)
    for step in range(8):
        # float arithmetic of the same expression: exact equality is expected
        assert decay["lr"] == 0.5 * warmup_cosine(step, 2, 6, 0.1)
        opt.step()
        sched.step()
    assert math.isclose(decay["lr"], 0.5 * 0.1)


def test_train_steps_logs_on_its_cadence_and_finishes(tmp_path):
    cfg = SequenceTrainingConfig(steps=7, log_every=2, eval_every=3, warmup_steps=0)
    model = torch.nn.Linear(2, 1)
    x = torch.ones(4, 2)
    with open_run(cfg, tmp_path) as store:
        ok = train_steps(
            store,
            model,
            cfg,
            lambda: model(x).square().mean(),
            lambda: {"eval.w": model.weight.sum().detach()},
            grad_clip=1.0,
        )
        store.set_status(cfg.steps, "finished")
    run = load_run(tmp_path)
    assert ok and run.status == "finished"
    assert list(run.scalar("train.loss").index) == [2, 4, 6]
    assert list(run.scalar("eval.w").index) == [3, 6, 7]
    assert math.isnan(last_or_nan(run, "never.logged"))
    assert last_or_nan(run, "eval.w") == run.last("eval.w")


def test_train_steps_stops_at_a_non_finite_loss(tmp_path):
    cfg = SequenceTrainingConfig(steps=10, log_every=1, eval_every=1)
    model = torch.nn.Linear(2, 1)
    losses = iter([1.0, 2.0, float("nan"), 3.0])

    def loss_fn() -> torch.Tensor:
        return model.weight.sum() * 0 + next(losses)

    with open_run(cfg, tmp_path) as store:
        ok = train_steps(store, model, cfg, loss_fn, lambda: {"eval.one": torch.tensor(1.0)})
    run = load_run(tmp_path)
    assert not ok and run.status == "diverged"
    assert list(run.scalar("train.loss").index) == [1, 2]
    assert list(run.scalar("eval.one").index) == [1, 2]


def test_mixer_config_rejects_heads_that_do_not_divide_the_width():
    with pytest.raises(ValueError, match="n_heads must divide qk_width"):
        MixerTransformerConfig(n_heads=3, qk_width=16)
