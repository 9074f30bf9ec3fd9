"""σReparam: identity at init, σ tracking, exact-spectral-norm gradients, conversion and edge cases.

Oracles: ``torch.linalg.matrix_norm(M, 2)`` (an SVD) for σ and, by autograd through it, for the
gradients; the unconverted model for outputs; hand-reshaped matrices for the per-head layouts.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import dynascope as ds
from dynascope.adapters import attention_views
from dynascope.nn import (
    SigmaReparam,
    Transformer,
    ViT,
    convert_to_sigma_reparam,
    register_sigma_reparam,
    remove_norm_layers,
    remove_sigma_reparam,
    sigma_reparam_modules,
)
from dynascope.probes import PROBES, ProbeContext, make_probe, qk_singular_values


def _vit(seed=0, **kwargs):
    torch.manual_seed(seed)
    return ViT(
        n_layers=2, d_model=12, n_heads=3, d_mlp=20, d_in=4, n_patches=7, d_out=5,
        pooling="mean", **kwargs,
    ).double()  # fmt: skip


def _matrix(W, layout, scope="per_matrix"):
    """The oracle's reshape of each layout into [*batch, d_out, d_in] (written out by hand)."""
    if layout == "out_in":
        return W.reshape(W.shape[0], -1)
    if layout == "in_out":
        return W.T
    n_heads, a, b = W.shape
    if scope == "per_head":
        return W.transpose(1, 2)
    if layout == "heads_split_out":  # [n_heads, d_model, d_head]: x -> [x W_0 | x W_1 | ...]
        return torch.cat([W[h] for h in range(n_heads)], dim=1).T
    return torch.cat([W[h] for h in range(n_heads)], dim=0).T  # W_O: [z_0 | z_1 | ...] -> x


def _exact_sigma(W, layout, scope="per_matrix"):
    return torch.linalg.matrix_norm(_matrix(W, layout, scope), 2)


# Small, pairwise-distinct sizes per layout.
CASES = [
    ("out_in", "per_matrix", (5, 7)),
    ("out_in", "per_matrix", (5, 3, 2, 2)),  # a Conv2d weight as [out, in·k·k]
    ("in_out", "per_matrix", (7, 5)),
    ("heads_split_out", "per_matrix", (3, 5, 2)),
    ("heads_split_in", "per_matrix", (3, 2, 5)),
    ("heads_split_out", "per_head", (3, 5, 2)),
    ("heads_split_in", "per_head", (3, 2, 5)),
]


class _Holder(nn.Module):
    def __init__(self, W):
        super().__init__()
        self.W = nn.Parameter(W)


def _holder(shape, layout, scope, seed=0, dtype=torch.float64, gamma_init="sigma0"):
    W = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    holder = _Holder(W)
    reparam = register_sigma_reparam(holder, "W", layout=layout, scope=scope, gamma_init=gamma_init)
    return holder, reparam


# -- initialisation ---------------------------------------------------------------------------
@pytest.mark.parametrize(("layout", "scope", "shape"), CASES)
def test_sigma_at_init_is_the_exact_spectral_norm_and_w_hat_equals_w(layout, scope, shape):
    holder, reparam = _holder(shape, layout, scope)
    W = holder.parametrizations.W.original
    torch.testing.assert_close(reparam.sigma, _exact_sigma(W, layout, scope), rtol=1e-12, atol=0)
    torch.testing.assert_close(reparam.gamma.detach(), reparam.sigma, rtol=0, atol=0)
    torch.testing.assert_close(holder.W, W, rtol=1e-13, atol=0)  # float64: σ/σ₀ = 1 ± 1e-15


def test_linear_output_equals_the_plain_linear_at_init():
    """S12 unit check: SNLinear(x) = Linear(x) at init (γ = σ₀), float32, atol 1e-6."""
    torch.manual_seed(0)
    plain = nn.Linear(24, 16)
    converted = nn.Linear(24, 16)
    converted.load_state_dict(plain.state_dict())
    register_sigma_reparam(converted, "weight")
    x = torch.randn(7, 24)
    torch.testing.assert_close(converted(x), plain(x), rtol=0, atol=1e-6)


