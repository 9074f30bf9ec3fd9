"""MultiHeadAttention against a naive per-head loop, torch.nn.MultiheadAttention, and itself.

Sizes are small and pairwise distinct (batch 2, pos 7, n_heads 3, d_head 5, d_model 11), so a
transposed or swapped axis fails loudly instead of broadcasting.
"""

import math

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from dynascope.nn import MultiHeadAttention, capture, masked_softmax

BATCH, POS, N_HEADS, D_HEAD, D_MODEL = 2, 7, 3, 5, 11


def naive_attention(module, x, keep=None, pairs=None):
    """Python loop over sequences and heads, explicit softmax over visible keys per query row.

    ``keep`` [batch, key_pos] and ``pairs`` [batch, query_pos, key_pos]: True = visible.
    Returns (output [batch, pos, d_model], pattern [batch, n_heads, query_pos, key_pos]).
    """
    batch, pos, d_model = x.shape
    out = torch.zeros(batch, pos, d_model, dtype=x.dtype)
    pattern = torch.zeros(batch, module.n_heads, pos, pos, dtype=x.dtype)
    for b in range(batch):
        allowed = torch.ones(pos, pos, dtype=torch.bool)
        if module.is_causal:
            allowed = torch.tril(allowed)
        if keep is not None:
            allowed = allowed & keep[b][None, :]
        if pairs is not None:
            allowed = allowed & pairs[b]
        for h in range(module.n_heads):
            q = x[b] @ module.W_Q[h]
            k = x[b] @ module.W_K[h]
            v = x[b] @ module.W_V[h]
            if module.use_bias:
                q, k, v = q + module.b_Q[h], k + module.b_K[h], v + module.b_V[h]
            scores = module.scale * q @ k.T
            p = torch.zeros(pos, pos, dtype=x.dtype)
            for i in range(pos):
                if module.attention == "linear":
                    p[i] = torch.where(allowed[i], scores[i], 0.0)
                elif allowed[i].any():
                    e = torch.exp(scores[i] - scores[i][allowed[i]].max()) * allowed[i]
                    p[i] = e / e.sum()
            pattern[b, h] = p
            out[b] += p @ v @ module.W_O[h]
    if module.use_bias:
        out += module.b_O
    return out, pattern


def make(dtype=torch.float64, seed=0, **kwargs):
    torch.manual_seed(seed)
    m = MultiHeadAttention(D_MODEL, N_HEADS, D_HEAD, **kwargs).to(dtype)
    with torch.no_grad():
        for b in (m.b_Q, m.b_K, m.b_V, m.b_O):
            if b is not None:  # biases start at zero; make them matter
                b.normal_()
    return m


def padding_mask():
    keep = torch.ones(BATCH, POS, dtype=torch.bool)
    keep[0, 5:] = False  # trailing padding
    keep[1, 2] = False  # a hole in the middle
    return keep


