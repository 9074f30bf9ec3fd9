"""Tests for the ΔW instrument of dynascope.probes.delta (S10): spectra of W_QK(t) - W_QK(0)
and W_OV(t) - W_OV(0) from width-2 d_head factors, against the dense difference, closed forms
(zero update, rank-1 update), invariances, edge cases, and the DeltaSpectrum probe.

Tolerances. The oracle is ``torch.linalg.svdvals`` of the dense difference formed in float64.
Both it and the factored path are backward stable, so each singular value is off by
O(eps * scale) with eps = 2.2e-16; the dense difference also cancels two products, so its own
error is O(eps * ||W_Q|| ||W_K||). We take scale = the largest of ||A_t|| ||B_t||, ||A_0|| ||B_0||
and s_max(Δ), and allow 1e-10 * scale: loose for any size drawn here, tight against a wrong
formula (off by O(s_max)).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dynascope as ds
from dynascope.adapters import AttentionView
from dynascope.probes import (
    PROBES,
    DeltaSpectrum,
    ProbeContext,
    delta_factors,
    delta_ov_singular_values,
    delta_qk_singular_values,
    effective_rank,
    factor_singular_values,
    make_probe,
    normalized_spectrum,
    rank_at,
    snapshot_views,
    stable_rank,
)

F64 = torch.float64
FAST = settings(max_examples=60, deadline=None)
N_LAYERS, N_HEADS, D_MODEL, D_HEAD = 2, 3, 11, 5


def dense_delta_singular_values(A, B, A0, B0):
    """Oracle: svdvals of the explicit d_model x d_model difference in float64, padded to 2r."""
    A, B, A0, B0 = (t.double() for t in (A, B, A0, B0))
    s = torch.linalg.svdvals(A @ B.mT - A0 @ B0.mT)
    width = 2 * A.shape[-1]
    return torch.nn.functional.pad(s, (0, max(0, width - s.shape[-1])))[..., :width]


def norm2(X):
    return torch.linalg.matrix_norm(X.double(), ord=2).max().item() if X.numel() else 0.0


def scale_of(A, B, A0, B0, s):
    s_max = s.max().item() if s.numel() else 0.0
    return max(norm2(A) * norm2(B), norm2(A0) * norm2(B0), s_max, 1e-300)


def random_views(n_layers=N_LAYERS, n_heads=N_HEADS, d_model=D_MODEL, d_head=D_HEAD, seed=0):
    g = torch.Generator().manual_seed(seed)

    def w(*shape):
        return torch.randn(*shape, generator=g, dtype=F64)

    return [
        AttentionView(
            f"blocks.{i}.attn",
            W_Q=w(n_heads, d_model, d_head),
            W_K=w(n_heads, d_model, d_head),
            W_V=w(n_heads, d_model, d_head),
            W_O=w(n_heads, d_head, d_model),
        )
        for i in range(n_layers)
    ]


def moved(views, step_size=1.0, seed=1):
    """Views plus a random update of relative size ``step_size`` on every weight."""
    g = torch.Generator().manual_seed(seed)

    def step(W):
        return W + step_size * torch.randn(W.shape, generator=g, dtype=W.dtype)

    return [
        AttentionView(v.name, step(v.W_Q), step(v.W_K), step(v.W_V), step(v.W_O)) for v in views
    ]


def stacked(views, field):
    return torch.stack([getattr(v, field) for v in views])


# --- delta_factors and the singular values -------------------------------------------------


@pytest.mark.parametrize("d_model, d_head", [(D_MODEL, D_HEAD), (7, 5)])  # 2 d_head > d_model
def test_delta_singular_values_match_dense_difference(d_model, d_head):
    init = random_views(d_model=d_model, d_head=d_head)
    views = moved(init)
    Q, K, Q0, K0 = (stacked(v, f) for v in (views, init) for f in ("W_Q", "W_K"))
    V, O, V0, O0 = (stacked(v, f) for v in (views, init) for f in ("W_V", "W_O"))
    s_qk = delta_qk_singular_values(views, init)
    s_ov = delta_ov_singular_values(views, init)
    assert s_qk.shape == s_ov.shape == (N_LAYERS, N_HEADS, 2 * d_head)
    expected_qk = dense_delta_singular_values(Q, K, Q0, K0)
    expected_ov = dense_delta_singular_values(V, O.mT, V0, O0.mT)
    torch.testing.assert_close(
        s_qk, expected_qk, rtol=0, atol=1e-10 * scale_of(Q, K, Q0, K0, expected_qk)
    )
    torch.testing.assert_close(
        s_ov, expected_ov, rtol=0, atol=1e-10 * scale_of(V, O.mT, V0, O0.mT, expected_ov)
    )
    # rank(Δ) <= 2 d_head, and a generic update reaches it (where d_model allows).
    assert rank_at(s_qk, 1e-8).max().item() == min(2 * d_head, d_model)


def test_delta_factors_reproduce_the_difference_and_reject_bad_shapes():
    init, views = random_views(n_layers=1), moved(random_views(n_layers=1))
    A, B, A0, B0 = views[0].W_Q, views[0].W_K, init[0].W_Q, init[0].W_K
    C, D = delta_factors(A, B, A0, B0)
    assert C.shape == D.shape == (N_HEADS, D_MODEL, 2 * D_HEAD)
    torch.testing.assert_close(C @ D.mT, A @ B.mT - A0 @ B0.mT, rtol=0, atol=1e-12)
    assert delta_factors(A.float(), B.float(), A0.float(), B0.float())[0].dtype == torch.float32
    with pytest.raises(ValueError, match=r"A0, B0 must have the shapes of A, B"):
        delta_factors(A, B, A0[..., :-1], B0)
    with pytest.raises(ValueError, match=r"init must hold one view per layer \(got 1 init"):
        delta_qk_singular_values(random_views(), init)
    with pytest.raises(ValueError, match=r"init W_Q of layer 'blocks.0.attn' must match"):
        delta_qk_singular_values(random_views(d_head=4), random_views())


def test_zero_update_gives_exactly_zero():
    init = random_views()
    for dtype in (torch.float32, F64):
        views = [
            AttentionView(v.name, *(getattr(v, f).to(dtype) for f in ("W_Q", "W_K", "W_V", "W_O")))
            for v in init
        ]
        s = delta_qk_singular_values(views, snapshot_views(views))
        torch.testing.assert_close(s, torch.zeros_like(s), rtol=0, atol=0)
        torch.testing.assert_close(stable_rank(s), torch.zeros(N_LAYERS, N_HEADS, dtype=dtype))
        torch.testing.assert_close(effective_rank(s), torch.zeros(N_LAYERS, N_HEADS, dtype=dtype))
        torch.testing.assert_close(normalized_spectrum(s), torch.zeros_like(s), rtol=0, atol=0)


def test_rank_one_update_has_stable_rank_one():
    init = random_views()
    g = torch.Generator().manual_seed(3)
    u, v = torch.randn(D_MODEL, 1, generator=g, dtype=F64), torch.randn(1, D_HEAD, dtype=F64)
    views = [AttentionView(x.name, x.W_Q.clone(), x.W_K, x.W_V, x.W_O) for x in init]
    views[1].W_Q[2] += u @ v  # only layer 1, head 2 moves: Δ_QK = u v W_K^T, rank 1
    s = delta_qk_singular_values(views, init)
    expected_s1 = torch.linalg.svdvals(u @ v @ init[1].W_K[2].mT)[0]
    torch.testing.assert_close(s[1, 2, 0], expected_s1, rtol=1e-12, atol=0)
    # The other singular values are rounding: O(eps * s_1).
    zeros = torch.zeros(2 * D_HEAD - 1, dtype=F64)
    torch.testing.assert_close(s[1, 2, 1:], zeros, rtol=0, atol=1e-12 * expected_s1.item())
    srank = stable_rank(s)
    torch.testing.assert_close(srank[1, 2], torch.tensor(1.0, dtype=F64), rtol=1e-12, atol=0)
    assert rank_at(s, 1e-10)[1, 2].item() == 1
    srank[1, 2] = 0.0
    torch.testing.assert_close(srank, torch.zeros_like(srank), rtol=0, atol=0)  # nothing else moved


def test_small_update_keeps_relative_accuracy_in_float32():
    """The update is 1e-4 of the weights. Stacking [W_Q(t), -W_Q(0)] [W_K(t), W_K(0)]^T would
    cancel two O(1) cores in float32 (error ~1e-7 absolute, 1e-3 of Δ); the arrangement used here
    keeps every core term at the update's size, so the error stays ~1e-7 relative to Δ."""
    init = random_views()
    views = moved(init, step_size=1e-4)
    init32 = [
        AttentionView(v.name, *(getattr(v, f).float() for f in "W_Q W_K W_V W_O".split()))
        for v in init
    ]
    views32 = [
        AttentionView(v.name, *(getattr(v, f).float() for f in "W_Q W_K W_V W_O".split()))
        for v in views
    ]
    s = delta_qk_singular_values(views32, init32)
    Q, K, Q0, K0 = (stacked(v, f) for v in (views32, init32) for f in ("W_Q", "W_K"))
    expected = dense_delta_singular_values(Q, K, Q0, K0)  # float64, from the float32 weights
    s_max = expected.amax(dim=-1, keepdim=True)
    error = ((s.double() - expected).abs() / s_max).max().item()
    assert error < 1e-5, error
    naive = factor_singular_values(torch.cat([Q, -Q0], -1), torch.cat([K, K0], -1))
    assert ((naive.double() - expected).abs() / s_max).max().item() > 10 * error


