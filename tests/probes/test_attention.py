"""Tests for dynascope.probes.attention: entropy against closed forms and hand-computed rows, the
edge cases (masks, empty rows, NaN, huge logits), the reductions, and the AttentionEntropy probe
on a tiny dynascope Transformer against the pure functions applied to patterns captured by hand.

Tolerances. The closed forms (uniform over k keys: log k; causal uniform: log(i + 1)) are
computed in float64 from rows 1/k rounded once, so the entropy is off by a few ulps of log k:
1e-12 absolute is loose for that and tight for any wrong formula. Bounds checks allow 1e-12
(float64) or 1e-5 (float32, softmax rows summing to 1 within a few eps) of slack.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dynascope as ds
from dynascope.probes import (
    COLLAPSE_THRESHOLD_NATS,
    PROBES,
    AttentionEntropy,
    ProbeContext,
    attention_entropy,
    entropy_collapsed,
    head_entropy,
    make_probe,
    normalized_attention_entropy,
)

F64 = torch.float64
FAST = settings(max_examples=60, deadline=None)
BATCH, N_HEADS, POS = 2, 3, 7


def exact(actual, expected, atol=1e-12):
    torch.testing.assert_close(actual, expected, rtol=0, atol=atol, equal_nan=True)


# --- closed forms and hand-computed cases ----------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 5, 11])
def test_uniform_rows_have_entropy_log_k(k):
    pattern = torch.full((BATCH, N_HEADS, POS, k), 1.0 / k, dtype=F64)
    exact(attention_entropy(pattern), torch.full((BATCH, N_HEADS, POS), math.log(k), dtype=F64))
    expected_normalized = 1.0 if k > 1 else math.nan  # 0 / log 1 is undefined
    exact(
        normalized_attention_entropy(pattern),
        torch.full((BATCH, N_HEADS, POS), expected_normalized, dtype=F64),
    )


def test_one_hot_rows_have_zero_entropy():
    keys = torch.randint(0, 5, (BATCH, N_HEADS, POS), generator=torch.Generator().manual_seed(0))
    pattern = torch.nn.functional.one_hot(keys, 5).to(F64)
    exact(attention_entropy(pattern), torch.zeros(BATCH, N_HEADS, POS, dtype=F64), atol=0)
    exact(normalized_attention_entropy(pattern), torch.zeros(BATCH, N_HEADS, POS, dtype=F64), 0)


def test_causal_uniform_rows_have_entropy_log_i_plus_1():
    causal = torch.ones(POS, POS, dtype=torch.bool).tril()
    counts = torch.arange(1, POS + 1, dtype=F64)
    pattern = (causal / counts[:, None]).expand(BATCH, N_HEADS, POS, POS)
    expected = counts.log().expand(BATCH, N_HEADS, POS)
    exact(attention_entropy(pattern, causal), expected)
    # Without the mask the zeros above the diagonal are 0 log 0 = 0: same entropy.
    exact(attention_entropy(pattern), expected)
    normalized = normalized_attention_entropy(pattern, causal)
    exact(normalized[..., 0], torch.full((BATCH, N_HEADS), math.nan, dtype=F64))  # one key
    exact(normalized[..., 1:], torch.ones(BATCH, N_HEADS, POS - 1, dtype=F64))


def test_padded_keys_are_ignored_whatever_they_hold():
    valid = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])  # [batch, key_pos]
    mask = valid[:, None, None, :]
    pattern = (valid.to(F64) / valid.sum(-1, keepdim=True))[:, None, None, :]
    pattern = pattern.expand(BATCH, N_HEADS, POS, 7).clone()
    pattern[1, ..., 4] = math.nan  # garbage at padded keys is not read
    pattern[1, ..., 5] = 3.0
    pattern[1, ..., 6] = -1.0
    expected = torch.tensor([math.log(7), math.log(4)], dtype=F64)[:, None, None]
    exact(attention_entropy(pattern, mask), expected.expand(BATCH, N_HEADS, POS))
    exact(normalized_attention_entropy(pattern, mask), torch.ones(BATCH, N_HEADS, POS, dtype=F64))


def test_hand_computed_three_key_rows():
    pattern = torch.tensor([[[[0.5, 0.25, 0.25], [0.7, 0.2, 0.1], [0.0, 0.4, 0.6]]]], dtype=F64)
    expected = torch.tensor(
        [
            1.5 * math.log(2),  # 0.5 log 2 + 2 * 0.25 log 4
            -(0.7 * math.log(0.7) + 0.2 * math.log(0.2) + 0.1 * math.log(0.1)),
            -(0.4 * math.log(0.4) + 0.6 * math.log(0.6)),  # 0 log 0 = 0
        ],
        dtype=F64,
    )
    exact(attention_entropy(pattern), expected[None, None])
    exact(normalized_attention_entropy(pattern), (expected / math.log(3))[None, None])


def test_eps_reproduces_the_reference_formula():
    pattern = torch.tensor([[[[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]]]], dtype=F64)
    reference = (-pattern * torch.log(pattern + 1e-6)).sum(-1)  # ml-sigma-reparam's logging
    exact(attention_entropy(pattern, eps=1e-6), reference)
    assert not torch.equal(attention_entropy(pattern, eps=1e-6), attention_entropy(pattern))


def test_rows_without_valid_keys_give_nan_and_are_skipped():
    mask = torch.ones(1, N_HEADS, POS, 4, dtype=torch.bool)
    mask[..., 2, :] = False  # query 2 sees nothing
    pattern = torch.where(mask, 0.25, 0.0).to(F64)  # the model writes a zero row
    entropy = attention_entropy(pattern, mask)
    assert entropy[..., 2].isnan().all() and not entropy[..., [0, 1, 3, 4, 5, 6]].isnan().any()
    exact(head_entropy(pattern, mask), torch.full((N_HEADS,), math.log(4), dtype=F64))
    everything_masked = torch.zeros_like(mask)
    exact(head_entropy(pattern, everything_masked), torch.full((N_HEADS,), math.nan, dtype=F64))


def test_float32_and_half_patterns_compute_in_float32():
    logits = torch.randn(BATCH, N_HEADS, POS, 5, generator=torch.Generator().manual_seed(1))
    pattern = logits.softmax(-1)
    assert attention_entropy(pattern).dtype == torch.float32
    from_half = attention_entropy(pattern.bfloat16())
    assert from_half.dtype == torch.float32
    # bfloat16 rounds each weight by <= 2^-9 relatively: entropy within ~1e-2 nats of float32.
    torch.testing.assert_close(from_half, attention_entropy(pattern), rtol=0, atol=2e-2)


# --- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad, match",
    [
        (
            math.nan,
            r"pattern must be finite and non-negative at valid keys \(got 0 negative, 1 NaN",
        ),
        (-0.1, r"pattern must be finite and non-negative at valid keys \(got 1 negative"),
        (math.inf, r"1 infinite entries"),
        (0.9, r"pattern rows must sum to 1 over valid keys within 0.001 \(got 1 rows off"),
    ],
)
def test_invalid_entries_raise_one_line_naming_pattern(bad, match):
    pattern = torch.full((BATCH, N_HEADS, POS, 4), 0.25, dtype=F64)
    pattern[1, 2, 3, 0] = bad
    with pytest.raises(ValueError, match=match):
        attention_entropy(pattern)
    with pytest.raises(ValueError, match=match):
        head_entropy(pattern, normalized=True)


def test_bad_arguments_raise():
    pattern = torch.full((N_HEADS, POS, 4), 0.25)
    with pytest.raises(ValueError, match=r"pattern must be a floating-point tensor \[\*batch"):
        attention_entropy(torch.full((POS, 4), 0.25))
    with pytest.raises(ValueError, match=r"pattern must be a floating-point tensor .*torch.int64"):
        attention_entropy(torch.ones(1, 1, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="mask must be a bool tensor"):
        attention_entropy(pattern, torch.ones(4))
    with pytest.raises(ValueError, match=r"mask must be broadcastable to shape \(3, 7, 4\)"):
        attention_entropy(pattern, torch.ones(5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"mask must be broadcastable to shape \(3, 7, 4\)"):
        attention_entropy(pattern, torch.ones(2, 3, 7, 4, dtype=torch.bool))  # would grow it
    with pytest.raises(ValueError, match="query_mask must be broadcastable"):
        head_entropy(pattern, query_mask=torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="eps must be finite and >= 0"):
        attention_entropy(pattern, eps=-1e-6)
    with pytest.raises(ValueError, match="threshold must be finite and >= 0"):
        entropy_collapsed(torch.zeros(3), threshold=math.nan)


# --- properties ----------------------------------------------------------------------------------


@st.composite
def patterns(draw):
    """(pattern, mask or None, T per row) from softmaxed logits, with empty rows under masks."""
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    n_heads, query_pos, key_pos = (draw(st.integers(1, 4)) for _ in range(3))
    dtype = draw(st.sampled_from([torch.float32, F64]))
    scale = draw(st.sampled_from([0.0, 1e-3, 1.0, 30.0, 1e30]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    shape = (*batch, n_heads, query_pos, key_pos)
    logits = scale * torch.randn(shape, generator=g, dtype=dtype)
    mask_kind = draw(st.sampled_from(["none", "causal", "random"]))
    if mask_kind == "none":
        mask = None
    elif mask_kind == "causal":
        mask = torch.ones(query_pos, key_pos, dtype=torch.bool).tril()
    else:  # per batch and query, may leave rows with no key at all
        mask = torch.rand((*batch, 1, query_pos, key_pos), generator=g) < 0.6
    masked = logits if mask is None else logits.masked_fill(~mask, -math.inf)
    pattern = masked.softmax(-1)  # NaN on empty rows: ignored, as they are at invalid keys
    counts = (
        torch.full(shape[:-1], float(key_pos), dtype=dtype)
        if mask is None
        else mask.expand(shape).sum(-1).to(dtype)
    )
    return pattern, mask, counts


@FAST
@given(patterns())
def test_entropy_is_finite_and_bounded_and_nan_only_on_empty_rows(case):
    pattern, mask, counts = case
    entropy = attention_entropy(pattern, mask)
    normalized = normalized_attention_entropy(pattern, mask)
    assert entropy.shape == pattern.shape[:-1] == normalized.shape
    assert entropy.dtype == pattern.dtype
    slack = 1e-12 if pattern.dtype == F64 else 1e-5
    has_key = counts > 0
    assert torch.equal(entropy.isnan(), ~has_key)
    assert torch.equal(normalized.isnan(), counts <= 1)
    h = entropy[has_key]
    assert bool((h >= -slack).all()) and bool((h <= counts[has_key].log() + slack).all())
    n = normalized[counts > 1]
    assert bool((n >= -slack).all()) and bool((n <= 1 + slack).all())
    heads = head_entropy(pattern, mask)
    assert heads.shape == (pattern.shape[-3],)


def test_huge_logits_give_one_hot_rows_and_zero_entropy():
    logits = 1e30 * torch.randn(BATCH, N_HEADS, POS, 5, generator=torch.Generator().manual_seed(2))
    for dtype in (torch.float32, F64):
        entropy = attention_entropy(logits.to(dtype).softmax(-1))
        exact(entropy, torch.zeros(BATCH, N_HEADS, POS, dtype=dtype), atol=0)


# --- reductions and the collapse flag --------------------------------------------------------


def test_head_entropy_means_over_batch_and_counted_queries():
    causal = torch.ones(POS, POS, dtype=torch.bool).tril()
    counts = torch.arange(1, POS + 1, dtype=F64)
    uniform = (causal / counts[:, None]).expand(BATCH, 1, POS, POS)
    one_hot = torch.eye(POS, dtype=F64).expand(BATCH, 1, POS, POS)
    pattern = torch.cat([uniform, one_hot, uniform], dim=1)  # heads: uniform, one-hot, uniform
    query_mask = torch.ones(BATCH, 1, POS, dtype=torch.bool)
    query_mask[1, 0, 4:] = False  # padding queries of sequence 1
    h = head_entropy(pattern, causal, query_mask)
    kept = torch.cat([counts, counts[:4]])
    mean_log = kept.log().mean()
    exact(h, torch.stack([mean_log, torch.tensor(0.0, dtype=F64), mean_log]))
    # Normalised: query 0 (one valid key) is skipped; uniform rows give 1, one-hot rows 0.
    exact(
        head_entropy(pattern, causal, query_mask, normalized=True),
        torch.tensor([1.0, 0.0, 1.0], dtype=F64),
    )


def test_entropy_collapsed_flag():
    h = torch.tensor([0.0, 0.05, 0.1, 2.0, math.nan])
    assert entropy_collapsed(h).tolist() == [True, True, False, False, False]
    assert entropy_collapsed(h, threshold=0.0).tolist() == [False] * 5
    assert COLLAPSE_THRESHOLD_NATS == 0.1
    # The documented meaning: H < 0.1 nats forces max weight > exp(-0.1), since the
    # min-entropy -log max_j A_ij is at most H. So a row with top weight 0.9 is never collapsed.
    for top, collapsed in ((0.9, False), (0.95, False), (0.99, True)):
        rest = (1 - top) / 9
        h_row = attention_entropy(torch.tensor([[[[top] + [rest] * 9]]], dtype=F64))
        assert h_row.item() >= -math.log(top)
        assert bool(entropy_collapsed(h_row)) == collapsed


# --- the probe -----------------------------------------------------------------------------------


def tiny_transformer(seed=0, **kwargs):
    torch.manual_seed(seed)
    options = dict(n_layers=2, d_model=12, n_heads=3, d_vocab=11, d_out=11, n_ctx=7)
    options.update(kwargs)
    return ds.nn.Transformer(**options)


def tokens(seed=0):
    return torch.randint(0, 11, (BATCH, POS), generator=torch.Generator().manual_seed(seed))


def expected_keys(model, x, key_padding_mask=None, threshold=COLLAPSE_THRESHOLD_NATS):
    """The pure functions applied to patterns captured by hand, in eval mode."""
    was_training = model.training
    model.eval()
    with torch.no_grad(), ds.capture_patterns(model) as patterns:
        model(x, key_padding_mask=key_padding_mask)
    model.train(was_training)
    out, heads, heads_normalized = {}, [], []
    for layer in range(model.n_layers):
        pattern = patterns[f"blocks.{layer}.attn"]
        is_causal = model.blocks[layer].attn.is_causal
        mask = torch.ones(POS, POS, dtype=torch.bool).tril() if is_causal else None
        query_mask = None
        if key_padding_mask is not None:
            keys = key_padding_mask[:, None, None, :]
            mask = keys if mask is None else mask & keys
            query_mask = key_padding_mask[:, None, :]
        h = head_entropy(pattern, mask, query_mask).double()
        n = head_entropy(pattern, mask, query_mask, normalized=True).double()
        heads.append(h)
        heads_normalized.append(n)
        out[f"L{layer}.attn.mean.entropy"] = h.mean().item()
        out[f"L{layer}.attn.mean.entropy_normalized"] = n.mean().item()
        for head in range(N_HEADS):
            out[f"L{layer}.H{head}.attn.entropy"] = h[head].item()
            out[f"L{layer}.H{head}.attn.entropy_normalized"] = n[head].item()
    h, n = torch.cat(heads), torch.cat(heads_normalized)
    out["attn.mean.entropy"] = h.mean().item()
    out["attn.min.entropy"] = h.min().item()
    out["attn.mean.entropy_normalized"] = n.mean().item()
    out["attn.min.entropy_normalized"] = n.min().item()
    out["attn.collapsed_heads"] = float((h < threshold).sum())
    return out


def assert_same_keys(out, expected):
    assert set(out) == set(expected)
    assert all(isinstance(v, float) for v in out.values())
    keys = sorted(expected)
    exact(
        torch.tensor([out[k] for k in keys], dtype=F64),
        torch.tensor([expected[k] for k in keys], dtype=F64),
        atol=0,
    )


@pytest.mark.parametrize("is_causal", [True, False])
def test_probe_equals_pure_functions_on_captured_patterns(is_causal):
    model = tiny_transformer(is_causal=is_causal)
    x = tokens()
    out = AttentionEntropy(x=x)(model, ProbeContext(step=0))
    expected = expected_keys(model, x)
    assert_same_keys(out, expected)
    assert len([k for k in out if k.startswith("L1.H")]) == 2 * N_HEADS


def test_probe_with_key_padding_mask():
    model = tiny_transformer()
    x = tokens()
    key_padding_mask = torch.ones(BATCH, POS, dtype=torch.bool)
    key_padding_mask[1, 5:] = False
    out = AttentionEntropy(x=x, key_padding_mask=key_padding_mask)(model, ProbeContext(step=0))
    assert_same_keys(out, expected_keys(model, x, key_padding_mask))
    assert out != AttentionEntropy(x=x)(model, ProbeContext(step=0))


def test_probe_holds_the_first_batch_and_counts_collapsed_heads():
    model = tiny_transformer()
    x0, x1 = tokens(0), tokens(1)
    probe = AttentionEntropy(collapse_threshold=1e9, per_head=False)
    first = probe(model, ProbeContext(step=0, batch={"x": x0, "y": x0}))
    later = probe(model, ProbeContext(step=5, batch={"x": x1}))
    assert first == later  # same model, same held inputs
    expected = expected_keys(model, x0, threshold=1e9)
    assert_same_keys(first, {k: v for k, v in expected.items() if ".H" not in k})
    assert first["attn.collapsed_heads"] == 2 * N_HEADS  # every finite head is below 1e9 nats
    assert (
        AttentionEntropy(x=x0, collapse_threshold=0.0)(model, ProbeContext(0))[
            "attn.collapsed_heads"
        ]
        == 0.0
    )


def test_probe_leaves_mode_rng_and_grads_untouched():
    model = tiny_transformer()
    model.train()
    model.blocks[1].eval()
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.25)
    modes = [m.training for m in model.modules()]
    grads = [p.grad.clone() for p in model.parameters()]
    params = [p.detach().clone() for p in model.parameters()]
    rng = torch.get_rng_state()

    AttentionEntropy(x=tokens())(model, ProbeContext(step=3))

    assert [m.training for m in model.modules()] == modes
    torch.testing.assert_close(torch.get_rng_state(), rng, rtol=0, atol=0)
    for p, g, w in zip(model.parameters(), grads, params):
        torch.testing.assert_close(p.grad, g, rtol=0, atol=0)
        torch.testing.assert_close(p.detach(), w, rtol=0, atol=0)


def test_probe_reports_nan_for_a_diverged_layer():
    model = tiny_transformer()
    with torch.no_grad():
        model.blocks[1].attn.W_Q.fill_(math.nan)
    out = AttentionEntropy(x=tokens())(model, ProbeContext(step=0))
    assert math.isfinite(out["L0.H2.attn.entropy"]) and math.isfinite(out["L0.attn.mean.entropy"])
    assert math.isnan(out["L1.H0.attn.entropy"]) and math.isnan(out["attn.mean.entropy"])
    assert math.isnan(out["attn.min.entropy_normalized"])
    assert set(out) == set(expected_keys(tiny_transformer(), tokens()))


def test_probe_errors():
    model = tiny_transformer()
    with pytest.raises(ValueError, match=r"needs inputs: pass x= .* \(got no batch\)"):
        AttentionEntropy()(model, ProbeContext(step=0))
    with pytest.raises(ValueError, match=r"\(got batch keys \['tokens'\]\)"):
        AttentionEntropy()(model, ProbeContext(step=0, batch={"tokens": tokens()}))
    with pytest.raises(ValueError, match="needs softmax attention"):
        AttentionEntropy(x=tokens())(tiny_transformer(attention="linear"), ProbeContext(0))
    with pytest.raises(ValueError, match="collapse_threshold must be finite and >= 0"):
        AttentionEntropy(collapse_threshold=-1.0)
    with pytest.raises(ValueError, match="key_padding_mask needs x"):
        AttentionEntropy(key_padding_mask=torch.ones(2, 7, dtype=torch.bool))


def test_probe_registry():
    assert PROBES["attention_entropy"] is AttentionEntropy
    probe = make_probe("attention_entropy", per_head=False)
    assert isinstance(probe, AttentionEntropy) and probe.name == "attention_entropy"
