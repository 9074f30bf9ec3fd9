"""torch.nn.MultiheadAttention adapter: views rebuild the module's output; captured patterns
equal ``need_weights=True, average_attn_weights=False``.

Oracle: the module itself (float64). Tolerance 1e-12 absolute: the same float64 arithmetic in a
different summation order differs by a few ulps (measured <= 4e-16 on patterns, ~1e-15 on
outputs).
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.testing import assert_close

from dynascope.adapters import attention_views, capture_patterns

BATCH, QUERY_POS, KEY_POS, N_HEADS, D_HEAD, D_KEY, D_VALUE = 2, 7, 6, 3, 5, 4, 11
D_MODEL = N_HEADS * D_HEAD  # 15
TOL = dict(rtol=0, atol=1e-12)


def build(*, separate=False, bias=True, batch_first=True, seed=0, n_heads_even=False, **kwargs):
    torch.manual_seed(seed)
    dims = dict(kdim=D_KEY, vdim=D_VALUE) if separate else {}
    d_model, n_heads = (8, 2) if n_heads_even else (D_MODEL, N_HEADS)  # the fast path needs even
    module = nn.MultiheadAttention(
        d_model, n_heads, bias=bias, batch_first=batch_first, **dims, **kwargs
    ).double()
    with torch.no_grad():  # zero-initialised biases would hide layout mistakes
        for p in module.parameters():
            p.normal_(std=0.5)
    return module.eval()


def inputs(separate=False, batch_first=True, self_attention=False, seed=1):
    g = torch.Generator().manual_seed(seed)
    if self_attention:
        x = torch.randn(BATCH, QUERY_POS, D_MODEL, generator=g, dtype=torch.float64)
        q = k = v = x if batch_first else x.transpose(0, 1)
        return q, k, v
    d_key, d_value = (D_KEY, D_VALUE) if separate else (D_MODEL, D_MODEL)
    q = torch.randn(BATCH, QUERY_POS, D_MODEL, generator=g, dtype=torch.float64)
    k = torch.randn(BATCH, KEY_POS, d_key, generator=g, dtype=torch.float64)
    v = torch.randn(BATCH, KEY_POS, d_value, generator=g, dtype=torch.float64)
    if not batch_first:
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
    return q, k, v


def reconstruct(view, q_in, k_in, v_in, mask=None):
    """sum_h softmax(scale (x_q W_Q[h] + b_Q[h]) (x_k W_K[h] + b_K[h])^T + mask) (x_v W_V[h] + b_V[h]) W_O[h] + b_O.

    Inputs ``[batch, pos, d]``; mask additive ``[batch, query_pos, key_pos]`` or None.
    Returns (output [batch, query_pos, d_model], pattern [batch, n_heads, query_pos, key_pos]).
    """
    out = torch.zeros(q_in.shape[0], q_in.shape[1], view.d_model, dtype=q_in.dtype)
    patterns = []
    for h in range(view.n_heads):
        bias = lambda b: 0.0 if b is None else b[h]  # noqa: E731
        q = q_in @ view.W_Q[h] + bias(view.b_Q)
        k = k_in @ view.W_K[h] + bias(view.b_K)
        v = v_in @ view.W_V[h] + bias(view.b_V)
        scores = view.scale * q @ k.mT + (0.0 if mask is None else mask)
        pattern = scores.softmax(-1)
        patterns.append(pattern)
        out = out + pattern @ v @ view.W_O[h]
    if view.b_O is not None:
        out = out + view.b_O
    return out, torch.stack(patterns, dim=1)


def batch_major(t, batch_first):
    return t if batch_first else t.transpose(0, 1)


@pytest.mark.parametrize("separate", [False, True], ids=["packed", "separate"])
@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "pos_first"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_views_rebuild_module_output(separate, batch_first, bias):
    module = build(separate=separate, bias=bias, batch_first=batch_first)
    [view] = attention_views(module)
    d_key = D_KEY if separate else D_MODEL
    assert (view.n_heads, view.d_model, view.d_head) == (N_HEADS, D_MODEL, D_HEAD)
    assert view.W_K.shape == (N_HEADS, d_key, D_HEAD)
    assert view.W_O.shape == (N_HEADS, D_HEAD, D_MODEL)
    assert (view.b_Q is None) == (not bias) and (view.b_O is None) == (not bias)
    assert view.scale == D_HEAD**-0.5
    q, k, v = inputs(separate, batch_first)
    with torch.no_grad():
        expected, weights = module(q, k, v, need_weights=True, average_attn_weights=False)
        out, pattern = reconstruct(view, *(batch_major(t, batch_first) for t in (q, k, v)))
    assert_close(out, batch_major(expected, batch_first), **TOL)
    assert_close(pattern, weights, **TOL)


def causal_bool(n):
    return torch.ones(n, n, dtype=torch.bool).triu(1)  # True = not allowed


def padding_bool():
    return torch.tensor([[False] * 7, [True, True] + [False] * 5])  # True = padding


@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "pos_first"])
@pytest.mark.parametrize(
    "case",
    ["plain", "padding", "causal", "causal+padding", "float_masks", "per_head_mask"],
)
def test_capture_equals_need_weights_self_attention(batch_first, case):
    module = build(batch_first=batch_first)
    q, k, v = inputs(batch_first=batch_first, self_attention=True)
    kwargs = {}
    if "padding" in case:
        kwargs["key_padding_mask"] = padding_bool()
    if "causal" in case:
        kwargs.update(attn_mask=causal_bool(QUERY_POS), is_causal=True)
    if case == "float_masks":
        g = torch.Generator().manual_seed(2)
        kwargs["attn_mask"] = torch.randn(QUERY_POS, QUERY_POS, generator=g, dtype=torch.float64)
        kwargs["key_padding_mask"] = torch.randn(BATCH, QUERY_POS, generator=g).double()
    if case == "per_head_mask":  # [batch * n_heads, query_pos, key_pos], bool
        g = torch.Generator().manual_seed(3)
        kwargs["attn_mask"] = torch.rand(BATCH * N_HEADS, QUERY_POS, QUERY_POS, generator=g) < 0.3
        kwargs["attn_mask"][..., 0] = False  # every query sees key 0: no NaN rows
    with torch.no_grad():
        expected = module(q, k, v, need_weights=True, average_attn_weights=False, **kwargs)[1]
        with capture_patterns(module) as patterns:
            module(q, k, v, need_weights=False, **kwargs)  # the fused path materialises nothing
    assert list(patterns) == [""]
    assert patterns[""].shape == (BATCH, N_HEADS, QUERY_POS, QUERY_POS)
    # causal+padding: the left-padded sequence's first queries see no key; NaN rows, as torch's.
    assert_close(patterns[""], expected, equal_nan=True, **TOL)


@pytest.mark.parametrize("extra", ["add_bias_kv", "add_zero_attn"])
def test_capture_with_appended_keys_and_separate_weights(extra):
    module = build(separate=True, batch_first=False, **{extra: True})
    q, k, v = inputs(separate=True, batch_first=False)
    kwargs = dict(key_padding_mask=padding_bool()[:, :KEY_POS])
    with torch.no_grad():
        expected = module(q, k, v, average_attn_weights=False, **kwargs)[1]
        with capture_patterns(module) as patterns:
            module(q, k, v, **kwargs)
    assert patterns[""].shape == (BATCH, N_HEADS, QUERY_POS, KEY_POS + 1)
    assert_close(patterns[""], expected, **TOL)


def test_capture_unbatched_and_positional_arguments():
    module = build()
    q, k, v = (t[0] for t in inputs())  # [pos, d]
    with torch.no_grad():
        expected = module(q, k, v, None, True, None, False)[1]  # [n_heads, query_pos, key_pos]
        with capture_patterns(module) as patterns:
            module(q, k, v, None, False)
    assert_close(patterns[""], expected[None], **TOL)


def test_capture_inside_transformer_encoder_layer_in_inference_mode():
    """The encoder layer's fused inference path would skip self_attn; torch does not take it while
    a submodule has hooks, so the pattern is seen (4 heads: an even count allows the fast path)."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(12, 4, 17, dropout=0.0, batch_first=True).double().eval()
    x = torch.randn(BATCH, QUERY_POS, 12, dtype=torch.float64)
    padding = padding_bool()
    with torch.inference_mode():
        with capture_patterns(layer) as patterns:
            layer(x, src_key_padding_mask=padding)
        expected = layer.self_attn(x, x, x, key_padding_mask=padding, average_attn_weights=False)[1]
    assert_close(patterns["self_attn"], expected, **TOL)
    assert not layer.self_attn._forward_pre_hooks and not layer.self_attn._forward_hooks


