"""Hugging Face GPT-2 adapter, against a tiny random GPT2LMHeadModel (no downloads).

Oracles: the module's own Conv1D projections (scores), its outputs and ``output_attentions``
patterns (eager kernel), float64. Tolerance 1e-12 absolute: same float64 arithmetic in another
order (measured <= 3e-16). ``reorder_and_upcast_attn`` forms scores in float32 (HF refuses it in
float64), so that case runs in float32 with 1e-6 (a few float32 ulps; measured 0).
"""

import pytest
import torch
from torch.testing import assert_close
from transformers import GPT2Config, GPT2LMHeadModel

from dynascope.adapters import attention_views, capture_patterns
from dynascope.probes import qk_singular_values

BATCH, POS, N_HEADS, D_HEAD, D_VOCAB = 2, 7, 3, 5, 11
D_MODEL = N_HEADS * D_HEAD  # 15
TOL = dict(rtol=0, atol=1e-12)
PADDING = torch.tensor([[1] * 7, [0, 0, 1, 1, 1, 1, 1]])  # left-padded second sequence


def build(dtype=torch.float64, attn_implementation="eager", seed=0, **config):
    torch.manual_seed(seed)
    config = GPT2Config(
        n_layer=2, n_embd=D_MODEL, n_head=N_HEADS, vocab_size=D_VOCAB, n_positions=POS,
        bos_token_id=0, eos_token_id=1, attn_implementation=attn_implementation, **config,
    )  # fmt: skip
    model = GPT2LMHeadModel(config).to(dtype).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # zero-initialised biases would hide layout mistakes
        for p in model.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=dtype))
    return model


def hooks(model):
    """Hook ids per module (HF installs its own output-capturing hooks on first use)."""
    return {
        n: (list(m._forward_pre_hooks), list(m._forward_hooks)) for n, m in model.named_modules()
    }


def tokens(seed=1):
    return torch.randint(0, D_VOCAB, (BATCH, POS), generator=torch.Generator().manual_seed(seed))


def record(model, x, **kwargs):
    """Run ``model``; per attention module: [hidden_states, attention_mask, (output, weights)]."""
    seen, handles = {}, []

    def pre(name):
        def hook(module, args, kw):  # GPT2Block passes hidden_states positionally
            seen[name] = [args[0], kw.get("attention_mask")]

        return hook

    def post(name):
        return lambda module, args, output: seen[name].append(output)

    for name, module in model.named_modules():
        if type(module).__name__ == "GPT2Attention":
            handles.append(module.register_forward_pre_hook(pre(name), with_kwargs=True))
            handles.append(module.register_forward_hook(post(name)))
    try:
        with torch.no_grad():
            out = model(x, output_attentions=True, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return seen, out


def view_scores(view, x):
    """Per head (x W_Q[h] + b_Q[h]) (x W_K[h] + b_K[h])^T * scale: [batch, n_heads, pos, pos]."""
    return torch.stack(
        [
            view.scale * (x @ view.W_Q[h] + view.b_Q[h]) @ (x @ view.W_K[h] + view.b_K[h]).mT
            for h in range(view.n_heads)
        ],
        dim=1,
    )


CONFIGS = {
    "default": {},
    "unscaled": dict(scale_attn_weights=False),
    "inverse_layer_idx": dict(scale_attn_by_inverse_layer_idx=True),
}


@pytest.mark.parametrize("flags", CONFIGS.values(), ids=CONFIGS.keys())
@pytest.mark.parametrize("mask", [None, PADDING], ids=["no_mask", "padding"])
def test_views_rebuild_scores_patterns_and_outputs(flags, mask):
    model = build(**flags)
    seen, _ = record(model, tokens(), attention_mask=mask)
    views = attention_views(model)
    assert [v.name for v in views] == ["transformer.h.0.attn", "transformer.h.1.attn"]
    for layer, view in enumerate(views):
        module = view.module
        x, additive_mask, (output, weights) = seen[view.name]
        expected_scale = (D_HEAD**-0.5 if flags.get("scale_attn_weights", True) else 1.0) / (
            layer + 1 if flags.get("scale_attn_by_inverse_layer_idx") else 1
        )
        assert view.scale == pytest.approx(expected_scale, rel=1e-15)
        # (1) scores from the views = scores from the module's own fused Conv1D projection
        q, k, _ = module.c_attn(x).split(D_MODEL, dim=2)
        q, k = (t.unflatten(-1, (N_HEADS, D_HEAD)).transpose(1, 2) for t in (q, k))
        scores = view_scores(view, x)
        assert_close(scores, module.scaling * q @ k.mT, **TOL)
        # (2) softmax of those scores = the module's weights; sum over heads = its output
        pattern = (scores + additive_mask).softmax(-1)
        assert_close(pattern, weights, **TOL)
        rebuilt = sum(
            pattern[:, h] @ (x @ view.W_V[h] + view.b_V[h]) @ view.W_O[h] for h in range(N_HEADS)
        )
        assert_close(rebuilt + view.b_O, output, **TOL)


@pytest.mark.parametrize("flags", CONFIGS.values(), ids=CONFIGS.keys())
@pytest.mark.parametrize("mask", [None, PADDING], ids=["no_mask", "padding"])
def test_capture_equals_output_attentions(flags, mask):
    model = build(**flags)
    x = tokens()
    with torch.no_grad():
        expected = model(x, attention_mask=mask, output_attentions=True).attentions
        before = hooks(model)
        with capture_patterns(model) as patterns:
            model(x, attention_mask=mask)
    assert hooks(model) == before
    assert list(patterns) == ["transformer.h.0.attn", "transformer.h.1.attn"]
    for pattern, weights in zip(patterns.values(), expected):
        assert not pattern.requires_grad
        assert_close(pattern, weights, **TOL)


def test_capture_reorder_and_upcast_in_float32():
    model = build(torch.float32, reorder_and_upcast_attn=True, scale_attn_by_inverse_layer_idx=True)
    x = tokens()
    with torch.no_grad():
        expected = model(x, attention_mask=PADDING, output_attentions=True).attentions
        with capture_patterns(model) as patterns:
            model(x, attention_mask=PADDING)
    for pattern, weights in zip(patterns.values(), expected):
        assert_close(pattern, weights, rtol=0, atol=1e-6)


@pytest.mark.parametrize("mask", [None, PADDING], ids=["no_mask", "padding"])
def test_capture_under_sdpa_equals_eager_patterns(mask):
    """sdpa materialises no pattern and gets a bool mask or None (causal inside the kernel)."""
    eager, sdpa = build(), build(attn_implementation="sdpa")
    x = tokens()
    with torch.no_grad():
        expected = eager(x, attention_mask=mask, output_attentions=True).attentions
        with capture_patterns(sdpa) as patterns:
            sdpa(x, attention_mask=mask)
    # Queries that see no key (left padding): eager spreads them uniformly, sdpa gives zero rows.
    keep = torch.ones(POS, POS, dtype=torch.bool).tril()[None]
    if mask is not None:
        keep = keep & mask[:, None, :].bool()
    sees_a_key = keep.any(-1)[:, None, :, None]  # [batch, 1, query_pos, 1]
    for pattern, weights in zip(patterns.values(), expected):
        assert_close(pattern, weights.where(sees_a_key, 0.0), **TOL)


def test_capture_cross_attention():
    model = build(add_cross_attention=True)
    x = tokens()
    g = torch.Generator().manual_seed(4)
    encoder = torch.randn(BATCH, 6, D_MODEL, generator=g, dtype=torch.float64)
    encoder_mask = torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0]])
    kwargs = dict(encoder_hidden_states=encoder, encoder_attention_mask=encoder_mask)
    with torch.no_grad():
        expected = model(x, output_attentions=True, **kwargs)
        with capture_patterns(model) as patterns:
            model(x, **kwargs)
    names = [f"transformer.h.{i}.{n}" for i in range(2) for n in ("attn", "crossattention")]
    assert sorted(patterns) == names
    for i in range(2):
        assert patterns[f"transformer.h.{i}.crossattention"].shape == (BATCH, N_HEADS, POS, 6)
        assert_close(
            patterns[f"transformer.h.{i}.crossattention"], expected.cross_attentions[i], **TOL
        )
        assert_close(patterns[f"transformer.h.{i}.attn"], expected.attentions[i], **TOL)


