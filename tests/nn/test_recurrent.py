"""Gated linear RNN, LRU and the linear-attention construction against independent oracles.

Oracles: a per-sequence, per-position Python loop for causal linear attention; dynascope's
``MultiHeadAttention(attention="linear", is_causal=True, scale=1)``; the plain-loop recurrence
(``sequential_scan``) and the closed form of a constant-input recurrence. float64 comparisons use
atol 1e-10 (sums of ~100 products of O(10) numbers: rounding ~1e-13) unless stated.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from dynascope.nn._scan import linear_scan, sequential_scan
from dynascope.nn.attention import MultiHeadAttention
from dynascope.nn.recurrent import (
    LRU,
    GatedLinearRNN,
    LRUBlock,
    LRUNetwork,
    RNNBaseline,
    causal_linear_attention,
    construction_counts,
    gated_rnn_from_linear_attention,
)

F64 = torch.float64


def _weights(n_heads, d_model, d_head, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    qkv = [torch.randn(n_heads, d_model, d_head, generator=g, dtype=dtype) for _ in range(3)]
    return (*qkv, torch.randn(n_heads, d_head, d_model, generator=g, dtype=dtype))


def naive_lsa(x, W_Q, W_K, W_V, W_O):
    """Loop over sequences, heads, queries t and keys s <= t."""
    batch, pos, d_model = x.shape
    out = torch.zeros(batch, pos, d_model, dtype=x.dtype)
    for b in range(batch):
        for h in range(W_Q.shape[0]):
            for t in range(pos):
                q = x[b, t] @ W_Q[h]
                for s in range(t + 1):
                    out[b, t] += (q @ (x[b, s] @ W_K[h])) * (x[b, s] @ W_V[h]) @ W_O[h]
    return out


@pytest.mark.parametrize(
    ("n_heads", "d_model", "d_head", "pos"),
    [(1, 3, 2, 1), (2, 5, 3, 7), (3, 4, 2, 16), (2, 6, 4, 33)],
)
def test_construction_equals_causal_linear_attention_float64(n_heads, d_model, d_head, pos):
    """The issue's criterion: |GRNN − LSA| <= 1e-6 in float64 (measured ~1e-13)."""
    W = _weights(n_heads, d_model, d_head, seed=pos)
    x = torch.randn(2, pos, d_model, generator=torch.Generator().manual_seed(1), dtype=F64)
    rnn = gated_rnn_from_linear_attention(*W)
    reference = naive_lsa(x, *W)
    with torch.no_grad():
        assert_close(causal_linear_attention(x, *W), reference, rtol=0, atol=1e-10)
        assert_close(rnn(x), reference, rtol=0, atol=1e-6)
        assert_close(rnn(x, sequential=True), reference, rtol=0, atol=1e-6)
    assert (rnn.lambdas() == 1).all()


def test_causal_linear_attention_matches_multi_head_attention_module():
    W_Q, W_K, W_V, W_O = _weights(3, 11, 5)
    module = MultiHeadAttention(11, 3, 5, attention="linear", is_causal=True, scale=1.0).double()
    with torch.no_grad():
        for name, W in zip(("W_Q", "W_K", "W_V", "W_O"), (W_Q, W_K, W_V, W_O)):
            getattr(module, name).copy_(W)
        x = torch.randn(2, 7, 11, dtype=F64)
        assert_close(causal_linear_attention(x, W_Q, W_K, W_V, W_O), module(x), rtol=0, atol=1e-10)


def test_construction_counts_match_the_built_module():
    W = _weights(2, 5, 3)
    rnn = gated_rnn_from_linear_attention(*W)
    counts = construction_counts(5, 2, 3)
    assert counts["neurons"] == rnn.d_hidden == rnn.d_gate == 18
    assert counts["rnn_parameters"] == sum(p.numel() for p in rnn.parameters())
    assert counts["attention_parameters"] == sum(w.numel() for w in W)


