"""Tests for dynascope.probes.spectral: factored spectra against the dense product, closed forms,
the L2-nuclear identities of Kobayashi et al. (2024), and the QK/OV probes on hand-built views.

Tolerances. The factored path (QR + SVD of the core) and the dense oracle (SVD of A @ B^T) are
both backward stable: each singular value is off by O(eps * ||A||_2 * ||B||_2) with eps = 2.2e-16
in float64 and small size-dependent constants. We compare with an absolute tolerance of 1e-10
times that scale: loose enough for any sizes drawn here, tight enough to catch a wrong formula
(which is off by O(scale)). A relative tolerance would be wrong for tiny/zero singular values.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import dynascope.adapters as adapters
from dynascope.adapters import AttentionView
from dynascope.probes import (
    PROBES,
    OVSpectrum,
    ProbeContext,
    QKSpectrum,
    balancedness,
    effective_rank,
    factor_singular_values,
    l2_nuclear_gap,
    l2_term,
    make_probe,
    nuclear_norm,
    ov_singular_values,
    qk_singular_values,
    rank_above,
    rank_at,
    stable_rank,
)

F64 = torch.float64
FAST = settings(max_examples=60, deadline=None)


def dense_singular_values(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """Oracle: svdvals of the dense product, zero-padded to r."""
    s = torch.linalg.svdvals(A @ B.mT)
    r = A.shape[-1]
    return torch.nn.functional.pad(s, (0, max(0, r - s.shape[-1])))[..., :r]


def scale_of(A: torch.Tensor, B: torch.Tensor) -> float:
    norm_A = torch.linalg.matrix_norm(A, ord=2).max().item() if A.numel() else 0.0
    norm_B = torch.linalg.matrix_norm(B, ord=2).max().item() if B.numel() else 0.0
    return max(norm_A * norm_B, 1e-300)


@st.composite
def factor_pairs(draw):
    """(A [..., m, r], B [..., n, r]) in float64: random, zero, rank-deficient, r >= m."""
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    m, n, r = draw(st.integers(1, 7)), draw(st.integers(1, 7)), draw(st.integers(1, 7))
    kind = draw(st.sampled_from(["random", "zero_A", "zero_both", "rank_deficient"]))
    scale = draw(st.sampled_from([1e-8, 1.0, 1e8]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    A = scale * torch.randn(*batch, m, r, generator=g, dtype=F64)
    B = torch.randn(*batch, n, r, generator=g, dtype=F64)
    if kind in ("zero_A", "zero_both"):
        A = torch.zeros_like(A)
    if kind == "zero_both":
        B = torch.zeros_like(B)
    if kind == "rank_deficient":
        k = draw(st.integers(1, r))
        A = A[..., :k] @ torch.randn(*batch, k, r, generator=g, dtype=F64) if k < r else A
        A[..., -1, :] = A[..., 0, :]  # a repeated row as well
    return A, B


# --- factor_singular_values -------------------------------------------------------------------


@FAST
@given(factor_pairs())
def test_factor_singular_values_match_dense_svd(AB):
    A, B = AB
    s = factor_singular_values(A, B)
    expected = dense_singular_values(A, B)
    assert s.shape == (*A.shape[:-2], A.shape[-1])
    torch.testing.assert_close(s, expected, rtol=0, atol=1e-10 * scale_of(A, B))
    torch.testing.assert_close(s, s.sort(dim=-1, descending=True).values, rtol=0, atol=0)


def test_factor_singular_values_pads_when_d_head_exceeds_d_model():
    g = torch.Generator().manual_seed(0)
    A = torch.randn(3, 6, generator=g, dtype=F64)  # m=3 < r=6
    B = torch.randn(4, 6, generator=g, dtype=F64)
    s = factor_singular_values(A, B)
    assert s.shape == (6,)
    torch.testing.assert_close(s[3:], torch.zeros(3, dtype=F64), rtol=0, atol=0)
    torch.testing.assert_close(s, dense_singular_values(A, B), rtol=0, atol=1e-12)


def test_factor_singular_values_dtypes():
    A, B = torch.randn(2, 5, 3), torch.randn(2, 4, 3)
    assert factor_singular_values(A, B).dtype == torch.float32
    assert factor_singular_values(A.bfloat16(), B.bfloat16()).dtype == torch.float32
    assert factor_singular_values(A.double(), B).dtype == F64


def test_factor_singular_values_rejects_bad_shapes():
    with pytest.raises(ValueError, match="must share their last dim r"):
        factor_singular_values(torch.ones(4, 3), torch.ones(4, 2))
    with pytest.raises(ValueError, match=r"must be \[\.\.\., m, r\]"):
        factor_singular_values(torch.ones(3), torch.ones(4, 3))


# --- views --------------------------------------------------------------------------------------


def random_views(n_layers=2, n_heads=3, d_model=7, d_head=5, seed=0):
    g = torch.Generator().manual_seed(seed)

    def w(*shape):
        return torch.randn(*shape, generator=g, dtype=F64)

    return [
        AttentionView(
            name=f"blocks.{i}.attn",
            W_Q=w(n_heads, d_model, d_head),
            W_K=w(n_heads, d_model, d_head),
            W_V=w(n_heads, d_model, d_head),
            W_O=w(n_heads, d_head, d_model),
        )
        for i in range(n_layers)
    ]


@pytest.mark.parametrize("d_model, d_head", [(7, 5), (3, 5)])
def test_qk_ov_singular_values_match_dense_per_head(d_model, d_head):
    views = random_views(d_model=d_model, d_head=d_head)
    qk = torch.stack([dense_singular_values(v.W_Q, v.W_K) for v in views])
    ov = torch.stack([dense_singular_values(v.W_V, v.W_O.mT) for v in views])
    torch.testing.assert_close(qk_singular_values(views), qk, rtol=0, atol=1e-10)
    torch.testing.assert_close(ov_singular_values(views), ov, rtol=0, atol=1e-10)
    assert qk.shape == (2, 3, d_head)


def test_singular_values_reject_mixed_and_empty_layers():
    views = random_views(n_layers=1) + random_views(n_layers=1, n_heads=2)
    with pytest.raises(ValueError, match="shapes differ across layers"):
        qk_singular_values(views)
    with pytest.raises(ValueError, match="views must hold at least one AttentionView"):
        ov_singular_values([])


# --- ranks ----------------------------------------------------------------------------------


def test_rank_at_and_rank_above():
    s = torch.tensor([[3.0, 1e-2, 1e-4, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    ranks = rank_at(s, rel_tol=1e-3)
    assert ranks.dtype == torch.long
    torch.testing.assert_close(ranks, torch.tensor([2, 0, 4]))
    torch.testing.assert_close(rank_at(s, rel_tol=1e-5), torch.tensor([3, 0, 4]))
    torch.testing.assert_close(rank_above(s, abs_tol=1e-3), torch.tensor([2, 0, 4]))
    with pytest.raises(ValueError, match="rel_tol must be >= 0"):
        rank_at(s, rel_tol=-1.0)
    with pytest.raises(ValueError, match="abs_tol must be >= 0"):
        rank_above(s, abs_tol=float("nan"))


@pytest.mark.parametrize("n", [1, 2, 5])
def test_effective_and_stable_rank_closed_forms(n):
    ones = torch.ones(n, dtype=F64)
    one_hot = torch.zeros(n + 2, dtype=F64)
    one_hot[1] = 4.0
    torch.testing.assert_close(effective_rank(ones), torch.tensor(float(n), dtype=F64))
    torch.testing.assert_close(effective_rank(one_hot), torch.tensor(1.0, dtype=F64))
    torch.testing.assert_close(stable_rank(ones), torch.tensor(float(n), dtype=F64))  # s(I_n)
    torch.testing.assert_close(stable_rank(one_hot), torch.tensor(1.0, dtype=F64))
    torch.testing.assert_close(nuclear_norm(ones), torch.tensor(float(n), dtype=F64))


def test_ranks_of_all_zero_rows_are_zero():
    s = torch.zeros(2, 3, 4)
    torch.testing.assert_close(effective_rank(s), torch.zeros(2, 3))
    torch.testing.assert_close(stable_rank(s), torch.zeros(2, 3))


def test_ranks_at_1e30_in_float32_do_not_overflow():
    s = torch.tensor([[1e30, 1e30, 1e30], [3e38, 0.0, 0.0]], dtype=torch.float32)
    torch.testing.assert_close(effective_rank(s), torch.tensor([3.0, 1.0]))
    torch.testing.assert_close(stable_rank(s), torch.tensor([3.0, 1.0]))


@FAST
@given(
    # Zero or >= 1e-6, so that c * s neither underflows nor overflows in float64.
    st.lists(st.one_of(st.just(0.0), st.floats(1e-6, 1e3)), min_size=1, max_size=8),
    st.sampled_from([1e-30, 1e-3, 7.0, 1e30]),
)
def test_effective_rank_is_scale_invariant_and_bounded(values, c):
    s = torch.tensor(values, dtype=F64)
    erank = effective_rank(s)
    torch.testing.assert_close(effective_rank(c * s), erank, rtol=1e-12, atol=0)
    n_nonzero = int((s > 0).sum())
    if n_nonzero:
        assert 1.0 - 1e-12 <= erank.item() <= n_nonzero + 1e-12
    else:
        assert erank.item() == 0.0


def test_effective_rank_matches_entropy_formula():
    s = torch.tensor([[4.0, 2.0, 1.0, 1.0, 0.0]], dtype=F64)
    p = [4 / 8, 2 / 8, 1 / 8, 1 / 8]
    expected = math.exp(-sum(q * math.log(q) for q in p))
    torch.testing.assert_close(effective_rank(s), torch.tensor([expected], dtype=F64))


@pytest.mark.parametrize("bad", [float("nan"), -1e-6, float("inf")])
def test_effective_rank_rejects_nan_negative_inf(bad):
    s = torch.tensor([[1.0, 0.5], [bad, 0.1]])
    with pytest.raises(ValueError, match="s must be finite and non-negative"):
        effective_rank(s)


# --- L2 term, gap, balancedness --------------------------------------------------------------


@FAST
@given(factor_pairs())
def test_gap_is_l2_term_minus_dense_nuclear_norm_and_non_negative(AB):
    A, B = AB
    gap = l2_nuclear_gap(A, B)
    l2 = 0.5 * (A.square().sum((-2, -1)) + B.square().sum((-2, -1)))
    dense_nuclear = torch.linalg.svdvals(A @ B.mT).sum(-1)
    atol = 1e-10 * max(scale_of(A, B), l2.abs().max().item() if l2.numel() else 0.0)
    torch.testing.assert_close(l2_term(A, B), l2, rtol=1e-14, atol=0)
    torch.testing.assert_close(gap, l2 - dense_nuclear, rtol=0, atol=atol)
    assert bool((gap >= -atol).all())


def balanced_factors(d_model=7, d_head=5, rank=3, seed=0):
    """A = U sqrt(S), B = V sqrt(S) from the SVD of a random rank-`rank` product."""
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(2, d_model, rank, generator=g, dtype=F64) @ torch.randn(
        2, rank, d_model, generator=g, dtype=F64
    )
    U, S, Vh = torch.linalg.svd(W)
    root = S[..., :d_head].sqrt()
    return U[..., :d_head] * root[..., None, :], Vh.mT[..., :d_head] * root[..., None, :], W


def test_gap_and_balancedness_vanish_for_balanced_factors():
    A, B, W = balanced_factors()
    torch.testing.assert_close(A @ B.mT, W, rtol=0, atol=1e-12)
    torch.testing.assert_close(l2_nuclear_gap(A, B), torch.zeros(2, dtype=F64), rtol=0, atol=1e-12)
    torch.testing.assert_close(balancedness(A, B), torch.zeros(2, dtype=F64), rtol=0, atol=1e-12)
    # Unbalance by a scalar c: A -> cA, B -> B/c keeps the product but opens a gap.
    assert bool((l2_nuclear_gap(3 * A, B / 3) > 1e-3).all())


def test_balancedness_matches_definition():
    g = torch.Generator().manual_seed(1)
    A, B = torch.randn(7, 5, generator=g, dtype=F64), torch.randn(4, 5, generator=g, dtype=F64)
    expected = torch.linalg.matrix_norm(A.T @ A - B.T @ B)
    torch.testing.assert_close(balancedness(A, B), expected, rtol=1e-14, atol=0)


@FAST
@given(factor_pairs())
def test_orthogonal_reparametrization_leaves_spectrum_gap_and_balancedness(AB):
    A, B = AB
    r = A.shape[-1]
    g = torch.Generator().manual_seed(r)
    R, _ = torch.linalg.qr(torch.randn(r, r, generator=g, dtype=F64))
    atol = 1e-10 * scale_of(A, B)
    torch.testing.assert_close(
        factor_singular_values(A @ R, B @ R), factor_singular_values(A, B), rtol=0, atol=atol
    )
    # The gap is a difference of O(l2 term) quantities: its rounding scales with the L2 term.
    gap_atol = 1e-10 * (scale_of(A, B) + l2_term(A, B).max().item())
    torch.testing.assert_close(
        l2_nuclear_gap(A @ R, B @ R), l2_nuclear_gap(A, B), rtol=0, atol=gap_atol
    )
    big = max(A.abs().max().item(), B.abs().max().item(), 1e-300) ** 2
    torch.testing.assert_close(
        balancedness(A @ R, B @ R), balancedness(A, B), rtol=0, atol=1e-10 * big * r
    )


# --- probes -------------------------------------------------------------------------------------

D_MODEL, D_HEAD = 7, 5
HEAD_DIAGONALS = [  # [layer][head]: diagonal of W_Q (W_K = I); W_QK = diag(d), s = sorted d.
    [[1.0, 0, 0, 0, 0], [2.0, 1.0, 5e-3, 0, 0], [1.0, 1.0, 1.0, 1.0, 1.0]],
    [[0.0, 0, 0, 0, 0], [6.0, 3.0, 15e-3, 0, 0], [3.0, 3.0, 3.0, 3.0, 3.0]],
]


def diag_views(zero_key_head=(1, 0)):
    """W_Q[h] = diag(d) [d_model, d_head]; W_K[h] = identity-like, zero for one head."""
    views = []
    for layer, diagonals in enumerate(HEAD_DIAGONALS):
        W_Q = torch.stack([torch.diag(torch.tensor(d, dtype=F64)) for d in diagonals])
        W_Q = torch.nn.functional.pad(W_Q, (0, 0, 0, D_MODEL - D_HEAD))  # [n_heads, 7, 5]
        W_K = torch.eye(D_MODEL, D_HEAD, dtype=F64).repeat(len(diagonals), 1, 1)
        if layer == zero_key_head[0]:
            W_K[zero_key_head[1]] = 0.0
        views.append(AttentionView(f"L{layer}", W_Q, W_K, W_V=W_Q, W_O=W_K.mT))
    return views


def expected_head_metrics(d, key_is_zero):
    """Closed forms for W_QK = diag(d) with W_Q = diag(d), W_K = I (or W_K = 0)."""
    s = sorted((0.0 if key_is_zero else x for x in d), reverse=True)
    k_norm_sq = 0.0 if key_is_zero else float(D_HEAD)
    total, top = sum(s), s[0]
    p = [x / total for x in s if x > 0] if total else []
    l2 = 0.5 * (sum(x * x for x in d) + k_norm_sq)
    gap = l2 - total
    return {
        "rank_1e-2": sum(x > 1e-2 * top for x in s),
        "rank_1e-3": sum(x > 1e-3 * top for x in s),
        "rank_abs": sum(x > 1e-3 for x in s),
        "effective_rank": math.exp(-sum(q * math.log(q) for q in p)) if total else 0.0,
        "stable_rank": sum(x * x for x in s) / top**2 if top else 0.0,
        "nuclear_norm": total,
        "gap": gap,
        "gap_rel": gap / l2 if l2 else 0.0,
        "balancedness": math.sqrt(sum((x * x - (k_norm_sq > 0)) ** 2 for x in d)),
    }, s


@pytest.mark.parametrize("probe_cls, product", [(QKSpectrum, "qk"), (OVSpectrum, "ov")])
def test_spectrum_probe_on_hand_built_views(probe_cls, product):
    out = probe_cls().measure_views(diag_views())
    expected, spectra = {}, []
    for layer, diagonals in enumerate(HEAD_DIAGONALS):
        spectra.append([])
        for head, d in enumerate(diagonals):
            metrics, s = expected_head_metrics(d, key_is_zero=(layer, head) == (1, 0))
            spectra[-1].append(s)
            for name, value in metrics.items():
                expected[f"L{layer}.H{head}.{product}.{name}"] = float(value)
    for name in metrics:
        per_head = [v for k, v in expected.items() if k.endswith(f".{product}.{name}")]
        expected[f"{product}.mean.{name}"] = sum(per_head) / len(per_head)

    singular_values = out.pop(f"{product}.singular_values")
    assert set(out) == set(expected)
    assert all(isinstance(v, float) for v in out.values())
    keys = sorted(expected)
    torch.testing.assert_close(
        torch.tensor([out[k] for k in keys], dtype=F64),
        torch.tensor([expected[k] for k in keys], dtype=F64),
        rtol=1e-12,
        atol=1e-12,
    )
    assert singular_values.dtype == torch.float32 and singular_values.device.type == "cpu"
    torch.testing.assert_close(singular_values, torch.tensor(spectra, dtype=torch.float32))


def test_spectrum_probe_options():
    out = QKSpectrum(rel_tols=(5e-3,), abs_tol=2.0, per_head=False).measure_views(diag_views())
    assert set(out) == {
        f"qk.{k}"
        for k in [
            "mean.rank_5e-3",
            "mean.rank_abs",
            "mean.effective_rank",
            "mean.stable_rank",
            "mean.nuclear_norm",
            "mean.gap",
            "mean.gap_rel",
            "mean.balancedness",
            "singular_values",
        ]
    }
    # rank_abs > 2.0 per head: [0, 0, 0], [0, 2, 5] -> mean 7/6.
    torch.testing.assert_close(out["qk.mean.rank_abs"], 7 / 6)
    with pytest.raises(ValueError, match="rel_tols must be distinct"):
        QKSpectrum(rel_tols=(0.01, 1e-2))
    with pytest.raises(ValueError, match="abs_tol must be >= 0"):
        OVSpectrum(abs_tol=-1.0)


def test_probe_registry():
    assert PROBES["qk_spectrum"] is QKSpectrum and PROBES["ov_spectrum"] is OVSpectrum
    probe = make_probe("ov_spectrum", per_head=False)
    assert isinstance(probe, OVSpectrum) and probe.name == "ov_spectrum"
    with pytest.raises(ValueError, match=r"unknown probe 'nope' \(allowed: .*qk_spectrum"):
        make_probe("nope")


class FakeAttention(nn.Module):
    """Holds W_Q..W_O in the dynascope layout, plus dropout to check mode restoration."""

    def __init__(self, views_layer: AttentionView):
        super().__init__()
        for field in ("W_Q", "W_K", "W_V", "W_O"):
            setattr(self, field, nn.Parameter(getattr(views_layer, field).clone()))
        self.dropout = nn.Dropout(0.5)


def fake_adapter(name, module):
    if not isinstance(module, FakeAttention):
        return None
    return AttentionView(name, module.W_Q, module.W_K, module.W_V, module.W_O, module=module)


def test_spectrum_probe_on_a_model_leaves_it_untouched(monkeypatch):
    # attention_views only knows registered classes; swap in an adapter for the fake module.
    monkeypatch.setattr(adapters, "_ADAPTERS", {"test.FakeAttention": fake_adapter})
    views = diag_views()
    model = nn.Sequential(*(FakeAttention(v) for v in views))
    model.train()
    model[1].dropout.eval()
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.25)
    modes = [m.training for m in model.modules()]
    grads = [p.grad.clone() for p in model.parameters()]
    rng = torch.get_rng_state()

    out = QKSpectrum()(model, ProbeContext(step=3))

    expected = QKSpectrum().measure_views(views)
    torch.testing.assert_close(out.pop("qk.singular_values"), expected.pop("qk.singular_values"))
    assert out == expected
    assert [m.training for m in model.modules()] == modes
    torch.testing.assert_close(torch.get_rng_state(), rng, rtol=0, atol=0)
    for p, g in zip(model.parameters(), grads):
        torch.testing.assert_close(p.grad, g, rtol=0, atol=0)


def test_huge_factors_do_not_overflow_the_core():
    """Factors of size 1e18 in float32: the product's singular values (~1e36) are representable,
    although R_A @ R_B^T formed naively would overflow; power-of-two scaling keeps them exact."""
    A = torch.eye(4, 3) * 1e18
    B = torch.eye(5, 3) * 2e18
    s = factor_singular_values(A, B)
    torch.testing.assert_close(s, torch.full((3,), 2e36), rtol=1e-6, atol=0)


def test_probe_reports_nan_for_non_finite_or_overflowing_weights():
    from dynascope.adapters import AttentionView

    def views(scale):
        W = torch.randn(1, 2, 6, 3, generator=torch.Generator().manual_seed(0)) * scale
        return [AttentionView(name="a", W_Q=W[0], W_K=W[0], W_V=W[0], W_O=W[0].mT)]

    for scale in (1e30, float("inf")):
        out = QKSpectrum().measure_views(views(scale))
        assert math.isnan(out["qk.mean.effective_rank"]) and math.isnan(out["L0.H1.qk.gap"])
        assert out["qk.singular_values"].shape == (1, 2, 3)
    finite = QKSpectrum().measure_views(views(1.0))
    nan_keys = QKSpectrum().measure_views(views(float("nan")))
    assert finite.keys() == nan_keys.keys()
