"""Tests for dynascope.probes.norms (parameter, gradient, update and last-layer norms, per group
and per layer), and for the probe contract of dynascope.probes.base (no grad, model mode, RNG
state and .grad left as found; the registry)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import dynascope.probes.base as base
from dynascope.nn import Transformer
from dynascope.optim import parameter_roles
from dynascope.probes import (
    PROBES,
    GradientNorms,
    LastLayerNorm,
    ParameterGroupNorms,
    ParameterNorms,
    Probe,
    ProbeContext,
    UpdateNorms,
    difference_norms,
    frobenius_norms,
    group_norms,
    isolated,
    last_layer_name,
    layer_groups,
    make_probe,
    register_probe,
    role_groups,
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


# -- groups ----------------------------------------------------------------------------------------
def transformer():
    """Distinct sizes: d_model 6, n_heads 3, d_head 2, d_mlp 5, d_vocab 11, d_out 7, n_ctx 4."""
    torch.manual_seed(0)
    model = Transformer(
        n_layers=2,
        d_model=6,
        n_heads=3,
        d_head=2,
        d_mlp=5,
        d_vocab=11,
        d_out=7,
        n_ctx=4,
        use_bias=True,
    )
    return model.double()


# Layer membership written out by hand (the oracle for layer_groups' rule).
LAYER_OF = {
    "L0": lambda n: n.startswith("blocks.0."),
    "L1": lambda n: n.startswith("blocks.1."),
    "W_E": lambda n: n == "W_E",
    "W_pos": lambda n: n == "W_pos",
    "ln_final": lambda n: n.startswith("ln_final."),
    "W_U": lambda n: n == "W_U",
    "b_U": lambda n: n == "b_U",
}


def concat_norm(tensors):
    """Oracle: the norm of all entries concatenated, float64."""
    return torch.linalg.norm(torch.cat([t.detach().double().flatten() for t in tensors])).item()


def test_group_norms_closed_forms():
    tensors = {"a": torch.ones(2, 3), "b": torch.full((4,), 2.0), "c": torch.tensor([3.0, 4.0])}
    groups = {"ab": ["a", "b"], "bc": ["b", "c"], "c_and_missing": ["c", "zz"], "none": ["zz"]}
    norms = group_norms(tensors, groups)
    assert list(norms) == ["ab", "bc", "c_and_missing"]  # a group with no present member: absent
    torch.testing.assert_close(
        torch.stack(list(norms.values())),
        torch.tensor([math.sqrt(6 + 16), math.sqrt(16 + 25), 5.0], dtype=F64),
    )
    with pytest.raises(ValueError, match="distinct names \\(got 'a' twice\\)"):
        group_norms([("a", torch.ones(1)), ("a", torch.ones(1))], groups)


def test_difference_norms():
    now = {"a": torch.tensor([1.0, 2.0]), "b": torch.ones(3), "c": torch.ones(2)}
    before = {"a": torch.tensor([4.0, 6.0]), "b": torch.ones(2), "d": torch.ones(1)}
    assert difference_norms(now, before) == {"a": torch.tensor(5.0, dtype=F64)}  # b: new shape


def test_role_groups_partition_the_trainable_parameters_as_parameter_roles():
    model = transformer()
    model.W_pos.requires_grad_(False)
    groups = role_groups(model)
    assert list(groups) == ["attention", "matrices", "vectors"]
    expected = {}
    for name, _, role in parameter_roles(model):
        expected.setdefault(role, []).append(name)
    assert groups == expected
    assert "W_pos" not in {n for names in groups.values() for n in names}
    assert "blocks.1.attn.W_O" in groups["attention"] and "blocks.0.attn.b_Q" in groups["vectors"]


def test_layer_groups_rule():
    names = [n for n, _ in transformer().named_parameters()]
    groups = layer_groups(names)
    assert set(groups) == set(LAYER_OF)
    for group, member in LAYER_OF.items():
        assert groups[group] == [n for n in names if member(n)]
    gpt2 = ["transformer.h.0.attn.c_attn.weight", "transformer.h.1.mlp.c_fc.bias",
            "transformer.wte.weight", "lm_head.weight", "bias"]  # fmt: skip
    assert layer_groups(gpt2, layer_pattern=r"^transformer\.h\.(\d+)\.") == {
        "L0": [gpt2[0]], "L1": [gpt2[1]], "transformer.wte": [gpt2[2]], "lm_head": [gpt2[3]],
        "bias": ["bias"],
    }  # fmt: skip
    with pytest.raises(ValueError, match="^layer_pattern is not a valid regular expression"):
        layer_groups(names, layer_pattern="(")
    with pytest.raises(ValueError, match="^layer_pattern needs a capture group"):
        ParameterGroupNorms(layer_pattern="blocks")


def test_parameter_group_norms_match_hand_computation():
    model = transformer()
    params = dict(model.named_parameters())
    out = ParameterGroupNorms()(model, ProbeContext(step=0))
    roles = {"attention": [], "matrices": [], "vectors": []}
    for name, p, role in parameter_roles(model):
        roles[role].append(p)
    expected = {"param_norm.total": concat_norm(params.values())}
    expected |= {f"param_norm.role.{r}": concat_norm(ps) for r, ps in roles.items()}
    expected |= {
        f"param_norm.{g}": concat_norm([p for n, p in params.items() if member(n)])
        for g, member in LAYER_OF.items()
        if g != "b_U"  # b_U is all zeros at init: norm 0 (checked below)
    }
    assert set(out) == set(expected) | {"param_norm.b_U"}
    assert all(isinstance(v, float) for v in out.values())
    for key, value in expected.items():
        assert out[key] == pytest.approx(value, rel=1e-12), key
    assert out["param_norm.b_U"] == 0.0


def test_layer_group_colliding_with_a_key_is_an_error():
    model = nn.Module()
    model.total = nn.Linear(2, 2)  # layer group "total" -> "param_norm.total"
    with pytest.raises(ValueError, match="layer group 'total' collides with the key 'param_norm"):
        ParameterGroupNorms()(model, ProbeContext(step=0))


# -- gradients -------------------------------------------------------------------------------------
def test_gradient_norms_of_a_known_gradient():
    """loss = sum of every parameter entry: every gradient entry is 1, a group's norm sqrt(n)."""
    model = transformer()
    assert GradientNorms()(model, ProbeContext(step=0)) == {}  # no backward yet
    sum(p.sum() for p in model.parameters()).backward()
    model.W_U.grad = None  # without a gradient: contributes nothing, key absent
    model.b_U.grad = None
    params = dict(model.named_parameters())
    numel = {n: p.numel() for n, p in params.items() if n not in ("W_U", "b_U")}
    out = GradientNorms()(model, ProbeContext(step=1))
    expected = {"grad_norm.total": math.sqrt(sum(numel.values()))}
    roles = {"attention": 0, "matrices": 0, "vectors": 0}
    for name, _, role in parameter_roles(model):
        roles[role] += numel.get(name, 0)
    expected |= {f"grad_norm.role.{r}": math.sqrt(k) for r, k in roles.items()}
    expected |= {
        f"grad_norm.{g}": math.sqrt(sum(k for n, k in numel.items() if member(n)))
        for g, member in LAYER_OF.items()
        if g not in ("W_U", "b_U")
    }
    assert set(out) == set(expected)
    for key, value in expected.items():
        assert out[key] == pytest.approx(value, rel=1e-12), key


