"""Fused ``qkv_proj`` adapter (Phi-3 style), against tiny random Phi3ForCausalLM models built from
a config (GQA and MHA, full and partial rotary; no downloads).

Oracles: per-head q, k, v cut independently out of the module's own ``qkv_proj(x)`` output the
way Phi-3's forward does (slice Q | K | V, ``view(..., -1, head_dim)``), with HF's
``apply_rotary_pos_emb`` and ``repeat_kv`` (scores); the module's outputs and
``output_attentions`` patterns (eager kernel), float64. Tolerances as the Llama adapter's
(tests/adapters/test_hf_llama.py): scores 1e-12 absolute (float64, another summation order);
patterns and outputs 1e-6 absolute, because HF's eager softmax runs in float32 even for a
float64 model (a float64 rounding difference can move a float32 entry by an ulp, 6e-8 at 1).
"""

import pytest
import torch
from torch import nn
from torch.testing import assert_close
from transformers import Phi3Config, Phi3ForCausalLM
from transformers.models.phi3.modeling_phi3 import apply_rotary_pos_emb, repeat_kv

from dynascope.adapters import attention_views, capture_patterns
from dynascope.probes import qk_singular_values

BATCH, POS, N_HEADS, N_KV_HEADS, D_HEAD, D_VOCAB = 3, 7, 4, 2, 8, 11
D_MODEL = N_HEADS * D_HEAD  # 32; Phi-3 has no separate head_dim
TOL = dict(rtol=0, atol=1e-12)
PATTERN_TOL = dict(rtol=0, atol=1e-6)
RIGHT_PADDING = torch.tensor([[1] * 7, [1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0, 0]])


