"""Permutation instruments against oracles: function invariance under permutation, recovery of a
known permutation by both matchings, hand-built similarities and barriers.

Tolerances: outputs of a net and its permuted copy agree to float64 rounding (atol 1e-12: the
same products summed in another order); recovered permutations and barrier values of a
hand-built curve are exact.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from dynascope.nn import KaimingMLP, SimpleCNN
from dynascope.probes import permutation as perm


def _with_random_biases(model: nn.Module, seed: int) -> nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, layer in perm.permutable_layers(model):
            if layer.bias is not None:
                layer.bias.copy_(
                    0.1 * torch.randn(layer.bias.shape, generator=gen, dtype=torch.float64)
                )
    return model


def _mlp(hidden, use_bias, seed=0):
    gen = torch.Generator().manual_seed(seed)
    model = KaimingMLP(7, hidden, 3, use_bias=use_bias, generator=gen).double()
    return _with_random_biases(model, seed + 1)


def _cnn(arch, use_bias, seed=0):
    gen = torch.Generator().manual_seed(seed)
    model = SimpleCNN(arch, in_channels=2, image_size=4, d_out=3, use_bias=use_bias, generator=gen)
    return _with_random_biases(model.double(), seed + 1)


def _random_perms(model, seed):
    gen = torch.Generator().manual_seed(seed)
    widths = perm.hidden_widths(perm.layer_params(model))
    return [torch.randperm(d, generator=gen) for d in widths]


CASES = [
    ("mlp", lambda b: _mlp((5, 6), b), (11, 7)),
    ("mlp1", lambda b: _mlp((9,), b), (11, 7)),
    ("cnn", lambda b: _cnn("5-avg-6-4", b), (11, 2, 4, 4)),
]


@pytest.mark.parametrize("use_bias", [False, True])
@pytest.mark.parametrize(("kind", "make", "x_shape"), CASES, ids=[c[0] for c in CASES])
def test_permuting_hidden_units_leaves_the_function_unchanged(kind, make, x_shape, use_bias):
    model = make(use_bias)
    x = torch.randn(x_shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    perms = _random_perms(model, 3)
    permuted = perm.apply_permutation(model, perms, x)
    torch.testing.assert_close(permuted(x), model(x), rtol=0, atol=1e-12)
    # the weights did move (a permutation that changes nothing would make the test vacuous)
    assert not torch.equal(perm.layer_params(permuted)[0][0], perm.layer_params(model)[0][0])
    # and the original is untouched: applying the inverse restores it exactly
    back = perm.apply_permutation(permuted, [perm.invert_permutation(p) for p in perms], x)
    for (w, b), (w0, b0) in zip(perm.layer_params(back), perm.layer_params(model)):
        torch.testing.assert_close(w, w0, rtol=0, atol=0)
        if b0 is not None:
            torch.testing.assert_close(b, b0, rtol=0, atol=0)


def test_permute_params_by_hand():
    """Two-layer chain with arange weights: rows of layer 0 and columns of layer 1 move."""
    w0 = torch.arange(6.0).reshape(3, 2)
    w1 = torch.arange(12.0).reshape(4, 3)
    b0 = torch.tensor([10.0, 11.0, 12.0])
    p = torch.tensor([2, 0, 1])
    [(v0, c0), (v1, c1)] = perm.permute_params([(w0, b0), (w1, None)], [p])
    torch.testing.assert_close(v0, torch.tensor([[4.0, 5.0], [0.0, 1.0], [2.0, 3.0]]))
    torch.testing.assert_close(c0, torch.tensor([12.0, 10.0, 11.0]))
    torch.testing.assert_close(v1, w1[:, [2, 0, 1]])
    assert c1 is None


@pytest.mark.parametrize("use_bias", [False, True])
@pytest.mark.parametrize(("kind", "make", "x_shape"), CASES, ids=[c[0] for c in CASES])
def test_both_matchings_recover_a_known_permutation_exactly(kind, make, x_shape, use_bias):
    model = make(use_bias)
    perms = _random_perms(model, 7)
    truth = [perm.invert_permutation(p) for p in perms]
    n = 400 if kind != "cnn" else 60  # Gaussian inputs: no unit is dead on all of them
    x = torch.randn(
        (n, *x_shape[1:]), generator=torch.Generator().manual_seed(2), dtype=torch.float64
    )
    permuted = perm.apply_permutation(model, perms, x)
    # precondition: every unit is alive on x (a unit dead on every input has an all-zero
    # activation column and cannot be identified by its activations)
    assert all((a.abs().amax(0) > 0).all() for a in perm.hidden_activations(model, x))
    found_act = perm.activation_matching(model, permuted, x)
    found_w = perm.weight_matching(
        perm.layer_params(model),
        perm.layer_params(permuted),
        generator=torch.Generator().manual_seed(0),
    )
    for found in (found_act, found_w):
        assert [f.tolist() for f in found] == [t.tolist() for t in truth]
    aligned = perm.apply_permutation(permuted, found_act)
    for (w, _), (w0, _) in zip(perm.layer_params(aligned), perm.layer_params(model)):
        torch.testing.assert_close(w, w0, rtol=0, atol=0)


@settings(max_examples=25, deadline=None)
@given(d=st.integers(1, 12), seed=st.integers(0, 10_000))
def test_match_units_finds_a_planted_permutation(d, seed):
    gen = torch.Generator().manual_seed(seed)
    planted = torch.randperm(d, generator=gen)
    noise = 0.1 * torch.rand(d, d, generator=gen, dtype=torch.float64)
    similarity = noise.clone()
    similarity[torch.arange(d), planted] += 1.0  # the planted pairs dominate each row and column
    found = perm.match_units(similarity)
    assert found.tolist() == planted.tolist()


def test_match_units_is_optimal_against_brute_force():
    import itertools

    similarity = torch.randn(5, 5, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    best = max(
        itertools.permutations(range(5)), key=lambda p: sum(similarity[i, p[i]] for i in range(5))
    )
    assert perm.match_units(similarity).tolist() == list(best)


def test_activation_similarity_is_the_cosine_and_dead_units_score_zero():
    a = torch.tensor([[1.0, 0.0, 0.0], [1.0, 2.0, 0.0], [0.0, 2.0, 0.0]], dtype=torch.float64)
    b = torch.tensor([[3.0, 0.0, 1.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    expected = torch.tensor(
        [
            [1 / math.sqrt(2), 0.0, 1.0],  # a0 = (1,1,0)/√2 vs b0 = (1,0,0), b2 = (1,1,0)/√2
            [0.0, 0.0, 0.5],  # a1 = (0,1,1)/√2 vs b2: 1/2
            [0.0, 0.0, 0.0],
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(perm.activation_similarity(a, b), expected, rtol=0, atol=1e-7)
    centred = perm.activation_similarity(a, b, center=True)
    dense = torch.corrcoef(torch.cat([a[:, :2], b[:, :1]], 1).mT)  # Pearson, units with variance
    torch.testing.assert_close(centred[:2, 0], dense[:2, 2], rtol=0, atol=1e-7)


@settings(max_examples=20, deadline=None)
@given(scale=st.sampled_from([1e-30, 1.0, 1e30]), seed=st.integers(0, 1000))
def test_activation_similarity_is_scale_invariant_and_bounded(scale, seed):
    gen = torch.Generator().manual_seed(seed)
    a = torch.rand(9, 4, generator=gen, dtype=torch.float64)
    b = torch.rand(9, 4, generator=gen, dtype=torch.float64)
    s = perm.activation_similarity(a, b, eps=0.0)
    torch.testing.assert_close(perm.activation_similarity(scale * a, b, eps=0.0), s)
    assert s.abs().max() <= 1 + 1e-12


def test_conv_activations_are_rows_per_position():
    model = _cnn("3-4", use_bias=False)
    x = torch.randn(2, 2, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    acts = perm.hidden_activations(model, x)
    conv0 = model.features[0]
    dense = F.relu(conv0(x))  # [2, 3, 4, 4]: input of the next convolution
    torch.testing.assert_close(acts[0], dense.permute(0, 2, 3, 1).reshape(32, 3), rtol=0, atol=0)
    assert acts[1].shape == (2, 4)  # the readout reads the globally pooled channels
    assert not model._forward_pre_hooks and not conv0._forward_pre_hooks  # hooks removed


def test_loss_barrier_of_a_hand_built_curve():
    alphas = torch.linspace(0, 1, 11, dtype=torch.float64)
    chord = 2.0 * alphas + 1.0 * (1 - alphas)  # l(a) = 2, l(b) = 1
    bump = 0.8 * 4 * alphas * (1 - alphas)  # height 0.8 at α = 0.5
    barrier = perm.loss_barrier(alphas, torch.stack([chord + bump, chord - bump]))
    torch.testing.assert_close(barrier, torch.tensor([0.8, 0.0], dtype=torch.float64))
    nan_curve = chord.clone()
    nan_curve[3] = float("nan")
    assert perm.loss_barrier(alphas, nan_curve).isnan()


def test_barrier_of_a_net_with_itself_is_zero_and_the_path_ends_at_the_nets():
    model_a, model_b = _mlp((6,), True, seed=0), _mlp((6,), True, seed=1)
    gen = torch.Generator().manual_seed(0)
    x, y = (
        torch.randn(50, 7, generator=gen, dtype=torch.float64),
        torch.randint(0, 3, (50,), generator=gen),
    )
    self_path = perm.interpolate(model_a, model_a, x, y)
    torch.testing.assert_close(
        self_path.barrier, torch.tensor(0.0, dtype=torch.float64), rtol=0, atol=1e-12
    )
    path = perm.interpolate(model_a, model_b, x, y, alphas=(0.0, 0.5, 1.0))
    with torch.no_grad():
        ends = [F.cross_entropy(m(x), y) for m in (model_b, model_a)]
        mid = perm.load_params(
            model_a, perm.average_params([perm.layer_params(model_a), perm.layer_params(model_b)])
        )
        ends.insert(1, F.cross_entropy(mid(x), y))
    torch.testing.assert_close(path.loss, torch.stack(ends), rtol=0, atol=1e-12)
    assert path.barrier >= 0 and path.error_barrier >= 0


def test_tuned_temperature_undoes_a_known_logit_scale():
    """Labels drawn from softmax(z): the NLL-optimal inverse temperature of c·z is 1/c."""
    gen = torch.Generator().manual_seed(0)
    z = 2.0 * torch.randn(40_000, 4, generator=gen, dtype=torch.float64)
    y = torch.multinomial(z.softmax(-1), 1, generator=gen).squeeze(1)
    beta = perm.tune_temperature(5.0 * z, y)
    # grid step is a factor 10^(3/99) ≈ 1.07; sampling noise at n = 40k is ~1%
    assert abs(math.log(beta * 5.0)) < math.log(1.1)
    # and the grid search equals a naive loop of cross-entropies over the same grid
    grid = 10.0 ** torch.linspace(-1.0, 2.0, 100, dtype=torch.float64)
    naive = torch.stack([F.cross_entropy(b * 5.0 * z[:2000], y[:2000]) for b in grid])
    assert perm.tune_temperature(5.0 * z[:2000], y[:2000]) == grid[torch.argmin(naive)]


def test_weight_matching_improves_the_alignment_of_two_different_nets():
    """On unrelated nets the objective after matching is at least that of the identity."""
    a, b = _mlp((8, 8), False, seed=0), _mlp((8, 8), False, seed=5)
    pa, pb = perm.layer_params(a), perm.layer_params(b)
    found = perm.weight_matching(pa, pb, generator=torch.Generator().manual_seed(0))

    def inner(params_b):
        return sum((wa * wb).sum() for (wa, _), (wb, _) in zip(pa, params_b))

    assert inner(perm.permute_params(pb, found)) >= inner(pb)


def test_n_way_average_by_hand():
    p1 = [(torch.ones(2, 2), None), (torch.zeros(1, 2), None)]
    p2 = [(3 * torch.ones(2, 2), None), (torch.ones(1, 2), None)]
    avg = perm.average_params([p1, p2])
    torch.testing.assert_close(avg[0][0], 2 * torch.ones(2, 2))
    torch.testing.assert_close(avg[1][0], 0.5 * torch.ones(1, 2))


def test_bad_inputs_are_one_line_errors():
    model = _mlp((5,), False)
    x = torch.zeros(2, 7, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"perms must hold one permutation per hidden axis \(1\)"):
        perm.apply_permutation(model, [], x)
    with pytest.raises(ValueError, match=r"perms\[0\] must be a permutation of range\(5\)"):
        perm.apply_permutation(model, [torch.tensor([0, 0, 1, 2, 3])], x)
    with pytest.raises(ValueError, match=r"x must be a probe batch .* \(got x=None"):
        perm.apply_permutation(model, [torch.arange(5)])
    with pytest.raises(ValueError, match="holds parameters or buffers"):
        perm.permutable_layers(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)))
    with pytest.raises(ValueError, match="reads 12 inputs but '0' gives 3 units"):
        perm.permutable_layers(nn.Sequential(nn.Conv2d(1, 3, 3), nn.Flatten(), nn.Linear(12, 2)))
    with pytest.raises(ValueError, match="at least 2 Linear/Conv2d layers"):
        perm.permutable_layers(nn.Linear(3, 2))
    with pytest.raises(ValueError, match="similarity must be finite"):
        perm.match_units(torch.tensor([[1.0, float("nan")], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="similarity must be square"):
        perm.match_units(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="alphas must contain 0 and 1"):
        perm.loss_barrier(torch.tensor([0.2, 0.5, 1.0]), torch.zeros(3))
    with pytest.raises(ValueError, match="hidden widths must agree"):
        perm.activation_matching(model, _mlp((6,), False), torch.zeros(2, 7, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"params\[1\] must have the layer shapes"):
        perm.weight_matching(perm.layer_params(model), perm.layer_params(_mlp((6,), False)))


def test_a_users_sequential_is_read_as_is():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 2)
    ).double()
    original = copy.deepcopy(model)
    perms = _random_perms(model, 1)
    x = torch.randn(8, 4, dtype=torch.float64)
    torch.testing.assert_close(
        perm.apply_permutation(model, perms, x)(x), model(x), rtol=0, atol=1e-12
    )
    for p, q in zip(model.parameters(), original.parameters()):
        assert torch.equal(p, q)


@settings(max_examples=15, deadline=None)
@given(
    hidden=st.lists(st.integers(1, 9), min_size=1, max_size=3),
    use_bias=st.booleans(),
    conv=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_any_permutation_of_any_small_chain_preserves_the_function(hidden, use_bias, conv, seed):
    if conv:
        model = _cnn("-".join(map(str, hidden)), use_bias, seed)
        shape = (5, 2, 4, 4)
    else:
        model = _mlp(tuple(hidden), use_bias, seed)
        shape = (5, 7)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    permuted = perm.apply_permutation(model, _random_perms(model, seed + 1), x)
    torch.testing.assert_close(permuted(x), model(x), rtol=0, atol=1e-12)


# -- issue 20: the chain is the executed graph, and permutations are never silent ---------------
class _ResidualMLP(nn.Module):
    """Only nn.Linear, but ``h + relu(mid(h))``: permuting the hidden axes breaks the skip."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.mid, self.out = nn.Linear(4, 6), nn.Linear(6, 6), nn.Linear(6, 2)

    def forward(self, x):
        h = F.relu(self.inp(x))
        h = h + F.relu(self.mid(h))
        return self.out(h)


