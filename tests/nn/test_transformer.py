"""Transformer, TransformerBlock, MLP: hand-written forward pass as oracle, properties, errors."""

import math

import pytest
import torch
from torch.testing import assert_close

from dynascope.adapters import attention_views
from dynascope.nn import MLP, MultiHeadAttention, Transformer, TransformerBlock

BATCH, POS, N_HEADS, D_HEAD, D_MODEL = 2, 7, 3, 5, 11
D_VOCAB, D_IN, D_OUT, D_MLP, N_CTX = 13, 4, 6, 17, 9


def build(dtype=torch.float64, **kwargs):
    torch.manual_seed(0)
    config = dict(
        n_layers=2, d_model=D_MODEL, n_heads=N_HEADS, d_head=D_HEAD, d_mlp=D_MLP,
        d_vocab=D_VOCAB, d_out=D_OUT, n_ctx=N_CTX,
    )  # fmt: skip
    config.update(kwargs)
    model = Transformer(**config).to(dtype)
    with torch.no_grad():  # make zero-initialised biases and unit LN gains matter
        for name, p in model.named_parameters():
            if name.endswith(("b_U", "b_in", "b_out", "weight", "bias")) or ".b_" in name:
                p.normal_()
    return model


def tokens(seed=1):
    return torch.randint(0, D_VOCAB, (BATCH, POS), generator=torch.Generator().manual_seed(seed))


def layer_norm(x, ln):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)  # biased, as nn.LayerNorm
    return (x - mean) / torch.sqrt(var + ln.eps) * ln.weight + ln.bias


def gelu(x):
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def reference_forward(model, inputs, use_ln=True, attn_mask=None):
    """GPT-2-style pre-LN forward written out by hand (attention is tested on its own)."""
    x = model.W_E[inputs] if model.W_E is not None else inputs @ model.W_in
    if model.W_pos is not None:
        x = x + model.W_pos[: inputs.shape[1]]
    norm = layer_norm if use_ln else (lambda x, ln: x)
    for block in model.blocks:
        x = x + block.attn(norm(x, block.ln1), attn_mask=attn_mask)
        if block.mlp is not None:
            h = norm(x, block.ln2)
            x = x + gelu(h @ block.mlp.W_in + block.mlp.b_in) @ block.mlp.W_out + block.mlp.b_out
    return norm(x, model.ln_final) @ model.W_U + model.b_U


def test_token_inputs_match_reference():
    model = build()
    x = tokens()
    with torch.no_grad():
        out = model(x)
        assert out.shape == (BATCH, POS, D_OUT)
        assert_close(out, reference_forward(model, x))


def test_vector_inputs_match_reference():
    model = build(d_vocab=None, d_in=D_IN, attention="linear", is_causal=False)
    assert model.W_E is None and model.W_in.shape == (D_IN, D_MODEL)
    x = torch.randn(BATCH, POS, D_IN, dtype=torch.float64)
    with torch.no_grad():
        out = model(x)
        assert out.shape == (BATCH, POS, D_OUT)
        assert_close(out, reference_forward(model, x))


@pytest.mark.parametrize("d_mlp", [None, 0])
def test_attention_only_without_ln(d_mlp):
    model = build(d_mlp=d_mlp, use_ln=False)
    assert all(b.mlp is None and b.ln2 is None for b in model.blocks)
    assert not any("mlp" in name or "ln" in name for name, _ in model.named_parameters())
    x = tokens()
    with torch.no_grad():
        assert_close(model(x), reference_forward(model, x, use_ln=False))


def test_parameter_layout():
    model = build(dtype=torch.float32)
    assert model.W_E.shape == (D_VOCAB, D_MODEL)
    assert model.W_pos.shape == (N_CTX, D_MODEL)
    assert model.W_U.shape == (D_MODEL, D_OUT)
    assert model.b_U.shape == (D_OUT,)
    assert model.blocks[1].mlp.W_in.shape == (D_MODEL, D_MLP)
    assert model.blocks[1].mlp.W_out.shape == (D_MLP, D_MODEL)
    assert isinstance(model.blocks[0].attn, MultiHeadAttention)
    assert model.blocks[0].attn.is_causal


