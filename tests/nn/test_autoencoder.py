"""LinearAutoencoder: shapes, init (orthogonal stack, nn.Linear default), hand-computed forward."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from dynascope.nn import LinearAutoencoder, depth_lr


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_shapes_of_weights_codes_and_reconstructions():
    model = LinearAutoencoder(d_in=11, d_latent=5, n_stack=3, generator=gen())
    assert model.W_enc.shape == (11, 5)
    assert model.W_stack.shape == (3, 5, 5)
    assert model.W_dec.shape == (5, 11)
    x = torch.randn(2, 7, 11, generator=gen(1))
    assert model.encode(x).shape == (2, 7, 5)
    assert model(x).shape == (2, 7, 11)
    assert model.end_to_end().shape == (11, 11)
    assert model.stack_product().shape == (5, 5)


def test_no_stack_is_a_two_layer_autoencoder():
    model = LinearAutoencoder(d_in=7, d_latent=3, n_stack=0, generator=gen())
    assert model.W_stack.shape == (0, 3, 3)
    torch.testing.assert_close(model.stack_product(), torch.eye(3))
    torch.testing.assert_close(model.end_to_end(), model.W_enc @ model.W_dec)


@pytest.mark.parametrize("scale", [1.0, 0.5, 2.0])
def test_orthogonal_stack_layers_have_every_singular_value_equal_to_s(scale):
    model = LinearAutoencoder(
        d_in=9, d_latent=5, n_stack=4, init_scale=scale, generator=gen(), dtype=torch.float64
    )
    eye = torch.eye(5, dtype=torch.float64)
    for layer in model.W_stack:  # W W^T = s^2 I (rows and columns)
        torch.testing.assert_close(layer @ layer.T, scale**2 * eye, rtol=0, atol=1e-12)
        torch.testing.assert_close(layer.T @ layer, scale**2 * eye, rtol=0, atol=1e-12)
    assert not torch.allclose(model.W_stack[0], model.W_stack[1])  # independent draws


def test_encoder_and_decoder_get_nn_linear_default_init():
    """Oracle: nn.Linear(bias=False) built from the global RNG with the same seed (same stream)."""
    torch.manual_seed(7)
    enc = nn.Linear(32, 16, bias=False)
    dec = nn.Linear(16, 32, bias=False)
    model = LinearAutoencoder(d_in=32, d_latent=16, n_stack=0, generator=gen(7))
    torch.testing.assert_close(model.W_enc, enc.weight.T, rtol=0, atol=0)
    torch.testing.assert_close(model.W_dec, dec.weight.T, rtol=0, atol=0)


def test_default_stack_matches_nn_linear_too():
    torch.manual_seed(3)
    layers = [nn.Linear(n_in, n_out, bias=False) for n_in, n_out in ((6, 4), (4, 6), (4, 4))]
    model = LinearAutoencoder(d_in=6, d_latent=4, n_stack=1, init="default", generator=gen(3))
    torch.testing.assert_close(model.W_enc, layers[0].weight.T, rtol=0, atol=0)
    torch.testing.assert_close(model.W_dec, layers[1].weight.T, rtol=0, atol=0)
    torch.testing.assert_close(model.W_stack[0], layers[2].weight.T, rtol=0, atol=0)


def test_runs_sharing_a_seed_share_encoder_and_decoder_whatever_the_depth():
    a = LinearAutoencoder(n_stack=0, generator=gen(5))
    b = LinearAutoencoder(n_stack=8, init="default", generator=gen(5))
    torch.testing.assert_close(a.W_enc, b.W_enc, rtol=0, atol=0)
    torch.testing.assert_close(a.W_dec, b.W_dec, rtol=0, atol=0)


def test_hand_computed_forward():
    """x = [1, 2, 3] -> h = [4, 5] -> swap -> [5, 4] -> x2 -> [10, 8] -> decode -> [10, 8, 0]."""
    model = LinearAutoencoder(d_in=3, d_latent=2, n_stack=2, generator=gen())
    with torch.no_grad():
        model.W_enc.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
        model.W_stack.copy_(torch.tensor([[[0.0, 1.0], [1.0, 0.0]], [[2.0, 0.0], [0.0, 2.0]]]))
        model.W_dec.copy_(torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]))
    x = torch.tensor([[1.0, 2.0, 3.0]])
    torch.testing.assert_close(model.encode(x), torch.tensor([[10.0, 8.0]]))
    torch.testing.assert_close(model(x), torch.tensor([[10.0, 8.0, 0.0]]))
    torch.testing.assert_close(x @ model.end_to_end(), model(x))


def test_end_to_end_map_equals_the_forward_on_the_identity():
    model = LinearAutoencoder(d_in=7, d_latent=3, n_stack=2, generator=gen(2), dtype=torch.float64)
    eye = torch.eye(7, dtype=torch.float64)
    torch.testing.assert_close(model(eye), model.end_to_end(), rtol=0, atol=1e-14)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_stack": -1}, "n_stack must be an integer >= 0"),
        ({"d_latent": 0}, "d_latent must be an integer >= 1"),
        ({"init": "xavier"}, "init must be one of orthogonal, default"),
        ({"init_scale": 0.0}, "init_scale must be a finite number > 0"),
        ({"init_scale": math.nan}, "init_scale must be a finite number > 0"),
    ],
)
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LinearAutoencoder(**kwargs)


def test_depth_lr_rule():
    assert depth_lr(0.05, 0) == 0.05  # no stack: unchanged
    assert depth_lr(0.05, 4) == pytest.approx(0.0125)  # s = 1: eta_0 / L
    assert depth_lr(0.1, 3, 0.5) == pytest.approx(0.1 / (3 * 0.5**4))
    assert depth_lr(0.1, 3, 0.5, lr_max=0.2) == 0.2
    with pytest.raises(ValueError, match="lr must be a finite number > 0"):
        depth_lr(0.0, 2)
    with pytest.raises(ValueError, match="n_stack must be an integer >= 0"):
        depth_lr(0.1, -2)
    with pytest.raises(ValueError, match="lr_max must be > 0 or None"):
        depth_lr(0.1, 2, lr_max=0.0)
