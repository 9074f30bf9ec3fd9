"""ViT: a hand-computed forward, pooling, shapes, errors, and its config on the digits task."""

from __future__ import annotations

import pytest
import torch

from dynascope.config import ConfigError, build_model, build_task, validate_config
from dynascope.nn import ViT


def _vit(pooling="cls", n_layers=1):
    torch.manual_seed(0)
    return ViT(
        n_layers=n_layers, d_model=6, n_heads=2, d_mlp=10, d_in=4, n_patches=5, d_out=3,
        pooling=pooling,
    ).double()  # fmt: skip


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_forward_equals_a_hand_written_pass(pooling):
    model = _vit(pooling)
    x = torch.randn(2, 5, 4, dtype=torch.float64)
    h = x @ model.W_in + model.b_in
    if pooling == "cls":
        h = torch.cat([model.cls.expand(2, 1, 6), h], dim=1)
    h = h + model.W_pos
    block = model.blocks[0]
    h = h + block.attn(block.ln1(h))
    h = h + block.mlp(block.ln2(h))
    h = model.ln_final(h)
    pooled = h[:, 0] if pooling == "cls" else h.mean(dim=1)
    expected = pooled @ model.W_U + model.b_U
    torch.testing.assert_close(model(x), expected, rtol=0, atol=1e-12)
    assert not block.attn.is_causal


def test_patch_order_matters_only_through_positions():
    """Without positions a mean-pooled ViT is permutation-invariant over patches."""
    model = _vit("mean")
    with torch.no_grad():
        model.W_pos.zero_()
    x = torch.randn(2, 5, 4, dtype=torch.float64)
    torch.testing.assert_close(model(x[:, [4, 2, 0, 1, 3]]), model(x), rtol=0, atol=1e-12)


def test_bad_inputs():
    model = _vit()
    with pytest.raises(ValueError, match=r"patches must have shape \[batch, n_patches=5, d_in=4\]"):
        model(torch.zeros(2, 6, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"pooling must be 'cls' or 'mean' \(got pooling='max'\)"):
        ViT(n_layers=1, d_model=6, n_heads=2, d_in=4, n_patches=5, d_out=3, pooling="max")


def test_vit_config_builds_for_digits_and_refuses_sequence_tasks():
    cfg = validate_config({"model": {"name": "vit", "d_model": 12, "n_heads": 3},
                           "task": {"name": "digits", "patch_size": 2}})  # fmt: skip
    task = build_task(cfg.task)
    model = build_model(cfg.model, task)
    assert isinstance(model, ViT) and model.n_patches == 16 and model.d_in == 4
    assert model(task.batch("train", 3, torch.Generator())["x"]).shape == (3, 10)
    with pytest.raises(
        ConfigError, match=r"n_heads must divide d_model \(got d_model=10, n_heads=3\)"
    ):
        validate_config({"model": {"name": "vit", "d_model": 10, "n_heads": 3}})
    wrong = validate_config({"model": {"name": "vit"}})  # default task: associative recall
    with pytest.raises(ConfigError, match=r"^model.name: vit classifies patch inputs"):
        build_model(wrong.model, build_task(wrong.task))
    seq = validate_config({"task": {"name": "digits"}})
    with pytest.raises(ConfigError, match=r"^model.name: transformer predicts at every position"):
        build_model(seq.model, build_task(seq.task))