@st.composite
def weight_pairs(draw):
    """(A, B, A0, B0) float64: random, zero update, rank-deficient update, huge scale."""
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    m, n, r = draw(st.integers(1, 7)), draw(st.integers(1, 7)), draw(st.integers(1, 4))
    kind = draw(st.sampled_from(["random", "zero", "zero_A", "rank_deficient", "small"]))
    scale = draw(st.sampled_from([1e-8, 1.0, 1e30]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))

    def w(*shape):
        return scale * torch.randn(*batch, *shape, generator=g, dtype=F64)

    A0, B0 = w(m, r), w(n, r)
    dA, dB = w(m, r), w(n, r)
    if kind == "zero":
        dA, dB = torch.zeros_like(dA), torch.zeros_like(dB)
    elif kind == "zero_A":
        A0 = torch.zeros_like(A0)
    elif kind == "rank_deficient":  # a rank-1 update of A only
        dA = dA[..., :1] @ torch.ones(*batch, 1, r, dtype=F64)
        dB = torch.zeros_like(dB)
    elif kind == "small":
        dA, dB = 1e-6 * dA, 1e-6 * dB
    return A0 + dA, B0 + dB, A0, B0, kind


@FAST
@given(weight_pairs())
def test_delta_singular_values_properties(case):
    A, B, A0, B0, kind = case
    s = factor_singular_values(*delta_factors(A, B, A0, B0))
    expected = dense_delta_singular_values(A, B, A0, B0)
    r = A.shape[-1]
    assert s.shape == (*A.shape[:-2], 2 * r)
    torch.testing.assert_close(s, expected, rtol=0, atol=1e-10 * scale_of(A, B, A0, B0, expected))
    if kind == "zero":
        torch.testing.assert_close(s, torch.zeros_like(s), rtol=0, atol=0)
        torch.testing.assert_close(stable_rank(s), torch.zeros(s.shape[:-1], dtype=F64))
    if kind == "rank_deficient":
        assert bool((stable_rank(s) <= 1 + 1e-9).all())
    # Orthogonal R on both factors, at t and at 0, leaves Δ and so its spectrum unchanged.
    R, _ = torch.linalg.qr(torch.randn(r, r, generator=torch.Generator().manual_seed(r), dtype=F64))
    rotated = factor_singular_values(*delta_factors(A @ R, B @ R, A0 @ R, B0 @ R))
    torch.testing.assert_close(rotated, s, rtol=0, atol=1e-10 * scale_of(A, B, A0, B0, expected))
    # Normalised spectrum in [0, 1], 1 at the top unless Δ = 0.
    t = normalized_spectrum(s)
    assert bool(((t >= 0) & (t <= 1)).all())
    nonzero = s[..., 0] > 0
    torch.testing.assert_close(t[..., 0][nonzero], torch.ones_like(t[..., 0][nonzero]))