class _OutOfOrder(nn.Module):
    """Registered ``c, a, b``; called ``a -> b -> c``: the executed chain is a plain chain."""

    def __init__(self) -> None:
        super().__init__()
        self.c, self.a, self.b = nn.Linear(5, 2), nn.Linear(4, 6), nn.Linear(6, 5)

    def forward(self, x):
        return self.c(F.relu(self.b(F.relu(self.a(x)))))


class _Reused(nn.Module):
    """``mid`` is called twice (weight sharing across depth)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.mid, self.out = nn.Linear(4, 6), nn.Linear(6, 6), nn.Linear(6, 2)

    def forward(self, x):
        h = F.relu(self.inp(x))
        h = F.relu(self.mid(F.relu(self.mid(h))))
        return self.out(h)


class _Unused(nn.Module):
    """``spare`` is registered (between the two layers called) but never called."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.spare, self.out = nn.Linear(4, 6), nn.Linear(6, 6), nn.Linear(6, 2)

    def forward(self, x):
        return self.out(F.relu(self.inp(x)))


class _Mixing(nn.Module):
    """A chain by structure, but ``flip`` mixes hidden units without parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.out = nn.Linear(4, 6), nn.Linear(6, 2)

    def forward(self, x):
        return self.out(F.relu(self.inp(x)).flip(-1))


def _probe(n=64, d=4, seed=0):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _seeded(cls, seed=0):
    torch.manual_seed(seed)
    return cls().double()


REFUSED = [
    (
        _ResidualMLP,
        r"layer 'out' reads 'inp', 'mid' but a chain layer reads only 'mid' "
        r"\(a residual or skip connection\)",
    ),
    (_Reused, r"layer 'mid' is called 2 times in one forward on x"),
    (_Unused, r"layer 'spare' is never called in one forward on x"),
]


@pytest.mark.parametrize(("cls", "message"), REFUSED, ids=["residual", "reused", "unused"])
def test_non_chains_are_refused_by_every_permutation_entry_point(cls, message):
    """Issue 20's inputs: before, apply_permutation returned nets 0.34-1.64 off in relative
    output, and activation_matching on the unused layer crashed in torch.cat."""
    model, x = _seeded(cls), _probe()
    widths = [6] if cls is _Unused else [6, 6]
    perms = [torch.randperm(d, generator=torch.Generator().manual_seed(1)) for d in widths]
    with pytest.raises(ValueError, match=message):
        perm.apply_permutation(model, perms, x)
    with pytest.raises(ValueError, match=message):
        perm.activation_matching(model, _seeded(cls, seed=1), x)
    with pytest.raises(ValueError, match=message):
        perm.layer_params(model, x)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_the_skip_is_really_what_the_refusal_protects():
    """The residual net, permuted layer by layer by hand, does change its function: the
    refusal is not over-cautious. (One permutation shared by both axes would be a symmetry;
    the chain's independent per-axis permutations are not.)"""
    model, x = _seeded(_ResidualMLP), _probe()
    params = perm.layer_params(model)  # registration order = call order here
    gen = torch.Generator().manual_seed(1)
    perms = [torch.randperm(6, generator=gen) for _ in range(2)]  # two different permutations
    changed = perm.load_params(model, perm.permute_params(params, perms))
    with torch.no_grad():
        gap = (changed(x) - model(x)).abs().amax() / model(x).abs().amax()
    assert gap > 0.1


def test_layers_called_out_of_registration_order_follow_the_executed_chain():
    model, x = _seeded(_OutOfOrder), _probe()
    assert perm.trace_chain(model, x) == ["a", "b", "c"]
    # without a probe batch the order is registration order, whose widths do not chain
    with pytest.raises(ValueError, match="layer 'a' reads 4 inputs but 'c' gives 2 units"):
        perm.permutable_layers(model)
    assert [name for name, _ in perm.permutable_layers(model, x)] == ["a", "b", "c"]
    perms = [torch.randperm(d, generator=torch.Generator().manual_seed(3)) for d in (6, 5)]
    permuted = perm.apply_permutation(model, perms, x)
    torch.testing.assert_close(permuted(x), model(x), rtol=0, atol=1e-12)
    found = perm.activation_matching(model, permuted, x)
    assert [f.tolist() for f in found] == [perm.invert_permutation(p).tolist() for p in perms]
    found_w = perm.weight_matching(
        perm.layer_params(model, x),
        perm.layer_params(permuted, x),
        generator=torch.Generator().manual_seed(0),
    )
    assert [f.tolist() for f in found_w] == [f.tolist() for f in found]
    aligned = perm.apply_permutation(permuted, found)  # the probe recorded by the matching
    for p, q in zip(aligned.parameters(), model.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_a_permutation_that_changes_the_function_is_refused():
    """Structurally a chain, but ``flip`` mixes units: only the function check can tell."""
    model, x = _seeded(_Mixing), _probe()
    assert perm.trace_chain(model, x) == ["inp", "out"]
    swap = torch.tensor([1, 0, 2, 3, 4, 5])
    with pytest.raises(
        ValueError,
        match=r"the permuted model computes another function: .* "
        r"\(allowed <= 1.49e-08\)",
    ):
        perm.apply_permutation(model, [swap], x)
    palindrome = torch.tensor([5, 4, 3, 2, 1, 0])  # commutes with the flip: a symmetry still
    torch.testing.assert_close(perm.apply_permutation(model, [palindrome], x)(x), model(x))


def test_check_same_function_tolerance_is_relative_sqrt_eps():
    model = _seeded(_OutOfOrder)
    x = _probe()
    nudged = copy.deepcopy(model)
    with torch.no_grad():
        nudged.c.bias.add_(1e-3)
    with pytest.raises(ValueError, match="computes another function"):
        perm.check_same_function(model, nudged, x)
    perm.check_same_function(model, copy.deepcopy(model), x)  # identical: passes
    with pytest.raises(ValueError, match=r"output shape \(64, 3\) differs from the model's"):
        perm.check_same_function(model, nn.Sequential(nn.Linear(4, 3)).double(), x)


def test_tracing_restores_mode_and_leaves_no_hooks():
    model = nn.Sequential(nn.Linear(4, 6), nn.Dropout(0.5), nn.ReLU(), nn.Linear(6, 2)).double()
    model.train()
    x = _probe()
    assert perm.trace_chain(model, x) == ["0", "3"]
    assert model.training and model[1].training
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    perms = [torch.randperm(6, generator=torch.Generator().manual_seed(0))]
    perm.apply_permutation(model, perms, x)  # dropout is off for the check (eval mode)
    assert model.training
