"""Edge of stability: optimizers' thresholds, Adam's preconditioner, the preconditioned sharpness.

Oracles:
- Thresholds of SGD (plain, heavy-ball with dampening, Nesterov): torch.optim.SGD itself on a
  1-D quadratic ``½ a θ²``, 200 steps at 0.95× and 1.05× the threshold: |θ| shrinks below
  1e-2·|θ_0| and grows above 1e2·|θ_0|. Adam's (P frozen, the regime its threshold is about):
  the spectral radius of the 2×2 linear map of ``(θ, m)`` is < 1 at 0.99× and > 1 at 1.01×.
- P = √v̂ + ε: torch's own Adam/AdamW step, ``θ_{t+1} − θ_t = −η m̂_{t+1} / P_{t+1}``,
  to 1e-12 relative (float64; with amsgrad too).
- λ_max(P⁻¹H): dense Hessian (``torch.func.hessian``, float64) and ``eigvals`` of the dense
  non-symmetric P⁻¹H; Lanczos run to convergence (tol 1e-10) agrees to 1e-10 relative
  (measured 1.3e-15; 3.5e-12 at the default tol 1e-5, 5e-9 at the probe's 20 steps, tol 1e-4).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

import dynascope as ds
from dynascope.probes import (
    ProbeContext,
    Sharpness,
    adam_preconditioner,
    preconditioned_sharpness,
    stability_threshold,
)


def _trained_mlp(optimizer_cls=torch.optim.Adam, steps=5, **kwargs):
    """tanh MLP 4-6-3 (P = 51), cross-entropy on 10 examples, float64, after ``steps`` steps."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))
    net = net.double()
    x = torch.randn(10, 4, dtype=torch.float64)
    y = torch.randint(0, 3, (10,))
    opt = optimizer_cls(net.parameters(), lr=0.05, **kwargs)
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()

    def loss_fn(p):
        return F.cross_entropy(functional_call(net, p, (x,)), y)

    return net, opt, loss_fn, {"x": x, "y": y}


# -- thresholds ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("momentum", "dampening", "nesterov", "formula"),
    [
        (0.0, 0.0, False, lambda b, d, lr: 2 / lr),
        (0.9, 0.0, False, lambda b, d, lr: (2 + 2 * b) / lr),
        (0.5, 0.3, False, lambda b, d, lr: (2 + 2 * b) / ((1 - d) * lr)),
        (0.9, 0.0, True, lambda b, d, lr: (2 + 2 * b) / ((1 + 2 * b) * lr)),
    ],
    ids=["gd", "heavy-ball", "dampened", "nesterov"],
)
def test_sgd_threshold_is_where_torch_sgd_turns_unstable(momentum, dampening, nesterov, formula):
    lr = 0.01
    make = lambda p: torch.optim.SGD(  # noqa: E731
        p, lr=lr, momentum=momentum, dampening=dampening, nesterov=nesterov
    )
    edge = stability_threshold(make([torch.zeros(1, requires_grad=True)]))
    assert edge.value == pytest.approx(formula(momentum, dampening, lr), rel=1e-12)
    assert not edge.preconditioned
    for factor, stable in ((0.95, True), (1.05, False)):
        theta = torch.tensor([1e-3], dtype=torch.float64, requires_grad=True)
        opt = make([theta])
        for _ in range(200):
            opt.zero_grad()
            (0.5 * factor * edge.value * theta**2).sum().backward()
            opt.step()
        size = abs(float(theta.detach())) / 1e-3
        assert (size < 1e-2) if stable else (size > 1e2), (factor, size)