# -- updates ---------------------------------------------------------------------------------------
def test_update_norms_after_a_hand_applied_update():
    model = transformer()
    model.W_pos.requires_grad_(False)  # frozen: not tracked
    probe = UpdateNorms()
    assert probe(model, ProbeContext(step=2)) == {}  # first call: snapshot only
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    for name, snap in probe._snapshot.items():  # clones on the parameter's device, no aliasing
        assert snap.device == params[name].device
        assert snap.untyped_storage().data_ptr() != params[name].untyped_storage().data_ptr()
    before = {n: p.detach().clone() for n, p in params.items()}
    generator = torch.Generator().manual_seed(1)
    deltas = {
        n: 1e-2 * torch.randn(p.shape, generator=generator, dtype=F64) for n, p in params.items()
    }
    with torch.no_grad():
        for name, p in params.items():
            p.add_(deltas[name])  # in place: a snapshot aliasing p would see no update

    out = probe(model, ProbeContext(step=5))

    def group(member):
        return [n for n in params if member(n)]

    groups = {"total": list(params)}
    for name, _, role in parameter_roles(model):
        groups.setdefault(f"role.{role}", []).append(name)
    groups |= {g: group(m) for g, m in LAYER_OF.items() if group(m)}
    assert "W_pos" not in groups
    expected = {"update_norm.interval": 3.0}
    for g, names in groups.items():
        expected[f"update_norm.{g}"] = concat_norm(deltas[n] for n in names)
        if g != "b_U":  # zero at the previous call
            expected[f"update_norm.relative.{g}"] = concat_norm(
                deltas[n] for n in names
            ) / concat_norm(before[n] for n in names)
    assert set(out) == set(expected) | {"update_norm.relative.b_U"}
    for key, value in expected.items():
        assert out[key] == pytest.approx(value, rel=1e-10), key  # float64: (p + d) - p ~ d
    assert out["update_norm.relative.b_U"] == math.inf

    still = probe(model, ProbeContext(step=6))  # nothing moved since the last call
    assert still["update_norm.total"] == 0.0 and still["update_norm.interval"] == 1.0
    assert still["update_norm.relative.total"] == 0.0


