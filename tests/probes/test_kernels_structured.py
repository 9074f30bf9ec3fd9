"""The structured-derivative eNTK against two oracles: the explicit float64 Jacobian product
``J(x1) J(x2)^T`` (one ``torch.autograd.grad`` per output entry) and the ``jacobian`` strategy.

Tolerances: 1e-10 absolute on MLP kernels of O(1) entries (float64 sums of a few hundred
products: round-off ~1e-14); 1e-12 relative to the largest entry on transformer kernels (whose
entries reach ~1e4 because LayerNorm rescales small embeddings).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import dynascope.probes.kernels as kernels
from dynascope.nn.mlp import MLP
from dynascope.nn.transformer import Transformer
from dynascope.probes.kernels import (
    empirical_ntk,
    empirical_ntk_memory,
    empirical_ntk_structure,
    model_function,
)

F64 = torch.float64
MODES = ("full", "trace", "diagonal")


def _explicit_jacobian(model_fn, params, x):
    """``[n, d_out, P]`` by one ``autograd.grad`` per output entry of one example at a time."""
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    rows = []
    for i in range(x.shape[0]):
        out = model_fn(leaves, x[i : i + 1]).reshape(-1)
        for c in range(out.shape[0]):
            grads = torch.autograd.grad(out[c], list(leaves.values()), retain_graph=True,
                                        allow_unused=True)  # fmt: skip
            rows.append(torch.cat([
                (torch.zeros_like(p) if g is None else g).reshape(-1)
                for g, p in zip(grads, leaves.values())
            ]))  # fmt: skip
    return torch.stack(rows).view(x.shape[0], -1, rows[0].numel())


def _oracle(model_fn, params, x1, x2, mode):
    J1, J2 = _explicit_jacobian(model_fn, params, x1), _explicit_jacobian(model_fn, params, x2)
    if mode == "full":
        return torch.einsum("icp,jdp->ijcd", J1, J2)
    if mode == "trace":
        return torch.einsum("icp,jcp->ij", J1, J2)
    return torch.einsum("icp,icp->ic", J1, J2)


def _mlp(depth, use_bias, d_in=3, width=6, d_out=2, seed=0, activation="tanh"):
    g = torch.Generator().manual_seed(seed)
    return MLP(d_in, width, d_out, depth=depth, parametrization="ntk", use_bias=use_bias,
               b_std=0.5, activation=activation, generator=g, dtype=F64)  # fmt: skip


def _inputs(shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize("use_bias", [False, True])
def test_structured_mlp_equals_explicit_jacobian_and_jacobian_strategy(mode, depth, use_bias):
    fn, params = model_function(_mlp(depth, use_bias))
    x1 = _inputs((5, 3))
    x2 = _inputs((5 if mode == "diagonal" else 4, 3), seed=2)
    K = empirical_ntk(fn, params, x1, x2, mode=mode, strategy="structured")
    torch.testing.assert_close(K, _oracle(fn, params, x1, x2, mode), rtol=0, atol=1e-10)
    K_jac = empirical_ntk(fn, params, x1, x2, mode=mode, strategy="jacobian")
    torch.testing.assert_close(K, K_jac, rtol=0, atol=1e-10)
    kinds = set(empirical_ntk_structure(fn, params, x1).values())
    assert kinds == ({"linear", "additive"} if use_bias else {"linear"})


@pytest.mark.parametrize("mode", ["full", "trace"])
@pytest.mark.parametrize("n", [17, 70])  # 2 and 4 groups of the symmetric path, uneven cuts
def test_structured_symmetric_kernel_equals_oracle(mode, n):
    fn, params = model_function(_mlp(2, True))
    x = _inputs((n, 3))
    K = empirical_ntk(fn, params, x, mode=mode, strategy="structured")
    torch.testing.assert_close(K, _oracle(fn, params, x, x, mode), rtol=0, atol=1e-10)


@pytest.mark.parametrize("chunk_size", [1, 2, 3])
def test_structured_chunks_equal_one_block(chunk_size):
    fn, params = model_function(_mlp(2, True))
    x1, x2 = _inputs((5, 3)), _inputs((4, 3), seed=2)
    for mode, b in (("full", x2), ("trace", x2), ("diagonal", x1.flip(0))):
        whole = empirical_ntk(fn, params, x1, b, mode=mode, strategy="structured")
        chunked = empirical_ntk(fn, params, x1, b, mode=mode, strategy="structured",
                                chunk_size=chunk_size)  # fmt: skip
        torch.testing.assert_close(chunked, whole, rtol=0, atol=1e-12)


@settings(max_examples=15, deadline=None)
@given(
    d_in=st.integers(1, 5),
    width=st.integers(1, 8),
    d_out=st.integers(1, 4),
    depth=st.integers(1, 3),
    n1=st.integers(1, 4),
    n2=st.integers(1, 4),
    use_bias=st.booleans(),
    activation=st.sampled_from(["relu", "tanh", "identity"]),
)
def test_structured_mlp_sizes_property(d_in, width, d_out, depth, n1, n2, use_bias, activation):
    model = _mlp(depth, use_bias, d_in, width, d_out, activation=activation)
    fn, params = model_function(model)
    x1, x2 = _inputs((n1, d_in)), _inputs((n2, d_in), seed=2)
    for mode in ("full", "trace"):
        K = empirical_ntk(fn, params, x1, x2, mode=mode, strategy="structured")
        torch.testing.assert_close(K, _oracle(fn, params, x1, x2, mode), rtol=0, atol=1e-10)


def test_structured_zero_weights_closed_form():
    """Edge case, closed form: all weights zero -> only the readout moves the output, and its
    input h = tanh(b_std beta) is the same for every example: Theta = (|h|^2 / width + b_std^2) I.
    """
    model = _mlp(2, True)
    with torch.no_grad():
        for layer in model.layers:
            layer.weight.zero_()
    fn, params = model_function(model)
    x = _inputs((3, 3))
    K = empirical_ntk(fn, params, x, mode="full", strategy="structured")
    h = torch.tanh(0.5 * model.layers[1].bias.detach())
    expected = (h.square().sum() / 6 + 0.25) * torch.eye(2, dtype=F64).expand(3, 3, 2, 2)
    torch.testing.assert_close(K, expected, rtol=0, atol=1e-12)


def _transformer(**kw):
    torch.manual_seed(0)
    cfg = dict(n_layers=2, d_model=6, n_heads=2, d_head=3, d_mlp=5, d_out=2, n_ctx=5,
               use_bias=True)  # fmt: skip
    cfg.update(kw)
    model = Transformer(**cfg).to(F64)
    with torch.no_grad():  # non-zero biases and LayerNorm parameters, so each one matters
        for name, p in model.named_parameters():
            if name.split(".")[-1] in ("bias", "b_Q", "b_K", "b_V", "b_O", "b_in", "b_out", "b_U"):
                p.normal_(0, 0.3)
            elif name.endswith("ln1.weight") or name.endswith("ln_final.weight"):
                p.uniform_(0.5, 1.5)
    return model


def _tokens(n, pos=4, seed=3, d_vocab=7):
    return torch.randint(0, d_vocab, (n, pos), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("mode", MODES)
def test_structured_transformer_equals_explicit_jacobian(mode):
    model = _transformer(d_vocab=7)
    fn, params = model_function(model)
    x1 = _tokens(3)
    x2 = _tokens(3 if mode == "diagonal" else 2, seed=4)
    K = empirical_ntk(fn, params, x1, x2, mode=mode, strategy="structured")
    ref = _oracle(fn, params, x1, x2, mode)
    tol = 1e-12 * ref.abs().max().item()
    torch.testing.assert_close(K, ref, rtol=0, atol=tol)
    K_jac = empirical_ntk(fn, params, x1, x2, mode=mode, strategy="jacobian")
    torch.testing.assert_close(K, K_jac, rtol=0, atol=tol)


def test_structured_transformer_reads_attention_mlp_embeddings_and_falls_back_on_layernorm():
    model = _transformer(d_vocab=7)
    fn, params = model_function(model)
    kinds = empirical_ntk_structure(fn, params, _tokens(2))
    for name, kind in kinds.items():
        leaf = name.split(".")[-1]
        if ".ln" in name or name.startswith("ln_final"):
            assert kind.startswith("fallback"), name
        elif leaf in ("W_Q", "W_K", "W_V", "W_O", "W_in", "W_out", "W_U"):
            assert kind == "linear", name
        elif leaf == "W_E":
            assert kind == "embedding", name
        else:  # W_pos and every bias
            assert kind == "additive", (name, kind)


def test_structured_vector_transformer_attention_only_no_layernorm():
    model = _transformer(d_in=4, d_mlp=None, use_ln=False, is_causal=False)
    fn, params = model_function(model)
    x1, x2 = _inputs((3, 4, 4)), _inputs((2, 4, 4), seed=2)
    kinds = empirical_ntk_structure(fn, params, x1)
    assert not any(k.startswith("fallback") for k in kinds.values()), kinds
    K = empirical_ntk(fn, params, x1, x2, mode="full", strategy="structured")
    ref = _oracle(fn, params, x1, x2, "full")
    torch.testing.assert_close(K, ref, rtol=0, atol=1e-12 * ref.abs().max().item())


def test_structured_parameter_subset_equals_jacobian():
    model = _transformer(d_vocab=7)
    fn, params = model_function(model, include=["blocks.0.attn.", "W_E", "blocks.1.ln2."])
    x1, x2 = _tokens(3), _tokens(2, seed=4)
    K = empirical_ntk(fn, params, x1, x2, mode="full", strategy="structured")
    ref = _oracle(fn, params, x1, x2, "full")
    torch.testing.assert_close(K, ref, rtol=0, atol=1e-12 * ref.abs().max().item())


class _TorchNNNet(nn.Module):
    """``nn.Embedding`` (with a padding row) -> ``nn.Linear`` twice (one layer called twice)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(6, 4, padding_idx=0)
        self.hidden = nn.Linear(4, 4)
        self.readout = nn.Linear(4, 3, bias=False)

    def forward(self, ids):
        h = self.embed(ids)  # [batch, pos, 4]
        h = torch.tanh(self.hidden(torch.tanh(self.hidden(h))))
        return self.readout(h).sum(1)  # [batch, 3]


