"""Registry, errors and the capture_patterns contract shared by every architecture."""

import math
import subprocess
import sys

import pytest
import torch
from torch import nn
from torch.testing import assert_close

import dynascope
import dynascope.adapters as adapters
from dynascope.adapters import AttentionView, attention_views, capture_patterns, register_adapter
from dynascope.nn import MultiHeadAttention, Transformer
from dynascope.nn import capture_patterns as nn_capture_patterns

BATCH, POS, N_HEADS, D_HEAD, D_MODEL, D_VOCAB = 2, 7, 3, 5, 11, 13
SUPPORTED = (
    r"\(supported: dynascope\.nn\.MultiHeadAttention, torch\.nn\.MultiheadAttention, "
    r"transformers\.GPT2Attention, transformers\.LlamaAttention-like, "
    r"transformers\.Phi3Attention-like, transformer_lens\.AbstractAttention; "
    r"register one with dynascope\.adapters\.register_adapter\)"
)


class Mixed(nn.Module):
    """A dynascope attention layer followed by a torch one."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.own = MultiHeadAttention(D_MODEL, N_HEADS, D_HEAD, is_causal=True, scale=0.3)
        self.torch_mha = nn.MultiheadAttention(12, 4, batch_first=True)
        self.proj = nn.Linear(D_MODEL, 12)

    def forward(self, x):
        y = self.proj(self.own(x))
        return self.torch_mha(y, y, y, need_weights=False)[0]


def test_no_attention_raises_listing_architectures():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    with pytest.raises(
        ValueError, match=r"no supported attention layer found in Sequential " + SUPPORTED
    ):
        attention_views(model)
    with pytest.raises(
        ValueError, match=r"no supported attention layer found in Sequential " + SUPPORTED
    ):
        with capture_patterns(model):
            pass


def test_top_level_capture_patterns_is_the_adapters_one():
    assert dynascope.capture_patterns is capture_patterns
    assert dynascope.attention_views is attention_views


def test_dynascope_attention_reads_its_capture_point_as_before():
    torch.manual_seed(0)
    model = Transformer(
        n_layers=2, d_model=D_MODEL, n_heads=N_HEADS, d_head=D_HEAD, d_mlp=17,
        d_vocab=D_VOCAB, d_out=D_VOCAB, n_ctx=POS,
    )  # fmt: skip
    x = torch.randint(0, D_VOCAB, (BATCH, POS), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        with nn_capture_patterns(model) as expected:
            model(x)
        with capture_patterns(model) as patterns:
            model(x)
    assert list(patterns) == ["blocks.0.attn", "blocks.1.attn"]
    for name in patterns:
        assert_close(patterns[name], expected[name], rtol=0, atol=0)  # the same computation
    assert [v.scale for v in attention_views(model)] == [D_HEAD**-0.5] * 2


def test_mixed_model_captures_every_layer_in_order():
    model = Mixed().double()
    x = torch.randn(BATCH, POS, D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        with capture_patterns(model) as patterns:
            model(x)
        y = model.proj(model.own(x))
        expected = model.torch_mha(y, y, y, average_attn_weights=False)[1]
    assert list(patterns) == ["own", "torch_mha"]
    assert patterns["own"].shape == (BATCH, N_HEADS, POS, POS)
    assert_close(patterns["torch_mha"], expected, rtol=0, atol=1e-12)  # float64, reordering
    own, torch_view = attention_views(model)
    assert own.scale == 0.3 and torch_view.scale == math.sqrt(1 / 3)
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())


def test_hooks_are_removed_when_the_block_raises():
    model = Mixed()
    with pytest.raises(RuntimeError, match="boom"):
        with capture_patterns(model):
            assert model.torch_mha._forward_pre_hooks and model.own.hook_pattern.has_listener
            raise RuntimeError("boom")
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())


def test_the_modules_own_input_errors_come_first():
    module = nn.MultiheadAttention(15, 3)
    bad = torch.randn(POS, BATCH, 14)  # wrong width: our einsum would fail too, but later
    with pytest.raises(AssertionError, match="was expecting embedding dimension of 15, but got 14"):
        with capture_patterns(module):
            module(bad, bad, bad)


class Toy(nn.Module):
    """One head, no biases; pattern = softmax(x W_Q (x W_K)^T)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(
            torch.randn(4, D_MODEL, 2, generator=torch.Generator().manual_seed(0))
        )

    def forward(self, x):
        return x


def toy_view(name, module):
    if not isinstance(module, Toy):
        return None
    w = module.w[:, None]  # [4, 1, d_model, 2]
    return AttentionView(name, w[0], w[1], w[2], w[3].mT, module=module, scale=1.0)


def toy_pattern(view, args, kwargs):
    x = args[0]
    return ((x @ view.W_Q[0]) @ (x @ view.W_K[0]).mT).softmax(-1)[:, None]


def test_registered_adapter_with_and_without_pattern_function(monkeypatch):
    monkeypatch.setattr(adapters, "_ADAPTERS", dict(adapters._ADAPTERS))
    monkeypatch.setattr(adapters, "_PATTERNS", dict(adapters._PATTERNS))
    register_adapter("test.Toy", toy_view)
    assert adapters.supported_architectures()[-1] == "test.Toy"
    model = nn.Sequential(Toy())
    [view] = attention_views(model)
    assert view.name == "0" and view.W_Q.shape == (1, D_MODEL, 2) and view.scale == 1.0
    with pytest.raises(
        ValueError, match=r"no pattern function registered for 0 \(test\.Toy\); pass pattern="
    ):
        with capture_patterns(model):
            pass
    with pytest.raises(ValueError, match="adapter 'test.Toy' is already registered"):
        register_adapter("test.Toy", toy_view, toy_pattern)
    adapters._PATTERNS["test.Toy"] = toy_pattern
    x = torch.randn(BATCH, POS, D_MODEL)
    with capture_patterns(model) as patterns:
        model(x)
    expected = ((x @ model[0].w[0]) @ (x @ model[0].w[1]).mT).softmax(-1)[:, None]
    assert_close(patterns["0"], expected, rtol=0, atol=0)  # the same operations


def test_view_scale_defaults_to_inverse_sqrt_d_head():
    W = torch.zeros(N_HEADS, D_MODEL, D_HEAD)
    view = AttentionView("a", W, W, W, W.mT)
    assert (
        view.scale == 1 / math.sqrt(D_HEAD) and not view.rotary and view.n_key_value_heads is None
    )


def test_import_does_not_import_transformers():
    code = "import sys, dynascope; import dynascope.adapters; print('transformers' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"
