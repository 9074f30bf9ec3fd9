"""Shared pieces of the S3/S4 studies on the engine: AdamW groups and the run config."""

from __future__ import annotations

import pickle

import pytest
import torch

from dynascope.studies._sequence_training import SequenceRunConfig, adamw_matrices
from dynascope.train import Loop


def test_adamw_decays_matrices_only_and_pickles():
    """>= 2-D parameters decay at the config's rate, 1-D ones not; one AdamW step on a decayed
    matrix with zero gradient equals the closed form w (1 − lr·wd)."""
    model = torch.nn.Linear(3, 2)
    cfg = SequenceRunConfig(loop=Loop(steps=1), lr=0.5, weight_decay=0.3)
    build = pickle.loads(pickle.dumps(adamw_matrices(cfg)))
    opt = build(model)
    decay, no_decay = opt.param_groups
    assert [p.shape for p in decay["params"]] == [torch.Size([2, 3])]
    assert [p.shape for p in no_decay["params"]] == [torch.Size([2])]
    assert (decay["weight_decay"], no_decay["weight_decay"], decay["lr"]) == (0.3, 0.0, 0.5)
    w0, b0 = model.weight.detach().clone(), model.bias.detach().clone()
    model.weight.grad = torch.zeros_like(model.weight)
    model.bias.grad = torch.zeros_like(model.bias)
    opt.step()
    torch.testing.assert_close(model.weight.detach(), w0 * (1 - 0.5 * 0.3))
    torch.testing.assert_close(model.bias.detach(), b0)


def test_config_rejects_out_of_range_values():
    with pytest.raises(ValueError, match="batch_size"):
        SequenceRunConfig(loop=Loop(steps=1), batch_size=0)
    with pytest.raises(ValueError, match="lr"):
        SequenceRunConfig(loop=Loop(steps=1), lr=0.0)