def test_structured_torch_nn_layers_padding_row_and_reused_layer():
    torch.manual_seed(0)
    model = _TorchNNNet().to(F64)
    fn, params = model_function(model)
    x1 = torch.tensor([[1, 0, 2], [3, 3, 0], [5, 1, 4]])
    x2 = torch.tensor([[0, 0, 2], [4, 1, 1]])
    kinds = empirical_ntk_structure(fn, params, x1)
    assert kinds == {"embed.weight": "embedding", "hidden.weight": "linear",
                     "hidden.bias": "additive", "readout.weight": "linear"}  # fmt: skip
    for mode, b in (("full", x2), ("trace", x2), ("diagonal", x1.flip(0))):
        K = empirical_ntk(fn, params, x1, b, mode=mode, strategy="structured")
        torch.testing.assert_close(K, _oracle(fn, params, x1, b, mode), rtol=0, atol=1e-10)


class _ScaledGradMatmul(torch.autograd.Function):
    """``x @ W`` whose backward doubles W's gradient (as gradient-scaling tricks do): the forward
    looks like a linear use, but autograd's derivative is not the forward's."""

    generate_vmap_rule = True  # torch.func (the jacobian fallback) needs these two

    @staticmethod
    def forward(x, W):
        return x @ W

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, grad):
        x, W = ctx.saved_tensors
        return grad @ W.mT, 2.0 * torch.einsum("...k,...o->ko", x, grad)


