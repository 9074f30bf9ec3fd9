"""CapturePoint, capture and capture_patterns: hooks appear only inside the block."""

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from dynascope.nn import CapturePoint, MultiHeadAttention, Transformer, capture, capture_patterns

BATCH, POS, N_HEADS, D_HEAD, D_MODEL, D_VOCAB = 2, 7, 3, 5, 11, 13


def small_transformer(**kwargs):
    torch.manual_seed(0)
    config = dict(
        n_layers=2, d_model=D_MODEL, n_heads=N_HEADS, d_head=D_HEAD, d_mlp=17,
        d_vocab=D_VOCAB, d_out=D_VOCAB, n_ctx=POS,
    )  # fmt: skip
    config.update(kwargs)
    return Transformer(**config)


def tokens():
    return torch.randint(0, D_VOCAB, (BATCH, POS), generator=torch.Generator().manual_seed(1))


def all_points(model):
    return [m for m in model.modules() if isinstance(m, CapturePoint)]


def test_capture_point_is_identity_and_reports_listeners():
    point = CapturePoint()
    x = torch.randn(BATCH, POS)
    assert point(x) is x
    assert not point.has_listener
    handle = point.register_forward_hook(lambda module, inputs, output: None)
    assert point.has_listener
    handle.remove()
    assert not point.has_listener


def test_capture_records_detached_outputs_and_removes_hooks():
    model = small_transformer()
    names = ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_attn_scores"]
    with capture(model, names) as cache:
        assert model.blocks[0].attn.hook_pattern.has_listener
        assert not model.blocks[0].attn.hook_attn_scores.has_listener
        model(tokens())
    assert list(cache) == names
    assert cache[names[0]].shape == (BATCH, N_HEADS, POS, POS)
    assert not cache[names[0]].requires_grad
    assert not any(p.has_listener for p in all_points(model))


def test_capture_all_points_by_default():
    model = small_transformer()
    with capture(model) as cache:
        model(tokens())
    assert sorted(cache) == [
        f"blocks.{i}.attn.hook_{n}" for i in range(2) for n in ("attn_scores", "pattern")
    ]


def test_capture_keeps_latest_forward_pass():
    model = small_transformer()
    x1, x2 = tokens(), tokens().flip(1)
    with capture(model, ["blocks.1.attn.hook_pattern"]) as cache:
        model(x1)
        model(x2)
    with capture_patterns(model) as patterns:
        model(x2)
    assert_close(cache["blocks.1.attn.hook_pattern"], patterns["blocks.1.attn"])


def test_capture_removes_hooks_on_exception():
    model = small_transformer()
    with pytest.raises(RuntimeError, match="boom"):
        with capture(model):
            assert all(p.has_listener for p in all_points(model))
            raise RuntimeError("boom")
    assert not any(p.has_listener for p in all_points(model))
    with pytest.raises(RuntimeError, match="boom"):
        with capture_patterns(model):
            raise RuntimeError("boom")
    assert not any(p.has_listener for p in all_points(model))


def test_capture_unknown_name_lists_available():
    model = small_transformer()
    with pytest.raises(ValueError, match=r"unknown capture point.*blocks\.0\.attn\.hook_pattern"):
        with capture(model, ["blocks.0.attn.pattern"]):
            pass
    assert not any(p.has_listener for p in all_points(model))


def test_capture_patterns_on_two_layer_transformer():
    model = small_transformer()
    x = tokens()
    with torch.no_grad():
        plain = model(x)  # fused path
        with capture_patterns(model) as patterns:
            captured = model(x)  # explicit path
    assert list(patterns) == ["blocks.0.attn", "blocks.1.attn"]
    for pattern in patterns.values():
        assert pattern.shape == (BATCH, N_HEADS, POS, POS)
        assert_close(pattern.sum(-1), torch.ones(BATCH, N_HEADS, POS))  # softmax rows
        assert_close(pattern.triu(1), torch.zeros_like(pattern))  # causal
    # Two blocks, LayerNorms and an unembedding amplify float32 reordering a little.
    assert_close(captured, plain, atol=1e-5, rtol=1e-5)
    assert not any(p.has_listener for p in all_points(model))


def test_capture_patterns_sees_an_attn_mask():
    """A neighbour-masked transformer (vector tokens, no positions) shows its patterns."""
    model = small_transformer(d_vocab=None, d_in=4, positional="none", is_causal=False)
    x = torch.randn(BATCH, POS, 4)
    pairs = torch.rand(BATCH, POS, POS, generator=torch.Generator().manual_seed(3)) < 0.5
    pairs[0, 2] = False  # a token that sees nothing
    with torch.no_grad():
        plain = model(x, attn_mask=pairs)
        with capture_patterns(model) as patterns:
            captured = model(x, attn_mask=pairs)
    assert list(patterns) == ["blocks.0.attn", "blocks.1.attn"]
    sees = pairs.any(-1)[:, None].float().expand(BATCH, N_HEADS, POS)
    for pattern in patterns.values():
        assert pattern.shape == (BATCH, N_HEADS, POS, POS)
        assert_close(pattern.sum(-1), sees)  # softmax rows; 0 for the token that sees nothing
        assert not pattern[~pairs[:, None].expand_as(pattern)].any()  # hidden keys get 0
    assert torch.equal(captured, plain)  # an attn_mask takes the explicit path either way


def test_capture_patterns_on_single_attention_module():
    m = MultiHeadAttention(D_MODEL, N_HEADS, D_HEAD)
    with capture_patterns(m) as patterns:
        m(torch.randn(BATCH, POS, D_MODEL))
    assert list(patterns) == [""]  # the root module's qualified name


def test_capture_patterns_without_attention_raises():
    with pytest.raises(ValueError, match="no attention pattern capture point"):
        with capture_patterns(nn.Linear(3, 4)):
            pass
