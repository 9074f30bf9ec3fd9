"""Parametrizations: roles from shapes, per-parameter learning rates, and equal functions at init.

Oracles: the mup library's rules written out by hand (MuAdam: matrix-like lr / m; MuSGD:
vector-like lr * m); Adam's first step moves every entry by lr (up to eps), so the measured
update of each weight is its group's learning rate; exact equalities where theory says the
parametrizations coincide (muP == SP at the base width; NTK == SP at init at any width).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

from dynascope.nn import Transformer
from dynascope.nn.mlp import MLP
from dynascope.nn.parametrization import (
    ReadoutMultiplier,
    abc_rule,
    apply_mup_attention,
    apply_mup_readout,
    infer_shapes,
    parameter_groups,
)


def _mlp(width: int, parametrization: str = "mup", **kw) -> MLP:
    return MLP(7, width, 3, depth=2, parametrization=parametrization, base_width=8, **kw)


def _lrs(groups) -> dict[str, float]:
    """Parameter id -> learning rate."""
    return {id(p): g["lr"] for g in groups for p in g["params"]}


def test_infer_shapes_on_an_mlp_gives_the_mup_roles():
    shapes = infer_shapes(_mlp(32, use_bias=True), _mlp(8, use_bias=True))
    assert {k: (s.role, s.width_mult) for k, s in shapes.items()} == {
        "layers.0.weight": ("input", 4.0),
        "layers.0.bias": ("vector", 4.0),
        "layers.1.weight": ("hidden", 4.0),
        "layers.1.bias": ("vector", 4.0),
        "layers.2.weight": ("readout", 4.0),
        "layers.2.bias": ("fixed", 1.0),
    }


def test_infer_shapes_reads_torch_linear_and_attention_layouts():
    lin = infer_shapes(nn.Linear(12, 5), nn.Linear(4, 5))  # weight [out, in]: fan-in grows
    assert lin["weight"].role == "readout" and lin["weight"].width_mult == 3.0
    wide = Transformer(n_layers=1, d_model=24, n_heads=6, d_mlp=48, d_vocab=11, d_out=5, n_ctx=7)
    base = Transformer(n_layers=1, d_model=8, n_heads=2, d_mlp=16, d_vocab=11, d_out=5, n_ctx=7)
    shapes = infer_shapes(wide, base)
    roles = {k: (s.role, s.fan_in_mult, s.fan_out_mult) for k, s in shapes.items()}
    assert roles["blocks.0.attn.W_Q"] == ("hidden", 3.0, 3.0)  # fan-in d_model, fan-out heads
    assert roles["blocks.0.attn.W_O"] == ("hidden", 3.0, 3.0)  # fan-in n_heads * d_head
    assert roles["blocks.0.mlp.W_in"] == ("hidden", 3.0, 3.0)
    assert roles["W_E"][0] == "input" and roles["W_pos"][0] == "input"
    assert roles["W_U"][0] == "readout" and roles["b_U"][0] == "fixed"
    assert roles["ln_final.weight"][0] == "vector"


def test_mup_adam_and_sgd_learning_rates_follow_the_mup_library_rules():
    model, base, lr, m = _mlp(32, use_bias=True), _mlp(8, use_bias=True), 0.1, 4.0
    names = dict(model.named_parameters())
    expected_adam = {"layers.1.weight": lr / m}  # MuAdam: only matrix-like is divided by m
    adam = _lrs(parameter_groups(model, base, lr=lr, optimizer="adam"))
    for name, p in names.items():
        assert adam[id(p)] == pytest.approx(expected_adam.get(name, lr)), name
    sgd = _lrs(parameter_groups(model, base, lr=lr, optimizer="sgd"))
    # MuSGD: vector-like (input, readout, biases) lr * m; square hidden matrix lr * 1; fixed lr
    expected_sgd = {"layers.1.weight": lr, "layers.2.bias": lr}
    for name, p in names.items():
        assert sgd[id(p)] == pytest.approx(expected_sgd.get(name, lr * m)), name
    ntk = _lrs(parameter_groups(model, base, lr=lr, parametrization="ntk"))
    for name, p in names.items():
        factor = 1.0 if name == "layers.2.bias" else m**-0.5
        assert ntk[id(p)] == pytest.approx(lr * factor), name
    standard = _lrs(parameter_groups(model, base, lr=lr, parametrization="standard"))
    assert set(standard.values()) == {lr}


def test_adam_first_step_moves_each_weight_by_its_group_learning_rate():
    """Adam's first update is lr * g / (|g| + eps): entries with |g| >> eps move by lr."""
    torch.manual_seed(0)
    model, base = _mlp(32, readout_init="default"), _mlp(8)
    opt = torch.optim.Adam(parameter_groups(model, base, lr=1e-2), eps=1e-12)
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    x, y = torch.randn(5, 7), torch.randint(3, (5,))
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    for name, p in model.named_parameters():
        step = (p.detach() - before[name]).abs()
        expected = 1e-2 / 4 if name == "layers.1.weight" else 1e-2
        moved = step[step > 0]
        torch.testing.assert_close(moved, torch.full_like(moved, expected), rtol=1e-4, atol=0)