# --- the probe -----------------------------------------------------------------------------------


def tiny_transformer(seed=0):
    torch.manual_seed(seed)
    return ds.nn.Transformer(n_layers=2, d_model=12, n_heads=3, d_vocab=11, d_out=11, n_ctx=7)


def metric_values(s, rel_tols=(1e-2, 1e-3), abs_tol=1e-3):
    """{metric: [n_layers, n_heads] float64} from singular values, by the definitions."""
    s = s.double()
    s_max = s.amax(-1)
    values = {f"rank_{t:.0e}".replace("e-0", "e-"): rank_at(s, t).double() for t in rel_tols}
    values["rank_abs"] = (s > abs_tol).sum(-1).double()
    values["effective_rank"] = effective_rank(s)
    values["stable_rank"] = torch.where(s_max > 0, s.square().sum(-1) / s_max.square(), 0.0)
    values["spectral_norm"] = s_max
    values["frobenius_norm"] = s.square().sum(-1).sqrt()
    return values


def expected_keys(views, init, per_head=True):
    out = {}
    for product, fn in (("dqk", delta_qk_singular_values), ("dov", delta_ov_singular_values)):
        s = fn(views, init)
        for metric, value in metric_values(s).items():
            out[f"{product}.mean.{metric}"] = value.mean().item()
            for layer in range(value.shape[0]):
                out[f"L{layer}.{product}.mean.{metric}"] = value[layer].mean().item()
                out[f"L{layer}.{product}.std.{metric}"] = value[layer].std(correction=0).item()
                for head in range(value.shape[1]) if per_head else ():
                    out[f"L{layer}.H{head}.{product}.{metric}"] = value[layer, head].item()
        out[f"{product}.singular_values"] = s.float()
        out[f"{product}.normalized_singular_values"] = normalized_spectrum(s).float()
    return out


