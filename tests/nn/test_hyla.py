"""HYLA and the hypernetwork attentions: hand-computed cases, one-head reduction, T5 buckets."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dynascope.nn import MultiHeadAttention
from dynascope.nn.hyla import (
    MIXERS,
    RelativePositionBias,
    hypernetwork_output,
    relative_position_bucket,
    rms_head,
)


def _set_weights(attn: MultiHeadAttention, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in attn.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))


def _naive(x, attn, normalization, target, bias=None):
    """Loop-by-loop oracle: per (b, q, k) pair build the generated network explicitly."""
    B, P, _ = x.shape
    H = attn.n_heads
    out = torch.zeros(B, P, attn.d_model, dtype=x.dtype)
    for b in range(B):
        q = torch.stack([x[b] @ attn.W_Q[h] + attn.b_Q[h] for h in range(H)])  # [H, P, d]
        k = torch.stack([x[b] @ attn.W_K[h] + attn.b_K[h] for h in range(H)])
        a = torch.einsum("hqd,hkd->hqk", q, k) * attn.scale
        if bias is not None:
            a = a + bias
        if normalization == "softmax":
            a = a.softmax(-1)
        elif normalization == "rms_head":
            a = a / torch.sqrt((a**2).mean(0, keepdim=True) + 1e-6)
        for qi in range(P):
            for ki in range(P):
                code = a[:, qi, ki]  # [H]: the latent code of this pair
                W_gen = sum(code[h] * attn.W_V[h] for h in range(H))  # [d_model, d_head]
                b_gen = sum(code[h] * attn.b_V[h] for h in range(H))
                Wo_gen = sum(code[h] * attn.W_O[h] for h in range(H))  # [d_head, d_model]
                if target == "default":
                    contrib = sum(
                        code[h] * ((x[b, ki] @ attn.W_V[h] + attn.b_V[h]) @ attn.W_O[h])
                        for h in range(H)
                    )
                else:
                    hidden = x[b, ki] @ W_gen + b_gen
                    if target == "mlp_relu":
                        hidden = hidden.clamp(min=0)
                    contrib = hidden @ Wo_gen
                out[b, qi] += contrib
        out[b] += attn.b_O
    return out


@pytest.mark.parametrize("attention", sorted(MIXERS))
def test_every_attention_matches_the_pairwise_hypernetwork_oracle(attention):
    """float64, distinct sizes; tolerance 1e-10: same arithmetic, different summation order."""
    attn = MultiHeadAttention(5, 3, 2, attention=attention, use_bias=True).double()
    _set_weights(attn)
    x = torch.randn(2, 4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    normalization, target = MIXERS[attention]
    torch.testing.assert_close(
        attn(x), _naive(x, attn, normalization, target), rtol=1e-10, atol=1e-10
    )


def test_hyla_hand_computed_case():
    """One batch, 2 positions, 2 heads, d_model 1, d_head 1: worked out on paper."""
    attn = MultiHeadAttention(1, 2, 1, attention="hyla", use_bias=False, scale=1.0).double()
    with torch.no_grad():
        attn.W_Q.copy_(torch.tensor([[[1.0]], [[2.0]]]))
        attn.W_K.copy_(torch.tensor([[[1.0]], [[-1.0]]]))
        attn.W_V.copy_(torch.tensor([[[1.0]], [[3.0]]]))
        attn.W_O.copy_(torch.tensor([[[2.0]], [[1.0]]]))
    x = torch.tensor([[[1.0], [2.0]]], dtype=torch.float64)
    # scores s_h[q,k] = (wq_h x_q)(wk_h x_k): head0 [[1,2],[2,4]], head1 [[-2,-4],[-4,-8]].
    # rms over heads per pair: (1,-2)/sqrt(2.5), (2,-4)/sqrt(10), (2,-4)/sqrt(10), (4,-8)/sqrt(40)
    # every pair normalises to c * (1, -2) with c = 1/sqrt(2.5) (eps 1e-6 negligible at 1e-6).
    c = 1 / 2.5**0.5
    # u_qk = relu(c*1*x_k*1 + c*(-2)*x_k*3) = relu(-5 c x_k) = 0 for x_k > 0 -> output 0.
    torch.testing.assert_close(
        attn(x), torch.zeros(1, 2, 1, dtype=torch.float64), atol=1e-12, rtol=0
    )
    # flip the sign of W_V[1]: u_qk = relu(c x_k - 6 c x_k * (-1)) = 7 c x_k;
    # out_q = sum_k sum_h a_h u_qk W_O[h] = sum_k (c*2 + (-2c)*1) * 7 c x_k = 0 again, so also
    # change W_O[1] to -1: weight per key c*2 + (-2c)(-1) = 4c -> out_q = 28 c^2 (x_1 + x_2).
    with torch.no_grad():
        attn.W_V[1] = -3.0
        attn.W_O[1] = -1.0
    expected = torch.full((1, 2, 1), 28 * c**2 * 3.0, dtype=torch.float64)
    torch.testing.assert_close(attn(x), expected, rtol=1e-5, atol=0)  # eps 1e-6 in the rms


def test_one_head_rms_head_is_the_sign_and_hyla_reduces_to_relu_or_min():
    """n_heads = 1: a/sqrt(a² + eps) = sign(a) (up to eps), so linear_rms_head gives
    sum_k sign(s_qk) v_k W_O and HYLA gives sum_k [s>0] relu(v_k) W_O + [s<0] min(v_k, 0) W_O."""
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(2, 1, 4, 4, generator=g, dtype=torch.float64) * 1000
    # exact closed form, and sign(a) within eps / (2 a²) (first-order bound, eps = 1e-6)
    torch.testing.assert_close(rms_head(scores), scores / (scores**2 + 1e-6).sqrt())
    bound = 1.01 * float(1e-6 / (2 * scores.abs().min() ** 2))  # 1% for float rounding
    torch.testing.assert_close(rms_head(scores), scores.sign(), rtol=0, atol=bound)
    v = torch.randn(2, 1, 4, 3, generator=g, dtype=torch.float64)
    W_O = torch.randn(1, 3, 5, generator=g, dtype=torch.float64)
    s = scores.sign()
    pattern = rms_head(scores)
    pos = (s[:, 0] > 0).double()[..., None]  # [b, q, k, 1]
    gated = pos * v[:, 0, None].clamp(min=0) + (1 - pos) * v[:, 0, None].clamp(max=0)
    expected = gated.sum(2) @ W_O[0]
    torch.testing.assert_close(
        hypernetwork_output(pattern, v, W_O, "mlp_relu"), expected, rtol=1e-8, atol=1e-8
    )  # eps/a² < 1e-9 at these scores
    torch.testing.assert_close(
        hypernetwork_output(pattern, v, W_O, "default"),
        (s[:, 0] @ v[:, 0]) @ W_O[0],
        rtol=1e-8,
        atol=1e-8,
    )


def test_gradients_flow_to_every_parameter_for_hyla_with_relative_bias():
    attn = MultiHeadAttention(6, 3, 2, attention="hyla", use_bias=True, relative_position_buckets=4)
    x = torch.randn(2, 5, 6, generator=torch.Generator().manual_seed(0))
    attn(x).square().sum().backward()
    for name, p in attn.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_relative_bias_is_added_to_the_scores():
    attn = MultiHeadAttention(4, 2, 2, attention="linear", relative_position_buckets=4)
    x = torch.randn(1, 3, 4, generator=torch.Generator().manual_seed(0))
    from dynascope.nn import capture

    with capture(attn, ["hook_attn_scores"]) as cache:
        attn(x)
    q = torch.einsum("bpm,hmd->bhpd", x, attn.W_Q)
    k = torch.einsum("bpm,hmd->bhpd", x, attn.W_K)
    expected = attn.scale * q @ k.mT + attn.relative_position(3, 3)
    torch.testing.assert_close(cache["hook_attn_scores"], expected.detach())


def test_t5_buckets_hand_values():
    """n_buckets = max_distance = 8, unidirectional: distances 0-3 exact, 4..7 log-spaced."""
    rel = torch.arange(-10, 4)  # key - query
    got = relative_position_bucket(rel, 8, 8)
    # n = query - key = 10..-3; n<=0 -> 0; n<4 exact; n>=4: min(7, 4 + floor(4 log2(n/4))):
    # n=4: 4; 5: 4+floor(1.29)=5; 6: 4+floor(2.34)=6; 7: 4+floor(3.23)=7; 8, 9, 10: 7 (clamped)
    expected = torch.tensor([7, 7, 7, 7, 6, 5, 4, 3, 2, 1, 0, 0, 0, 0])
    torch.testing.assert_close(got, expected)
    bi = relative_position_bucket(torch.tensor([-1, 1]), 8, 8, bidirectional=True)
    torch.testing.assert_close(bi, torch.tensor([1, 5]))


def test_bias_table_lookup_and_bad_input():
    bias = RelativePositionBias(2, 4)
    out = bias(3, 3)
    assert out.shape == (1, 2, 3, 3)
    torch.testing.assert_close(out[0, :, 2, 0], bias.weight[:, 2].detach())
    with pytest.raises(ValueError, match="max_distance must be >= n_buckets=8"):
        relative_position_bucket(torch.zeros(1), 8, 4)
    with pytest.raises(ValueError, match="attention must be one of"):
        MultiHeadAttention(4, 2, attention="hypa")
    with pytest.raises(ValueError, match="target_network must be one of"):
        hypernetwork_output(
            torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1), "swiglu"
        )
    with pytest.raises(ValueError, match="scores must be"):
        rms_head(torch.zeros(3, 3))


@pytest.mark.parametrize("attention", ["softmax", "linear", "hyla"])
def test_relative_bias_attentions_match_the_oracle_with_bias(attention):
    attn = MultiHeadAttention(
        5, 3, 2, attention=attention, use_bias=True, relative_position_buckets=4
    ).double()
    _set_weights(attn, seed=2)
    x = torch.randn(2, 6, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    bias = attn.relative_position(6, 6)[0].detach()
    normalization, target = MIXERS[attention]
    expected = _naive(x, attn, normalization, target, bias=bias)
    torch.testing.assert_close(attn(x), expected, rtol=1e-10, atol=1e-10)


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.floats(-1e30, 1e30, allow_nan=False), min_size=12, max_size=12),
    st.floats(1e-3, 1e3),
)
def test_rms_head_properties(values, c):
    """Per (q, k) pair the head vector has RMS <= 1; zero stays zero; eps = 0 is scale-free."""
    a = torch.tensor(values, dtype=torch.float64).reshape(1, 3, 2, 2)
    out = rms_head(a)
    assert out.isfinite().all()
    assert (out.square().mean(1) <= 1 + 1e-12).all()
    torch.testing.assert_close(rms_head(torch.zeros(1, 3, 2, 2)), torch.zeros(1, 3, 2, 2))
    nonzero = a.square().mean(1, keepdim=True).expand_as(a) > 1e-200  # away from underflow
    scaled = rms_head(a * c, eps=0.0)
    torch.testing.assert_close(scaled[nonzero], rms_head(a, eps=0.0)[nonzero])
