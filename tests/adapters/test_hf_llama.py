"""Llama-style adapter, against tiny random LlamaForCausalLM models (GQA and MHA, no downloads).

Oracles: the module's own q_proj/k_proj with HF's ``apply_rotary_pos_emb`` and ``repeat_kv``
(scores), its outputs and ``output_attentions`` patterns (eager kernel), float64.
Tolerances: scores 1e-12 absolute (float64, another summation order; measured <= 4e-15).
Patterns and outputs 1e-6 absolute: HF's eager softmax runs in float32 even for a float64
model, so a float64 rounding difference in the scores can move a float32 pattern entry by an ulp
(6e-8 at 1); measured 0 against the eager kernel, 5e-8 for sdpa-mode capture (float64 softmax)
against eager patterns. Left-padded queries that see no key are NaN in HF (its
float64 mask minimum overflows to -inf in float32), and are compared as NaN.
"""

import pytest
import torch
from torch import nn
from torch.testing import assert_close
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

from dynascope.adapters import attention_views, capture_patterns
from dynascope.probes import qk_singular_values

BATCH, POS, N_HEADS, N_KV_HEADS, D_HEAD, D_MODEL, D_VOCAB = 3, 7, 4, 2, 6, 20, 11
TOL = dict(rtol=0, atol=1e-12)
PATTERN_TOL = dict(rtol=0, atol=1e-6, equal_nan=True)
PADDING = torch.tensor([[1] * 7, [0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0]])  # left, right
# Left padding makes HF's float64 Llama write NaN into the padded positions' hidden states, which
# then poison every score of that sequence in the next layer; the rebuild test uses right padding.
RIGHT_PADDING = torch.tensor([[1] * 7, [1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0, 0]])


def build(n_kv_heads=N_KV_HEADS, attention_bias=False, attn_implementation="eager", family="llama"):
    torch.manual_seed(0)
    config_cls, model_cls = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "mistral": (MistralConfig, MistralForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    }[family]
    config = config_cls(
        hidden_size=D_MODEL, num_attention_heads=N_HEADS, num_key_value_heads=n_kv_heads,
        head_dim=D_HEAD, intermediate_size=13, vocab_size=D_VOCAB, num_hidden_layers=2,
        max_position_embeddings=POS, bos_token_id=0, eos_token_id=1, pad_token_id=2,
        attn_implementation=attn_implementation,
    )  # fmt: skip
    if family == "llama":
        config.attention_bias = attention_bias
    model = model_cls(config).double().eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # zero-initialised biases would hide layout mistakes
        for name, p in model.named_parameters():
            if "proj.bias" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def tokens(seed=1):
    return torch.randint(0, D_VOCAB, (BATCH, POS), generator=torch.Generator().manual_seed(seed))


def sees_a_key(mask):
    """[batch, 1, query_pos, 1]: True where a query sees at least one key (causal and padding)."""
    keep = torch.ones(POS, POS, dtype=torch.bool).tril()[None]
    if mask is not None:
        keep = keep & mask[:, None, :].bool()
    return keep.any(-1)[:, None, :, None]


def hooks(model):
    return {
        n: (list(m._forward_pre_hooks), list(m._forward_hooks)) for n, m in model.named_modules()
    }