def test_capture_with_past_key_values_raises():
    model = build()
    x = tokens()
    with torch.no_grad():
        cache = model(x[:, :4], use_cache=True).cache
        with capture_patterns(model) as patterns:
            model(x, use_cache=True)  # a fresh cache is empty: fine
        assert len(patterns) == 2
        before = hooks(model)
        with pytest.raises(
            ValueError, match=r"cannot see the 4 cached positions; run with use_cache=False"
        ):
            with capture_patterns(model):
                model(x[:, 4:], cache=cache, use_cache=True)
    assert hooks(model) == before


def test_views_share_storage_with_the_model():
    model = build()
    views = attention_views(model)
    for view in views:
        for field in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
            source = view.module.c_proj if field in ("W_O", "b_O") else view.module.c_attn
            param = source.weight if field.startswith("W") else source.bias
            assert (
                getattr(view, field).untyped_storage().data_ptr()
                == param.untyped_storage().data_ptr()
            )
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)
    for before, after in zip(attention_views(build()), views):
        for field in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
            assert_close(getattr(after, field), 2.0 * getattr(before, field), rtol=0, atol=0)
    # Still differentiable after the in-place update (plain slices, not split/chunk outputs).
    (views[0].W_K.square().sum() + views[0].b_V.sum()).backward()
    grad = torch.cat([torch.zeros(2 * D_MODEL), torch.ones(D_MODEL)]).double()  # Q | K | V
    assert_close(views[0].module.c_attn.bias.grad, grad, rtol=0, atol=0)


def test_qk_spectrum_matches_dense_product():
    views = attention_views(build())
    s = qk_singular_values(views)  # [n_layers, n_heads, d_head]
    assert s.shape == (2, N_HEADS, D_HEAD) and s.dtype == torch.float64
    dense = torch.stack([torch.linalg.svdvals(v.W_Q @ v.W_K.mT) for v in views])[
        ..., :D_HEAD
    ]  # rank <= d_head
    assert_close(s, dense, rtol=0, atol=1e-10 * dense.max().item())
