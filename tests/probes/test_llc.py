"""The local learning coefficient (dynascope.probes.llc) against models whose λ is known.

Oracles:
- a quadratic loss sampled with a full batch: Langevin with step ε on the Gaussian of precision
  p = nβ h + γ has the exact stationary variance 1 / (p (1 − ε p / 4)), so
  λ̂ = ½ Σ_i nβ h_i / (p_i (1 − ε p_i / 4)) in closed form (step bias and localization included);
- (a) linear regression with d parameters: λ = d/2 (regular model);
- (b) y = a·b·x at a true a·b = c ≠ 0: λ = 1/2 (the true set ab = c is a smooth curve);
- (c) reduced-rank regression y = B A x, A: [H, M], B: [N, H], true rank r: the closed form of
  Aoyagi & Watanabe (2005), checked below on cases known independently.
The data are realizable without noise (y = f(x; w0)), so L_n(w) − L_n(w0) is the empirical
K_n(w) with no O(1/sqrt(log n)) fluctuation term (Watanabe 2013, WBIC, Theorem 4), and w* = w0.
(a)–(c) choose ε and γ with llc_calibrate (the same ladders and budget for every case), then
measure at those settings with 8 chains x 1000 draws; tolerance 10 % of λ (the goal of
issue 30), about three standard errors of the final run.
"""

from __future__ import annotations

import math

import pytest
import torch

from dynascope.probes import default_n_beta, head_restriction, llc, llc_calibrate

F64 = torch.float64


def _batches(x, y, size):
    return [{"x": x[i : i + size], "y": y[i : i + size]} for i in range(0, x.shape[0], size)]


def aoyagi_watanabe(M: int, N: int, H: int, r: int) -> tuple[float, int]:
    """(λ, m) of reduced-rank regression, Aoyagi & Watanabe (2005), Neural Networks 18,
    Main Theorem: M inputs, N outputs, H hidden units, true rank r <= H."""
    if N + r <= M + H and M + r <= N + H and H + r <= M + N:
        s = 2 * (H + r) * (M + N) - (M - N) ** 2 - (H + r) ** 2
        return (s / 8, 1) if (M + H + N + r) % 2 == 0 else ((s + 1) / 8, 2)
    if M + H < N + r:
        return (H * M - H * r + N * r) / 2, 1
    if N + H < M + r:
        return (H * N - H * r + M * r) / 2, 1
    return M * N / 2, 1


@pytest.mark.parametrize(("M", "N", "H"), [(3, 3, 3), (4, 2, 2), (2, 5, 2), (3, 4, 1)])
def test_aoyagi_watanabe_full_rank_is_the_regular_count(M, N, H):
    # r = H <= min(M, N): the true set is a smooth manifold of rank-H matrices, of dimension
    # H (M + N - H) in a parameter space of H (M + N): λ = (d - dim)/2 ... = H (M + N - H) / 2
    assert aoyagi_watanabe(M, N, H, H) == (H * (M + N - H) / 2, 1)


@pytest.mark.parametrize("M", [1, 2, 3, 5])
def test_aoyagi_watanabe_product_of_two_vectors(M):
    # H = 1, r = 0: K = |a|^2 |b|^2 (a in R^M, b in R^N): λ = min(M, N) / 2, m = 2 iff M = N
    # (Watanabe 2009, §7.1 example); M = N = 1 is case (b) at the origin: λ = 1/2, m = 2.
    for N in (M, M + 1, M + 3):
        lam, m = aoyagi_watanabe(M, N, 1, 0)
        assert lam == min(M, N) / 2
        assert m == (2 if M == N else 1)


def _quadratic(h, n_beta, gamma, step):
    exact = 0.5 * sum(
        n_beta * hi / ((n_beta * hi + gamma) * (1 - step * (n_beta * hi + gamma) / 4)) for hi in h
    )
    return exact