def build(n_kv_heads=N_KV_HEADS, partial_rotary_factor=1.0, attn_implementation="eager"):
    torch.manual_seed(0)
    config = Phi3Config(
        hidden_size=D_MODEL, num_attention_heads=N_HEADS, num_key_value_heads=n_kv_heads,
        intermediate_size=13, vocab_size=D_VOCAB, num_hidden_layers=2,
        max_position_embeddings=POS, original_max_position_embeddings=POS, bos_token_id=0,
        eos_token_id=1, pad_token_id=2, partial_rotary_factor=partial_rotary_factor,
        attn_implementation=attn_implementation,
    )  # fmt: skip
    model = Phi3ForCausalLM(config).double().eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # O(1) weights so that patterns are far from uniform
        for name, p in model.named_parameters():
            if "qkv_proj" in name or "o_proj" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def tokens(seed=1):
    return torch.randint(0, D_VOCAB, (BATCH, POS), generator=torch.Generator().manual_seed(seed))


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
        if type(module).__name__ == "Phi3Attention":
            handles.append(module.register_forward_pre_hook(pre(name), with_kwargs=True))
            handles.append(module.register_forward_hook(post(name)))
    try:
        with torch.no_grad():
            model(x, output_attentions=True, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return seen


def independent_heads(module, x, n_kv_heads):
    """q, k, v ``[batch, heads, pos, d_head]`` cut from ``qkv_proj(x)`` as Phi-3's forward does."""
    qkv = module.qkv_proj(x)
    q_end, k_end = N_HEADS * D_HEAD, (N_HEADS + n_kv_heads) * D_HEAD
    split = lambda t: t.view(*x.shape[:-1], -1, D_HEAD).transpose(1, 2)  # noqa: E731
    return split(qkv[..., :q_end]), split(qkv[..., q_end:k_end]), split(qkv[..., k_end:])


KINDS = {
    "gqa": dict(n_kv_heads=N_KV_HEADS),
    "mha": dict(n_kv_heads=N_HEADS),
    "gqa_partial_rotary": dict(n_kv_heads=N_KV_HEADS, partial_rotary_factor=0.5),
}


@pytest.mark.parametrize("kind", KINDS.values(), ids=KINDS.keys())
@pytest.mark.parametrize("mask", [None, RIGHT_PADDING], ids=["no_mask", "right_padding"])
def test_views_rebuild_scores_patterns_and_outputs(kind, mask):
    model = build(**kind)
    n_kv = kind["n_kv_heads"]
    seen = record(model, tokens(), attention_mask=mask)
    views = attention_views(model)
    assert [v.name for v in views] == [f"model.layers.{i}.self_attn" for i in range(2)]
    for view in views:
        module = view.module
        assert (view.n_heads, view.d_model, view.d_head) == (N_HEADS, D_MODEL, D_HEAD)
        assert view.rotary and view.n_key_value_heads == n_kv and view.scale == D_HEAD**-0.5
        assert view.b_Q is None and view.b_O is None
        x, (cos, sin), additive_mask, (output, weights) = seen[view.name]
        if "partial_rotary_factor" in kind:
            assert cos.shape[-1] == D_HEAD // 2  # the case really rotates half of each head
        # (1) scores from the views (+ HF's RoPE) = scores from the module's own fused projection
        q_hf, k_hf, v_hf = independent_heads(module, x, n_kv)
        q_hf, k_hf = apply_rotary_pos_emb(q_hf, k_hf, cos, sin)
        k_hf = repeat_kv(k_hf, module.num_key_value_groups)
        v_hf = repeat_kv(v_hf, module.num_key_value_groups)
        q = torch.stack([x @ view.W_Q[h] for h in range(N_HEADS)], dim=1)
        k = torch.stack([x @ view.W_K[h] for h in range(N_HEADS)], dim=1)
        v = torch.stack([x @ view.W_V[h] for h in range(N_HEADS)], dim=1)
        assert_close(v, v_hf, **TOL)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        scores = view.scale * q @ k.mT
        assert_close(scores, module.scaling * q_hf @ k_hf.mT, **TOL)
        # (2) softmax (in float32, as HF's eager kernel) = its weights; heads summed = its output
        pattern = (scores + additive_mask).softmax(-1, dtype=torch.float32).double()
        assert_close(pattern, weights, **PATTERN_TOL)
        rebuilt = sum(pattern[:, h] @ v[:, h] @ view.W_O[h] for h in range(N_HEADS))
        assert_close(rebuilt, output, **PATTERN_TOL)


@pytest.mark.parametrize("kind", KINDS.values(), ids=KINDS.keys())
@pytest.mark.parametrize("mask", [None, RIGHT_PADDING], ids=["no_mask", "right_padding"])
def test_capture_equals_output_attentions(kind, mask):
    model = build(**kind)
    x = tokens()
    with torch.no_grad():
        expected = model(x, attention_mask=mask, output_attentions=True).attentions
        with capture_patterns(model) as patterns:
            model(x, attention_mask=mask)
    assert list(patterns) == [f"model.layers.{i}.self_attn" for i in range(2)]
    for pattern, weights in zip(patterns.values(), expected, strict=True):
        assert pattern.shape == (BATCH, N_HEADS, POS, POS)
        assert_close(pattern, weights, **PATTERN_TOL)


@pytest.mark.parametrize("mask", [None, RIGHT_PADDING], ids=["no_mask", "right_padding"])
def test_capture_under_sdpa_equals_eager_patterns(mask):
    eager, sdpa = build(), build(attn_implementation="sdpa")
    x = tokens()
    with torch.no_grad():
        expected = eager(x, attention_mask=mask, output_attentions=True).attentions
        with capture_patterns(sdpa) as patterns:
            sdpa(x, attention_mask=mask)
    for pattern, weights in zip(patterns.values(), expected, strict=True):
        assert_close(pattern, weights, **PATTERN_TOL)


def test_views_share_storage_except_repeated_kv_heads():
    for n_kv_heads in (N_KV_HEADS, N_HEADS):
        view = attention_views(build(n_kv_heads=n_kv_heads))[0]
        attn = view.module
        for field, param in dict(
            W_Q=attn.qkv_proj.weight, W_K=attn.qkv_proj.weight, W_V=attn.qkv_proj.weight,
            W_O=attn.o_proj.weight,
        ).items():  # fmt: skip
            shared = (
                getattr(view, field).untyped_storage().data_ptr()
                == param.untyped_storage().data_ptr()
            )
            assert shared != (n_kv_heads != N_HEADS and field in ("W_K", "W_V")), field
        with torch.no_grad():  # rows Q | K | V, head-major: K head 1, d_head 2 is row 32 + 10
            attn.qkv_proj.weight[N_HEADS * D_HEAD + D_HEAD + 2, 3] = 42.0
            attn.qkv_proj.weight[D_HEAD + 1, 5] = -7.0  # Q head 1, d_head 1, d_model 5
        view = attention_views(attn)[0]  # fresh: grouped K/V heads are copies
        groups = N_HEADS // n_kv_heads
        assert view.W_K[groups, 3, 2] == 42.0 and view.W_Q[1, 5, 1] == -7.0


def test_qk_spectrum_matches_dense_product():
    views = attention_views(build())
    s = qk_singular_values(views)  # [n_layers, n_heads, d_head]
    dense = torch.stack([torch.linalg.svdvals(v.W_Q @ v.W_K.mT) for v in views])[..., :D_HEAD]
    assert_close(s, dense, rtol=0, atol=1e-10 * dense.max().item())


class FusedLayout(nn.Module):
    """Not a transformers class: Phi-3's projections and head bookkeeping, with biases."""

    def __init__(self, qkv_width=(3 + 2) * 5):
        super().__init__()
        self.head_dim, self.num_key_value_heads = 5, 1
        self.qkv_proj = nn.Linear(8, qkv_width)
        self.o_proj = nn.Linear(3 * 5, 8)

    def forward(self, hidden_states):
        return self.o_proj(self.qkv_proj(hidden_states)[..., :15])


def test_same_layout_module_gets_views_and_bad_widths_are_refused():
    module = FusedLayout()
    [view] = attention_views(module)
    assert view.W_K.shape == (3, 8, 5) and view.n_key_value_heads == 1 and not view.rotary
    b = module.qkv_proj.bias
    assert_close(view.b_V, b[20:25].expand(3, 5), rtol=0, atol=0)
    assert_close(view.b_Q, b[:15].view(3, 5), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"qkv_proj width must be .* \(got 26, "):
        attention_views(FusedLayout(qkv_width=26))
    with pytest.raises(ValueError, match="only for Phi3Attention"):
        with capture_patterns(module):
            module(torch.randn(2, 4, 8))