def test_relative_update_of_a_zero_group_that_did_not_move_is_nan():
    linear = nn.Linear(2, 3)
    nn.init.zeros_(linear.bias)
    probe = UpdateNorms()
    probe(linear, ProbeContext(step=0))
    out = probe(linear, ProbeContext(step=1))
    assert out["update_norm.bias"] == 0.0 and math.isnan(out["update_norm.relative.bias"])  # 0/0


def test_update_norms_restart_on_another_model_and_after_reset():
    probe = UpdateNorms()
    a, b = tiny_model(), tiny_model()
    probe(a, ProbeContext(step=0))
    assert probe(b, ProbeContext(step=1)) == {}
    assert probe(b, ProbeContext(step=2))["update_norm.total"] == 0.0
    probe.reset()
    assert probe(b, ProbeContext(step=3)) == {}


def test_sgd_update_norm_is_lr_times_grad_norm_in_trainer_order():
    """Trainer order: zero_grad(set_to_none), backward, optimizer.step, then the probes. For SGD
    without momentum the update is -lr * grad, so per group ||update|| = lr * ||grad||."""
    model = transformer()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    grads, updates = GradientNorms(), UpdateNorms()
    generator = torch.Generator().manual_seed(0)
    updates(model, ProbeContext(step=0))
    for step in range(1, 4):
        x = torch.randint(0, 11, (2, 4), generator=generator)
        optimizer.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        optimizer.step()
        g = grads(model, ProbeContext(step=step))
        u = updates(model, ProbeContext(step=step))
        keys = [k.replace("grad_norm.", "") for k in g]
        assert len(keys) == 1 + 3 + len(LAYER_OF)
        for key in keys:
            assert u[f"update_norm.{key}"] == pytest.approx(0.1 * g[f"grad_norm.{key}"], rel=1e-8)