def test_quadratic_loss_matches_the_exact_langevin_variance():
    h = torch.tensor([0.5, 1.0, 2.0, 4.0], dtype=F64)
    loss_fn = lambda p, b: 0.5 * (h * p["w"] ** 2).sum()  # noqa: E731
    n_beta, gamma, step = 100.0, 20.0, 2e-3  # ε p up to 0.84: a large, known step bias
    result = llc(loss_fn, {"w": torch.zeros(4, dtype=F64)}, [None], n_beta=n_beta,
                 localization=gamma, step_size=step, n_chains=4, n_draws=600, seed=0)  # fmt: skip
    exact = _quadratic(h.tolist(), n_beta, gamma, step)
    stderr = result.std / 2
    assert abs(result.mean - exact) < 4 * stderr + 0.02 * exact, (result.mean, exact, stderr)
    # the drift energy is exactly Σ p_i / (1 − ε p_i / 4) at stationarity
    p = [n_beta * hi + gamma for hi in h.tolist()]
    energy = sum(pi / (1 - step * pi / 4) for pi in p)
    assert result.step_bias == pytest.approx(step * energy / (8 * result.mean), rel=0.1)


def test_seeded_calls_repeat_and_leave_the_global_rng_alone():
    loss_fn = lambda p, b: 0.5 * (p["w"] ** 2).sum()  # noqa: E731
    params = {"w": torch.zeros(3)}
    state = torch.get_rng_state()
    kwargs = dict(n_beta=50.0, localization=1.0, step_size=1e-3, n_chains=2, n_draws=20, seed=3)
    a, b = llc(loss_fn, params, [None], **kwargs), llc(loss_fn, params, [None], **kwargs)
    assert torch.equal(a.trace, b.trace)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(params["w"], torch.zeros(3))


def test_restrict_samples_only_the_selected_entries():
    seen = []

    def loss_fn(p, b):
        seen.append({k: v.detach().clone() for k, v in p.items()})
        return 0.5 * sum((v**2).sum() for v in p.values())

    params = {"W_Q": torch.zeros(3, 4, 2), "W_O": torch.zeros(3, 2, 4), "b_O": torch.zeros(4)}
    restrict = head_restriction("attn", 1, biases=False)
    restrict = {k.removeprefix("attn."): v for k, v in restrict.items() if "W_Q" in k or "W_O" in k}
    llc(loss_fn, params, [None], n_beta=10.0, localization=1.0, step_size=1e-2, n_chains=1,
        n_draws=5, restrict=restrict)  # fmt: skip
    last = seen[-1]
    for name in ("W_Q", "W_O"):
        assert bool((last[name][1] != 0).all()), name
        assert bool((last[name][[0, 2]] == 0).all()), name
    assert bool((last["b_O"] == 0).all())


def test_head_restriction_names_the_per_head_weights():
    assert head_restriction("blocks.0.attn", 2) == {
        f"blocks.0.attn.{n}": 2 for n in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V")
    }


def test_a_diverging_chain_gives_nan():
    loss_fn = lambda p, b: 0.5 * (p["w"] ** 2).sum()  # noqa: E731
    result = llc(loss_fn, {"w": torch.zeros(2)}, [None], n_beta=1e4, localization=0.0,
                 step_size=1.0, n_chains=2, n_draws=50)  # fmt: skip
    assert math.isnan(result.mean) and bool(torch.isnan(result.per_chain).all())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_beta": 0.0}, "n_beta must be a finite number > 0"),
        ({"step_size": -1.0}, "step_size must be a finite number > 0"),
        ({"localization": float("nan")}, "localization must be a finite number >= 0"),
        ({"n_chains": 0}, "n_chains must be an integer >= 1"),
        ({"n_draws": 1}, "n_draws must be an integer >= 2"),
        ({"burn_in": -1}, "burn_in must be an integer >= 0"),
        ({"preconditioner": "adam"}, "preconditioner must be None or 'rmsprop'"),
        ({"restrict": {"v": True}}, "restrict names parameters not in params"),
        ({"restrict": {"w": torch.ones(3, dtype=torch.bool)}}, r"restrict\['w'\] mask must"),
        ({"restrict": {"w": 7}}, r"restrict\['w'\] must be True, a bool mask or an index"),
        ({"restrict": {"w": False}}, "restrict selects no parameter entry"),
    ],
)
def test_bad_arguments_are_refused(kwargs, match):
    base = dict(n_beta=10.0, localization=1.0, step_size=1e-3, n_chains=1, n_draws=4)
    with pytest.raises(ValueError, match=match):
        llc(lambda p, b: (p["w"] ** 2).sum(), {"w": torch.zeros(2)}, [None], **{**base, **kwargs})


