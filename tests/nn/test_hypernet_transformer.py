"""SequenceTransformer and HypernetTransformer: shapes, the generated MLP, gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dynascope.nn import HypernetTransformer, SequenceTransformer, capture


def test_hypernet_mlp_matches_explicit_weights():
    torch.manual_seed(0)
    model = HypernetTransformer(
        5,
        3,
        d_latent=4,
        d_hidden=7,
        d_model=8,
        n_layers=1,
        n_heads=2,
        d_mlp=16,
        relative_position_buckets=6,
    ).double()
    ctx = torch.randn(2, 6, 5, dtype=torch.float64)
    xq = torch.randn(2, 3, dtype=torch.float64)
    with capture(model, ["hook_latent"]) as cache:
        y = model(ctx, xq)
    z = cache["hook_latent"]
    torch.testing.assert_close(z, model.encoder(ctx)[:, -1].detach())
    for b in range(2):  # W(z) = sum_m z_m theta_m, then the MLP on x_query
        W = sum(z[b, m] * model.theta[m] for m in range(4))
        expected = F.gelu(xq[b] @ W + model.b_hidden) @ model.w_readout + model.b_readout
        torch.testing.assert_close(y[b], expected.detach())


@pytest.mark.parametrize("kind", ["softmax", "hyla", "linear"])
def test_sequence_transformer_gradients_flow(kind):
    model = SequenceTransformer(
        4,
        2,
        d_model=8,
        n_layers=2,
        n_heads=4,
        d_head=2,
        d_mlp=16,
        attention=kind,
        relative_position_buckets=5,
    )
    out = model(torch.randn(3, 5, 4))
    assert out.shape == (3, 5, 2)
    out.square().sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    with pytest.raises(ValueError, match="x must have shape"):
        model(torch.randn(3, 5))


@pytest.mark.parametrize("kind", ["softmax", "hyla", "linear", "linear_rms_head"])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("buckets", [None, 5])
def test_last_only_is_the_full_forward_last_row(kind, is_causal, buckets):
    """Oracle: the full forward's last row (float64, 1e-12), values and gradients, for every
    mask and with the T5 bias (its last query row)."""
    torch.manual_seed(0)
    model = SequenceTransformer(4, 2, d_model=8, n_layers=3, n_heads=4, d_head=2, d_mlp=16,
                                attention=kind, relative_position_buckets=buckets,
                                is_causal=is_causal).double()  # fmt: skip
    x = torch.randn(3, 7, 4, dtype=torch.float64)
    full = model(x)[:, -1:]
    grads_full = torch.autograd.grad(full.sum(), list(model.parameters()), allow_unused=True)
    last = model(x, last_only=True)
    grads_last = torch.autograd.grad(last.sum(), list(model.parameters()), allow_unused=True)
    torch.testing.assert_close(last, full, rtol=0, atol=1e-12)
    for a, b in zip(grads_last, grads_full, strict=True):
        if a is None or b is None:
            assert a is None and b is None
        else:
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_bad_sizes():
    with pytest.raises(ValueError, match="n_layers must be >= 1"):
        SequenceTransformer(4, 1, d_model=8, n_layers=0, n_heads=2, d_mlp=8)
    with pytest.raises(ValueError, match="d_latent must be positive"):
        HypernetTransformer(4, 3, d_latent=0, d_hidden=2, d_model=8, n_layers=1, n_heads=2, d_mlp=8)
