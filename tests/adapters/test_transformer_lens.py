"""TransformerLens adapter, against tiny random ``HookedTransformer`` models (no downloads).

Oracles: the module's own parameters and properties (the layout is TransformerLens's), and its
``run_with_cache`` activations: ``attn_scores`` (q k^T / attn_scale, causal-masked) against
scores rebuilt from the views, and ``pattern`` against :func:`capture_patterns`. float64;
tolerance 1e-12 absolute (same float64 arithmetic in another order). Grouped-query attention
(``n_key_value_heads``) and rotary layers are covered.
"""

import warnings

import pytest
import torch
from torch.testing import assert_close

transformer_lens = pytest.importorskip("transformer_lens")

from dynascope.adapters import attention_views, capture_patterns  # noqa: E402

BATCH, POS, N_HEADS, D_HEAD, D_MODEL, D_VOCAB = 2, 7, 3, 5, 12, 11
TOL = dict(rtol=0, atol=1e-12)


def build(seed=0, **config):
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = dict(
        n_layers=2, d_model=D_MODEL, n_ctx=POS, d_head=D_HEAD, n_heads=N_HEADS, d_vocab=D_VOCAB,
        act_fn="gelu", normalization_type="LN", dtype=torch.float64, seed=seed,
    )  # fmt: skip
    cfg.update(config)
    with warnings.catch_warnings():  # 3.x warns that 4.0 drops HookedTransformer
        warnings.simplefilter("ignore", DeprecationWarning)
        model = HookedTransformer(HookedTransformerConfig(**cfg))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # zero-initialised biases would hide layout mistakes
        for p in model.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model.eval()


def tokens(seed=1):
    return torch.randint(0, D_VOCAB, (BATCH, POS), generator=torch.Generator().manual_seed(seed))


CONFIGS = {
    "mha": {},
    "gqa": dict(n_key_value_heads=1),
    "rotary": dict(positional_embedding_type="rotary", rotary_dim=D_HEAD - 1),
    "no_scale": dict(use_attn_scale=False),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_views_are_the_modules_own_tensors(name):
    model = build(**CONFIGS[name])
    views = attention_views(model)
    assert [v.name for v in views] == ["blocks.0.attn", "blocks.1.attn"]
    for view, block in zip(views, model.blocks):
        attn = block.attn
        for field in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
            assert_close(getattr(view, field), getattr(attn, field), **TOL)
        assert view.W_K.shape == (N_HEADS, D_MODEL, D_HEAD)
        assert view.scale == 1.0 / attn.attn_scale
        assert view.rotary == (name == "rotary")
        assert view.n_key_value_heads == (1 if name == "gqa" else None)
    if name == "mha":  # plain attention: views share storage with the parameters
        assert views[0].W_Q.data_ptr() == model.blocks[0].attn.W_Q.data_ptr()


@pytest.mark.parametrize("name", ["mha", "gqa", "no_scale"])
def test_scores_from_views_match_the_models_own(name):
    model = build(**CONFIGS[name])
    x = tokens()
    _, cache = model.run_with_cache(x)
    causal = torch.ones(POS, POS, dtype=torch.bool).tril()
    for layer, view in enumerate(attention_views(model)):
        with torch.no_grad():  # the attention layer's input: ln1 (with its affine) of resid_pre
            resid = model.blocks[layer].ln1(cache["resid_pre", layer])
        q = torch.einsum("bpm,hmd->bhpd", resid, view.W_Q) + view.b_Q[:, None]
        k = torch.einsum("bpm,hmd->bhpd", resid, view.W_K) + view.b_K[:, None]
        scores = view.scale * q @ k.transpose(-1, -2)
        expected = cache["attn_scores", layer]
        assert_close(scores[..., causal], expected[..., causal], **TOL)


@pytest.mark.parametrize("name", CONFIGS)
def test_capture_patterns_reads_the_models_hook_pattern(name):
    model = build(**CONFIGS[name])
    x = tokens()
    _, cache = model.run_with_cache(x)
    with capture_patterns(model) as patterns:
        model(x)
    assert list(patterns) == ["blocks.0.attn", "blocks.1.attn"]
    for layer in range(2):
        assert_close(patterns[f"blocks.{layer}.attn"], cache["pattern", layer], **TOL)
        assert patterns[f"blocks.{layer}.attn"].shape == (BATCH, N_HEADS, POS, POS)
    assert all(not m._forward_hooks for m in model.modules() if m is not model)  # removed