# -- last layer ------------------------------------------------------------------------------------
class Custom(nn.Module):
    def __init__(self, linear_first=False):
        super().__init__()
        if linear_first:
            self.lin = nn.Linear(2, 3)
        self.a = nn.Parameter(torch.ones(2, 3))
        self.b = nn.Parameter(torch.ones(3))
        self.c = nn.Parameter(torch.full((3, 3), 2.0))
        self.d = nn.Parameter(torch.ones(2, 2, 2))


def test_last_layer_identification():
    model = transformer()
    assert last_layer_name(model) == "W_U"  # not blocks.1.mlp.W_out, registered later
    assert last_layer_name(nn.Sequential(nn.Linear(2, 2), model)) == "1.W_U"
    seq = tiny_model()
    assert last_layer_name(seq) == "2.weight"
    assert last_layer_name(seq, "0.weight") == "0.weight"
    assert last_layer_name(Custom()) == "c"  # no nn.Linear: the last 2-D parameter
    assert last_layer_name(Custom(linear_first=True)) == "lin.weight"  # nn.Linear wins
    tied = nn.Module()
    tied.embed = nn.Embedding(11, 5)
    tied.head = nn.Linear(5, 11, bias=False)
    tied.head.weight = tied.embed.weight
    assert last_layer_name(tied) == "embed.weight"
    with pytest.raises(ValueError, match="^parameter: 'nope' is not a parameter of the model"):
        last_layer_name(seq, "nope")
    with pytest.raises(ValueError, match="^parameter: the model has no W_U, nn.Linear or 2-D"):
        last_layer_name(nn.LayerNorm(4))


def test_last_layer_norm_probe():
    model = transformer()
    out = LastLayerNorm()(model, ProbeContext(step=0))
    assert out == {"last_layer.norm": pytest.approx(concat_norm([model.W_U]), rel=1e-12)}
    seq = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    out = LastLayerNorm()(seq, ProbeContext(step=0))
    weight_only = concat_norm([seq[2].weight])
    assert out["last_layer.norm"] == pytest.approx(weight_only, rel=1e-6)  # float32 weights
    assert weight_only != pytest.approx(concat_norm([seq[2].weight, seq[2].bias]), rel=1e-6)
    picked = LastLayerNorm(parameter="0.weight")(seq, ProbeContext(step=0))
    assert picked["last_layer.norm"] == pytest.approx(concat_norm([seq[0].weight]), rel=1e-6)


def test_norm_probes_are_registered():
    for name, cls in [
        ("parameter_group_norms", ParameterGroupNorms),
        ("gradient_norms", GradientNorms),
        ("update_norms", UpdateNorms),
        ("last_layer_norm", LastLayerNorm),
    ]:
        assert PROBES[name] is cls and isinstance(make_probe(name), cls)


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


CONTRACT_PROBES = [
    MeddlingProbe,
    ParameterNorms,
    ParameterGroupNorms,
    GradientNorms,
    UpdateNorms,
    LastLayerNorm,
]


@pytest.mark.parametrize("probe_cls", CONTRACT_PROBES)
def test_probe_leaves_mode_rng_and_grad_untouched(probe_cls):
    probe = probe_cls()
    model = tiny_model()
    model.train()
    model[2].eval()  # mixed modes must come back exactly
    model(torch.randn(4, 3)).sum().backward()
    model[0].bias.grad = None  # a parameter without a gradient must stay without one
    grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    params = [p.detach().clone() for p in model.parameters()]
    modes = [m.training for m in model.modules()]
    rng = torch.get_rng_state()

    probe(model, ProbeContext(step=6))  # UpdateNorms measures from its second call on
    out = probe(model, ProbeContext(step=7, batch={"x": torch.ones(2, 3)}))

    assert out
    assert [m.training for m in model.modules()] == modes
    torch.testing.assert_close(torch.get_rng_state(), rng, rtol=0, atol=0)
    for p, g, p0 in zip(model.parameters(), grads, params):
        if g is None:
            assert p.grad is None
        else:
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