def test_init_scales():
    torch.manual_seed(0)
    model = Transformer(
        n_layers=1, d_model=128, n_heads=4, d_mlp=256, d_vocab=512, d_out=64, n_ctx=256
    )
    # >= 16k draws each: sample std within ~1% of the true one; 5% is safe.
    for W, std in (
        (model.W_E, 0.02),
        (model.W_pos, 0.02),
        (model.W_U, 1 / math.sqrt(128)),
        (model.blocks[0].mlp.W_in, 1 / math.sqrt(128)),
        (model.blocks[0].mlp.W_out, 1 / math.sqrt(256)),
    ):
        assert abs(W.std().item() / std - 1) < 0.05
    for b in (model.b_U, model.blocks[0].mlp.b_in, model.blocks[0].mlp.b_out):
        assert_close(b.detach(), torch.zeros_like(b))
    vec = Transformer(n_layers=1, d_model=128, n_heads=4, d_in=200, d_out=3, n_ctx=4)
    assert abs(vec.W_in.std().item() * math.sqrt(200) - 1) < 0.05


def test_causality():
    model = build()
    x = tokens()
    changed = x.clone()
    changed[:, 4] = (x[:, 4] + 1) % D_VOCAB
    with torch.no_grad():
        before, after = model(x), model(changed)
    assert_close(after[:, :4], before[:, :4])
    assert not torch.allclose(after[:, 4:], before[:, 4:])


def test_no_positional_non_causal_is_permutation_equivariant():
    model = build(positional="none", is_causal=False)
    assert model.W_pos is None
    x = tokens()
    perm = torch.tensor([3, 0, 6, 1, 5, 2, 4])
    with torch.no_grad():
        assert_close(model(x[:, perm]), model(x)[:, perm])


def test_padding_hides_keys():
    model = build(is_causal=False)
    x = tokens()
    keep = torch.ones(BATCH, POS, dtype=torch.bool)
    keep[:, 5:] = False
    changed = x.clone()
    changed[:, 5:] = (x[:, 5:] + 3) % D_VOCAB
    with torch.no_grad():
        before = model(x, key_padding_mask=keep)
        after = model(changed, key_padding_mask=keep)
    assert_close(after[:, :5], before[:, :5])


def neighbour_model():
    """Vector tokens, no positions, no causal mask: attn_mask is the whole mask."""
    return build(d_vocab=None, d_in=D_IN, positional="none", is_causal=False)


def test_attn_mask_matches_reference():
    model = neighbour_model()
    x = torch.randn(BATCH, POS, D_IN, dtype=torch.float64)
    pairs = torch.rand(BATCH, POS, POS, generator=torch.Generator().manual_seed(2)) < 0.5
    pairs[1, 4] = False  # a token that sees nothing gets b_O from every attention layer
    with torch.no_grad():
        assert_close(model(x, attn_mask=pairs), reference_forward(model, x, attn_mask=pairs))


def test_attn_mask_hides_keys():
    model = neighbour_model()
    x = torch.randn(1, 5, D_IN, dtype=torch.float64)
    alone = torch.eye(5, dtype=torch.bool)[None]  # every token sees only itself
    changed = x.clone()
    changed[0, 4] += 1.0
    with torch.no_grad():
        before, after = model(x, attn_mask=alone), model(changed, attn_mask=alone)
    assert_close(after[0, :4], before[0, :4])  # nothing leaks from token 4
    assert not torch.allclose(after[0, 4], before[0, 4])