@pytest.mark.parametrize(("layout", "scope", "shape"), CASES)
def test_gamma_one_gives_unit_spectral_norm(layout, scope, shape):
    holder, _ = _holder(shape, layout, scope, gamma_init="one")
    s = _exact_sigma(holder.W.detach(), layout, scope)
    torch.testing.assert_close(s, torch.ones_like(s), rtol=1e-12, atol=0)


# -- the running σ ----------------------------------------------------------------------------
@pytest.mark.parametrize(("layout", "scope", "shape"), [CASES[0], CASES[3], CASES[5]])
def test_running_sigma_tracks_the_spectral_norm_under_slow_drift(layout, scope, shape):
    """S12: after 50 small random updates (1% of W's scale each), one power step per training
    forward keeps σ within 1% of matrix_norm(W, 2) (float32)."""
    holder, reparam = _holder((16, 24) if layout == "out_in" else shape, layout, scope,
                              dtype=torch.float32)  # fmt: skip
    W = holder.parametrizations.W.original
    generator = torch.Generator().manual_seed(1)
    drift = 0.01 * float(W.detach().std())
    for _ in range(50):
        with torch.no_grad():
            W.add_(drift * torch.randn(W.shape, generator=generator))
        holder.W  # noqa: B018 -- a training forward (grad on): one power-iteration step
    exact = _exact_sigma(W.detach().double(), layout, scope).float()
    torch.testing.assert_close(reparam.sigma, exact, rtol=0.01, atol=0)


def test_u_and_sigma_move_only_in_training_forwards_with_grad():
    holder, reparam = _holder((5, 7), "out_in", "per_matrix")
    with torch.no_grad():
        holder.parametrizations.W.original.mul_(torch.linspace(0.5, 2, 7))  # new singular vectors
    u0, sigma0 = reparam.u.clone(), reparam.sigma.clone()
    with torch.no_grad():
        holder.W  # noqa: B018
    holder.eval()
    holder.W  # noqa: B018
    assert torch.equal(reparam.u, u0) and torch.equal(reparam.sigma, sigma0)
    holder.train()
    holder.W  # noqa: B018
    assert not torch.equal(reparam.u, u0) and not torch.equal(reparam.sigma, sigma0)


# -- gradients --------------------------------------------------------------------------------
@pytest.mark.parametrize(("layout", "scope", "shape"), CASES)
def test_gradients_match_the_exact_spectral_norm(layout, scope, shape):
    """With u, v converged (300 power steps), the gradient of a loss through Ŵ = γW/σ(W) w.r.t.
    W and γ equals autograd through ``γ W / matrix_norm(W, 2)`` (float64, tolerance 1e-10:
    the estimator v uᵀ is the exact gradient of σ once u, v are the top singular vectors)."""
    holder, reparam = _holder(shape, layout, scope, seed=3)
    W = holder.parametrizations.W.original
    with torch.no_grad():  # move W away from the SVD so the power iteration has work to do
        W.add_(0.3 * torch.randn(W.shape, generator=torch.Generator().manual_seed(4),
                                 dtype=W.dtype))  # fmt: skip
        reparam.gamma.mul_(1.7)
    for _ in range(300):
        holder.W  # noqa: B018
    C = torch.randn(shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)

    def loss(W_hat):
        return (W_hat * C).sum() + (W_hat**3).sum()

    loss(holder.W).backward()
    W_ref = W.detach().clone().requires_grad_(True)
    gamma_ref = reparam.gamma.detach().clone().requires_grad_(True)
    sigma = _exact_sigma(W_ref, layout, scope)
    shape_b = sigma.shape + (1,) * (W_ref.ndim - sigma.ndim)
    loss(W_ref * (gamma_ref / sigma).reshape(shape_b)).backward()
    torch.testing.assert_close(W.grad, W_ref.grad, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(reparam.gamma.grad, gamma_ref.grad, rtol=1e-10, atol=1e-10)


# -- conversion -------------------------------------------------------------------------------
def _models():
    torch.manual_seed(0)
    seq = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 3 * 3, 5)).double()
    mha = nn.MultiheadAttention(6, 2, batch_first=True).double()
    transformer = Transformer(
        n_layers=2, d_model=12, n_heads=3, d_mlp=20, d_in=4, d_out=5, n_ctx=7
    ).double()
    return {
        "vit": (_vit(), torch.randn(2, 7, 4, dtype=torch.float64)),
        "transformer": (transformer, torch.randn(2, 7, 4, dtype=torch.float64)),
        "conv": (seq, torch.randn(2, 3, 5, 5, dtype=torch.float64)),
        "torch_mha": (mha, torch.randn(2, 7, 6, dtype=torch.float64)),
    }


