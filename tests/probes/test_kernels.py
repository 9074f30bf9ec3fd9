"""Kernel instruments against independent oracles.

Oracles: an explicit float64 Jacobian built row by row with ``torch.autograd.grad`` (eNTK,
linearization); closed forms (depth-1 arc-cosine NTK/NNGP, GD on a quadratic); naive HSIC
(CKA). Tolerances: 1e-10 absolute where both sides are float64 sums of O(1) terms over at most
a few hundred parameters (round-off ~1e-14); the wide-net check uses a width-dependent bound
(fluctuations of the eNTK are O(width^-1/2), see the test).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dynascope.nn.mlp import MLP
from dynascope.probes import ProbeContext
from dynascope.probes.kernels import (
    NTKDrift,
    analytic_ntk_relu,
    centered_kernel_alignment,
    empirical_ntk,
    kernel_alignment,
    kernel_gd_predictions,
    linearize,
    model_function,
    nngp_relu,
    ntk_relative_change,
)

D_IN, WIDTH, D_OUT = 3, 7, 2
F64 = torch.float64


def _net(seed=0, d_out=D_OUT):
    g = torch.Generator().manual_seed(seed)
    return MLP(D_IN, WIDTH, d_out, depth=2, parametrization="ntk", use_bias=True, b_std=0.5,
               activation="tanh", generator=g, dtype=F64)  # fmt: skip


def _explicit_jacobian(model, x, names=None):
    """``[n, d_out, P]`` by one ``autograd.grad`` per output entry (the oracle)."""
    params = [p for k, p in model.named_parameters() if names is None or k in names]
    rows = []
    for i in range(x.shape[0]):
        out = model(x[i : i + 1])[0]
        for c in range(out.shape[0]):
            grads = torch.autograd.grad(out[c], params, retain_graph=True)
            rows.append(torch.cat([g.reshape(-1) for g in grads]))
    return torch.stack(rows).view(x.shape[0], -1, rows[0].numel())


@pytest.fixture(scope="module")
def setup():
    model = _net()
    g = torch.Generator().manual_seed(1)
    x1 = torch.randn(5, D_IN, generator=g, dtype=F64)
    x2 = torch.randn(4, D_IN, generator=g, dtype=F64)
    return model, x1, x2


@pytest.mark.parametrize("strategy", ["jacobian", "jvp_vjp"])
@pytest.mark.parametrize("chunk_size", [None, 2])
def test_entk_equals_explicit_jacobian_products(setup, strategy, chunk_size):
    model, x1, x2 = setup
    fn, params = model_function(model)
    J1, J2 = _explicit_jacobian(model, x1), _explicit_jacobian(model, x2)
    full = torch.einsum("icp,jdp->ijcd", J1, J2)
    kw = {"strategy": strategy, "chunk_size": chunk_size}
    torch.testing.assert_close(
        empirical_ntk(fn, params, x1, x2, mode="full", **kw), full, rtol=0, atol=1e-10
    )
    torch.testing.assert_close(
        empirical_ntk(fn, params, x1, x2, mode="trace", **kw),
        torch.einsum("icp,jcp->ij", J1, J2),
        rtol=0,
        atol=1e-10,
    )
    x3 = x1[[4, 3, 2, 1, 0]]
    torch.testing.assert_close(
        empirical_ntk(fn, params, x1, x3, mode="diagonal", **kw),
        torch.einsum("icp,icp->ic", J1, _explicit_jacobian(model, x3)),
        rtol=0,
        atol=1e-10,
    )


@pytest.mark.parametrize("strategy", ["jacobian", "jvp_vjp"])
def test_entk_over_a_parameter_subset(setup, strategy):
    model, x1, x2 = setup
    names = ["layers.1.weight", "layers.2.bias"]
    fn, params = model_function(model, include=names)
    assert sorted(params) == names
    J1, J2 = _explicit_jacobian(model, x1, names), _explicit_jacobian(model, x2, names)
    torch.testing.assert_close(
        empirical_ntk(fn, params, x1, x2, strategy=strategy, chunk_size=3),
        torch.einsum("icp,jdp->ijcd", J1, J2),
        rtol=0,
        atol=1e-10,
    )


class _ScaledNet(torch.nn.Module):
    """A net with a 0-d parameter (a learned output scale, as σReparam's γ per matrix)."""

    def __init__(self):
        super().__init__()
        self.inner = _net()
        self.scale = torch.nn.Parameter(torch.tensor(1.7, dtype=F64))

    def forward(self, x):
        return self.scale * self.inner(x)


@pytest.mark.parametrize("strategy", ["jacobian", "jvp_vjp"])
@pytest.mark.parametrize("chunk_size", [None, 2])
@pytest.mark.parametrize("mode", ["full", "trace", "diagonal"])
def test_entk_with_a_scalar_parameter_equals_explicit_jacobian_products(
    setup, strategy, chunk_size, mode
):
    _, x1, x2 = setup
    model = _ScaledNet()
    fn, params = model_function(model)
    J1, J2 = _explicit_jacobian(model, x1), _explicit_jacobian(model, x2)
    kw = {"strategy": strategy, "chunk_size": chunk_size, "mode": mode}
    if mode == "diagonal":
        x2, J2 = x1.flip(0), _explicit_jacobian(model, x1.flip(0))
    expected = {
        "full": lambda: torch.einsum("icp,jdp->ijcd", J1, J2),
        "trace": lambda: torch.einsum("icp,jcp->ij", J1, J2),
        "diagonal": lambda: torch.einsum("icp,icp->ic", J1, J2),
    }[mode]()
    torch.testing.assert_close(
        empirical_ntk(fn, params, x1, x2, **kw), expected, rtol=0, atol=1e-10
    )


def test_entk_gram_is_symmetric_psd_and_trace_mode_is_the_trace(setup):
    model, x1, _ = setup
    fn, params = model_function(model)
    full = empirical_ntk(fn, params, x1)  # [n, n, d, d]
    gram = full.permute(0, 2, 1, 3).reshape(5 * D_OUT, 5 * D_OUT)
    torch.testing.assert_close(gram, gram.mT, rtol=0, atol=1e-12)
    # PSD up to round-off: smallest eigenvalue >= -1e-12 of the largest
    eig = torch.linalg.eigvalsh(gram)
    assert eig.min() >= -1e-12 * eig.max()
    torch.testing.assert_close(
        empirical_ntk(fn, params, x1, mode="trace"),
        torch.diagonal(full, dim1=2, dim2=3).sum(-1),
        rtol=0,
        atol=1e-12,
    )
    torch.testing.assert_close(
        empirical_ntk(fn, params, x1, mode="diagonal"),
        torch.diagonal(torch.diagonal(full, dim1=0, dim2=1), dim1=0, dim2=1),
        rtol=0,
        atol=1e-12,
    )


def test_empirical_ntk_rejects_bad_arguments(setup):
    model, x1, x2 = setup
    fn, params = model_function(model)
    with pytest.raises(ValueError, match="mode must be one of full, trace, diagonal"):
        empirical_ntk(fn, params, x1, mode="mean")
    with pytest.raises(
        ValueError, match="strategy must be one of auto, structured, jacobian, jvp_vjp"
    ):
        empirical_ntk(fn, params, x1, strategy="loop")
    with pytest.raises(ValueError, match="chunk_size must be None or an integer >= 1"):
        empirical_ntk(fn, params, x1, chunk_size=0)
    with pytest.raises(ValueError, match="n1 must equal n2"):
        empirical_ntk(fn, params, x1, x2, mode="diagonal")
    with pytest.raises(ValueError, match="share the per-example shape"):
        empirical_ntk(fn, params, x1, torch.zeros(2, 4, dtype=F64))
    with pytest.raises(ValueError, match="params must hold at least one tensor"):
        empirical_ntk(fn, {}, x1)
    with pytest.raises(ValueError, match=r"model_fn must return \[n, d_out\]"):
        empirical_ntk(lambda p, x: fn(p, x)[:, :, None], params, x1)
    with pytest.raises(ValueError, match="include selects no parameter"):
        model_function(model, include=["nope."])


# -- analytic kernels ---------------------------------------------------------------------------
def _depth1_closed_form(x1, x2):
    """One hidden ReLU layer, sigma_w = 1, sigma_b = 0, written out (module docstring)."""
    d = x1.shape[1]
    n1, n2 = x1.norm(dim=1)[:, None], x2.norm(dim=1)[None, :]
    cos = ((x1 @ x2.T) / (n1 * n2)).clamp(-1, 1)
    theta = torch.arccos(cos)
    nngp = n1 * n2 / (2 * math.pi * d) * (torch.sin(theta) + (math.pi - theta) * cos)
    ntk = nngp + (math.pi - theta) / (2 * math.pi) * (x1 @ x2.T) / d
    return nngp, ntk


def test_analytic_depth1_equals_the_closed_form():
    g = torch.Generator().manual_seed(3)
    x1, x2 = torch.randn(6, 4, generator=g, dtype=F64), torch.randn(5, 4, generator=g, dtype=F64)
    nngp, ntk = _depth1_closed_form(x1, x2)
    # float64 round-off of arccos near |c| = 1 is the only difference
    torch.testing.assert_close(nngp_relu(x1, x2, depth=1), nngp, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(analytic_ntk_relu(x1, x2, depth=1), ntk, rtol=1e-12, atol=1e-12)
    # on the diagonal (theta = 0): NNGP = |x|^2 / (2 d), NTK = |x|^2 / d; arccos(1 - 1e-16)
    # is ~1.5e-8, so the diagonal is exact to ~1e-8 relative
    sq = (x1 * x1).sum(1) / 4
    torch.testing.assert_close(torch.diagonal(nngp_relu(x1, depth=1)), sq / 2, rtol=1e-8, atol=0)
    torch.testing.assert_close(torch.diagonal(analytic_ntk_relu(x1)), sq, rtol=1e-8, atol=0)


def test_analytic_ntk_matches_wide_ntk_nets_better_as_width_grows():
    """Relative Frobenius error, mean over 3 seeds: <= 4 / sqrt(width) at widths 64 and 4096
    (depth 1) and 128 and 1024 (depth 2), and smaller at the larger width. The constant 4 sits
    above the measured error * sqrt(width) (1.4-2.8) with room for other seeds."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, generator=g, dtype=F64)
    for depth, widths in ((1, (64, 4096)), (2, (128, 1024))):
        target = analytic_ntk_relu(x, depth=depth, b_std=0.3)
        errors = []
        for width in widths:
            err = 0.0
            for seed in range(3):
                net = MLP(5, width, 1, depth=depth, parametrization="ntk", use_bias=True,
                          b_std=0.3, generator=torch.Generator().manual_seed(seed), dtype=F64)  # fmt: skip
                fn, params = model_function(net)
                K = empirical_ntk(fn, params, x, mode="trace", chunk_size=4)
                err += float(torch.linalg.norm(K - target) / torch.linalg.norm(target)) / 3
            assert err <= 4 / math.sqrt(width), (depth, width, err)
            errors.append(err)
        assert errors[1] < errors[0], (depth, errors)


def test_analytic_kernels_reject_bad_arguments():
    x = torch.ones(2, 3)
    with pytest.raises(ValueError, match="depth must be an integer >= 1"):
        analytic_ntk_relu(x, depth=0)
    with pytest.raises(ValueError, match="W_std must be a finite number > 0"):
        nngp_relu(x, W_std=0.0)
    with pytest.raises(ValueError, match="b_std must be a finite number >= 0"):
        nngp_relu(x, b_std=-1.0)
    with pytest.raises(ValueError, match=r"x2 must be \[n2, d_in=3\]"):
        analytic_ntk_relu(x, torch.ones(2, 4))


def test_zero_input_gets_zero_kernel_row_without_nan():
    x = torch.tensor([[0.0, 0.0], [1.0, 2.0]], dtype=F64)
    K = analytic_ntk_relu(x, depth=3)
    assert torch.isfinite(K).all()
    torch.testing.assert_close(K[0], torch.zeros(2, dtype=F64))


# -- linearization and kernel GD ----------------------------------------------------------------
def test_linearized_output_equals_f0_plus_jacobian_times_delta(setup):
    model, x1, _ = setup
    fn, params0 = model_function(model)
    g = torch.Generator().manual_seed(5)
    delta = {k: 0.1 * torch.randn(v.shape, generator=g, dtype=F64) for k, v in params0.items()}
    f_lin = linearize(fn, params0)
    J = _explicit_jacobian(model, x1)  # [n, d_out, P], parameters in named_parameters order
    d = torch.cat([delta[k].reshape(-1) for k, _ in model.named_parameters()])
    expected = model(x1).detach() + J @ d
    moved = {k: params0[k] + delta[k] for k in params0}
    torch.testing.assert_close(f_lin(moved, x1), expected, rtol=0, atol=1e-10)
    torch.testing.assert_close(f_lin(params0, x1), model(x1).detach(), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="params must have the names of params0"):
        f_lin({"x": d}, x1)


def test_training_the_linearized_twin_is_kernel_gd_with_the_entk():
    """GD on the linearized MLP with (1/2N) sum |f - y|^2 equals kernel GD with Theta_0, on the
    training inputs and on test inputs, to 1e-10 (function-space dynamics of a linear model)."""
    model = _net(seed=2)
    g = torch.Generator().manual_seed(6)
    x, x_test = (
        torch.randn(6, D_IN, generator=g, dtype=F64),
        torch.randn(3, D_IN, generator=g, dtype=F64),
    )
    y = torch.randn(6, D_OUT, generator=g, dtype=F64)
    fn, params0 = model_function(model)
    f_lin = linearize(fn, params0)
    lr, steps = 0.5, 25
    params = {k: v.clone() for k, v in params0.items()}
    train_traj, test_traj = [], []
    for _ in range(steps + 1):
        train_traj.append(f_lin(params, x).detach())
        test_traj.append(f_lin(params, x_test).detach())
        loss_grad = torch.func.grad(lambda p: 0.5 * ((f_lin(p, x) - y) ** 2).sum() / len(x))
        grads = loss_grad(params)
        params = {k: params[k] - lr * grads[k] for k in params}
    K = empirical_ntk(fn, params0, x)
    K_test = empirical_ntk(fn, params0, x_test, x)
    f_train, f_test = kernel_gd_predictions(
        K_test, K, y, lr, steps, f0_train=fn(params0, x), f0_test=fn(params0, x_test)
    )
    torch.testing.assert_close(f_train, torch.stack(train_traj), rtol=0, atol=1e-10)
    torch.testing.assert_close(f_test, torch.stack(test_traj), rtol=0, atol=1e-10)


def test_kernel_gd_matches_the_closed_form_and_broadcasts_a_scalar_kernel():
    g = torch.Generator().manual_seed(7)
    A = torch.randn(5, 5, generator=g, dtype=F64)
    K = A @ A.T / 5
    y = torch.randn(5, 2, generator=g, dtype=F64)
    f0 = torch.randn(5, 2, generator=g, dtype=F64)
    lr, steps = 0.3, 12
    f, test = kernel_gd_predictions(None, K, y, lr, steps, f0_train=f0)
    assert test is None and f.shape == (steps + 1, 5, 2)
    step = torch.eye(5, dtype=F64) - lr / 5 * K
    expected = y - torch.linalg.matrix_power(step, steps) @ (y - f0)
    torch.testing.assert_close(f[-1], expected, rtol=0, atol=1e-12)
    full = torch.einsum("ij,cd->ijcd", K, torch.eye(2, dtype=F64))  # Theta (x) I
    torch.testing.assert_close(kernel_gd_predictions(None, full, y, lr, steps, f0_train=f0)[0], f)
    f_sum, _ = kernel_gd_predictions(None, K, y, lr / 5, steps, f0_train=f0, loss="sum")
    torch.testing.assert_close(f_sum, f, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"K_train must be \[5, 5\] or \[5, 5, 2, 2\]"):
        kernel_gd_predictions(None, K[:4], y, lr, steps)
    with pytest.raises(ValueError, match="lr must be a finite number > 0"):
        kernel_gd_predictions(None, K, y, -1.0, steps)
    with pytest.raises(ValueError, match="loss must be 'mean' or 'sum'"):
        kernel_gd_predictions(None, K, y, lr, steps, loss="max")


# -- kernel comparisons -------------------------------------------------------------------------
def test_relative_change_and_alignment_on_hand_built_kernels():
    K0 = torch.eye(3, dtype=F64)
    torch.testing.assert_close(ntk_relative_change(2 * K0, K0), torch.tensor(1.0, dtype=F64))
    torch.testing.assert_close(ntk_relative_change(K0, K0), torch.tensor(0.0, dtype=F64))
    y = torch.tensor([1.0, -1.0, 2.0], dtype=F64)
    torch.testing.assert_close(kernel_alignment(torch.outer(y, y), y), torch.tensor(1.0, dtype=F64))
    # <I, yy^T> / (sqrt(3) |y|^2) = 1 / sqrt(3)
    torch.testing.assert_close(kernel_alignment(K0, y), torch.tensor(3**-0.5, dtype=F64))
    with pytest.raises(ValueError, match="K_0 must not be all zero"):
        ntk_relative_change(K0, torch.zeros(3, 3))
    with pytest.raises(ValueError, match="K_t and K_0 must have the same shape"):
        ntk_relative_change(K0, torch.eye(2))
    with pytest.raises(ValueError, match="y must have 3 rows"):
        kernel_alignment(K0, torch.ones(2))


@settings(max_examples=25, deadline=None)
@given(scale=st.sampled_from([1e-30, 1e-3, 1.0, 1e30]), seed=st.integers(0, 10_000))
def test_relative_change_is_scale_invariant_and_nan_propagates(scale, seed):
    g = torch.Generator().manual_seed(seed)
    A, B = torch.randn(4, 4, generator=g, dtype=F64), torch.randn(4, 4, generator=g, dtype=F64)
    base = ntk_relative_change(A @ A.T, B @ B.T)
    torch.testing.assert_close(ntk_relative_change(scale * A @ A.T, scale * B @ B.T), base)
    K = (A @ A.T).clone()
    K[1, 2] = float("nan")
    assert torch.isnan(ntk_relative_change(K, B @ B.T))


def _hsic(K, L):
    n = K.shape[0]
    H = torch.eye(n, dtype=K.dtype) - torch.ones(n, n, dtype=K.dtype) / n
    return torch.trace(K @ H @ L @ H)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(3, 8), rank=st.integers(1, 4), scale=st.sampled_from([1e-3, 1.0, 1e6]),
       seed=st.integers(0, 10_000))  # fmt: skip
def test_cka_equals_naive_hsic_ratio_and_is_scale_and_shift_invariant(n, rank, scale, seed):
    g = torch.Generator().manual_seed(seed)
    A, B = torch.randn(n, rank, generator=g, dtype=F64), torch.randn(n, 3, generator=g, dtype=F64)
    K, L = scale * A @ A.T, B @ B.T  # rank-deficient PSD kernels
    cka = centered_kernel_alignment(K, L)
    naive = _hsic(K, L) / torch.sqrt(_hsic(K, K) * _hsic(L, L))
    torch.testing.assert_close(cka, naive, rtol=1e-9, atol=1e-12)
    assert -1e-12 <= float(cka) <= 1 + 1e-12
    torch.testing.assert_close(
        centered_kernel_alignment(K + 5.0 * scale, L), cka, rtol=1e-7, atol=1e-9
    )


def test_cka_rejects_a_constant_kernel():
    with pytest.raises(ValueError, match="must not be all zero"):
        centered_kernel_alignment(torch.ones(3, 3), torch.eye(3))


# -- probe --------------------------------------------------------------------------------------
def test_ntk_drift_probe_measures_the_relative_change_and_resumes():
    model = _net(seed=4, d_out=1)
    x = torch.randn(6, D_IN, generator=torch.Generator().manual_seed(8), dtype=F64)
    probe = NTKDrift(n_examples=4)
    first = probe(model, ProbeContext(step=0, batch={"x": x}))
    assert first["ntk.relative_change"] == 0.0 and first["ntk.alignment_0"] == pytest.approx(1.0)
    fn, params = model_function(model)
    K0 = empirical_ntk(fn, params, x[:4], mode="trace")
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.1)
    fn, params = model_function(model)
    K1 = empirical_ntk(fn, params, x[:4], mode="trace")
    resumed = NTKDrift(n_examples=4)
    resumed.load_state_dict(probe.state_dict())
    for pr in (probe, resumed):  # a later batch is ignored: the probe batch is fixed
        out = pr(model, ProbeContext(step=1, batch={"x": x.flip(0)}))
        assert out["ntk.relative_change"] == pytest.approx(
            float(ntk_relative_change(K1, K0)), rel=1e-12
        )
        assert out["ntk.trace"] == pytest.approx(float(torch.trace(K1)), rel=1e-12)
    # Issue 20: without inputs (as the HF callback steps it) it raised nothing and logged {}.
    for ctx, got in ((ProbeContext(step=0), "no batch"), (ProbeContext(0, {"y": x}), r"\['y'\]")):
        with pytest.raises(ValueError, match=rf"ntk_drift needs inputs: pass x=.*\(got .*{got}"):
            NTKDrift()(model, ctx)
    with pytest.raises(ValueError, match="n_examples must be an integer >= 1"):
        NTKDrift(n_examples=0)