def test_structured_falls_back_on_tied_weights_and_custom_gradients():
    """A weight used as embedding and as readout (two layouts), and one whose autograd gradient
    is not its forward's (a custom backward): both go to the jacobian fallback, exactly."""
    g = torch.Generator().manual_seed(0)
    params = {"W_E": torch.randn(5, 3, generator=g, dtype=F64),
              "W": torch.randn(3, 3, generator=g, dtype=F64)}  # fmt: skip

    def model_fn(p, ids):
        h = p["W_E"][ids]  # [batch, pos, 3]
        h = torch.tanh(_ScaledGradMatmul.apply(h, p["W"]))
        return (h @ p["W_E"].T).sum(1)  # tied readout, [batch, 5]

    x1, x2 = torch.tensor([[0, 1], [2, 2], [4, 0]]), torch.tensor([[3, 1], [1, 0]])
    kinds = empirical_ntk_structure(model_fn, params, x1)
    assert kinds["W_E"] == "fallback (uses with different weight layouts)"
    assert kinds["W"] == "fallback (its gradient is not rebuilt from the recorded uses)"
    K = empirical_ntk(model_fn, params, x1, x2, mode="full", strategy="structured")
    torch.testing.assert_close(K, _oracle(model_fn, params, x1, x2, "full"), rtol=0, atol=1e-10)


