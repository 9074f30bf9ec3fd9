"""MultitaskHypernet and MonolithicMLP: hand-computed forward, hand-written code gradient,
the ReLU symmetry (permuted, positively rescaled hidden units) and input errors."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dynascope.nn.multitask_hypernet import MonolithicMLP, MultitaskHypernet


def _net(layers: int = 1, dtype=torch.float64) -> MultitaskHypernet:
    net = MultitaskHypernet(5, 7, 3, 4, layers, generator=torch.Generator().manual_seed(0))
    return net.to(dtype)


def test_forward_matches_a_per_task_loop():
    # Oracle: each task's weights assembled module by module, y = relu(x W / sqrt 5) W_head.
    net = _net()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 6, 5, generator=g, dtype=torch.float64)
    z = torch.randn(2, 4, generator=g, dtype=torch.float64)
    theta = net.theta[0].detach().view(4, 5, 7)
    expected = torch.stack(
        [
            torch.relu(x[t] @ sum(z[t, m] * theta[m] for m in range(4)) / math.sqrt(5))
            @ net.W_head.detach()
            for t in range(2)
        ]
    )
    torch.testing.assert_close(net(x, z).detach(), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layers", [1, 2])
def test_code_gradient_matches_autograd(layers):
    # Oracle: autograd of the same loss; float64, so agreement to rounding (1e-10).
    net = _net(layers)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 9, 5, generator=g, dtype=torch.float64)
    y = torch.randn(3, 9, 3, generator=g, dtype=torch.float64)
    z = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    losses = 0.5 * (net(x, z) - y).square().mean((1, 2))
    (expected,) = torch.autograd.grad(losses.sum(), z)
    loss, grad = net.code_gradient(x, y, z.detach())
    torch.testing.assert_close(loss, losses.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, expected, rtol=1e-10, atol=1e-12)


def _plain_code_gradient(net: MultitaskHypernet, x, y, z):
    """The plain form code_gradient replaced (2026-12-07): pre-activations divided by
    sqrt(fan_in), the ReLU mask as a float multiply."""
    scales = [math.sqrt(a) for a, _ in net.shapes]
    Ws, hs, us = net.weights(z), [x], []
    for W, scale in zip(Ws, scales):
        us.append(torch.bmm(hs[-1], W) / scale)
        hs.append(torch.relu(us[-1]))
    err = hs[-1] @ net.W_head - y
    dh = (err / (err.shape[1] * err.shape[2])) @ net.W_head.T
    grad = torch.zeros_like(z)
    for layer in reversed(range(net.n_hidden_layers)):
        du = dh * (us[layer] > 0)
        dW = torch.bmm(hs[layer].transpose(1, 2), du) / scales[layer]
        grad += dW.reshape(z.shape[0], -1) @ net.theta[layer].T
        if layer:
            dh = torch.bmm(du, Ws[layer].transpose(1, 2)) / scales[layer]
    return 0.5 * err.square().mean((1, 2)), grad


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**16), layers=st.integers(1, 2), n_input=st.sampled_from([4, 5, 16]))
def test_code_gradient_equals_the_plain_form(seed, layers, n_input):
    # Oracle: the plain form above. Scaling the weights instead of the pre-activations is exact
    # when sqrt(fan_in) is a power of two (S5's fan_in 16, float32): bitwise equal there, equal
    # to float32 rounding otherwise (the second layer's fan_in is 7).
    g = torch.Generator().manual_seed(seed)
    net = MultitaskHypernet(n_input, 7, 3, 4, layers, generator=g)
    x = torch.rand(3, 9, n_input, generator=g) * 3.4 - 1.7
    y, z = torch.randn(3, 9, 3, generator=g), torch.randn(3, 4, generator=g)
    with torch.no_grad():
        expected = _plain_code_gradient(net, x, y, z)
    got = net.code_gradient(x, y, z)
    if layers == 1 and n_input in (4, 16):
        assert all(torch.equal(a, b) for a, b in zip(got, expected))
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**16), log_scale=st.floats(-3, 3))
def test_permuted_positively_rescaled_units_leave_the_function_unchanged(seed, log_scale):
    net = _net()
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(7, generator=g)
    c = torch.exp(log_scale * torch.rand(7, generator=g, dtype=torch.float64))
    twin = _net()
    with torch.no_grad():
        twin.theta[0].copy_((net.modules_of(0)[:, :, perm] * c).reshape(4, -1))
        twin.W_head.copy_(net.W_head[perm] / c[:, None])
    x = torch.randn(2, 5, 5, generator=g, dtype=torch.float64)
    z = torch.randn(2, 4, generator=g, dtype=torch.float64)
    torch.testing.assert_close(twin(x, z), net(x, z), rtol=1e-9, atol=1e-12)


def test_init_is_truncated_at_two_standard_deviations():
    net = MultitaskHypernet(16, 32, 4, 12, generator=torch.Generator().manual_seed(0))
    assert net.theta[0].abs().max() <= 2 / math.sqrt(12)
    assert net.W_head.abs().max() <= 2 / math.sqrt(32)
    # the same generator seed gives the same network
    again = MultitaskHypernet(16, 32, 4, 12, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(again.theta[0], net.theta[0], rtol=0, atol=0)


def test_monolithic_forward_matches_concatenated_input():
    net = MonolithicMLP(5, 7, 3, 4, generator=torch.Generator().manual_seed(0)).double()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 6, 5, generator=g, dtype=torch.float64)
    z = torch.randn(2, 4, generator=g, dtype=torch.float64)
    inp = torch.cat([x, z[:, None].expand(2, 6, 4)], -1)
    expected = torch.relu(inp @ net.W[0].detach() / 3.0) @ net.W_head.detach()
    torch.testing.assert_close(net(x, z).detach(), expected, rtol=1e-12, atol=1e-12)


def test_bad_inputs_raise_one_line_errors():
    net = _net()
    with pytest.raises(ValueError, match=r"x must be \[tasks, batch, n_input=5\]"):
        net(torch.zeros(2, 5, dtype=torch.float64), torch.zeros(2, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"z must be \[tasks=2, M=4\]"):
        net(torch.zeros(2, 3, 5, dtype=torch.float64), torch.zeros(3, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="y must be"):
        net.code_gradient(torch.zeros(2, 3, 5), torch.zeros(2, 3, 2), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="n_modules must be an int >= 1"):
        MultitaskHypernet(5, 7, 3, 0)
    with pytest.raises(ValueError, match=r"layer must be in \[0, 1\)"):
        net.modules_of(1)