def test_construction_keeps_float32_error_near_rounding():
    """float32: error relative to the output's size stays within 1e-5 (about 100 ulp)."""
    W = _weights(2, 4, 2, dtype=torch.float32)
    x = torch.randn(4, 16, 4)
    with torch.no_grad():
        out, ref = gated_rnn_from_linear_attention(*W)(x), causal_linear_attention(x, *W)
    assert ((out - ref).abs().max() / ref.abs().max()) < 1e-5


def test_constant_input_recurrence_has_its_closed_form():
    """h_t = λ h_{t−1} + 1 gives (1 − λ^{t+1}) / (1 − λ); λ = 0 gives 1, λ = 1 gives t + 1."""
    lam = torch.tensor([0.0, 0.5, 0.9, 1.0], dtype=F64)
    t = torch.arange(9, dtype=F64)[:, None]
    expected = torch.where(lam == 1, t + 1, (1 - lam ** (t + 1)) / (1 - lam).clamp_min(1e-30))
    expected[:, 0] = 1.0
    assert_close(linear_scan(lam, torch.ones(9, 4, dtype=F64)), expected, rtol=1e-12, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(
    pos=st.integers(1, 40),
    d_hidden=st.integers(1, 6),
    batch=st.integers(1, 3),
    is_complex=st.booleans(),
    per_step=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_parallel_scan_equals_the_loop(pos, d_hidden, batch, is_complex, per_step, seed):
    """Any length (powers of two and not), real or complex, constant or per-step decays,
    including exact 0 and 1 decays; atol 1e-10 (|h| <= 40 in float64)."""
    g = torch.Generator().manual_seed(seed)
    shape = (batch, pos, d_hidden) if per_step else (d_hidden,)
    a = torch.rand(shape, generator=g, dtype=F64)
    a[..., 0] = 0.0
    if d_hidden > 1:
        a[..., 1] = 1.0
    b = torch.randn(batch, pos, d_hidden, generator=g, dtype=F64)
    if is_complex:
        a = a * torch.exp(1j * torch.rand(shape, generator=g, dtype=F64) * 6.28)
        b = b + 1j * torch.randn(batch, pos, d_hidden, generator=g, dtype=F64)
    assert_close(linear_scan(a, b), sequential_scan(a, b), rtol=0, atol=1e-10)


def test_scan_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"b must have shape \[..., pos, d_hidden\]"):
        linear_scan(torch.ones(3), torch.ones(3))
    with pytest.raises(ValueError, match="a must have shape"):
        linear_scan(torch.ones(4), torch.ones(2, 5, 3))


@pytest.mark.parametrize("kind", ["real", "complex"])
@pytest.mark.parametrize("use_gamma_norm", [False, True])
def test_gated_rnn_parallel_equals_sequential_and_matches_its_definition(kind, use_gamma_norm):
    torch.manual_seed(0)
    rnn = GatedLinearRNN(
        5, 7, 3, lambda_kind=kind, use_gamma_norm=use_gamma_norm, use_skip=True
    ).double()
    x = torch.randn(2, 9, 5, dtype=F64)
    with torch.no_grad():
        out = rnn(x)
        assert_close(out, rnn(x, sequential=True), rtol=0, atol=1e-10)
        # the definition, written out with a Python loop over positions
        lam = rnn.lambdas()
        gamma = torch.exp(rnn.gamma_log) if use_gamma_norm else 1.0
        h = torch.zeros(2, 7, dtype=lam.dtype)
        W_out = rnn.W_out_h if kind == "real" else torch.complex(rnn.W_out_h, rnn.W_out_h_im)
        for t in range(9):
            h = lam * h + gamma * (x[:, t] @ rnn.W_in_x) * (x[:, t] @ rnn.W_in_g)
            y = ((h @ W_out.to(h.dtype)).real * (x[:, t] @ rnn.W_out_x)) @ rnn.D + x[:, t]
            assert_close(out[:, t], y, rtol=0, atol=1e-10)


def test_gated_rnn_init_ring_and_gamma():
    torch.manual_seed(1)
    rnn = GatedLinearRNN(3, 500, lambda_kind="complex", use_gamma_norm=True, r_min=0.4, r_max=0.9)
    r = rnn.lambdas().abs().detach()
    assert r.min() >= 0.4 - 1e-6 and r.max() <= 0.9 + 1e-6
    assert_close(torch.exp(rnn.gamma_log).detach(), torch.sqrt(1 - r**2), rtol=1e-5, atol=1e-6)
    assert rnn.lambdas().angle().abs().max() > 1.0  # phases spread over [0, 2π)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_permuting_hidden_neurons_preserves_the_function(seed):
    torch.manual_seed(seed)
    rnn = GatedLinearRNN(4, 6).double()
    perm = torch.randperm(6)
    other = GatedLinearRNN(4, 6).double()
    with torch.no_grad():
        other.W_in_x.copy_(rnn.W_in_x[:, perm])
        other.W_in_g.copy_(rnn.W_in_g[:, perm])
        other.nu_log.copy_(rnn.nu_log[perm])
        other.W_out_h.copy_(rnn.W_out_h[perm])
        other.W_out_x.copy_(rnn.W_out_x)
        other.D.copy_(rnn.D)
        x = torch.randn(2, 5, 4, dtype=F64)
        assert_close(other(x), rnn(x), rtol=0, atol=1e-12)


def test_lru_parallel_equals_sequential_and_blocks_run():
    torch.manual_seed(2)
    lru = LRU(4, 6).double()
    x = torch.randn(3, 10, 4, dtype=F64)
    with torch.no_grad():
        assert_close(lru(x), lru(x, sequential=True), rtol=0, atol=1e-10)
        # first position: h_0 = γ ⊙ (x_0 @ B), y_0 = Re(h_0 @ C) + D ⊙ x_0
        B = torch.complex(lru.B_re, lru.B_im) * torch.exp(lru.gamma_log)
        y0 = ((x[:, 0].to(B.dtype) @ B) @ torch.complex(lru.C_re, lru.C_im)).real + lru.D * x[:, 0]
        assert_close(lru(x)[:, 0], y0, rtol=0, atol=1e-12)
    for norm in ("post", "pre"):
        assert LRUBlock(4, 6, norm=norm)(x.float()).shape == (3, 10, 4)
    assert LRUNetwork(4, 8, 6, 2, 1)(x.float()).shape == (3, 10, 1)
    for kind in ("lstm", "gru"):
        assert RNNBaseline(kind, 4, 5, 1)(x.float()).shape == (3, 10, 1)


def test_bad_arguments_are_one_line_errors():
    with pytest.raises(ValueError, match="lambda_kind must be 'real' or 'complex'"):
        GatedLinearRNN(3, 4, lambda_kind="imag")
    with pytest.raises(ValueError, match=r"d_hidden must be a positive int \(got d_hidden=0\)"):
        GatedLinearRNN(3, 0)
    with pytest.raises(ValueError, match="need 0 <= r_min < r_max <= 1"):
        GatedLinearRNN(3, 4, r_min=0.9, r_max=0.5)
    with pytest.raises(ValueError, match=r"x must have shape \[batch, pos, d_model=3\]"):
        GatedLinearRNN(3, 4)(torch.randn(2, 5, 4))
    with pytest.raises(ValueError, match="norm must be 'post' or 'pre'"):
        LRUBlock(3, 4, norm="mid")
    with pytest.raises(ValueError, match="kind must be 'lstm' or 'gru'"):
        RNNBaseline("rnn", 3, 4, 1)
    W_Q, W_K, W_V, W_O = _weights(2, 5, 3)
    with pytest.raises(ValueError, match="W_Q, W_K, W_V must share a shape"):
        gated_rnn_from_linear_attention(W_Q, W_K[:1], W_V, W_O)
    with pytest.raises(ValueError, match=r"W_O must have shape \[n_heads, d_head, d_model\]"):
        causal_linear_attention(torch.randn(1, 2, 5, dtype=F64), W_Q, W_K, W_V, W_O.mT)
    assert math.isfinite(construction_counts(1, 1, 1)["rnn_parameters"])
