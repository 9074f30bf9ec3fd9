"""KernelAttentionNet and ElmanRNN: per-example hand-written loops as oracles, SP == NTK at init."""

from __future__ import annotations

import math

import pytest
import torch

from dynascope.nn import capture
from dynascope.nn.kernel_nets import ElmanRNN, KernelAttentionNet

D_IN, WIDTH, D_OUT, BATCH, POS = 3, 6, 2, 2, 5
F64 = torch.float64


def _x():
    return torch.randn(BATCH, POS, D_IN, generator=torch.Generator().manual_seed(4), dtype=F64)


def _attention(parametrization="ntk", logit_scale="1/n"):
    return KernelAttentionNet(D_IN, WIDTH, D_OUT, parametrization=parametrization,
                              logit_scale=logit_scale, generator=torch.Generator().manual_seed(0),
                              dtype=F64)  # fmt: skip


def _rnn(parametrization="ntk", activation="tanh"):
    return ElmanRNN(D_IN, WIDTH, D_OUT, parametrization=parametrization, activation=activation,
                    generator=torch.Generator().manual_seed(0), dtype=F64)  # fmt: skip


@pytest.mark.parametrize("logit_scale", ["1/n", "1/sqrt(n)"])
def test_attention_matches_a_per_token_loop(logit_scale):
    net, x = _attention(logit_scale=logit_scale), _x()
    s = 1 / WIDTH if logit_scale == "1/n" else 1 / math.sqrt(WIDTH)
    r = 1 / math.sqrt(WIDTH)
    out = torch.zeros(BATCH, D_OUT, dtype=F64)
    for b in range(BATCH):
        e = [x[b, t] @ net.W_E / math.sqrt(D_IN) for t in range(POS)]
        q = [r * e_t @ net.W_Q[0] for e_t in e]
        k = [r * e_t @ net.W_K[0] for e_t in e]
        v = [r * e_t @ net.W_V[0] for e_t in e]
        pooled = torch.zeros(WIDTH, dtype=F64)
        for i in range(POS):
            logits = torch.stack([s * torch.dot(q[i], k[j]) for j in range(POS)])
            p = torch.exp(logits - logits.max())
            p = p / p.sum()
            a = sum(p[j] * v[j] for j in range(POS))
            pooled = pooled + r * a @ net.W_O[0] / POS
        out[b] = r * pooled @ net.W_U
    torch.testing.assert_close(net(x), out, rtol=0, atol=1e-12)


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_rnn_matches_the_unrolled_recursion(activation):
    net, x = _rnn(activation=activation), _x()
    phi = torch.tanh if activation == "tanh" else torch.relu
    r = 1 / math.sqrt(WIDTH)
    out = torch.zeros(BATCH, D_OUT, dtype=F64)
    for b in range(BATCH):
        h = torch.zeros(WIDTH, dtype=F64)
        hs = []
        for t in range(POS):
            h = phi(r * h @ net.W_hh + x[b, t] @ net.W_in / math.sqrt(D_IN))
            hs.append(h)
        out[b] = r * (sum(hs) / POS) @ net.W_U
    torch.testing.assert_close(net(x), out, rtol=0, atol=1e-12)


@pytest.mark.parametrize("make", [_attention, _rnn])
def test_standard_and_ntk_agree_at_init(make):
    torch.testing.assert_close(make("standard")(_x()), make("ntk")(_x()), rtol=1e-12, atol=1e-12)


def test_attention_exposes_its_pattern_in_the_transformerlens_layout():
    net = _attention()
    assert net.W_Q.shape == (1, WIDTH, WIDTH) and net.W_O.shape == (1, WIDTH, WIDTH)
    with capture(net, ["hook_pattern"]) as cache:
        net(_x())
    pattern = cache["hook_pattern"]
    assert pattern.shape == (BATCH, 1, POS, POS)
    torch.testing.assert_close(pattern.sum(-1), torch.ones(BATCH, 1, POS, dtype=F64))


def test_bad_arguments_are_one_line_errors():
    with pytest.raises(ValueError, match="width must be a positive integer"):
        ElmanRNN(3, 0)
    with pytest.raises(ValueError, match="parametrization must be 'standard' or 'ntk'"):
        KernelAttentionNet(3, 4, parametrization="mup")
    with pytest.raises(ValueError, match="logit_scale must be"):
        KernelAttentionNet(3, 4, logit_scale="1")
    with pytest.raises(ValueError, match="activation must be 'tanh' or 'relu'"):
        ElmanRNN(3, 4, activation="gelu")
    with pytest.raises(ValueError, match=r"x must be \[batch, pos, d_in=3\]"):
        ElmanRNN(3, 4)(torch.zeros(2, 3))