def test_adam_threshold_is_38_over_lr_and_the_frozen_preconditioner_map_turns_unstable_there():
    theta = torch.zeros(1, requires_grad=True)
    edge = stability_threshold(torch.optim.Adam([theta], lr=0.002, betas=(0.9, 0.999)))
    assert edge.preconditioned and edge.value == pytest.approx(38 / 0.002, rel=1e-12)
    for beta1 in (0.0, 0.5, 0.9, 0.99):
        lr = 0.01
        value = stability_threshold(torch.optim.AdamW([theta], lr=lr, betas=(beta1, 0.99))).value
        for factor, stable in ((0.99, True), (1.01, False)):
            a = factor * value  # an eigenvalue of P⁻¹H; in P^{1/2} coordinates P = 1
            # m' = β₁ m + (1 − β₁) a θ,  θ' = θ − η m'  on the state (θ, m)
            step = torch.tensor(
                [[1 - lr * (1 - beta1) * a, -lr * beta1], [(1 - beta1) * a, beta1]],
                dtype=torch.float64,
            )
            radius = float(torch.linalg.eigvals(step).abs().max())
            assert (radius < 1) if stable else (radius > 1), (beta1, factor, radius)


def test_threshold_errors_name_the_optimizer_and_the_field():
    theta = torch.zeros(1, requires_grad=True)
    with pytest.raises(ValueError, match=r"knows torch.optim.SGD, .*Adam.*\(got RMSprop\)$"):
        stability_threshold(torch.optim.RMSprop([theta], lr=0.1))
    with pytest.raises(ValueError, match=r"lr must be a finite float > 0 or an optimizer"):
        stability_threshold(-1.0)
    other = torch.zeros(1, requires_grad=True)
    groups = [{"params": [theta], "momentum": 0.9}, {"params": [other], "momentum": 0.5}]
    with pytest.raises(ValueError, match=r"param_groups must share one momentum"):
        stability_threshold(torch.optim.SGD(groups, lr=0.1))


# -- Adam's preconditioner ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "kwargs"),
    [
        (torch.optim.Adam, {}),
        (torch.optim.AdamW, {"weight_decay": 0.0}),
        (torch.optim.Adam, {"amsgrad": True}),
    ],
    ids=["adam", "adamw", "amsgrad"],
)
def test_preconditioner_is_the_denominator_of_torch_adams_step(cls, kwargs):
    net, opt, loss_fn, batch = _trained_mlp(cls, steps=3, betas=(0.8, 0.9), eps=1e-3, **kwargs)
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    opt.zero_grad()
    F.cross_entropy(net(batch["x"]), batch["y"]).backward()
    opt.step()  # step t = 4
    named = dict(net.named_parameters())
    diag = adam_preconditioner(opt, named)
    for name, p in named.items():
        m_hat = opt.state[p]["exp_avg"] / (1 - 0.8**4)
        torch.testing.assert_close(
            p.detach() - before[name], -0.05 * m_hat / diag[name], rtol=1e-12, atol=1e-15
        )
        assert bool((diag[name] >= 1e-3).all())


def test_preconditioner_refuses_other_optimizers_unstepped_state_and_foreign_tensors():
    net = torch.nn.Linear(3, 2)
    named = dict(net.named_parameters())
    with pytest.raises(ValueError, match=r"torch.optim.Adam or torch.optim.AdamW \(got SGD\)$"):
        adam_preconditioner(torch.optim.SGD(net.parameters(), lr=0.1), named)
    with pytest.raises(ValueError, match=r"params\['weight'\] has no Adam second moment yet"):
        adam_preconditioner(torch.optim.Adam(net.parameters()), named)
    with pytest.raises(ValueError, match=r"params\['w'\] is not a parameter of the optimizer"):
        adam_preconditioner(torch.optim.Adam(net.parameters()), {"w": torch.zeros(2)})


# -- preconditioned sharpness -------------------------------------------------------------------


def test_preconditioned_sharpness_matches_the_dense_eigenvalues_of_p_inverse_h(dense_hessian):
    net, opt, loss_fn, _ = _trained_mlp(torch.optim.Adam, steps=5)
    named = dict(net.named_parameters())
    H = dense_hessian(loss_fn, named)
    P = torch.cat([d.reshape(-1) for d in adam_preconditioner(opt, named).values()])
    dense = torch.linalg.eigvals(H / P[:, None]).real.max()  # P⁻¹H, not symmetric
    symmetric = torch.linalg.eigvalsh(H / (P.sqrt()[:, None] * P.sqrt()[None, :])).max()
    torch.testing.assert_close(dense, symmetric, rtol=1e-9, atol=0)
    raw = torch.linalg.eigvalsh(H).max()
    assert not math.isclose(float(dense), float(raw), rel_tol=0.1)  # P changes the answer
    value = preconditioned_sharpness(loss_fn, named, opt, iters=51, tol=1e-10)
    assert value == pytest.approx(float(dense), rel=1e-10)