def _out(model, x):
    out = (
        model(x, x, x, need_weights=False) if isinstance(model, nn.MultiheadAttention) else model(x)
    )
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("name", ["vit", "transformer", "conv", "torch_mha"])
def test_convert_and_remove_leave_outputs_unchanged(name):
    """Converting an untrained model (γ = σ₀) and later baking Ŵ back into plain parameters
    leave its outputs unchanged (float64, atol 1e-12: σ/σ₀ − 1 is float64 rounding)."""
    model, x = _models()[name]
    expected = _out(model, x).detach()
    n_linear = sum(isinstance(m, nn.Linear | nn.Conv2d) for m in model.modules())
    convert_to_sigma_reparam(model)
    converted = sigma_reparam_modules(model)
    assert len(converted) >= n_linear
    torch.testing.assert_close(_out(model, x), expected, rtol=0, atol=1e-12)

    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(3):  # train a little: Ŵ ≠ W now
        optimizer.zero_grad()
        _out(model, x).square().mean().backward()
        optimizer.step()
    with torch.no_grad():
        trained = _out(model, x)
    remove_sigma_reparam(model)
    assert not sigma_reparam_modules(model)
    assert all(isinstance(p, nn.Parameter) for p in model.parameters())
    with torch.no_grad():
        torch.testing.assert_close(_out(model, x), trained, rtol=0, atol=1e-12)


def test_vit_conversion_covers_every_linear_map_and_only_those():
    model = convert_to_sigma_reparam(_vit())
    names = set(sigma_reparam_modules(model))
    attn = {f"blocks.{i}.attn.W_{m}" for i in range(2) for m in "QKVO"}
    mlp = {f"blocks.{i}.mlp.W_{m}" for i in range(2) for m in ("in", "out")}
    assert names == attn | mlp | {"W_in", "W_U"}
    assert isinstance(model.W_pos, nn.Parameter)  # positions, biases, norms untouched


def test_attention_views_and_spectral_probes_read_the_effective_weights():
    model = convert_to_sigma_reparam(_vit(), gamma_init="one")
    views = attention_views(model)
    assert [v.name for v in views] == ["blocks.0.attn", "blocks.1.attn"]
    W_Q = views[0].W_Q  # [n_heads, d_model, d_head], now Ŵ_Q with ‖Ŵ_Q‖₂ = γ = 1
    assert W_Q.shape == (3, 12, 4)
    torch.testing.assert_close(
        _exact_sigma(W_Q.detach(), "heads_split_out"), torch.tensor(1.0, dtype=torch.float64)
    )
    dense = torch.linalg.svdvals(views[0].W_Q[1] @ views[0].W_K[1].T)[:4]
    torch.testing.assert_close(qk_singular_values(views)[0, 1], dense, rtol=1e-10, atol=1e-12)
    x = torch.randn(2, 7, 4, dtype=torch.float64)
    out = make_probe("attention_entropy")(model, ProbeContext(step=0, batch={"x": x}))
    assert 0 < out["attn.mean.entropy"] <= torch.log(torch.tensor(7.0)).item() + 1e-9


def test_per_head_scope_normalises_each_head():
    model = convert_to_sigma_reparam(_vit(), scope="per_head", gamma_init="one")
    reparam = sigma_reparam_modules(model)["blocks.0.attn.W_O"]
    assert reparam.sigma.shape == (3,) and reparam.gamma.shape == (3,)
    W_O = model.blocks[0].attn.W_O.detach()  # [n_heads, d_head, d_model]
    norms = torch.linalg.matrix_norm(W_O, 2)
    torch.testing.assert_close(norms, torch.ones(3, dtype=torch.float64), rtol=1e-12, atol=0)
    assert sigma_reparam_modules(model)["W_U"].sigma.shape == ()  # non-head maps: one σ


