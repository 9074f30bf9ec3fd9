"""ACT against hand-computed halting; UT / Hyper-UT shapes, ponder statistics and gradients.

Oracles: constant p = 0.3 gives n = 4, rem = 0.1, weights 0.3, 0.3, 0.3, 0.1 (tensor2tensor's
rule worked by hand, SYSTEMS.md S8); accumulated mode with states s_t = t gives Σ_t w_t·t;
the interpolation gives prev_t = w_t s_t + (1 − w_t) prev_{t−1} evaluated by hand.
Tolerance 1e-6: float32 sums of a few terms.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dynascope.nn.universal import (
    HyperUT,
    UniversalTransformer,
    adaptive_computation_time,
    timing_signal,
)


def _const(p):
    return lambda state: torch.full(state.shape[:2], p)


def _plus_one(state, step):
    return state + 1.0


def test_constant_halting_matches_the_hand_computed_case():
    r = adaptive_computation_time(torch.zeros(2, 3, 4), _plus_one, _const(0.3), max_steps=10)
    torch.testing.assert_close(r.n_updates, torch.full((2, 3), 4.0))
    torch.testing.assert_close(r.remainders, torch.full((2, 3), 0.1))
    torch.testing.assert_close(r.weights[:, 0, 0], torch.tensor([0.3, 0.3, 0.3, 0.1]))
    assert r.steps == 4
    torch.testing.assert_close(r.halting_probability, torch.ones(2, 3))
    # interpolation by hand: states 1, 2, 3, 4
    prev = 0.0
    for w, s in zip([0.3, 0.3, 0.3, 0.1], [1, 2, 3, 4]):
        prev = w * s + (1 - w) * prev
    torch.testing.assert_close(r.output, torch.full((2, 3, 4), prev))
    assert float(r.ponder_cost()) == pytest.approx(4.1)


def test_accumulated_output_is_the_weighted_sum_of_states():
    r = adaptive_computation_time(
        torch.zeros(1, 1, 2), _plus_one, _const(0.3), max_steps=10, accumulated=True
    )
    expected = 0.3 * 1 + 0.3 * 2 + 0.3 * 3 + 0.1 * 4
    torch.testing.assert_close(r.output, torch.full((1, 1, 2), expected))


@given(
    st.lists(st.floats(0.0, 1.0), min_size=6, max_size=6),
    st.integers(1, 12),
    st.booleans(),
)
@settings(max_examples=80, deadline=None)
def test_weights_sum_to_one_per_position_with_the_remainder(ps, max_steps, force):
    """Halted positions: Σ_t w_t = 1 = hp; those stopped by T without force: Σ w = hp < 1."""
    p = torch.tensor(ps).reshape(2, 3)
    r = adaptive_computation_time(
        torch.zeros(2, 3, 1),
        _plus_one,
        lambda state: p,
        max_steps=max_steps,
        force_halt_at_max=force,
    )
    total = r.weights.sum(0)
    torch.testing.assert_close(total, r.halting_probability, rtol=0, atol=1e-6)
    halted = r.halting_probability > 1 - 0.01
    torch.testing.assert_close(total[halted], torch.ones_like(total[halted]), rtol=0, atol=1e-6)
    if force:
        assert bool(halted.all())
    assert float(r.n_updates.max()) <= max_steps
    # each position's weights: p until it halts, then its remainder, then zeros
    for b in range(2):
        for j in range(3):
            w = r.weights[:, b, j]
            n = int(r.n_updates[b, j])
            assert bool((w[n:] == 0).all())
            if n > 1:
                torch.testing.assert_close(w[: n - 1], torch.full((n - 1,), float(p[b, j])))


def test_hitting_max_steps_assigns_no_remainder_unless_forced():
    r = adaptive_computation_time(torch.zeros(1, 1, 1), _plus_one, _const(0.1), max_steps=3)
    assert r.steps == 3 and float(r.remainders) == 0.0
    assert float(r.halting_probability) == pytest.approx(0.3)
    f = adaptive_computation_time(
        torch.zeros(1, 1, 1), _plus_one, _const(0.1), max_steps=3, force_halt_at_max=True
    )
    assert float(f.remainders) == pytest.approx(0.8) and float(f.weights.sum()) == pytest.approx(1)


@pytest.mark.parametrize("cls", [UniversalTransformer, HyperUT])
@pytest.mark.parametrize("halting", ["basic", "global"])
def test_models_give_logits_ponder_statistics_and_gradients(cls, halting):
    torch.manual_seed(0)
    model = cls(
        d_vocab=11,
        d_out=7,
        n_ctx=5,
        d_model=12,
        n_heads=3,
        d_mlp=20,
        act_max_steps=4,
        halting=halting,
    )
    x = torch.randint(11, (2, 5))
    result = model.act(x)
    logits = model.readout(result)
    assert logits.shape == (2, 7)
    torch.testing.assert_close(model(x), logits)
    assert result.n_updates.shape == (2, 5) and float(result.n_updates.max()) <= 4
    if halting == "global":  # one halting decision per sequence
        assert bool((result.n_updates == result.n_updates[:, :1]).all())
    loss = logits.logsumexp(-1).mean() + model.act_loss_weight * result.ponder_cost()
    loss.backward()
    assert model.halt.weight.grad is not None and model.halt.weight.grad.abs().sum() > 0
    if cls is HyperUT:
        ent = model.last_mix_entropy
        assert ent.shape == (result.steps, 2)
        assert bool(((ent >= 0) & (ent <= math.log(4) + 1e-6)).all())


def test_hyper_ut_with_one_bank_is_a_universal_transformer_block():
    """K = 1: the mixture is the single bank, so Hyper-UT's block is a plain pre-LN block."""
    torch.manual_seed(0)
    hyper = HyperUT(n_banks=1, d_vocab=5, d_out=3, n_ctx=4, d_model=8, n_heads=2, d_mlp=6)
    ut = UniversalTransformer(d_vocab=5, d_out=3, n_ctx=4, d_model=8, n_heads=2, d_mlp=6)
    blk, ref = hyper.block, ut.block
    with torch.no_grad():
        for name in ("W_Q", "W_K", "W_V", "W_O"):
            getattr(ref.attn, name).copy_(getattr(blk, name)[0])
        ref.mlp.W_in.copy_(blk.W_in[0])
        ref.mlp.b_in.copy_(blk.b_in[0])  # noqa: E702
        ref.mlp.W_out.copy_(blk.W_out[0])
        ref.mlp.b_out.copy_(blk.b_out[0])  # noqa: E702
    x = torch.randn(2, 4, 8)
    torch.testing.assert_close(blk(x, torch.ones(2, 1)), ref(x), rtol=1e-5, atol=1e-5)


def test_timing_signal_and_bad_input():
    sig = timing_signal(6, 8)
    assert sig.shape == (6, 8)
    torch.testing.assert_close(sig[0], torch.tensor([0.0] * 4 + [1.0] * 4))
    with pytest.raises(ValueError, match="max_steps must be >= 1"):
        adaptive_computation_time(torch.zeros(1, 1, 1), _plus_one, _const(0.5), max_steps=0)
    with pytest.raises(ValueError, match=r"epsilon must be in \(0, 1\)"):
        adaptive_computation_time(
            torch.zeros(1, 1, 1), _plus_one, _const(0.5), max_steps=1, epsilon=0.0
        )
    kw = dict(d_vocab=5, d_out=3, n_ctx=4, d_model=8, n_heads=2, d_mlp=6)
    with pytest.raises(ValueError, match="halting must be 'basic' or 'global'"):
        UniversalTransformer(halting="local", **kw)
    with pytest.raises(ValueError, match="n_banks must be >= 1"):
        HyperUT(n_banks=0, **kw)
    with pytest.raises(ValueError, match="tokens must be a long tensor"):
        UniversalTransformer(**kw)(torch.zeros(2, 4))