def test_views_share_storage_with_the_module():
    for separate in (False, True):
        module = build(separate=separate)
        [view] = attention_views(module)
        with torch.no_grad():
            for p in module.parameters():
                p.add_(1.0)  # in place: every view must see it
        [fresh] = attention_views(build(separate=separate))
        for field in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
            assert_close(getattr(view, field), getattr(fresh, field) + 1.0, rtol=0, atol=0)
        # Still differentiable after the in-place update (plain slices, not split/chunk outputs).
        sum((getattr(view, f) ** 2).sum() for f in ("W_Q", "W_K", "b_V")).backward()
        assert module.in_proj_bias.grad is not None


def test_capture_rejects_nested_tensors_after_the_forward():
    module = build(n_heads_even=True)
    parts = [torch.randn(3, 8, dtype=torch.float64), torch.randn(5, 8, dtype=torch.float64)]
    with pytest.warns(UserWarning, match="nested tensors is in prototype stage"):
        nested = torch.nested.nested_tensor(parts)
    with torch.no_grad(), pytest.raises(ValueError, match="nested-tensor inputs"):
        with capture_patterns(module):
            module(nested, nested, nested, need_weights=False)
    assert not module._forward_pre_hooks and not module._forward_hooks


@settings(max_examples=25, deadline=None)
@given(
    n_heads=st.integers(1, 3),
    d_head=st.integers(1, 4),
    query_pos=st.integers(1, 5),
    key_pos=st.integers(1, 5),
    d_key=st.integers(1, 5),
    batch_first=st.booleans(),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_views_and_capture_for_any_sizes(
    n_heads, d_head, query_pos, key_pos, d_key, batch_first, bias, seed
):
    torch.manual_seed(seed)
    d_model = n_heads * d_head
    module = nn.MultiheadAttention(
        d_model, n_heads, bias=bias, batch_first=batch_first, kdim=d_key, vdim=d_key + 1
    ).double()
    q = torch.randn(2, query_pos, d_model, dtype=torch.float64)
    k = torch.randn(2, key_pos, d_key, dtype=torch.float64)
    v = torch.randn(2, key_pos, d_key + 1, dtype=torch.float64)
    qkv = (q, k, v) if batch_first else tuple(t.transpose(0, 1) for t in (q, k, v))
    with torch.no_grad():
        with capture_patterns(module) as patterns:
            expected, weights = module(*qkv, average_attn_weights=False)
        [view] = attention_views(module)
        out, pattern = reconstruct(view, q, k, v)
    assert_close(out, batch_major(expected, batch_first), **TOL)
    assert_close(pattern, weights, **TOL)
    assert_close(patterns[""], weights, **TOL)
