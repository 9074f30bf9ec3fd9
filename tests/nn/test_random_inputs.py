"""RandomInputs: seeds appended to every token, same m seeds across the batch, input-major order
(neighbour masks: tests/nn/test_attention.py and test_transformer.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dynascope.nn.random_inputs import RandomInputs, append_seeds, draw_seeds


def test_append_seeds_hand_built():
    x = torch.arange(2 * 3 * 1, dtype=torch.float32).reshape(2, 3, 1)
    seeds = torch.tensor([[10.0, 11.0], [20.0, 21.0]])
    out = append_seeds(x, seeds)  # [4, 3, 3]
    assert out.shape == (4, 3, 3)
    for i in range(2):
        for j in range(2):
            expected = torch.cat([x[i], seeds[j].expand(3, 2)], dim=-1)
            torch.testing.assert_close(out[i * 2 + j], expected)


def test_per_token_seeds_and_wrapper_reshape():
    x = torch.randn(3, 4, 2)
    seeds = draw_seeds(5, 1, kind="uniform", pos=4, generator=torch.Generator().manual_seed(0))
    model = nn.Linear(3, 7)
    wrapped = RandomInputs(model, d_seed=1)
    out = wrapped(x, seeds)
    assert out.shape == (3, 5, 4, 7)
    torch.testing.assert_close(out[2, 4], model(torch.cat([x[2], seeds[4]], dim=-1)))


def test_draw_seeds_kinds():
    g = torch.Generator().manual_seed(0)
    bits = draw_seeds(200, 10, kind="bits", generator=g)
    assert set(bits.unique().tolist()) == {0.0, 1.0}
    assert 0.4 < bits.mean().item() < 0.6  # 2000 fair bits: 5 sigma is 0.056
    with pytest.raises(ValueError, match="kind must be one of"):
        draw_seeds(2, 2, kind="ternary")
    with pytest.raises(ValueError, match="m must be an int >= 1"):
        draw_seeds(0, 2)


def test_wrapper_bad_seed_width():
    with pytest.raises(ValueError, match="seeds must end in d_seed=2"):
        RandomInputs(nn.Identity(), 2)(torch.zeros(1, 2, 1), torch.zeros(3, 1))