def test_gradients_reach_every_parameter():
    model = build(dtype=torch.float32, use_bias=True)
    model(tokens()).square().mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_attention_views_share_storage():
    model = build(dtype=torch.float32, n_layers=3, use_bias=True)
    views = attention_views(model)
    assert [v.name for v in views] == ["blocks.0.attn", "blocks.1.attn", "blocks.2.attn"]
    for view, block in zip(views, model.blocks):
        assert (view.n_heads, view.d_model, view.d_head) == (N_HEADS, D_MODEL, D_HEAD)
        assert view.W_O.shape == (N_HEADS, D_HEAD, D_MODEL)
        assert view.b_O.shape == (D_MODEL,)
        assert view.module is block.attn
        for field in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
            got, param = getattr(view, field), getattr(block.attn, field)
            assert got.untyped_storage().data_ptr() == param.untyped_storage().data_ptr()
    with torch.no_grad():
        model.blocks[1].attn.W_Q.zero_()
    assert_close(views[1].W_Q, torch.zeros(N_HEADS, D_MODEL, D_HEAD))


def test_block_and_mlp():
    torch.manual_seed(0)
    block = TransformerBlock(D_MODEL, N_HEADS, D_HEAD, d_mlp=D_MLP, is_causal=False).double()
    x = torch.randn(BATCH, POS, D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        h = x + block.attn(layer_norm(x, block.ln1))
        want = h + block.mlp(layer_norm(h, block.ln2))
        assert_close(block(x), want)
    mlp = MLP(D_MODEL, D_MLP, activation="relu").double()
    with torch.no_grad():
        mlp.b_in.normal_()
        want = torch.clamp(x @ mlp.W_in + mlp.b_in, min=0) @ mlp.W_out + mlp.b_out
        assert_close(mlp(x), want)


def test_errors():
    common = dict(n_layers=1, d_model=D_MODEL, n_heads=N_HEADS, d_head=D_HEAD, d_out=D_OUT)
    with pytest.raises(
        ValueError, match=r"exactly one of d_vocab .* and d_in .*d_vocab=13, d_in=4"
    ):
        Transformer(**common, n_ctx=N_CTX, d_vocab=D_VOCAB, d_in=D_IN)
    with pytest.raises(ValueError, match=r"exactly one of d_vocab .* and d_in"):
        Transformer(**common, n_ctx=N_CTX)
    with pytest.raises(ValueError, match="positional must be one of"):
        Transformer(**common, n_ctx=N_CTX, d_vocab=D_VOCAB, positional="sinusoidal")
    with pytest.raises(ValueError, match="n_ctx must be positive"):
        Transformer(**common, n_ctx=0, d_vocab=D_VOCAB)
    with pytest.raises(ValueError, match="attention must be one of"):
        Transformer(**common, n_ctx=N_CTX, d_vocab=D_VOCAB, attention="hypernet")
    with pytest.raises(ValueError, match="d_mlp must be None, 0 or positive"):
        Transformer(**common, n_ctx=N_CTX, d_vocab=D_VOCAB, d_mlp=-1)
    with pytest.raises(ValueError, match="activation must be one of"):
        MLP(D_MODEL, D_MLP, activation="swish")

    model = Transformer(**common, n_ctx=POS - 1, d_vocab=D_VOCAB)
    with pytest.raises(ValueError, match=r"sequence length must be at most n_ctx=6 \(got 7\)"):
        model(tokens())
    with pytest.raises(ValueError, match="token inputs must be a long tensor"):
        model(torch.randn(BATCH, POS - 1))
    vec = Transformer(**common, n_ctx=N_CTX, d_in=D_IN)
    with pytest.raises(ValueError, match=r"vector inputs must have shape \[batch, pos, d_in=4\]"):
        vec(torch.randn(BATCH, POS, D_IN + 1))
    with pytest.raises(ValueError, match="attn_mask must be a bool tensor"):
        vec(torch.randn(BATCH, POS, D_IN), attn_mask=torch.ones(BATCH, POS, POS))
