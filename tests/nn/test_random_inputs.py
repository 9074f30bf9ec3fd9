"""RandomInputs: seeds appended to every token, same m seeds across the batch, input-major order;
MaskedTransformer: a dense oracle for the neighbour mask."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dynascope.nn import MultiHeadAttention
from dynascope.nn.masked_transformer import MaskedTransformer, masked_attention
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


def test_masked_attention_equals_a_dense_loop():
    torch.manual_seed(0)
    attn = MultiHeadAttention(6, 2, 3, use_bias=True)
    for p in (attn.b_Q, attn.b_K, attn.b_V, attn.b_O):
        nn.init.normal_(p)
    x = torch.randn(2, 5, 6, dtype=torch.float32)
    mask = torch.rand(2, 5, 5) < 0.5
    mask[0, 3] = False  # a query with no visible key gives b_O
    out = masked_attention(attn, x, mask)
    for b in range(2):
        for i in range(5):
            acc = attn.b_O.clone()
            keys = mask[b, i].nonzero().flatten()
            for h in range(2):
                if len(keys) == 0:
                    continue
                q = x[b, i] @ attn.W_Q[h] + attn.b_Q[h]
                k = x[b, keys] @ attn.W_K[h] + attn.b_K[h]
                v = x[b, keys] @ attn.W_V[h] + attn.b_V[h]
                w = torch.softmax(k @ q * attn.scale, dim=0)
                acc = acc + (w @ v) @ attn.W_O[h]
            torch.testing.assert_close(out[b, i], acc, rtol=1e-5, atol=1e-6)


def test_masked_transformer_shape_and_locality():
    torch.manual_seed(1)
    model = MaskedTransformer(n_layers=1, d_model=8, n_heads=2, d_mlp=16, d_in=4, d_out=3)
    x = torch.randn(1, 5, 4)
    mask = torch.eye(5, dtype=torch.bool)[None]  # every vertex sees only itself
    out = model(x, mask)
    x2 = x.clone()
    x2[0, 4] += 1.0
    out2 = model(x2, mask)
    torch.testing.assert_close(out[0, :4], out2[0, :4])  # nothing leaks from vertex 4
    with pytest.raises(ValueError, match="attn_mask must be a bool tensor"):
        model(x, mask.float())