@pytest.mark.parametrize("name", sorted(PROBES))
def test_probes_keep_their_contract_on_a_converted_model(name):
    """Probes read Ŵ under no_grad: u, v, σ (buffers) and every parameter stay as they were."""
    torch.manual_seed(0)
    model = Transformer(n_layers=2, d_model=12, n_heads=3, d_mlp=20, d_vocab=11, d_out=11, n_ctx=7)
    convert_to_sigma_reparam(model)
    task = ds.tasks.AssociativeRecall(n_keys=6, n_values=5, n_pairs=3)
    batch = task.batch("train", 4, torch.Generator().manual_seed(1))
    task.loss(model(batch["x"]), batch).backward()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    probe = make_probe(name)
    for step in (0, 1):
        probe(model, ProbeContext(step=step, batch=batch))
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key]), key


def test_remove_norm_layers_and_convert_with_remove_norms():
    model = convert_to_sigma_reparam(_vit(), remove_norms=True)
    assert not any(isinstance(m, nn.LayerNorm) for m in model.modules())
    assert isinstance(model.blocks[0].ln1, nn.Identity) and isinstance(model.ln_final, nn.Identity)
    seq = remove_norm_layers(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.GroupNorm(2, 4)))
    assert [type(m) for m in seq] == [nn.Linear, nn.Identity, nn.Identity]
    assert model(torch.randn(2, 7, 4, dtype=torch.float64)).shape == (2, 5)


def test_state_dict_round_trip_resumes_the_power_iteration():
    model = convert_to_sigma_reparam(_vit())
    x = torch.randn(2, 7, 4, dtype=torch.float64)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(3):
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()
    fresh = convert_to_sigma_reparam(_vit(seed=9))
    fresh.load_state_dict(model.state_dict())
    model(x)  # one training forward each: the same u, v, σ afterwards
    fresh(x)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(fresh.state_dict()[key], value, rtol=0, atol=0)


def test_stats_only_measures_sigma_and_leaves_the_weight():
    torch.manual_seed(0)
    layer = nn.Linear(6, 4)
    W = layer.weight.detach().clone()
    reparam = register_sigma_reparam(layer, "weight", stats_only=True)
    assert reparam.gamma is None and not any("gamma" in n for n, _ in layer.named_parameters())
    with torch.no_grad():
        layer.parametrizations.weight.original.mul_(3.0)
    layer.weight  # noqa: B018
    assert torch.equal(layer.weight, 3 * W)
    torch.testing.assert_close(reparam.sigma, torch.linalg.matrix_norm(3 * W, 2), rtol=1e-5, atol=0)


def test_sigma_is_computed_in_float32_under_autocast():
    torch.manual_seed(0)
    layer = nn.Linear(24, 16)
    reparam = register_sigma_reparam(layer, "weight")
    x = torch.randn(5, 24)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    assert reparam.sigma.dtype == torch.float32 and reparam.u.dtype == torch.float32
    exact = torch.linalg.matrix_norm(layer.parametrizations.weight.original.detach(), 2)
    torch.testing.assert_close(reparam.sigma, exact, rtol=1e-6, atol=0)  # bf16 would be ~1e-2