def record(model, x, **kwargs):
    """Run ``model``; per attention module: [hidden_states, (cos, sin), mask, (output, weights)]."""
    seen, handles = {}, []

    def pre(name):
        def hook(module, args, kw):
            seen[name] = [kw["hidden_states"], kw["position_embeddings"], kw["attention_mask"]]

        return hook

    def post(name):
        return lambda module, args, output: seen[name].append(output)

    for name, module in model.named_modules():
        if type(module).__name__ == "LlamaAttention":
            handles.append(module.register_forward_pre_hook(pre(name), with_kwargs=True))
            handles.append(module.register_forward_hook(post(name)))
    try:
        with torch.no_grad():
            model(x, output_attentions=True, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return seen


KINDS = {
    "gqa": dict(n_kv_heads=N_KV_HEADS),
    "mha": dict(n_kv_heads=N_HEADS),
    "gqa_bias": dict(n_kv_heads=N_KV_HEADS, attention_bias=True),
}


@pytest.mark.parametrize("kind", KINDS.values(), ids=KINDS.keys())
@pytest.mark.parametrize("mask", [None, RIGHT_PADDING], ids=["no_mask", "right_padding"])
def test_views_rebuild_scores_patterns_and_outputs(kind, mask):
    model = build(**kind)
    seen = record(model, tokens(), attention_mask=mask)
    views = attention_views(model)
    assert [v.name for v in views] == [f"model.layers.{i}.self_attn" for i in range(2)]
    for view in views:
        module = view.module
        assert (view.n_heads, view.d_model, view.d_head) == (N_HEADS, D_MODEL, D_HEAD)
        assert view.rotary and view.n_key_value_heads == kind["n_kv_heads"]
        assert view.scale == D_HEAD**-0.5
        x, (cos, sin), additive_mask, (output, weights) = seen[view.name]
        # (1) scores from the views (+ HF's own RoPE) = scores from the module's own projections
        q_hf = module.q_proj(x).unflatten(-1, (N_HEADS, D_HEAD)).transpose(1, 2)
        k_hf = module.k_proj(x).unflatten(-1, (kind["n_kv_heads"], D_HEAD)).transpose(1, 2)
        q_hf, k_hf = apply_rotary_pos_emb(q_hf, k_hf, cos, sin)
        k_hf = repeat_kv(k_hf, module.num_key_value_groups)
        bias = lambda b, h: 0.0 if b is None else b[h]  # noqa: E731
        q = torch.stack([x @ view.W_Q[h] + bias(view.b_Q, h) for h in range(N_HEADS)], dim=1)
        k = torch.stack([x @ view.W_K[h] + bias(view.b_K, h) for h in range(N_HEADS)], dim=1)
        v = torch.stack([x @ view.W_V[h] + bias(view.b_V, h) for h in range(N_HEADS)], dim=1)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        scores = view.scale * q @ k.mT
        assert_close(scores, module.scaling * q_hf @ k_hf.mT, **TOL)
        # (2) softmax (in float32, as HF's eager kernel) = its weights; heads summed = its output
        pattern = (scores + additive_mask).softmax(-1, dtype=torch.float32).double()
        assert_close(pattern, weights, **PATTERN_TOL)
        rebuilt = sum(pattern[:, h] @ v[:, h] @ view.W_O[h] for h in range(N_HEADS))
        if view.b_O is not None:
            rebuilt = rebuilt + view.b_O
        assert_close(rebuilt, output, **PATTERN_TOL)


@pytest.mark.parametrize("kind", KINDS.values(), ids=KINDS.keys())
@pytest.mark.parametrize("mask", [None, PADDING], ids=["no_mask", "padding"])
def test_capture_equals_output_attentions(kind, mask):
    model = build(**kind)
    x = tokens()
    with torch.no_grad():
        expected = model(x, attention_mask=mask, output_attentions=True).attentions
        before = hooks(model)
        with capture_patterns(model) as patterns:
            model(x, attention_mask=mask)
    assert hooks(model) == before
    assert list(patterns) == [f"model.layers.{i}.self_attn" for i in range(2)]
    for pattern, weights in zip(patterns.values(), expected):
        assert pattern.shape == (BATCH, N_HEADS, POS, POS)
        assert_close(pattern, weights, **PATTERN_TOL)


@pytest.mark.parametrize("family", ["mistral", "qwen2"])
def test_capture_for_the_rest_of_the_family(family):
    model = build(family=family)
    x = tokens()
    with torch.no_grad():
        expected = model(x, attention_mask=PADDING, output_attentions=True).attentions
        with capture_patterns(model) as patterns:
            model(x, attention_mask=PADDING)
    for pattern, weights in zip(patterns.values(), expected, strict=True):
        assert_close(pattern, weights, **PATTERN_TOL)


@pytest.mark.parametrize("mask", [None, PADDING], ids=["no_mask", "padding"])
def test_capture_under_sdpa_equals_eager_patterns(mask):
    eager, sdpa = build(), build(attn_implementation="sdpa")
    x = tokens()
    with torch.no_grad():
        expected = eager(x, attention_mask=mask, output_attentions=True).attentions
        with capture_patterns(sdpa) as patterns:
            sdpa(x, attention_mask=mask)
    layer0, layer1 = patterns.values()
    # Queries that see no key: NaN in eager (see module docstring), zero rows in sdpa.
    assert_close(layer0, expected[0].where(sees_a_key(mask), 0.0), **PATTERN_TOL)
    # Those NaN rows poison the left-padded sequence's next layer in eager only; compare the rest.
    rest = [0, 2] if mask is not None else [0, 1, 2]
    assert_close(layer1[rest], expected[1][rest], **PATTERN_TOL)


def test_capture_with_a_filled_cache_raises():
    model = build()
    x = tokens()
    with torch.no_grad():
        cache = model(x[:, :5], use_cache=True).cache
        with pytest.raises(ValueError, match=r"cannot see the 5 cached positions"):
            with capture_patterns(model):
                model(x[:, 5:], cache=cache, use_cache=True)


def test_views_share_storage_except_repeated_kv_heads():
    for n_kv_heads in (N_KV_HEADS, N_HEADS):
        model = build(n_kv_heads=n_kv_heads, attention_bias=True)
        view = attention_views(model)[0]
        attn = view.module
        sources = dict(
            W_Q=attn.q_proj.weight, W_K=attn.k_proj.weight, W_V=attn.v_proj.weight,
            W_O=attn.o_proj.weight, b_Q=attn.q_proj.bias, b_K=attn.k_proj.bias,
            b_V=attn.v_proj.bias, b_O=attn.o_proj.bias,
        )  # fmt: skip
        for field, param in sources.items():
            shared = (
                getattr(view, field).untyped_storage().data_ptr()
                == param.untyped_storage().data_ptr()
            )
            copied = n_kv_heads != N_HEADS and field in ("W_K", "W_V", "b_K", "b_V")
            assert shared != copied, field
        with torch.no_grad():
            attn.q_proj.weight[D_HEAD + 1, 3] = 42.0  # head 1, d_model 3, d_head 1
            attn.o_proj.weight[4, 2 * D_HEAD + 5] = -7.0  # head 2, d_head 5, d_model 4
        assert view.W_Q[1, 3, 1] == 42.0 and view.W_O[2, 5, 4] == -7.0


def test_grouped_kv_heads_are_repeated_per_query_head():
    view = attention_views(build())[0]
    groups = N_HEADS // N_KV_HEADS
    k_weight = view.module.k_proj.weight.unflatten(0, (N_KV_HEADS, D_HEAD))  # [kv, d_head, d_model]
    for h in range(N_HEADS):
        assert_close(view.W_K[h], k_weight[h // groups].T, rtol=0, atol=0)


def test_qk_spectrum_matches_dense_product():
    views = attention_views(build(attention_bias=True))
    s = qk_singular_values(views)  # [n_layers, n_heads, d_head]
    assert s.shape == (2, N_HEADS, D_HEAD)
    dense = torch.stack([torch.linalg.svdvals(v.W_Q @ v.W_K.mT) for v in views])[..., :D_HEAD]
    assert_close(s, dense, rtol=0, atol=1e-10 * dense.max().item())


class LlamaLayout(nn.Module):
    """Not a transformers class: same projections and head bookkeeping, no position_embeddings."""

    def __init__(self):
        super().__init__()
        self.head_dim, self.num_key_value_groups = 5, 3
        self.q_proj = nn.Linear(8, 3 * 5, bias=False)
        self.k_proj = nn.Linear(8, 5, bias=False)
        self.v_proj = nn.Linear(8, 5, bias=False)
        self.o_proj = nn.Linear(3 * 5, 8, bias=False)

    def forward(self, hidden_states):
        return self.o_proj(self.q_proj(hidden_states))


def test_same_layout_module_gets_views_but_no_pattern_recomputation():
    module = LlamaLayout()
    [view] = attention_views(module)
    assert view.W_K.shape == (3, 8, 5) and view.n_key_value_heads == 1 and not view.rotary
    with pytest.raises(
        ValueError,
        match=r"only for LlamaAttention, MistralAttention, Qwen2Attention \(got LlamaLayout",
    ):
        with capture_patterns(module):
            module(torch.randn(2, 4, 8))
    assert not module._forward_pre_hooks and not module._forward_hooks


def test_inconsistent_head_bookkeeping_raises():
    module = LlamaLayout()
    module.num_key_value_groups = 2
    with pytest.raises(
        ValueError,
        match=r"n_heads = n_kv_heads\*num_key_value_groups \(got 15, 5, head_dim=5, num_key_value_groups=2\)",
    ):
        attention_views(module)