def test_preconditioned_sharpness_refuses_sgd():
    net, opt, loss_fn, _ = _trained_mlp(torch.optim.SGD, steps=1)
    with pytest.raises(ValueError, match=r"needs an optimizer with a second-moment state"):
        preconditioned_sharpness(loss_fn, dict(net.named_parameters()), opt)


# -- the Sharpness probe ------------------------------------------------------------------------


def test_probe_reports_the_momentum_threshold_for_sgd():
    net, opt, loss_fn, batch = _trained_mlp(torch.optim.SGD, steps=1, momentum=0.9)
    loss = lambda output, b: F.cross_entropy(output, b["y"])  # noqa: E731
    out = Sharpness(loss=loss, lr=opt, tol=1e-8)(net, ProbeContext(step=1, batch=batch))
    assert out["sharpness.threshold"] == pytest.approx(3.8 / 0.05, rel=1e-12)
    assert out["sharpness.edge_ratio"] == out["sharpness.lambda_max"] / out["sharpness.threshold"]
    assert out["sharpness.two_over_lr"] == 2 / 0.05  # the existing keys stay
    assert "sharpness.preconditioned_lambda_max" not in out


def test_probe_reports_the_preconditioned_sharpness_for_adam_after_its_first_step(dense_hessian):
    net, opt, loss_fn, batch = _trained_mlp(torch.optim.Adam, steps=0)
    loss = lambda output, b: F.cross_entropy(output, b["y"])  # noqa: E731
    probe = Sharpness(loss=loss, lr=opt, iters=51, tol=1e-10)
    first = probe(net, ProbeContext(step=0, batch=batch))
    assert "sharpness.preconditioned_lambda_max" not in first  # no second moment yet
    assert "sharpness.edge_ratio" not in first and "sharpness.two_over_lr" in first
    for _ in range(5):
        opt.zero_grad()
        F.cross_entropy(net(batch["x"]), batch["y"]).backward()
        opt.step()
    out = probe(net, ProbeContext(step=5))
    named = dict(net.named_parameters())
    H = dense_hessian(loss_fn, named)
    P = torch.cat([d.reshape(-1) for d in adam_preconditioner(opt, named).values()])
    dense = float(torch.linalg.eigvals(H / P[:, None]).real.max())
    assert out["sharpness.preconditioned_lambda_max"] == pytest.approx(dense, rel=1e-10)
    assert out["sharpness.preconditioned_threshold"] == pytest.approx(38 / 0.05, rel=1e-12)
    assert out["sharpness.edge_ratio"] == pytest.approx(dense / (38 / 0.05), rel=1e-10)
    assert "sharpness.threshold" not in out


@pytest.mark.slow  # trains the docs' Digits MLP (P = 4810): 7-14 s on a loaded 2-core machine
def test_docs_snippet_runs_as_written_with_fewer_steps(tmp_path, monkeypatch):
    text = (Path(__file__).parents[2] / "docs" / "instruments.md").read_text()
    section = text[text.index("## Adam's edge of stability") :]
    code = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    for full, short in [
        ("range(1, 1001)", "range(1, 3)"),
        ("ds.EveryN(100)", "ds.EveryN(1)"),
        ("Sharpness(loss=loss_fn, lr=opt)", "Sharpness(loss=loss_fn, lr=opt, iters=4)"),
    ]:
        assert full in code
        code = code.replace(full, short)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/instruments.md", "exec"), {})
    run = ds.load_run(tmp_path / "runs" / "adam-eos")
    assert sorted(run.scalar("sharpness.edge_ratio").index) == [1, 2]  # none before a step
    assert run.scalar("sharpness.preconditioned_threshold").tolist() == pytest.approx([3800.0] * 2)
