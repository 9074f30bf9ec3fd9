"""KaimingMLP and SimpleCNN (S7): forward against a hand-written oracle, Kaiming-normal init
statistics, shapes, seeds, errors.

Tolerances: forwards are compared in float64 to 1e-12 (same products); the init standard
deviation to 3% (a 256 × 1024 sample: relative standard error of the sample std ≈ 0.14%, of
the per-layer check ≈ 1/sqrt(2n)).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from dynascope.nn import KaimingMLP, SimpleCNN
from dynascope.nn.cnn import parse_cnn_arch


def test_mlp_forward_matches_a_hand_written_oracle():
    gen = torch.Generator().manual_seed(0)
    model = KaimingMLP(7, (5, 6), 3, generator=gen).double()
    x = torch.randn(4, 7, dtype=torch.float64, generator=gen)
    w0, w1, w2 = (layer.weight for layer in model.layers)
    expected = F.relu(F.relu(x @ w0.T) @ w1.T) @ w2.T
    torch.testing.assert_close(model(x), expected, rtol=0, atol=1e-12)
    assert all(layer.bias is None for layer in model.layers)  # bias-free by default
    torch.testing.assert_close(model(x.reshape(4, 1, 7)), expected)  # flattens [batch, ...]


def test_cnn_forward_matches_a_hand_written_oracle():
    gen = torch.Generator().manual_seed(1)
    model = SimpleCNN("3-avg-4", in_channels=2, image_size=4, d_out=5, generator=gen).double()
    x = torch.randn(2, 2, 4, 4, dtype=torch.float64, generator=gen)
    conv0, conv1 = model.features[0], model.features[3]
    h = F.relu(F.conv2d(x, conv0.weight, padding=1))
    h = F.avg_pool2d(h, 2)
    h = F.relu(F.conv2d(h, conv1.weight, padding=1))
    expected = h.mean(dim=(2, 3)) @ model.readout.weight.T
    torch.testing.assert_close(model(x), expected, rtol=0, atol=1e-12)
    assert conv0.bias is None and model.readout.bias is None


@pytest.mark.parametrize("use_bias", [False, True])
def test_kaiming_normal_std_is_sqrt_two_over_fan_in_and_biases_start_at_zero(use_bias):
    mlp = KaimingMLP(
        256, (1024,), 512, use_bias=use_bias, generator=torch.Generator().manual_seed(0)
    )
    for layer in mlp.layers:
        expected = math.sqrt(2.0 / layer.weight.shape[1])
        assert abs(layer.weight.std().item() / expected - 1) < 0.03
        assert abs(layer.weight.mean().item()) < 0.03 * expected
        if use_bias:
            assert torch.equal(layer.bias, torch.zeros_like(layer.bias))
    cnn = SimpleCNN("64-128", in_channels=32, generator=torch.Generator().manual_seed(0))
    conv = cnn.features[2]  # 64 -> 128: fan_in = 64 * 9
    assert abs(conv.weight.std().item() / math.sqrt(2.0 / (64 * 9)) - 1) < 0.03


def test_the_generator_fixes_the_weights():
    a = KaimingMLP(8, (4,), 2, generator=torch.Generator().manual_seed(3))
    b = KaimingMLP(8, (4,), 2, generator=torch.Generator().manual_seed(3))
    c = KaimingMLP(8, (4,), 2, generator=torch.Generator().manual_seed(4))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.layers[0].weight, c.layers[0].weight)


def test_cnn_arch_parsing_and_output_shape():
    assert parse_cnn_arch("32-32-avg-64-64") == [32, 32, "avg", 64, 64]
    model = SimpleCNN("32-32-avg-64-64")
    assert model(torch.zeros(3, 1, 8, 8)).shape == (3, 10)
    assert model.readout.weight.shape == (10, 64)


def test_bad_arguments_are_one_line_errors():
    with pytest.raises(
        ValueError, match=r"hidden\[1\] must be an integer >= 1 \(got hidden\[1\]=0\)"
    ):
        KaimingMLP(4, (3, 0), 2)
    with pytest.raises(ValueError, match=r"hidden must hold at least one width"):
        KaimingMLP(4, (), 2)
    with pytest.raises(ValueError, match=r"x must be \[batch, ...\] flattening to d_in=4"):
        KaimingMLP(4, (3,), 2)(torch.zeros(2, 5))
    with pytest.raises(ValueError, match=r"token 'max'"):
        SimpleCNN("8-max-16")
    with pytest.raises(ValueError, match=r"at least one convolution"):
        SimpleCNN("avg")
    with pytest.raises(ValueError, match=r"an 'avg' pool needs an even map size \(got 3"):
        SimpleCNN("4-avg-4-avg", image_size=6)
    with pytest.raises(ValueError, match=r"x must be \[batch, 1, 8, 8\]"):
        SimpleCNN("4")(torch.zeros(2, 64))
