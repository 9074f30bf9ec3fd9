"""MatrixFactorization (S01 toy): closed-form gradient, end point, gradient-flow identity."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dynascope.tasks import MatrixFactorization


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_target_and_threshold_constant() -> None:
    toy = MatrixFactorization()
    torch.testing.assert_close(
        toy.target(), torch.diag(torch.tensor([0.2, 0.4, 0.6, 0.8, 1.0], dtype=torch.float64))
    )
    assert toy.threshold_constant == 0.5
    assert MatrixFactorization(data_scale=0.5).threshold_constant == 1.0


def test_loss_matches_definition_batched() -> None:
    toy = MatrixFactorization(data_scale=0.7)
    A, B = toy.init_factors(3, gen(0))
    lam = torch.tensor([0.0, 0.1, 0.5], dtype=torch.float64)
    D = toy.target()
    expected = torch.stack(
        [
            0.7 * torch.linalg.matrix_norm(A[i] @ B[i].T - D) ** 2
            + lam[i] / 2 * (A[i].square().sum() + B[i].square().sum())
            for i in range(3)
        ]
    )
    torch.testing.assert_close(toy.loss(A, B, lam), expected)
    assert toy.loss(A[0], B[0], 0.3).shape == ()


@pytest.mark.parametrize("penalty", ["factors", "product"])
@pytest.mark.parametrize("data_scale", [1.0, 0.5])
def test_closed_form_gradient_equals_autograd(data_scale: float, penalty: str) -> None:
    toy = MatrixFactorization(data_scale=data_scale, penalty=penalty)
    A = torch.randn(4, 5, 3, generator=gen(0), dtype=torch.float64, requires_grad=True)
    B = torch.randn(4, 5, 3, generator=gen(1), dtype=torch.float64, requires_grad=True)
    lam = torch.tensor([0.0, 0.1, 0.4, 0.8], dtype=torch.float64)
    toy.loss(A, B, lam).sum().backward()
    grad_A, grad_B = toy.gradients(A.detach(), B.detach(), lam)
    torch.testing.assert_close(grad_A, A.grad)
    torch.testing.assert_close(grad_B, B.grad)
    new_A, new_B = toy.gradient_step(A.detach(), B.detach(), lam, lr=0.05)
    torch.testing.assert_close(new_A, A.detach() - 0.05 * A.grad)
    torch.testing.assert_close(new_B, B.detach() - 0.05 * B.grad)


@pytest.mark.parametrize("data_scale", [1.0, 0.5])
def test_gradient_descent_converges_to_predicted_singular_values(data_scale: float) -> None:
    toy = MatrixFactorization(data_scale=data_scale)
    # Thresholds c*lam at least 0.1 from every d_i (marginal modes converge sublinearly).
    threshold = torch.tensor([0.0, 0.1, 0.3, 0.5], dtype=torch.float64)
    lam = threshold / toy.threshold_constant
    A, B = toy.init_factors(4, gen(0))
    for _ in range(4000):
        A, B = toy.gradient_step(A, B, lam, lr=0.05)
    grad_A, grad_B = toy.gradients(A, B, lam)
    assert float(grad_A.abs().max()) < 1e-8 and float(grad_B.abs().max()) < 1e-8
    predicted = toy.predicted_singular_values(lam)  # [4, 5]
    torch.testing.assert_close(torch.linalg.svdvals(A @ B.mT), predicted, atol=1e-6, rtol=0)


def test_predicted_singular_values_closed_form() -> None:
    toy = MatrixFactorization()
    torch.testing.assert_close(
        toy.predicted_singular_values(0.8),
        torch.tensor([0.6, 0.4, 0.2, 0.0, 0.0], dtype=torch.float64),
    )
    assert toy.predicted_singular_values(torch.zeros(2, 3)).shape == (2, 3, 5)


def test_product_penalty_loss_is_the_frobenius_norm_of_the_product() -> None:
    """Hand-built: A = diag(1, 2), B = I, D = 0 -> loss = ‖AB‖² + (λ/2)‖AB‖² = 5 (1 + λ/2)."""
    toy = MatrixFactorization(diag=(0.0, 0.0), penalty="product")
    A = torch.diag(torch.tensor([1.0, 2.0], dtype=torch.float64))
    B = torch.eye(2, dtype=torch.float64)
    torch.testing.assert_close(toy.loss(A, B, 0.4), torch.tensor(5.0 * 1.2, dtype=torch.float64))


def test_gradient_flow_balancedness_identity() -> None:
    # d/dt (A^T A - B^T B) = -2 lam (A^T A - B^T B); one Euler step of size eta has O(eta) error.
    toy = MatrixFactorization()
    A, B = toy.init_factors(3, gen(2))
    lam = torch.tensor([0.0, 0.2, 0.8], dtype=torch.float64)
    eta = 1e-7

    def imbalance(A, B):
        return A.mT @ A - B.mT @ B

    M = imbalance(A, B)
    derivative = (imbalance(*toy.gradient_step(A, B, lam, eta)) - M) / eta
    torch.testing.assert_close(derivative, -2 * lam[:, None, None] * M, atol=1e-6, rtol=1e-5)


def test_init_factors_independent_deterministic() -> None:
    toy = MatrixFactorization()
    A, B = toy.init_factors(2, gen(0), std=0.3)
    A2, B2 = toy.init_factors(2, gen(0), std=0.3)
    assert A.shape == B.shape == (2, 5, 5) and A.dtype == torch.float64
    torch.testing.assert_close(A, A2, rtol=0, atol=0)
    torch.testing.assert_close(B, B2, rtol=0, atol=0)
    assert not torch.equal(A, B)
    g = gen(0)
    torch.testing.assert_close(A, 0.3 * torch.randn(2, 5, 5, generator=g, dtype=torch.float64))
    torch.testing.assert_close(B, 0.3 * torch.randn(2, 5, 5, generator=g, dtype=torch.float64))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"diag": ()}, r"diag must be non-empty \(got diag=\(\)\)"),
        (
            {"diag": (0.1, -0.2)},
            r"diag entries must be finite numbers >= 0 \(got diag=\(0.1, -0.2\)\)",
        ),
        (
            {"diag": (float("nan"),)},
            r"diag entries must be finite numbers >= 0 \(got diag=\(nan,\)\)",
        ),
        ({"data_scale": 0}, r"data_scale must be a finite number > 0 \(got data_scale=0\)"),
        ({"penalty": "nuclear"}, r"penalty must be one of factors, product \(got 'nuclear'\)"),
    ],
)
def test_bad_arguments_raise(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MatrixFactorization(**kwargs)


def test_bad_factor_shapes_and_init_arguments_raise() -> None:
    toy = MatrixFactorization()
    A = torch.zeros(2, 4, 4)
    with pytest.raises(ValueError, match=r"A and B must both have shape \[..., n, r\] with n=5"):
        toy.loss(A, A, 0.1)
    with pytest.raises(ValueError, match=r"n_lambda must be an int >= 1 \(got n_lambda=0\)"):
        toy.init_factors(0, gen(0))
    with pytest.raises(ValueError, match=r"std must be a finite number > 0 \(got std=-1.0\)"):
        toy.init_factors(1, gen(0), std=-1.0)


@settings(max_examples=30, deadline=None)
@given(
    scale=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**31),
)
def test_l2_term_bounds_nuclear_norm(scale, seed) -> None:
    # (1/2)(|A|^2 + |B|^2) >= |A B^T|_*, including at zero and for rank-deficient factors.
    toy = MatrixFactorization()
    A, B = toy.init_factors(1, gen(seed))
    A = A * scale
    B[..., -2:] = 0.0
    l2 = 0.5 * (A.square().sum() + B.square().sum())
    nuclear = torch.linalg.svdvals(A @ B.mT).sum()
    assert float(l2) >= float(nuclear) - 1e-12