@pytest.mark.parametrize("attention", ["softmax", "linear"])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("use_bias", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_matches_naive_loop(attention, is_causal, use_bias, padded):
    m = make(attention=attention, is_causal=is_causal, use_bias=use_bias)
    x = torch.randn(BATCH, POS, D_MODEL, dtype=torch.float64)
    keep = padding_mask() if padded else None
    with torch.no_grad():
        want_out, want_pattern = naive_attention(m, x, keep)
        got_fast = m(x, key_padding_mask=keep)  # fused SDPA for softmax, no listener
        with capture(m) as cache:
            got_slow = m(x, key_padding_mask=keep)  # explicit path
    # float64 default tolerances: the paths differ from the oracle only by summation order.
    assert_close(got_fast, want_out)
    assert_close(got_slow, want_out)
    assert_close(cache["hook_pattern"], want_pattern)
    assert cache["hook_attn_scores"].shape == (BATCH, N_HEADS, POS, POS)


def pair_mask():
    """A random [batch, query_pos, key_pos] mask with a query that sees no key at all."""
    pairs = torch.rand(BATCH, POS, POS, generator=torch.Generator().manual_seed(5)) < 0.5
    pairs[0, 3] = False
    return pairs


@pytest.mark.parametrize("attention", ["softmax", "linear"])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_attn_mask_matches_naive_loop(attention, is_causal, padded):
    m = make(attention=attention, is_causal=is_causal, use_bias=True)
    x = torch.randn(BATCH, POS, D_MODEL, dtype=torch.float64)
    keep = padding_mask() if padded else None
    pairs = pair_mask()
    with torch.no_grad():
        want_out, want_pattern = naive_attention(m, x, keep, pairs)
        with capture(m, ["hook_pattern"]) as cache:
            got = m(x, key_padding_mask=keep, attn_mask=pairs)
        got_unlistened = m(x, key_padding_mask=keep, attn_mask=pairs)
    # float64 default tolerances: only the summation order differs from the loop.
    assert_close(got, want_out)
    assert_close(cache["hook_pattern"], want_pattern)
    assert torch.equal(got_unlistened, got)  # an attn_mask always takes the explicit path
    assert_close(got[0, 3], m.b_O.detach())  # query 3 of sequence 0 sees nothing


def test_attn_mask_with_last_query_is_the_last_row():
    m = make(is_causal=True, use_bias=True)
    x = torch.randn(BATCH, POS, D_MODEL, dtype=torch.float64)
    pairs = pair_mask()
    with torch.no_grad():
        full = m(x, attn_mask=pairs)
        last = m(x, attn_mask=pairs, last_query=True)
    assert_close(last, full[:, -1:])


def naive_masked_softmax(scores, mask):
    """Row by row: exp of the visible scores over their sum; hidden keys and empty rows 0."""
    out = torch.zeros_like(scores)
    rows = scores.reshape(-1, scores.shape[-1])
    keep = mask.expand(scores.shape).reshape(-1, scores.shape[-1])
    for r in range(rows.shape[0]):
        if keep[r].any():
            e = torch.exp(rows[r] - rows[r][keep[r]].max()) * keep[r]
            out.view(-1, scores.shape[-1])[r] = e / e.sum()
    return out


def test_masked_softmax_matches_a_naive_loop():
    g = torch.Generator().manual_seed(0)
    scores = 3 * torch.randn(BATCH, N_HEADS, POS, POS, dtype=torch.float64, generator=g)
    mask = pair_mask()[:, None]
    got = masked_softmax(scores, mask)
    assert_close(got, naive_masked_softmax(scores, mask))  # float64: summation order only
    assert_close(got[0, :, 3], torch.zeros(N_HEADS, POS, dtype=torch.float64))
    assert_close(masked_softmax(scores), scores.softmax(dim=-1))
    causal = torch.ones(POS, POS, dtype=torch.bool).tril()[None, None]
    assert_close(
        masked_softmax(scores, causal, every_row_visible=True),
        naive_masked_softmax(scores, causal),
    )


def _old_general(scores, mask):  # the copy in MultiHeadAttention, its hypernetwork path and
    visible = mask.any(dim=-1, keepdim=True)  # MaskedTransformer's masked_attention
    filled = scores.masked_fill(~mask, float("-inf")).masked_fill(~visible, 0.0)
    return filled.softmax(dim=-1).masked_fill(~visible, 0.0)


def _old_causal(scores, mask):  # MultiHeadAttention's causal-only path
    hidden = torch.zeros(mask.shape[-2:], dtype=scores.dtype, device=scores.device)
    return (scores + hidden.masked_fill(~mask[0, 0], float("-inf"))).softmax(-1)


def _bitwise_equal(a, b):
    return torch.equal(a, b) and torch.equal(torch.signbit(a), torch.signbit(b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_masked_softmax_is_bitwise_the_formulas_it_replaced(dtype):
    """Outputs and the gradients of q, k, v through ``pattern @ v``, to the bit (and sign of 0).

    Also the causal path of the hypernetwork attentions, which used the general formula and now
    takes the additive one: the same bits forward and backward.
    """
    g = torch.Generator().manual_seed(1)
    causal = torch.ones(POS, POS, dtype=torch.bool).tril()[None, None]
    cases = [
        (pair_mask()[:, None], _old_general, {}),
        (causal, _old_causal, {"every_row_visible": True}),
        (causal, _old_general, {"every_row_visible": True}),
    ]
    for mask, old, kwargs in cases:
        q, k, v = (
            torch.randn(BATCH, N_HEADS, POS, D_HEAD, dtype=dtype, generator=g).requires_grad_()
            for _ in range(3)
        )
        upstream = torch.randn(BATCH, N_HEADS, POS, D_HEAD, dtype=dtype, generator=g)
        results = []
        for softmax in (lambda s: old(s, mask), lambda s: masked_softmax(s, mask, **kwargs)):
            z = softmax(0.4 * q @ k.mT) @ v
            results.append((z.detach(), *torch.autograd.grad(z, (q, k, v), upstream)))
        for got, want in zip(*results):
            assert _bitwise_equal(got, want)


def test_custom_scale_matches_naive_loop():
    m = make(scale=0.3, is_causal=True)
    assert m.scale == 0.3
    x = torch.randn(BATCH, POS, D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        assert_close(m(x), naive_attention(m, x)[0])


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_fused_and_explicit_paths_agree_in_float32(is_causal, padded):
    m = make(dtype=torch.float32, is_causal=is_causal, use_bias=True)
    x = torch.randn(BATCH, POS, D_MODEL)
    keep = padding_mask() if padded else None
    with torch.no_grad():
        fused = m(x, key_padding_mask=keep)
        with capture(m, ["hook_pattern"]):
            explicit = m(x, key_padding_mask=keep)
    # Same math, different kernels: SDPA accumulates in another order (and may use an online
    # softmax), so outputs of size O(1) differ by a few float32 ulps (eps = 1.2e-7).
    assert_close(fused, explicit, atol=1e-6, rtol=1e-5)


def test_listening_to_scores_only_takes_explicit_path():
    m = make(dtype=torch.float32)
    x = torch.randn(BATCH, POS, D_MODEL)
    with capture(m, ["hook_attn_scores"]) as cache:
        m(x)
    with torch.no_grad():
        q = torch.einsum("bpm,hmd->bhpd", x, m.W_Q)
        k = torch.einsum("bpm,hmd->bhpd", x, m.W_K)
        want = m.scale * q @ k.mT  # before masking: raw scaled scores
    assert_close(cache["hook_attn_scores"], want)


def test_query_seeing_no_key_gets_zero_pattern_and_finite_gradients():
    m = make(is_causal=True, use_bias=True)
    x = torch.randn(BATCH, POS, D_MODEL, dtype=torch.float64, requires_grad=True)
    keep = torch.ones(BATCH, POS, dtype=torch.bool)
    keep[0, 0] = False  # causal: query 0 of sequence 0 sees only key 0, which is padding
    with capture(m) as cache:
        out = m(x, key_padding_mask=keep)
    assert_close(cache["hook_pattern"][0, :, 0], torch.zeros(N_HEADS, POS, dtype=torch.float64))
    assert_close(out[0, 0], m.b_O.detach())
    with torch.no_grad():
        assert_close(out.detach(), naive_attention(m, x.detach(), keep)[0])
    out.sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())
    with torch.no_grad():
        assert_close(m(x, key_padding_mask=keep), out.detach())  # fused path agrees


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_matches_torch_multihead_attention(is_causal, padded):
    d_model = N_HEADS * D_HEAD  # torch's module requires d_model = n_heads * d_head
    torch.manual_seed(1)
    ref = nn.MultiheadAttention(d_model, N_HEADS, bias=True, batch_first=True).double()
    with torch.no_grad():
        ref.in_proj_bias.normal_()
        ref.out_proj.bias.normal_()
    ours = MultiHeadAttention(d_model, N_HEADS, is_causal=is_causal, use_bias=True).double()
    # nn.Linear stores [out, in]; row block h*d_head:(h+1)*d_head of each projection is head h.
    W_q, W_k, W_v = ref.in_proj_weight.detach().chunk(3)
    b_q, b_k, b_v = ref.in_proj_bias.detach().chunk(3)
    with torch.no_grad():
        for W_ours, W_ref in ((ours.W_Q, W_q), (ours.W_K, W_k), (ours.W_V, W_v)):
            W_ours.copy_(W_ref.view(N_HEADS, D_HEAD, d_model).transpose(1, 2))
        for b_ours, b_ref in ((ours.b_Q, b_q), (ours.b_K, b_k), (ours.b_V, b_v)):
            b_ours.copy_(b_ref.view(N_HEADS, D_HEAD))
        ours.W_O.copy_(ref.out_proj.weight.T.reshape(N_HEADS, D_HEAD, d_model))
        ours.b_O.copy_(ref.out_proj.bias)

    x = torch.randn(BATCH, POS, d_model, dtype=torch.float64)
    keep = padding_mask() if padded else None
    causal_mask = torch.ones(POS, POS, dtype=torch.bool).triu(1) if is_causal else None
    with torch.no_grad():
        want_out, want_pattern = ref(
            x,
            x,
            x,
            key_padding_mask=None if keep is None else ~keep,  # torch: True = ignore
            attn_mask=causal_mask,  # torch: True = not allowed
            need_weights=True,
            average_attn_weights=False,
        )
        with capture(ours, ["hook_pattern"]) as cache:
            got_out = ours(x, key_padding_mask=keep)
        got_fused = ours(x, key_padding_mask=keep)
    assert_close(got_out, want_out)
    assert_close(got_fused, want_out)
    assert_close(cache["hook_pattern"], want_pattern)


def test_parameter_shapes_and_default_d_head():
    m = MultiHeadAttention(D_MODEL, N_HEADS, D_HEAD, use_bias=True)
    assert m.W_Q.shape == m.W_K.shape == m.W_V.shape == (N_HEADS, D_MODEL, D_HEAD)
    assert m.W_O.shape == (N_HEADS, D_HEAD, D_MODEL)
    assert m.b_Q.shape == m.b_K.shape == m.b_V.shape == (N_HEADS, D_HEAD)
    assert m.b_O.shape == (D_MODEL,)
    assert m.scale == 1 / math.sqrt(D_HEAD)

    plain = MultiHeadAttention(12, 4)
    assert plain.d_head == 3
    assert (plain.b_Q, plain.b_K, plain.b_V, plain.b_O) == (None, None, None, None)
    assert sorted(n for n, _ in plain.named_parameters()) == ["W_K", "W_O", "W_Q", "W_V"]


def test_init_scales():
    torch.manual_seed(0)
    m = MultiHeadAttention(256, 4, 64, use_bias=True)
    # 65536 draws per matrix: the sample std is within ~0.3% of the true one; 5% is safe.
    for W in (m.W_Q, m.W_K, m.W_V):
        assert abs(W.std().item() * math.sqrt(256) - 1) < 0.05
    assert abs(m.W_O.std().item() * math.sqrt(4 * 64) - 1) < 0.05
    for b in (m.b_Q, m.b_K, m.b_V, m.b_O):
        assert_close(b.detach(), torch.zeros_like(b))


def test_symmetries_leave_output_unchanged():
    """Permuting heads, or rotating each head's q/k (and v/o) spaces, preserves the function."""
    m = make(is_causal=True)
    x = torch.randn(BATCH, POS, D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        want = m(x)
        perm = torch.tensor([2, 0, 1])
        R = torch.linalg.qr(torch.randn(N_HEADS, D_HEAD, D_HEAD, dtype=torch.float64))[0]
        m.W_Q.copy_((m.W_Q @ R)[perm])
        m.W_K.copy_((m.W_K @ R)[perm])
        m.W_V.copy_((m.W_V @ R)[perm])
        m.W_O.copy_((R.mT @ m.W_O)[perm])
        assert_close(m(x), want)


def test_errors():
    with pytest.raises(
        ValueError, match=r"n_heads must divide d_model \(got d_model=64, n_heads=5\)"
    ):
        MultiHeadAttention(64, 5)
    MultiHeadAttention(64, 5, 7)  # explicit d_head needs no divisibility
    with pytest.raises(ValueError, match="attention must be one of"):
        MultiHeadAttention(D_MODEL, N_HEADS, D_HEAD, attention="cosine")
    with pytest.raises(ValueError, match="n_heads must be positive"):
        MultiHeadAttention(D_MODEL, 0)
    with pytest.raises(ValueError, match="d_head must be positive"):
        MultiHeadAttention(D_MODEL, N_HEADS, 0)
    m = MultiHeadAttention(D_MODEL, N_HEADS, D_HEAD)
    with pytest.raises(ValueError, match=r"x must have shape \[batch, pos, d_model=11\]"):
        m(torch.randn(BATCH, POS, D_MODEL + 1))
    with pytest.raises(ValueError, match="key_padding_mask must be a bool tensor"):
        m(torch.randn(BATCH, POS, D_MODEL), key_padding_mask=torch.ones(BATCH, POS))
    with pytest.raises(ValueError, match="key_padding_mask must be a bool tensor"):
        m(torch.randn(BATCH, POS, D_MODEL), torch.ones(BATCH, POS + 1, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"attn_mask must be a bool tensor of shape \[batch, "):
        m(torch.randn(BATCH, POS, D_MODEL), attn_mask=torch.ones(BATCH, POS, POS))
    with pytest.raises(ValueError, match=r"attn_mask must be a bool tensor of shape \[batch, "):
        m(torch.randn(BATCH, POS, D_MODEL), attn_mask=torch.ones(1, POS, POS, dtype=torch.bool))
