"""MLP (SP / NTK / muP, bottleneck): hand-written forward passes as oracles, properties, errors."""

from __future__ import annotations

import math

import pytest
import torch

from dynascope.nn.mlp import MLP

D_IN, WIDTH, D_OUT = 5, 12, 3


def _x(n=4, seed=9):
    return torch.randn(n, D_IN, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _make(parametrization, seed=0, **kw):
    g = torch.Generator().manual_seed(seed)
    return MLP(D_IN, WIDTH, D_OUT, parametrization=parametrization, generator=g,
               dtype=torch.float64, **kw)  # fmt: skip


def test_ntk_forward_matches_the_written_formula():
    net = _make("ntk", depth=2, use_bias=True, b_std=0.4, W_std=1.3)
    W = [layer.weight for layer in net.layers]
    b = [layer.bias for layer in net.layers]
    x = _x()
    h1 = torch.relu(x @ W[0] / math.sqrt(D_IN) + 0.4 * b[0])
    h2 = torch.relu(h1 @ W[1] / math.sqrt(WIDTH) + 0.4 * b[1])
    expected = h2 @ W[2] / math.sqrt(WIDTH) + 0.4 * b[2]
    torch.testing.assert_close(net(x), expected, rtol=0, atol=1e-12)
    # NTK init: N(0, W_std^2) entries (sample std of 144 entries: within 15%, ~2.5 sigma)
    assert abs(float(W[1].detach().std()) / 1.3 - 1) < 0.15


def test_standard_and_ntk_give_the_same_function_at_init_but_different_gradients():
    sp, ntk = _make("standard", use_bias=True, b_std=0.2), _make("ntk", use_bias=True, b_std=0.2)
    x = _x()
    torch.testing.assert_close(sp(x), ntk(x), rtol=1e-12, atol=1e-12)
    sp(x).sum().backward()
    ntk(x).sum().backward()
    # d/dW_ntk = d/dW_sp / sqrt(fan_in) (hidden layer: fan_in = WIDTH) ...
    g_sp, g_ntk = sp.layers[1].weight.grad, ntk.layers[1].weight.grad
    torch.testing.assert_close(g_ntk, g_sp / math.sqrt(WIDTH), rtol=1e-10, atol=1e-14)
    # ... and the NTK bias gradient carries the b_std multiplier
    torch.testing.assert_close(ntk.layers[1].bias.grad, 0.2 * sp.layers[1].bias.grad)


def test_mup_readout_and_width_multiplier():
    net = _make("mup", base_width=4)
    assert net.width_mult == 3.0
    assert net.layers[-1].mult == pytest.approx(1 / 3)
    torch.testing.assert_close(net(_x()), torch.zeros(4, D_OUT, dtype=torch.float64))  # zero init
    assert net.layer_roles == {
        "layers.0.weight": "input",
        "layers.1.weight": "hidden",
        "layers.2.weight": "readout",
    }
    # at base width with the default readout init, muP is SP exactly
    mup = MLP(D_IN, WIDTH, D_OUT, parametrization="mup", base_width=WIDTH, readout_init="default",
              generator=torch.Generator().manual_seed(0), dtype=torch.float64)  # fmt: skip
    torch.testing.assert_close(mup(_x()), _make("standard")(_x()), rtol=0, atol=1e-12)
    # default readout init at m = 3: weight = sqrt(m) * SP weight, forward / m
    wide = MLP(D_IN, WIDTH, D_OUT, parametrization="mup", base_width=4, readout_init="default",
               generator=torch.Generator().manual_seed(0), dtype=torch.float64)  # fmt: skip
    sp = _make("standard")
    torch.testing.assert_close(wide.layers[-1].weight, math.sqrt(3) * sp.layers[-1].weight)


def test_bottleneck_layout_and_codes():
    net = _make("ntk", depth=2, bottleneck=2)  # S16: d_in -> n -> d -> n -> d_out
    shapes = [tuple(layer.weight.shape) for layer in net.layers]
    assert shapes == [(D_IN, WIDTH), (WIDTH, 2), (2, WIDTH), (WIDTH, D_OUT)]
    pre = net.preactivations(_x())
    assert net.bottleneck_index == 1 and pre[1].shape == (4, 2)
    W = [layer.weight for layer in net.layers]
    z = torch.relu(_x() @ W[0] / math.sqrt(D_IN)) @ W[1] / math.sqrt(WIDTH)  # no activation on z
    torch.testing.assert_close(pre[1], z, rtol=0, atol=1e-12)
    expected = torch.relu(z @ W[2] / math.sqrt(2)) @ W[3] / math.sqrt(WIDTH)
    torch.testing.assert_close(net(_x()), expected, rtol=0, atol=1e-12)


def test_permuting_hidden_units_preserves_the_function():
    net = _make("standard", depth=1, use_bias=True, b_std=0.5)
    perm = torch.randperm(WIDTH, generator=torch.Generator().manual_seed(2))
    out = net(_x())
    with torch.no_grad():
        net.layers[0].weight.copy_(net.layers[0].weight[:, perm])
        net.layers[0].bias.copy_(net.layers[0].bias[perm])
        net.layers[1].weight.copy_(net.layers[1].weight[perm])
    torch.testing.assert_close(net(_x()), out, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"width": 0}, "width must be a positive integer"),
        ({"depth": 0}, "depth must be a positive integer"),
        ({"parametrization": "mf"}, "parametrization must be one of standard, ntk, mup"),
        ({"activation": "swish"}, "activation must be one of relu, tanh, gelu, identity"),
        ({"W_std": 0.0}, "W_std must be a finite number > 0"),
        ({"b_std": float("nan")}, "b_std must be a finite number >= 0"),
        ({"bottleneck": 2, "bottleneck_after": 3}, r"bottleneck_after must be in 1..depth=2"),
        ({"bottleneck_after": 1}, "bottleneck_after needs a bottleneck"),
        ({"bottleneck": 2, "parametrization": "mup"}, "bottleneck is not supported"),
        ({"readout_init": "ones"}, "readout_init must be 'zero' or 'default'"),
    ],
)
def test_bad_arguments_are_one_line_errors(kwargs, match):
    args = {"d_in": D_IN, "width": WIDTH, **kwargs}
    with pytest.raises(ValueError, match=match):
        MLP(**args)


def test_wrong_input_shape_is_refused():
    with pytest.raises(ValueError, match=r"x must be \[batch, d_in=5\]"):
        _make("ntk")(torch.zeros(2, 4, dtype=torch.float64))