def assert_keys_match(out, expected, atol=1e-6):
    assert set(out) == set(expected)
    for key in expected:
        if key.endswith("singular_values"):
            assert out[key].dtype == torch.float32 and out[key].device.type == "cpu"
            torch.testing.assert_close(out[key], expected[key], rtol=0, atol=atol, equal_nan=True)
    keys = sorted(k for k in expected if not k.endswith("singular_values"))
    assert all(isinstance(out[k], float) for k in keys)
    torch.testing.assert_close(
        torch.tensor([out[k] for k in keys], dtype=F64),
        torch.tensor([expected[k] for k in keys], dtype=F64),
        rtol=1e-6,
        atol=atol,
        equal_nan=True,
    )


def test_probe_on_hand_built_views_matches_definitions():
    init = random_views()
    views = moved(init)
    out = DeltaSpectrum(init=init).measure_views(views)
    assert_keys_match(out, expected_keys(views, init), atol=1e-9)
    assert out["dqk.singular_values"].shape == (N_LAYERS, N_HEADS, 2 * D_HEAD)
    assert out["L1.H2.dqk.rank_1e-3"] == 2 * D_HEAD


def test_probe_snapshots_at_first_call_and_tracks_updates():
    model = tiny_transformer()
    probe = make_probe("delta_spectrum")
    first = probe(model, ProbeContext(step=0))
    assert probe.init_step == 0
    zero = {k: v for k, v in first.items() if not k.endswith("singular_values")}
    assert set(zero.values()) == {0.0}  # Δ = 0: every rank, norm and std is exactly 0
    for key in ("dqk", "dov"):
        assert first[f"{key}.singular_values"].shape == (2, 3, 8)
        assert not first[f"{key}.singular_values"].any()
        assert not first[f"{key}.normalized_singular_values"].any()

    init = snapshot_views(ds.attention_views(model))
    with torch.no_grad():
        model.blocks[0].attn.W_Q[1] += 0.1 * torch.randn(12, 4)  # rank <= 4 update of one head
    later = probe(model, ProbeContext(step=10))
    assert probe.init_step == 0
    expected = expected_keys(ds.attention_views(model), init)
    assert_keys_match(later, expected)
    assert later["L0.H0.dqk.stable_rank"] == 0.0 and later["L0.H1.dqk.stable_rank"] > 1.0
    assert later["L0.H1.dov.stable_rank"] == 0.0  # W_V, W_O did not move
    # A probe built with the model holds the same reference; reset() takes a new one.
    built_before = DeltaSpectrum(init=tiny_transformer())
    assert_keys_match(built_before(model, ProbeContext(step=10)), expected)
    probe.reset()
    assert probe(model, ProbeContext(step=11))["dqk.mean.stable_rank"] == 0.0
    assert probe.init_step == 11