# -- errors and edge cases --------------------------------------------------------------------
def test_bad_arguments_raise_one_line_errors():
    W = torch.randn(3, 5, 2)
    with pytest.raises(ValueError, match=r"layout must be one of .* \(got layout='rows'\)"):
        SigmaReparam(W, layout="rows")
    with pytest.raises(ValueError, match=r"scope must be one of .* \(got scope='per_row'\)"):
        SigmaReparam(W, layout="heads_split_out", scope="per_row")
    with pytest.raises(ValueError, match=r"gamma_init must be one of .* \(got gamma_init=2\)"):
        SigmaReparam(W, layout="heads_split_out", gamma_init=2)
    with pytest.raises(ValueError, match=r"scope='per_head' needs a per-head layout"):
        SigmaReparam(torch.randn(4, 5), scope="per_head")
    with pytest.raises(ValueError, match=r"weight must have 3 dims for layout='heads_split_in'"):
        SigmaReparam(torch.randn(4, 5), layout="heads_split_in")
    with pytest.raises(ValueError, match=r"weight must be a floating-point tensor"):
        SigmaReparam(torch.ones(4, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"weight must be finite"):
        SigmaReparam(torch.tensor([[1.0, float("nan")], [0.0, 1.0]]))
    model = convert_to_sigma_reparam(_vit())
    with pytest.raises(ValueError, match="already carries SigmaReparam"):
        convert_to_sigma_reparam(model)
    with pytest.raises(ValueError, match="W_Q already carries a SigmaReparam"):
        register_sigma_reparam(model.blocks[0].attn, "W_Q", layout="heads_split_out")


@settings(max_examples=20, deadline=None)
@given(layout_case=st.sampled_from(CASES), dtype=st.sampled_from([torch.float32, torch.float64]))
def test_a_zero_weight_is_refused(layout_case, dtype):
    layout, scope, shape = layout_case
    with pytest.raises(ValueError, match=r"weight must not be all zero \(got spectral norm 0"):
        SigmaReparam(torch.zeros(shape, dtype=dtype), layout=layout, scope=scope)


def test_a_zero_weight_in_a_model_is_named():
    with pytest.raises(ValueError, match=r"weight must not be all zero"):  # one dead head
        SigmaReparam(torch.cat([torch.ones(1, 5, 2), torch.zeros(1, 5, 2)]),
                     layout="heads_split_out", scope="per_head")  # fmt: skip
    model = _vit()
    with torch.no_grad():
        model.blocks[1].mlp.W_out.zero_()
    with pytest.raises(ValueError, match=r"^blocks\.1\.mlp\.W_out: weight must not be all zero"):
        convert_to_sigma_reparam(model)


def test_a_weight_that_reaches_zero_gives_zero_with_finite_gradients():
    holder, reparam = _holder((5, 7), "out_in", "per_matrix")
    with torch.no_grad():
        holder.parametrizations.W.original.zero_()
    holder.W.sum().backward()
    assert torch.equal(holder.W, torch.zeros(5, 7, dtype=torch.float64))
    assert reparam.sigma == 0
    assert torch.isfinite(holder.parametrizations.W.original.grad).all()
    assert torch.isfinite(reparam.gamma.grad).all()


@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(2, 6),
    n=st.integers(2, 6),
    rank=st.integers(1, 2),
    seed=st.integers(0, 2**16),
)
def test_rank_deficient_weights_get_their_exact_spectral_norm(m, n, rank, seed):
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(m, rank, generator=g, dtype=torch.float64) @ torch.randn(
        rank, n, generator=g, dtype=torch.float64
    )
    holder = _Holder(W)
    reparam = register_sigma_reparam(holder, "W", gamma_init="one")
    exact = torch.linalg.matrix_norm(W, 2)
    torch.testing.assert_close(reparam.sigma, exact, rtol=1e-10, atol=0)
    for _ in range(3):  # training forwards stay on the spectral norm (u, v already exact)
        holder.W  # noqa: B018
    torch.testing.assert_close(reparam.sigma, exact, rtol=1e-10, atol=0)
    torch.testing.assert_close(torch.linalg.matrix_norm(holder.W.detach(), 2), exact / exact)


@settings(max_examples=25, deadline=None)
@given(
    exponent=st.sampled_from([-30, -20, 20, 30]),
    layout_case=st.sampled_from(CASES),
    seed=st.integers(0, 2**16),
)
def test_huge_and_tiny_weights_stay_finite_in_float32(exponent, layout_case, seed):
    """Scales 1e±30 in float32: the power step runs on W divided by a power of two (exact), so
    nothing overflows (‖W u‖² ~ 1e60 would) or underflows; σ within 1e-5 of the float64 oracle."""
    layout, scope, shape = layout_case
    g = torch.Generator().manual_seed(seed)
    W = (torch.randn(shape, generator=g, dtype=torch.float64) * 10.0**exponent).float()
    holder = _Holder(W)
    reparam = register_sigma_reparam(holder, "W", layout=layout, scope=scope)
    holder.W  # noqa: B018 -- a training forward
    exact = _exact_sigma(W.double(), layout, scope)
    torch.testing.assert_close(reparam.sigma.double(), exact, rtol=1e-5, atol=0)
    W_hat = holder.W.detach()
    assert torch.isfinite(W_hat).all()
    torch.testing.assert_close(W_hat.double() / 10.0**exponent, W.double() / 10.0**exponent,
                               rtol=1e-5, atol=1e-6)  # fmt: skip