def test_a_loss_that_is_not_finite_at_w_star_is_refused():
    with pytest.raises(ValueError, match="loss_fn is not finite at params on batch 0"):
        llc(lambda p, b: p["w"].sum() / 0.0, {"w": torch.ones(2)}, [None], n_beta=1.0,
            localization=1.0, step_size=1.0)  # fmt: skip


def test_calibrate_refuses_when_no_step_size_works():
    loss_fn = lambda p, b: 0.5 * (p["w"] ** 2).sum()  # noqa: E731
    with pytest.raises(ValueError, match="llc_calibrate: no step size passed .* diverged"):
        llc_calibrate(loss_fn, {"w": torch.zeros(2)}, [None], n_beta=1e4, n_chains=2,
                      n_draws=10, step_sizes=[10.0, 5.0])  # fmt: skip


# (a)-(c): known learning coefficients, settings from llc_calibrate -------------------------

N_SAMPLES, BATCH = 4096, 64


def _linear(d=10):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N_SAMPLES, d, generator=g, dtype=F64)
    w0 = torch.randn(d, generator=g, dtype=F64)
    loss = lambda p, b: 0.5 * ((b["x"] @ p["w"] - b["y"]) ** 2).mean()  # noqa: E731
    return loss, {"w": w0}, _batches(x, x @ w0, BATCH), d / 2


def _product(c=1.0):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N_SAMPLES, generator=g, dtype=F64)
    a0 = b0 = torch.tensor(math.sqrt(c), dtype=F64)
    loss = lambda p, b: 0.5 * ((p["a"] * p["b"] * b["x"] - b["y"]) ** 2).mean()  # noqa: E731
    return loss, {"a": a0, "b": b0}, _batches(x, c * x, BATCH), 0.5


def _reduced_rank(M=3, N=3, H=3, r=1):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N_SAMPLES, M, generator=g, dtype=F64)
    A0, B0 = torch.zeros(H, M, dtype=F64), torch.zeros(N, H, dtype=F64)
    A0[:r] = torch.randn(r, M, generator=g, dtype=F64)  # the unused H - r hidden units are
    B0[:, :r] = torch.randn(N, r, generator=g, dtype=F64)  # zero in A and B: most singular
    loss = lambda p, b: 0.5 * ((b["x"] @ (p["B"] @ p["A"]).T - b["y"]) ** 2).sum(-1).mean()  # noqa: E731
    lam, m = aoyagi_watanabe(M, N, H, r)
    assert m == 1  # M + N + H + r even: no log log n term slowing the convergence
    return loss, {"A": A0, "B": B0}, _batches(x, x @ (B0 @ A0).T, BATCH), lam


@pytest.mark.slow
@pytest.mark.parametrize(
    "case", [_linear, _product, _reduced_rank], ids=["a-linear", "b-ab", "c-rrr"]
)
def test_llc_recovers_the_known_learning_coefficient(case):
    loss_fn, params, batches, known = case()
    n_beta = default_n_beta(N_SAMPLES)
    cal = llc_calibrate(loss_fn, params, batches, n_beta=n_beta, n_chains=4, n_draws=1000)
    result = llc(loss_fn, params, batches, n_beta=n_beta, localization=cal.localization,
                 step_size=cal.step_size, n_chains=8, n_draws=1000, seed=1)  # fmt: skip
    assert abs(result.mean - known) <= 0.1 * known, (result.mean, known, cal.tried)