def test_mup_equals_sp_at_the_base_width_at_init_and_after_training():
    """At m = 1 muP (readout init "default") is SP: same weights, outputs and learning rates."""
    x, y = torch.randn(6, 7), torch.randint(3, (6,))
    outs = {}
    for parametrization in ("standard", "mup"):
        torch.manual_seed(3)
        model = _mlp(8, parametrization, readout_init="default")
        base = _mlp(8, parametrization)
        opt = torch.optim.Adam(
            parameter_groups(model, base, lr=1e-2, parametrization=parametrization)
        )
        init = model(x).detach()
        for _ in range(3):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        outs[parametrization] = (init, model(x).detach())
    torch.testing.assert_close(outs["mup"][0], outs["standard"][0], rtol=0, atol=0)
    torch.testing.assert_close(outs["mup"][1], outs["standard"][1], rtol=0, atol=0)


@pytest.mark.parametrize("width", [8, 40])
def test_ntk_and_sp_compute_the_same_function_at_init(width):
    """x @ (Z / sqrt(fan_in)) == (x @ Z) / sqrt(fan_in): float32 rounding only (rtol 1e-5)."""
    x = torch.randn(6, 7)
    torch.manual_seed(1)
    sp = _mlp(width, "standard")(x)
    torch.manual_seed(1)
    ntk = _mlp(width, "ntk")(x)
    torch.testing.assert_close(ntk, sp, rtol=1e-5, atol=1e-6)


def test_transformer_mup_is_the_identity_at_base_width_and_divides_the_readout_by_m():
    kw = dict(n_layers=1, n_heads=2, d_vocab=11, d_out=5, n_ctx=7)
    x = torch.randint(11, (2, 7))
    torch.manual_seed(0)
    model = Transformer(d_model=8, d_mlp=16, **kw)
    ref = model(x).detach()
    assert apply_mup_attention(model, base_d_head=4) == 1
    apply_mup_readout(model, "W_U", 1.0)
    torch.testing.assert_close(model(x), ref, rtol=0, atol=0)

    torch.manual_seed(0)
    wide = Transformer(d_model=32, d_mlp=64, n_layers=1, n_heads=8, d_vocab=11, d_out=5, n_ctx=7)
    W_U = wide.W_U.detach().clone()
    apply_mup_readout(wide, "W_U", 4.0)
    torch.testing.assert_close(wide.W_U, W_U * 2.0 / 4.0)  # stored × sqrt(m), used ÷ m
    apply_mup_attention(wide, base_d_head=2)
    assert wide.blocks[0].attn.scale == pytest.approx(math.sqrt(2) / 4)
    base = Transformer(d_model=8, d_mlp=16, **kw)
    apply_mup_readout(base, "W_U", 1.0)
    shapes = infer_shapes(wide, base)
    assert shapes["parametrizations.W_U.original"].role == "readout"
    assert shapes["parametrizations.W_U.original"].width_mult == 4.0


def test_bad_input_is_refused_with_the_field_named():
    with pytest.raises(ValueError, match="parametrization must be one of"):
        abc_rule("sp")
    with pytest.raises(ValueError, match="optimizer must be one of"):
        abc_rule("mup", "lion")
    with pytest.raises(ValueError, match="lr must be > 0"):
        parameter_groups(_mlp(16), _mlp(8), lr=0.0)
    with pytest.raises(ValueError, match="weight_decay must be >= 0"):
        parameter_groups(_mlp(16), _mlp(8), lr=1.0, weight_decay=-1.0)
    with pytest.raises(ValueError, match="base_model must have the same parameters"):
        infer_shapes(_mlp(16), MLP(7, 8, 3, depth=1))
    with pytest.raises(ValueError, match="width_mult must be > 0"):
        ReadoutMultiplier(0.0)
    with pytest.raises(ValueError, match="name must name a parameter"):
        apply_mup_readout(_mlp(8), "W_U", 2.0)
    with pytest.raises(ValueError, match="base_d_head must be >= 1"):
        apply_mup_attention(_mlp(8), 0)


def test_l2_weight_decay_is_scaled_against_the_learning_rate():
    groups = parameter_groups(_mlp(32), _mlp(8), lr=1.0, weight_decay=0.1, decoupled_wd=False)
    for group in groups:
        assert group["lr"] * group["weight_decay"] == pytest.approx(0.1)


def _single_process_group(tmp_path):
    import torch.distributed as dist

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    return dist


def test_mup_groups_on_ddp_and_compiled_models_equal_the_bare_models(tmp_path):
    """Issue 20: ``parameter_groups(DDP(model), base)`` and ``(torch.compile(model), base)``
    raised (the ``module.`` / ``_orig_mod.`` prefixes were not stripped). Oracle: the bare
    model's groups, parameter by parameter; both wrappers share the bare model's tensors."""
    model, base = _mlp(32, use_bias=True), _mlp(8, use_bias=True)
    bare = _lrs(parameter_groups(model, base, lr=1e-2))
    dist = _single_process_group(tmp_path)
    try:
        ddp = nn.parallel.DistributedDataParallel(model)
        with warnings.catch_warnings():  # torch._dynamo's first import: torch.jit deprecations
            warnings.filterwarnings("ignore", r"`torch\.jit\.script", DeprecationWarning)
            compiled = torch.compile(model)  # only builds the wrapper; nothing is compiled here
        wrapped = {
            "ddp": ddp,
            "compile": compiled,
            "compile(ddp)": torch.compile(ddp),
            "data_parallel": nn.DataParallel(model),
        }
        for name, wrapper in wrapped.items():
            assert _lrs(parameter_groups(wrapper, base, lr=1e-2)) == bare, name
            shapes = infer_shapes(wrapper, torch.compile(base))  # a wrapped base works too
            assert set(shapes) == {k for k, _ in wrapper.named_parameters()}, name
            assert [s.role for s in shapes.values()] == [
                s.role for s in infer_shapes(model, base).values()
            ]
    finally:
        dist.destroy_process_group()