def test_probe_per_layer_std_and_options():
    init = random_views()
    out = DeltaSpectrum(init=init, rel_tols=(5e-3,), per_head=False).measure_views(moved(init))
    assert not any(".H" in k for k in out)
    assert "dov.mean.rank_5e-3" in out and "dqk.mean.rank_1e-2" not in out
    with pytest.raises(ValueError, match="rel_tols must be distinct"):
        DeltaSpectrum(rel_tols=(0.01, 1e-2))
    with pytest.raises(ValueError, match="abs_tol must be >= 0"):
        DeltaSpectrum(abs_tol=-1.0)
    with pytest.raises(ValueError, match=r"DeltaSpectrum has no reference W\(0\)"):
        DeltaSpectrum().measure_views(init)


def test_probe_reports_nan_for_non_finite_or_overflowing_weights():
    init = [
        AttentionView(v.name, *(getattr(v, f).float() for f in "W_Q W_K W_V W_O".split()))
        for v in random_views()
    ]
    finite = DeltaSpectrum(init=init).measure_views(moved(init))
    cases = [
        [AttentionView(v.name, v.W_Q * 0 + bad, v.W_K, v.W_V, v.W_O) for v in init]
        for bad in (math.nan, math.inf)
    ] + [[AttentionView(v.name, 1e30 * v.W_Q, 1e30 * v.W_K, v.W_V, v.W_O) for v in init]]
    for views in cases:  # the last: Δ_QK ~ 1e60 overflows float32
        out = DeltaSpectrum(init=init).measure_views(views)
        assert out.keys() == finite.keys()
        assert math.isnan(out["dqk.mean.stable_rank"]) and math.isnan(out["L1.H0.dqk.rank_abs"])
        assert math.isnan(out["L0.dqk.std.effective_rank"])
        assert out["dqk.singular_values"].isnan().all()
        assert not math.isnan(out["dov.mean.stable_rank"])  # W_V, W_O are finite
    huge = [
        AttentionView(v.name, *(1e30 * getattr(v, f).double() for f in "W_Q W_K W_V W_O".split()))
        for v in init
    ]
    out = DeltaSpectrum(init=huge).measure_views(moved(huge, step_size=1e30))
    assert math.isfinite(out["dqk.mean.stable_rank"])  # float64 holds 1e60


def test_probe_leaves_mode_rng_and_grads_untouched():
    model = tiny_transformer()
    model.train()
    model.blocks[1].eval()
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.25)
    modes = [m.training for m in model.modules()]
    grads = [p.grad.clone() for p in model.parameters()]
    rng = torch.get_rng_state()
    probe = DeltaSpectrum()
    probe(model, ProbeContext(step=0))
    probe(model, ProbeContext(step=1))
    assert [m.training for m in model.modules()] == modes
    torch.testing.assert_close(torch.get_rng_state(), rng, rtol=0, atol=0)
    for p, g in zip(model.parameters(), grads):
        torch.testing.assert_close(p.grad, g, rtol=0, atol=0)
    # The reference is a copy: training the model does not move it.
    with torch.no_grad():
        model.blocks[0].attn.W_K.add_(1.0)
    assert probe(model, ProbeContext(step=2))["L0.dqk.mean.stable_rank"] > 0


def test_probe_registry():
    assert PROBES["delta_spectrum"] is DeltaSpectrum
    assert make_probe("delta_spectrum").name == "delta_spectrum"
