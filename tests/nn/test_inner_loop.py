"""fit_codes: batched Adam equals one torch.optim.Adam per task; the hand-written gradient path
equals autograd; second order differentiates through the inner steps (finite differences)."""

from __future__ import annotations

import pytest
import torch

from dynascope.nn.inner_loop import fit_codes
from dynascope.nn.multitask_hypernet import MultitaskHypernet


def _problem():
    g = torch.Generator().manual_seed(0)
    net = MultitaskHypernet(4, 6, 2, 3, generator=g).double()
    xs = torch.randn(5, 3, 8, 4, generator=g, dtype=torch.float64)  # [steps, tasks, batch, in]
    ys = torch.randn(5, 3, 8, 2, generator=g, dtype=torch.float64)
    code_0 = torch.randn(3, generator=g, dtype=torch.float64)
    return net, xs, ys, code_0


def test_batched_adam_equals_one_torch_adam_per_task():
    # Oracle: torch.optim.Adam run separately on each task's code with the same inputs;
    # float64, so agreement to rounding.
    net, xs, ys, code_0 = _problem()

    def loss_fn(code, step):
        return 0.5 * (net(xs[step], code) - ys[step]).square().mean((1, 2))

    fitted = fit_codes(loss_fn, code_0, 3, steps=5, lr=0.05)
    for t in range(3):
        code = code_0.clone().requires_grad_(True)
        opt = torch.optim.Adam([code], lr=0.05)
        for step in range(5):
            opt.zero_grad()
            loss = 0.5 * (net(xs[step, t : t + 1], code[None]) - ys[step, t : t + 1]).square()
            loss.mean().backward()
            opt.step()
        torch.testing.assert_close(fitted[t], code.detach(), rtol=1e-10, atol=1e-12)
    assert not fitted.requires_grad


def test_hand_written_gradient_path_equals_autograd_path():
    net, xs, ys, code_0 = _problem()
    by_autograd = fit_codes(
        lambda c, s: 0.5 * (net(xs[s], c) - ys[s]).square().mean((1, 2)),
        code_0,
        3,
        steps=5,
        lr=0.05,
    )
    by_hand = fit_codes(
        None,
        code_0,
        3,
        steps=5,
        lr=0.05,
        grad_fn=lambda c, s: net.code_gradient(xs[s], ys[s], c)[1],
    )
    torch.testing.assert_close(by_hand, by_autograd, rtol=1e-10, atol=1e-12)


def test_zero_steps_return_the_initial_codes():
    _, _, _, code_0 = _problem()
    out = fit_codes(lambda c, s: c.sum(-1), code_0, 4, steps=0, lr=1.0)
    torch.testing.assert_close(out, code_0.expand(4, -1))


def test_second_order_gradient_matches_finite_differences():
    # Oracle: central differences of the outer loss along W_head's first entry, float64;
    # step 1e-6 gives truncation ~1e-12 and rounding ~1e-10, so rtol 1e-5.
    net, xs, ys, code_0 = _problem()

    def outer() -> torch.Tensor:
        def loss_fn(code, step):
            return 0.5 * (net(xs[step], code) - ys[step]).square().mean((1, 2))

        code = fit_codes(loss_fn, code_0, 3, steps=3, lr=0.05, second_order=True)
        return 0.5 * (net(xs[4], code) - ys[4]).square().mean()

    (grad,) = torch.autograd.grad(outer(), net.W_head)
    h = 1e-6
    with torch.no_grad():
        net.W_head[0, 0] += h
        up = outer().item()
        net.W_head[0, 0] -= 2 * h
        down = outer().item()
        net.W_head[0, 0] += h
    torch.testing.assert_close(grad[0, 0].item(), (up - down) / (2 * h), rtol=1e-5, atol=1e-10)
    # first order sees the codes as constants: a different gradient
    first = fit_codes(
        lambda c, s: 0.5 * (net(xs[s], c) - ys[s]).square().mean((1, 2)),
        code_0,
        3,
        steps=3,
        lr=0.05,
    )
    (grad_fo,) = torch.autograd.grad(0.5 * (net(xs[4], first) - ys[4]).square().mean(), net.W_head)
    assert not torch.allclose(grad_fo, grad)


def test_bad_arguments_raise():
    code_0 = torch.zeros(3)
    f = lambda c, s: c.sum(-1)  # noqa: E731
    with pytest.raises(ValueError, match="steps must be an int >= 0"):
        fit_codes(f, code_0, 2, steps=-1, lr=0.1)
    with pytest.raises(ValueError, match="lr and eps must be > 0"):
        fit_codes(f, code_0, 2, steps=1, lr=0.0)
    with pytest.raises(ValueError, match=r"code_0 must be \[M_hat\] or \[n_tasks=2, M_hat\]"):
        fit_codes(f, torch.zeros(3, 3), 2, steps=1, lr=0.1)
    with pytest.raises(ValueError, match="exactly one of loss_fn and grad_fn"):
        fit_codes(None, code_0, 2, steps=1, lr=0.1)
    with pytest.raises(ValueError, match="second_order needs loss_fn"):
        fit_codes(None, code_0, 2, steps=1, lr=0.1, grad_fn=f, second_order=True)
    with pytest.raises(ValueError, match=r"loss_fn must return \[tasks=2\]"):
        fit_codes(lambda c, s: c.sum(), code_0, 2, steps=1, lr=0.1)