def test_llc_probe_logs_on_the_step_axis_with_a_per_head_label():
    import dynascope as ds
    from dynascope.probes import LLC, ProbeContext

    torch.manual_seed(0)
    model = ds.nn.Transformer(
        n_layers=1, d_model=12, n_heads=3, d_mlp=20, d_vocab=11, d_out=11, n_ctx=7
    )
    task = ds.tasks.AssociativeRecall(n_keys=6, n_values=5, n_pairs=3)
    batch = task.batch("train", 16, torch.Generator().manual_seed(1))
    probe = LLC(restrict=head_restriction("blocks.0.attn", 1, biases=False), include=["blocks.0.attn."],
                label="L0.H1", n_chains=2, n_draws=20)  # fmt: skip
    out = probe(model, ProbeContext(step=0, batch=batch))
    assert set(out) == {f"L0.H1.llc.{k}" for k in ("mean", "std", "step_bias", "init_loss")}
    assert all(math.isfinite(out[f"L0.H1.llc.{k}"]) for k in ("mean", "std", "init_loss"))
    # an untrained model is no minimum: λ̂ <= 0 there gives step_bias = inf (documented)
    assert out["L0.H1.llc.step_bias"] > 0


def test_llc_under_no_grad_samples_with_the_loss_gradient():
    # Every probe runs under torch.no_grad(); the chain must still follow the loss's gradient.
    # Oracle: the same call with gradients on (the trace is bitwise the same: same seed, same
    # operations). Before the fix the no_grad chain got a zero gradient (a random walk held
    # only by γ), 1.44 instead of 0.80 here.
    x = torch.randn(64, 3, generator=torch.Generator().manual_seed(0), dtype=F64)
    y = x @ torch.tensor([1.0, -2.0, 0.5], dtype=F64)
    loss_fn = lambda p, b: 0.5 * ((x @ p["w"] - y) ** 2).mean()  # noqa: E731
    params = {"w": torch.tensor([1.0, -2.0, 0.5], dtype=F64)}
    kwargs = dict(n_beta=default_n_beta(64), localization=1.0, step_size=1e-3, n_chains=2,
                  n_draws=50, seed=0)  # fmt: skip
    with_grad = llc(loss_fn, params, [None], **kwargs)
    with torch.no_grad():
        without = llc(loss_fn, params, [None], **kwargs)
    torch.testing.assert_close(without.trace, with_grad.trace, rtol=0, atol=0)


def test_llc_probe_equals_the_pure_function_on_its_loss():
    # The probe (under no_grad, model in eval mode) against llc() on the same loss of the same
    # parameters, batch, settings and seed: equal traces, so equal estimates.
    import dynascope as ds
    from dynascope.probes import LLC, ProbeContext

    torch.manual_seed(0)
    model = ds.nn.Transformer(n_layers=1, d_model=12, n_heads=3, d_mlp=20, d_vocab=11, d_out=11,
                              n_ctx=7)  # fmt: skip
    task = ds.tasks.AssociativeRecall(n_keys=6, n_values=5, n_pairs=3)
    batch = task.batch("train", 16, torch.Generator().manual_seed(1))
    settings = dict(n_beta=10.0, step_size=1e-3, localization=1.0, n_chains=2, n_draws=20)
    out = LLC(batch=batch, **settings)(model, ProbeContext(step=0))
    params = {name: p.detach() for name, p in model.named_parameters()}

    def loss_fn(p, _):
        output = torch.func.functional_call(model, p, (batch["x"],))
        return torch.nn.functional.cross_entropy(output[:, -1], batch["y"])

    model.eval()
    expected = llc(loss_fn, params, [None], **settings)
    assert out["llc.mean"] == pytest.approx(expected.mean, rel=1e-12)