def test_structured_falls_back_on_sequence_first_layout():
    """``[pos, batch, d]`` inside the model with pos == batch: the tracer's shape test passes,
    the per-example weighted gradient check does not."""
    g = torch.Generator().manual_seed(0)
    params = {"W": torch.randn(3, 2, generator=g, dtype=F64)}

    def model_fn(p, x):  # x [batch, pos, 3]
        h = torch.tanh(x.transpose(0, 1) @ p["W"])  # [pos, batch, 2]
        return h.transpose(0, 1).reshape(x.shape[0], -1)

    x1, x2 = _inputs((3, 3, 3)), _inputs((3, 3, 3), seed=2)
    assert empirical_ntk_structure(model_fn, params, x1) == {
        "W": "fallback (its gradient is not rebuilt from the recorded uses)"
    }
    ref = _oracle(model_fn, params, x1, x2, "full")
    for chunk_size in (None, 2):  # blocks of 2 and 1: a one-example block passes the check
        K = empirical_ntk(model_fn, params, x1, x2, mode="full", strategy="structured",
                          chunk_size=chunk_size)  # fmt: skip
        torch.testing.assert_close(K, ref, rtol=0, atol=1e-10)


def test_structured_hf_gpt2_conv1d_weights_are_read():
    """Tiny random Hugging Face GPT-2 (SDPA attention): ``Conv1D`` is ``addmm(b, x.view(-1, d),
    W)``, read as a linear map over flattened (example, position) rows; the tied embedding and
    the position embedding (ids without a batch axis) fall back."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=11, n_positions=8, n_embd=8, n_layer=1, n_head=2,
                                  bos_token_id=0, eos_token_id=0)  # fmt: skip
    gpt2 = transformers.GPT2LMHeadModel(cfg).to(F64).eval()

    class Logits(nn.Module):
        def __init__(self):
            super().__init__()
            self.gpt2 = gpt2

        def forward(self, ids):
            return self.gpt2(ids).logits

    fn, params = model_function(Logits())
    x1, x2 = _tokens(2, pos=3, d_vocab=11), _tokens(2, pos=3, seed=4, d_vocab=11)
    kinds = empirical_ntk_structure(fn, params, x1)
    for name, kind in kinds.items():
        if ".c_attn." in name or ".c_proj." in name or ".c_fc." in name:
            assert kind == ("linear" if name.endswith("weight") else "additive"), name
    assert kinds["gpt2.transformer.wte.weight"].startswith("fallback")
    K = empirical_ntk(fn, params, x1, x2, mode="trace", strategy="structured")
    ref = empirical_ntk(fn, params, x1, x2, mode="trace", strategy="jacobian")
    torch.testing.assert_close(K, ref, rtol=0, atol=1e-12 * ref.abs().max().item())


def test_structured_use_under_no_grad_contributes_nothing():
    g = torch.Generator().manual_seed(0)
    params = {"W": torch.randn(3, 2, generator=g, dtype=F64),
              "V": torch.randn(3, 2, generator=g, dtype=F64)}  # fmt: skip

    def model_fn(p, x):
        with torch.no_grad():
            frozen = x @ p["V"]  # no gradient reaches V: its kernel is 0
        return torch.tanh(x @ p["W"]) + frozen

    x1, x2 = _inputs((3, 3)), _inputs((2, 3), seed=2)
    assert empirical_ntk_structure(model_fn, params, x1) == {"W": "linear", "V": "linear"}
    K = empirical_ntk(model_fn, params, x1, x2, mode="full", strategy="structured")
    torch.testing.assert_close(K, _oracle(model_fn, params, x1, x2, "full"), rtol=0, atol=1e-10)


def test_structured_refuses_data_dependent_uses_across_blocks():
    W = torch.randn(3, 2, dtype=F64)

    def model_fn(p, x):
        return x @ p["W"] if x[0, 0] > 0 else x @ p["W"].detach()

    x = torch.tensor([[1.0, 0, 0], [-1.0, 0, 0]], dtype=F64)
    with pytest.raises(RuntimeError, match="uses the parameters differently"):
        empirical_ntk(model_fn, {"W": W}, x, strategy="structured", chunk_size=1)


def test_auto_strategy_is_structured_with_jacobian_fallback(monkeypatch):
    calls = []
    for name in ("entk_structured", "entk_jacobian", "entk_jvp_vjp"):
        original = getattr(kernels, name)
        monkeypatch.setattr(kernels, name,
                            lambda *a, _f=original, _n=name: calls.append(_n) or _f(*a))  # fmt: skip
    fn, params = model_function(_mlp(2, True))
    x = _inputs((4, 3))
    K = empirical_ntk(fn, params, x, mode="trace")
    assert calls == ["entk_structured"]
    torch.testing.assert_close(K, _oracle(fn, params, x, x, "trace"), rtol=0, atol=1e-10)
    ln = nn.LayerNorm(3).to(F64)  # nothing to read: every parameter falls back
    fn_ln, params_ln = model_function(ln)
    assert all(
        k.startswith("fallback") for k in empirical_ntk_structure(fn_ln, params_ln, x).values()
    )
    K_ln = empirical_ntk(fn_ln, params_ln, x, mode="trace")
    torch.testing.assert_close(K_ln, _oracle(fn_ln, params_ln, x, x, "trace"), rtol=0, atol=1e-10)


def test_memory_estimate_and_budget():
    fn, params = model_function(_mlp(2, True, width=64, d_out=3))
    x = _inputs((32, 3))
    est = empirical_ntk_memory(fn, params, x, mode="full")
    assert set(est) == {"structured", "jacobian", "jvp_vjp"}
    kernel_bytes = 32 * 32 * 3 * 3 * 8
    assert all(isinstance(v, int) and v > kernel_bytes for v in est.values())
    assert est["structured"] < est["jacobian"]
    chunked = empirical_ntk_memory(fn, params, x, mode="full", chunk_size=4)
    assert chunked["jacobian"] < est["jacobian"]
    whole = empirical_ntk(fn, params, x, mode="full", strategy="jacobian")
    budget = (chunked["jacobian"] + est["jacobian"]) // 2  # fits only when chunked
    fitted = empirical_ntk(fn, params, x, mode="full", strategy="jacobian", memory_budget=budget)
    torch.testing.assert_close(fitted, whole, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"memory_budget=1000 bytes is below the estimated peak"):
        empirical_ntk(fn, params, x, mode="full", memory_budget=1000)
    with pytest.raises(ValueError, match="memory_budget must be None or bytes >= 1"):
        empirical_ntk(fn, params, x, memory_budget=0)


def test_structured_float32_matches_float64_oracle():
    model = _mlp(2, True, width=16, activation="relu")
    x = _inputs((6, 3))
    fn64, p64 = model_function(model)
    ref = _oracle(fn64, p64, x, x, "full")
    fn32, p32 = model_function(model.to(torch.float32))
    K = empirical_ntk(fn32, p32, x.float(), mode="full", strategy="structured")
    torch.testing.assert_close(K.double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())


def test_structured_nan_input_propagates():
    fn, params = model_function(_mlp(1, False))
    x = _inputs((2, 3))
    x[1, 0] = float("nan")
    K = empirical_ntk(fn, params, x, mode="trace", strategy="structured")
    assert torch.isfinite(K[0, 0]) and torch.isnan(K[1, 1])


def test_f_linear_and_einsum_with_ellipsis_are_structured():
    g = torch.Generator().manual_seed(0)
    params = {"W": torch.randn(4, 3, generator=g, dtype=F64),
              "b": torch.randn(4, generator=g, dtype=F64),
              "V": torch.randn(2, 4, 2, generator=g, dtype=F64)}  # fmt: skip

    def model_fn(p, x):  # x [batch, pos, 3]
        h = torch.tanh(F.linear(x, p["W"], p["b"]))  # [batch, pos, 4]
        return torch.einsum("...pm,hmd->...hd", h, 2.0 * p["V"]).reshape(x.shape[0], -1)

    x1, x2 = _inputs((3, 2, 3)), _inputs((2, 2, 3), seed=2)
    kinds = empirical_ntk_structure(model_fn, params, x1)
    assert kinds == {"W": "linear", "b": "additive", "V": "linear"}
    K = empirical_ntk(model_fn, params, x1, x2, mode="full", strategy="structured")
    torch.testing.assert_close(K, _oracle(model_fn, params, x1, x2, "full"), rtol=0, atol=1e-10)
