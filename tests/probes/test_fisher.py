"""Neural Fisher kernel (S14): scores, diagonal Fisher, exact Gram, randomized embedding.

Oracles: closed-form score gradients of a linear softmax model and of a Gaussian energy; a dense
float64 Jacobian from a per-example ``torch.autograd.grad`` loop; the exact SVD of the dense
feature matrix. Tolerances are float64 rounding (1e-10 on O(1) entries) unless stated.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dynascope.probes.fisher import (
    conditional_score,
    diagonal_fisher,
    fisher_scores,
    jem_score,
    mean_score_gradient,
    nfk_embedding,
    nfk_features,
    nfk_gram,
    nfk_transform,
    principal_angle_cosines,
)

F64 = torch.float64


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def mlp_params(d_in=4, d_hidden=6, d_out=3, seed=0):
    g = gen(seed)
    return {
        "W1": torch.randn(d_in, d_hidden, generator=g, dtype=F64) / d_in**0.5,
        "b1": torch.randn(d_hidden, generator=g, dtype=F64) * 0.1,
        "W2": torch.randn(d_hidden, d_out, generator=g, dtype=F64) / d_hidden**0.5,
    }


def mlp_logits(params, x):
    return torch.tanh(x @ params["W1"] + params["b1"]) @ params["W2"]


def mlp_jem(params, x):
    return jem_score(mlp_logits(params, x))


def dense_jacobian(score_fn, params, x):
    """Oracle: per-example autograd loop, float64, rows flattened in dict order."""
    rows = []
    for i in range(x.shape[0]):
        leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
        s = score_fn(leaves, x[i : i + 1]).sum()
        grads = torch.autograd.grad(s, list(leaves.values()))
        rows.append(torch.cat([g.reshape(-1) for g in grads]))
    return torch.stack(rows)


def test_jem_scores_of_a_linear_softmax_model_match_the_closed_form():
    """grad_W logsumexp(x W + b) = x ⊗ softmax, grad_b = softmax; centring subtracts the mean."""
    x = torch.randn(7, 5, generator=gen(1), dtype=F64)
    params = {"W": torch.randn(5, 3, generator=gen(2), dtype=F64), "b": torch.zeros(3, dtype=F64)}

    def score(p, x):
        return jem_score(x @ p["W"] + p["b"])

    prob = torch.softmax(x @ params["W"], dim=-1)
    expected = torch.cat([torch.einsum("nd,nc->ndc", x, prob).reshape(7, -1), prob], dim=1)
    torch.testing.assert_close(
        fisher_scores(score, params, x, center=False), expected, rtol=0, atol=1e-12
    )
    torch.testing.assert_close(
        fisher_scores(score, params, x), expected - expected.mean(0), rtol=0, atol=1e-12
    )
    torch.testing.assert_close(
        mean_score_gradient(score, params, x, chunk_size=3), expected.mean(0), rtol=0, atol=1e-12
    )


def test_conditional_scores_take_tuple_inputs_and_match_the_closed_form():
    """grad_W log softmax(x W)_y = x ⊗ (e_y - softmax(x W))."""
    x = torch.randn(6, 4, generator=gen(3), dtype=F64)
    y = torch.tensor([0, 2, 1, 1, 0, 2])
    params = {"W": torch.randn(4, 3, generator=gen(4), dtype=F64)}

    def score(p, inputs):
        xb, yb = inputs
        return conditional_score(xb @ p["W"], yb)

    resid = torch.nn.functional.one_hot(y, 3).to(F64) - torch.softmax(x @ params["W"], -1)
    expected = torch.einsum("nd,nc->ndc", x, resid).reshape(6, -1)
    got = fisher_scores(score, params, (x, y), center=False, chunk_size=4)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_energy_based_scores_use_the_model_sample_mean():
    """Gaussian energy E(x) = ½‖x − θ‖²: U_x = −∇E(x) + mean_{x'} ∇E(x') = x − mean(x').

    θ cancels exactly; the diagonal Fisher over the samples is their (biased) variance.
    """
    theta = torch.tensor([0.5, -1.0, 2.0], dtype=F64)
    params = {"theta": theta}

    def score(p, x):  # s = −E
        return -0.5 * (x - p["theta"]).square().sum(-1)

    samples = theta + torch.randn(50, 3, generator=gen(5), dtype=F64)
    x = torch.randn(4, 3, generator=gen(6), dtype=F64)
    g_bar = mean_score_gradient(score, params, samples)
    U = fisher_scores(score, params, x, mean_grad=g_bar)
    torch.testing.assert_close(U, x - samples.mean(0), rtol=0, atol=1e-12)
    D = diagonal_fisher(score, params, samples, damping=0.0, chunk_size=7)
    torch.testing.assert_close(D, samples.var(0, unbiased=False), rtol=1e-12, atol=0)


@pytest.mark.parametrize("chunk_size", [None, 1, 4])
def test_exact_gram_and_diagonal_fisher_match_a_dense_float64_oracle(chunk_size):
    x = torch.randn(11, 4, generator=gen(7), dtype=F64)
    params = mlp_params()
    J = dense_jacobian(mlp_jem, params, x)  # [N, P]
    U = J - J.mean(0)
    second = U.square().mean(0)
    D_oracle = second + 1e-3 * second.mean()
    D = diagonal_fisher(mlp_jem, params, x, damping=1e-3, chunk_size=chunk_size)
    torch.testing.assert_close(D, D_oracle, rtol=1e-10, atol=0)
    K_oracle = U @ torch.diag(1 / D_oracle) @ U.T
    K = nfk_gram(mlp_jem, params, x, fisher_diag=D, chunk_size=chunk_size)
    torch.testing.assert_close(K, K_oracle, rtol=0, atol=1e-10)
    torch.testing.assert_close(K, K.T, rtol=0, atol=1e-12)  # matmul rounding only
    eig = torch.linalg.eigvalsh(K)
    assert eig.min() > -1e-10 * eig.max()
    # centring: every row of C J sums to zero over examples, so K 1 = 0
    torch.testing.assert_close(K.sum(1), torch.zeros(11, dtype=F64), rtol=0, atol=1e-9)


@settings(max_examples=10, deadline=None)
@given(chunk=st.integers(1, 9), center=st.booleans())
def test_gram_and_embedding_do_not_depend_on_the_chunk_size(chunk, center):
    x = torch.randn(9, 4, generator=gen(15), dtype=F64)
    params = mlp_params()
    whole = nfk_gram(mlp_jem, params, x, center=center)
    torch.testing.assert_close(
        nfk_gram(mlp_jem, params, x, center=center, chunk_size=chunk), whole, rtol=0, atol=1e-12
    )
    a = nfk_embedding(mlp_jem, params, x, k=3, center=center, generator=gen(2))
    b = nfk_embedding(mlp_jem, params, x, k=3, center=center, chunk_size=chunk, generator=gen(2))
    torch.testing.assert_close(a.embedding, b.embedding, rtol=0, atol=1e-10)


def test_cross_gram_centres_both_sides_with_the_scored_sets_mean():
    x1 = torch.randn(5, 4, generator=gen(8), dtype=F64)
    x2 = torch.randn(3, 4, generator=gen(9), dtype=F64)
    params = mlp_params()
    J1, J2 = dense_jacobian(mlp_jem, params, x1), dense_jacobian(mlp_jem, params, x2)
    g = J1.mean(0)
    expected = (J1 - g) @ (J2 - g).T
    torch.testing.assert_close(nfk_gram(mlp_jem, params, x1, x2), expected, rtol=0, atol=1e-10)
    uncentred = nfk_gram(mlp_jem, params, x1, x2, center=False)
    torch.testing.assert_close(uncentred, J1 @ J2.T, rtol=0, atol=1e-10)


def low_rank_problem(n=40, P=50, r=5, seed=10):
    """A score linear in θ whose inputs span r dims: J = Z A M, so rank(Φ) = r."""
    g = gen(seed)
    M = torch.randn(8, P, generator=g, dtype=F64)
    A = torch.randn(r, 8, generator=g, dtype=F64)
    x = torch.randn(n, r, generator=g, dtype=F64) @ A  # inputs in an r-dim subspace of R^8
    params = {"theta": torch.randn(P, generator=g, dtype=F64)}

    def score(p, x):
        return (x @ M) @ p["theta"]

    return score, params, x


def test_randomized_embedding_recovers_the_exact_svd_when_the_sketch_covers_the_rank():
    """k + p ≥ rank(Φ): top-k subspace, singular values and U_k Σ_k equal the exact SVD."""
    score, params, x = low_rank_problem()
    D = diagonal_fisher(score, params, x)
    phi = nfk_features(score, params, x, fisher_diag=D)
    U, S, Vh = torch.linalg.svd(phi, full_matrices=False)
    assert int((S > 1e-9 * S[0]).sum()) == 5  # rank r; the sketch below has l = k + p = 5
    emb = nfk_embedding(
        score, params, x, k=3, oversampling=2, power_iters=0, fisher_diag=D, generator=gen(0)
    )
    torch.testing.assert_close(emb.singular_values, S[:3], rtol=1e-10, atol=0)
    cos = principal_angle_cosines(U[:, :3], emb.left)
    torch.testing.assert_close(cos, torch.ones(3, dtype=F64), rtol=0, atol=1e-10)
    signs = torch.sign((U[:, :3] * emb.left).sum(0))
    torch.testing.assert_close(emb.embedding, U[:, :3] * S[:3] * signs, rtol=0, atol=1e-10)
    torch.testing.assert_close(emb.right, Vh[:3].T * signs, rtol=0, atol=1e-10)
    # Nyström consistency: embedding the scored points again by JVPs gives (U_k Σ_k)_i
    again = nfk_transform(emb, score, params, x, chunk_size=9)
    torch.testing.assert_close(again, emb.embedding, rtol=0, atol=1e-10)


def test_randomized_embedding_recovers_the_top_k_eigenspace_of_a_nonlinear_nfk():
    """Issue 5's done-when on a low-rank case: mean principal-angle cosine ≥ 0.99.

    Tanh MLP, JEM score, diagonal Fisher, N = 60, P = 48: Φ is numerically low-rank (the
    spectrum decays); k = 4, p = 10, q = 2 (S14's recipe at smoke size).
    """
    x = torch.randn(60, 4, generator=gen(11), dtype=F64)
    params = mlp_params()
    D = diagonal_fisher(mlp_jem, params, x)
    K = nfk_gram(mlp_jem, params, x, fisher_diag=D)
    evals, evecs = torch.linalg.eigh(K)
    top = evecs[:, -4:]
    emb = nfk_embedding(
        mlp_jem, params, x, k=4, oversampling=10, power_iters=2, fisher_diag=D, generator=gen(1)
    )
    cos = principal_angle_cosines(top, emb.left)
    assert cos.mean() >= 0.99 and cos.min() >= 0.99, cos
    torch.testing.assert_close(
        emb.singular_values.square(), evals.flip(0)[:4], rtol=1e-6, atol=0
    )  # power iterations: relative error (σ_{l+1}/σ_k)^{2(2q+1)} ≪ 1e-6 here


def test_uncentred_identity_fisher_gram_is_the_gradient_gram():
    """D = I, no centring: K = J Jᵀ, the empirical NTK of the scalar score."""
    x = torch.randn(6, 4, generator=gen(12), dtype=F64)
    params = mlp_params()
    J = dense_jacobian(mlp_jem, params, x)
    K = nfk_gram(mlp_jem, params, x, center=False)
    torch.testing.assert_close(K, J @ J.T, rtol=0, atol=1e-10)


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(2, 9),
    a=st.integers(1, 4),
    seed=st.integers(0, 2**16),
    scale=st.sampled_from([1e-30, 1.0, 1e30]),
)
def test_principal_angles_are_invariant_to_a_change_of_basis_and_scale(n, a, seed, scale):
    a = min(a, n)
    A = torch.randn(n, a, generator=gen(seed), dtype=F64)
    R = torch.linalg.qr(torch.randn(a, a, generator=gen(seed + 1), dtype=F64)).Q
    cos = principal_angle_cosines(A, scale * A @ R)
    torch.testing.assert_close(cos, torch.ones(a, dtype=F64), rtol=0, atol=1e-8)


def test_principal_angles_of_orthogonal_subspaces_are_zero():
    e = torch.eye(4, dtype=F64)
    torch.testing.assert_close(
        principal_angle_cosines(e[:, :2], e[:, 2:]), torch.zeros(2, dtype=F64)
    )


def test_zero_score_gradients_give_a_zero_kernel_and_need_damping_only_for_whitening():
    params = {"w": torch.zeros(3, dtype=F64)}

    def flat(p, x):  # s independent of x: every centred score is 0
        return (p["w"].sum() * torch.ones(x.shape[0], dtype=F64)).square()

    x = torch.randn(5, 2, generator=gen(13), dtype=F64)
    torch.testing.assert_close(nfk_gram(flat, params, x), torch.zeros(5, 5, dtype=F64))
    D = diagonal_fisher(flat, params, x, damping=0.0)
    with pytest.raises(ValueError, match="fisher_diag must be finite and > 0"):
        nfk_gram(flat, params, x, fisher_diag=D)


def test_bad_inputs_are_one_line_errors():
    x = torch.randn(5, 4, dtype=F64)
    params = mlp_params()
    with pytest.raises(ValueError, match=r"k must lie in \[1, min\(N, P\)\] = \[1, 5\] \(got 6\)"):
        nfk_embedding(mlp_jem, params, x, k=6)
    with pytest.raises(ValueError, match="oversampling must be an integer >= 0"):
        nfk_embedding(mlp_jem, params, x, k=2, oversampling=-1)
    with pytest.raises(ValueError, match="power_iters must be an integer >= 0"):
        nfk_embedding(mlp_jem, params, x, k=2, power_iters=-1)
    with pytest.raises(ValueError, match="chunk_size must be None or an integer >= 1"):
        fisher_scores(mlp_jem, params, x, chunk_size=0)
    with pytest.raises(ValueError, match=r"mean_grad must be \[P\] with P=48"):
        fisher_scores(mlp_jem, params, x, mean_grad=torch.zeros(3, dtype=F64))
    with pytest.raises(ValueError, match="damping must be finite and >= 0"):
        diagonal_fisher(mlp_jem, params, x, damping=float("nan"))
    with pytest.raises(ValueError, match="fisher_diag must be finite and > 0"):
        nfk_features(mlp_jem, params, x, fisher_diag=torch.full((48,), float("nan"), dtype=F64))
    with pytest.raises(ValueError, match=r"fisher_diag must be \[P\] with P=48"):
        nfk_features(mlp_jem, params, x, fisher_diag=torch.ones(4, dtype=F64))
    with pytest.raises(ValueError, match="params must be a non-empty dict"):
        fisher_scores(mlp_jem, {}, x)
    with pytest.raises(ValueError, match="every tensor must share the leading size N"):
        fisher_scores(mlp_jem, params, (x, torch.zeros(3)))
    with pytest.raises(ValueError, match="A and B must share their row count"):
        principal_angle_cosines(torch.ones(3, 1), torch.ones(4, 1))
    emb = nfk_embedding(mlp_jem, params, x, k=2, generator=gen(0))
    with pytest.raises(ValueError, match="params hold P=3 entries but the embedding"):
        nfk_transform(emb, mlp_jem, {"w": torch.zeros(3, dtype=F64)}, x)


def test_uncentred_identity_fisher_gram_equals_the_empirical_ntk_of_the_score():
    """S14's eNTK relation against dynascope's own eNTK (d_out = 1, full mode)."""
    from dynascope.probes.kernels import empirical_ntk

    x = torch.randn(7, 4, generator=gen(14), dtype=F64)
    params = mlp_params()
    K = nfk_gram(mlp_jem, params, x, center=False)
    ntk = empirical_ntk(mlp_jem, params, x, mode="full")
    torch.testing.assert_close(K, ntk[..., 0, 0], rtol=0, atol=1e-10)
