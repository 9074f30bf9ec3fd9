"""Tests for dynascope.probes.norms, and for the probe contract of dynascope.probes.base
(no grad, model mode, RNG state and .grad left as found; the registry)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import dynascope.probes.base as base
from dynascope.probes import (
    PROBES,
    ParameterNorms,
    Probe,
    ProbeContext,
    frobenius_norms,
    isolated,
    make_probe,
    register_probe,
)

F64 = torch.float64


def test_frobenius_norms_closed_forms():
    tensors = {
        "ones": torch.ones(2, 3, 4),  # sqrt(24)
        "eye": torch.eye(5),  # sqrt(5)
        "vec": torch.tensor([3.0, -4.0]),  # 5
        "empty": torch.zeros(0, 3),  # 0
    }
    norms = frobenius_norms(tensors)
    assert list(norms) == list(tensors)
    torch.testing.assert_close(
        torch.stack(list(norms.values())),
        torch.tensor([math.sqrt(24), math.sqrt(5), 5.0, 0.0], dtype=F64),
    )
    assert frobenius_norms(list(tensors.items()))["vec"].dtype == F64


def test_frobenius_norms_rejects_duplicate_names():
    with pytest.raises(ValueError, match="distinct names \\(got 'w' twice\\)"):
        frobenius_norms([("w", torch.ones(2)), ("w", torch.ones(3))])


def tiny_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 5), nn.Dropout(0.5), nn.Linear(5, 2, bias=False))


def test_parameter_norms_probe_keys_and_values():
    model = tiny_model()
    out = ParameterNorms()(model, ProbeContext(step=0))
    params = dict(model.named_parameters())
    assert set(out) == {f"norm.{name}" for name in params} | {"norm.total"}
    assert all(isinstance(v, float) for v in out.values())
    names = list(params)
    expected = torch.stack([p.detach().double().flatten().norm() for p in params.values()])
    torch.testing.assert_close(torch.tensor([out[f"norm.{n}"] for n in names], dtype=F64), expected)
    all_entries = torch.cat([p.detach().double().flatten() for p in params.values()])
    torch.testing.assert_close(out["norm.total"], all_entries.norm().item())


def test_parameter_norms_of_a_model_without_parameters():
    assert ParameterNorms()(nn.ReLU(), ProbeContext(step=0)) == {"norm.total": 0.0}


class MeddlingProbe(Probe):
    """Does everything a probe must not leak: switches mode, draws random numbers, runs a
    forward pass that would build a graph. Records what it saw inside."""

    name = "meddling"

    def measure(self, model, ctx):
        self.grad_enabled = torch.is_grad_enabled()
        model.eval()
        model[1].train()
        torch.rand(3)
        y = model(torch.randn(4, 3)).sum()
        self.requires_grad = y.requires_grad
        return {"y": y.item(), "step": float(ctx.step)}


class FailingProbe(MeddlingProbe):
    def measure(self, model, ctx):
        super().measure(model, ctx)
        raise RuntimeError("probe failed")


@pytest.mark.parametrize("probe", [MeddlingProbe(), ParameterNorms()])
def test_probe_leaves_mode_rng_and_grad_untouched(probe):
    model = tiny_model()
    model.train()
    model[2].eval()  # mixed modes must come back exactly
    model(torch.randn(4, 3)).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    params = [p.detach().clone() for p in model.parameters()]
    modes = [m.training for m in model.modules()]
    rng = torch.get_rng_state()

    out = probe(model, ProbeContext(step=7, batch={"x": torch.ones(2, 3)}))

    assert out
    assert [m.training for m in model.modules()] == modes
    torch.testing.assert_close(torch.get_rng_state(), rng, rtol=0, atol=0)
    for p, g, p0 in zip(model.parameters(), grads, params):
        torch.testing.assert_close(p.grad, g, rtol=0, atol=0)
        torch.testing.assert_close(p.detach(), p0, rtol=0, atol=0)
    if isinstance(probe, MeddlingProbe):
        assert not probe.grad_enabled and not probe.requires_grad
        assert out["step"] == 7.0


def test_isolated_restores_on_exception():
    model = tiny_model()
    model.train()
    rng = torch.get_rng_state()
    with pytest.raises(RuntimeError, match="probe failed"):
        FailingProbe()(model, ProbeContext(step=0))
    assert all(m.training for m in model.modules())
    torch.testing.assert_close(torch.get_rng_state(), rng, rtol=0, atol=0)
    assert torch.is_grad_enabled()
    with isolated(model):
        assert not torch.is_grad_enabled()


def test_probe_registry(monkeypatch):
    monkeypatch.setattr(base, "PROBES", dict(PROBES))
    assert make_probe("parameter_norms").name == "parameter_norms"

    @register_probe("test_meddling")
    class Registered(MeddlingProbe):
        pass

    assert Registered.name == "test_meddling" and base.PROBES["test_meddling"] is Registered
    assert isinstance(make_probe("test_meddling"), Registered)
    with pytest.raises(ValueError, match="probe 'test_meddling' is already registered"):
        register_probe("test_meddling")(MeddlingProbe)
    with pytest.raises(ValueError, match="register_probe needs a Probe subclass"):
        register_probe("test_not_a_probe")(int)
    with pytest.raises(
        ValueError, match=r"unknown probe 'nope' \(allowed: .*parameter_norms, .*test_meddling"
    ):
        make_probe("nope")
    assert "test_meddling" not in PROBES  # the real registry is untouched
