"""Study ntk-lazy-validity: the net against MLP, centering, the engine run against the twin's
closed form, the slope and exponent fits on power laws, the verdicts on hand-built stores,
presets, and the smoke preset end to end, killed and resumed."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from helpers import Killed, stored_rows
from pydantic import ValidationError

from dynascope import studies
from dynascope.nn.mlp import MLP
from dynascope.store import RunStore, load_run
from dynascope.studies.ntk_lazy_validity import (
    STUDY,
    LazyRun,
    alpha_slope,
    analyze,
    build_h,
    build_lazy,
    build_runs,
    growth_exponent,
    two_layer,
)
from dynascope.studies.ntk_lazy_validity import runs as runs_module
from dynascope.studies.ntk_lazy_validity.protocol import PROTOCOL
from dynascope.train import Loop, run_members

F64 = torch.float64


def loop(steps: int) -> Loop:
    return Loop(steps=steps, log_every=10, dtype="float64", checkpoint_every=20)


def test_two_layer_is_the_ntk_mlp_of_depth_one():
    g = torch.Generator().manual_seed(0)
    net = MLP(5, 13, 1, depth=1, parametrization="ntk", activation="tanh", generator=g, dtype=F64)
    x = torch.randn(7, 5, generator=g, dtype=F64)
    w = {"W": net.layers[0].weight.detach(), "v": net.layers[1].weight.detach()}
    torch.testing.assert_close(two_layer(w, x, "tanh"), net(x).detach(), rtol=0, atol=1e-14)
    wb = {k: torch.stack([v, 2 * v]) for k, v in w.items()}  # a leading alpha axis
    torch.testing.assert_close(two_layer(wb, x, "tanh")[0], net(x).detach(), rtol=0, atol=1e-14)


@pytest.mark.parametrize("centering", ["antisymmetric", "offset"])
def test_h_vanishes_at_init_and_moves_after(centering):
    cfg = LazyRun(loop=loop(10), width=9, n_train=4, alphas=[1.0], centering=centering)
    h_fn, w0 = build_h(cfg, torch.Generator().manual_seed(1), F64)
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(2), dtype=F64)
    torch.testing.assert_close(h_fn(w0, x), torch.zeros(4, 1, dtype=F64), rtol=0, atol=0)
    first = next(iter(w0))  # "a_W" (antisymmetric) or "W": moving one copy breaks the symmetry
    assert h_fn({**w0, first: w0[first] + 0.1}, x).abs().max() > 1e-3


@pytest.mark.parametrize("centering", ["antisymmetric", "offset"])
def test_twin_products_with_the_jacobian_equal_linearize_and_its_vjp(centering):
    """Oracle: LazyStep's twin output ``alpha hbar`` and gradient (products with J = Dh(w0))
    equal dynascope.probes.linearize and torch.func.vjp at w0 on a random wbar, to 1e-12."""
    from torch.func import vjp

    from dynascope.probes.kernels import linearize

    cfg = LazyRun(loop=loop(10), width=12, n_train=6, alphas=[2.0, 16.0], centering=centering)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, cfg.d_in, generator=g, dtype=F64)
    f_star = torch.randn(6, generator=g, dtype=F64)
    h_fn, w0 = build_h(cfg, g, F64)
    alphas = torch.tensor(cfg.alphas, dtype=F64)
    w0b = {k: v.expand(2, *v.shape).clone() for k, v in w0.items()}
    step = runs_module.LazyStep(h_fn, w0b, x, f_star, alphas, cfg.lr, torch.eye(6, dtype=F64))
    wbar = {k: v + 0.3 * torch.randn(v.shape, generator=g, dtype=F64) for k, v in w0b.items()}
    expected = alphas[:, None] * linearize(h_fn, w0b)(wbar, x)[..., 0]
    torch.testing.assert_close(step.twin_output(wbar), expected, rtol=0, atol=1e-12)
    _, pullback = vjp(lambda w: h_fn(w, x)[..., 0], w0b)
    (grad,) = pullback((expected - f_star) / alphas[:, None])
    got = step.twin_gradient(expected)
    for k in w0b:
        torch.testing.assert_close(got[k], grad[k], rtol=0, atol=1e-12)


@pytest.mark.parametrize("centering", ["antisymmetric", "none"])
def test_engine_run_twin_matches_the_closed_form_and_logs_sups(tmp_path, centering):
    """Oracle: GD on the twin is alpha hbar_t = f* - (I - eta K)^t (f* - alpha h(w0)) (to 1e-10
    in float64; alpha h(w0) = 0 when centered, not for the uncentered control); D is a running
    sup from 0; the weights move O(1/alpha) when centered."""
    cfg = LazyRun(loop=loop(60), width=12, n_train=6, alphas=[2.0, 16.0], kernel_points=2,
                  probe_every=1, centering=centering)  # fmt: skip
    run_members(build_lazy, cfg, tmp_path / "run")
    run = load_run(tmp_path / "run")
    assert run.status == "finished"
    steps, D = run.tensors("D")
    assert list(steps) == list(range(61)) and D.shape == (61, 2)
    # h(w0) = hbar(w0) (= 0 when centered; uncentered, alpha h(w0) = O(alpha): 1e-12 rounding)
    np.testing.assert_allclose(D[0], [0.0, 0.0], rtol=0, atol=0 if centering != "none" else 1e-12)
    assert np.all(np.diff(D, axis=0) >= 0) and D[-1].min() > 0
    assert run.tensors("oracle_error")[1][-1].max() <= 1e-10
    assert 0 < run.last("lr_lambda_max") < 2
    residual = run.tensors("residual")[1]
    if centering == "none":  # alpha h(w0) = O(alpha): the initial residual grows with alpha
        assert residual[0, 1] > 3 * residual[0, 0]
        return
    np.testing.assert_allclose(residual[0, 0], residual[0, 1], rtol=1e-12)  # ||f*|| for both
    dist = run.tensors("param_dist")[1][-1]
    assert 0.5 < dist[0] * 2.0 / (dist[1] * 16.0) < 2.0


def test_slope_and_exponent_recover_power_laws():
    """D = 3 t^1.5 / alpha^2: alpha-slope -2 and alpha*(T) ~ T^(1.5 / 2) exactly."""
    alphas = np.array([8.0, 16.0, 32.0, 64.0])
    t = np.arange(0, 5001) * 0.01
    D = 3.0 * t[:, None] ** 1.5 / alphas[None] ** 2
    assert alpha_slope(alphas, D[-1]) == pytest.approx(-2.0, abs=1e-12)
    assert growth_exponent(alphas, t, D, 1.0, 50.0) == pytest.approx(0.75, abs=1e-12)
    assert np.isnan(growth_exponent(alphas, t, D * alphas**3, 1.0, 50.0))  # D grows with alpha
    assert np.isnan(alpha_slope(alphas[:2], D[-1, :2]))  # two points: no slope


def write_run(path, *, seed, centering, D_fn, steps=5000, lr=0.01, fit=True):
    alphas = [4.0, 8.0, 16.0, 32.0, 64.0, 128.0]
    cfg = LazyRun(loop=loop(steps), seed=seed, alphas=alphas, centering=centering, lr=lr)
    a = torch.tensor(alphas, dtype=F64)
    with RunStore(path) as store:
        store.write_config(cfg.model_dump(mode="json"))
        store.set_status(0, "running")
        store.log(0, {"lr_lambda_max": 0.5})
        for step in [*range(10), *range(10, steps + 1, 10)]:
            t = step * lr
            store.log(step, {"D": D_fn(t, a), "move": torch.ones(6, dtype=F64) * min(t, 1.0),
                             "oracle_error": torch.zeros(6, dtype=F64),
                             "residual": torch.ones(6, dtype=F64) * (math.exp(-t) if fit else 1),
                             "param_dist": 1.0 / a, "ntk.relative_change": 0.1 / a})  # fmt: skip
        store.set_status(steps, "finished")
    return load_run(path)


def anti(t, a):
    return (t**3 if t < 1 else t**1.5) / a**2


def offset(t, a):
    return (t**2 if t < 1 else t**1.2) / a


def uncentered(t, a):
    return t * a / 100  # the initial residual grows with alpha: D grows with it


def power_law_runs(tmp_path, none_fn=uncentered, seeds=5, fit=True):
    runs = {}
    for seed in range(seeds):
        for centering, fn in (("antisymmetric", anti), ("offset", offset), ("none", none_fn)):
            runs[f"s{seed}_{centering}"] = write_run(
                tmp_path / f"{centering}{seed}", seed=seed, centering=centering, D_fn=fn,
                fit=fit or centering != "none")  # fmt: skip
    return runs


def test_the_verdicts_on_power_law_stores(tmp_path):
    """Antisymmetric: D = t^3 / a^2 early, t^1.5 / a^2 late; offset: t^2 / a early, t^1.2 / a
    late (continuous at t = 1); the uncentered control: D = t a / 100. Known: n1 slopes -2 and
    -1, n2 exponents 0.75 and 1.2 (> 1.1: not held), early controls 1.5 and 2; n1's control
    is the uncentered runs' slope, +1 (not held)."""
    analysis = analyze(power_law_runs(tmp_path), tmp_path / "fig")
    v = {x.claim.split(":")[0]: x for x in analysis.verdicts}
    assert list(v) == ["n1", "n2", "n1-offset", "n2-offset"]
    assert v["n1"].status == "held" and v["n1"].per_seed == pytest.approx((-2.0,) * 5)
    assert v["n1"].interval == pytest.approx((-2.0, -2.0)) and v["n1"].n_seeds == 5
    for claim in ("n1", "n1-offset"):  # read from the s*_none runs
        assert v[claim].control.status == "not held"
        assert v[claim].control.measured == pytest.approx(1.0)
        assert v[claim].control.kind == "ablation" and v[claim].precondition.met
    assert v["n2"].status == "held" and v["n2"].per_seed == pytest.approx((0.75,) * 5)
    assert v["n2"].control.measured == pytest.approx(1.5)
    assert v["n1-offset"].status == "held" and v["n1-offset"].per_seed == pytest.approx((-1.0,) * 5)
    assert v["n2-offset"].status == "not held" and v["n2-offset"].measured == pytest.approx(1.2)
    assert v["n2-offset"].control.measured == pytest.approx(2.0)
    assert v["n1"].threshold == PROTOCOL.claim("n1").threshold
    assert len(analysis.figures) == 1


def test_a_control_that_also_falls_like_one_over_alpha_makes_n1_inconclusive(tmp_path):
    """If the uncentered net's D fell like 1/alpha too, the slope could not tell the centered
    net from its ablation: n1 then reads inconclusive, not held."""
    analysis = analyze(power_law_runs(tmp_path, none_fn=offset), tmp_path / "fig")
    n1 = analysis.verdicts[0]
    assert n1.control.status == "held" and n1.status == "inconclusive"


def test_an_arm_that_does_not_fit_its_targets_fails_n1s_precondition(tmp_path):
    """The uncentered control that never fits (residual stays at its start): n1 and n1-offset
    inconclusive on the precondition; n2 reads only its own arm and is judged."""
    analysis = analyze(power_law_runs(tmp_path, fit=False), tmp_path / "fig")
    v = {x.claim.split(":")[0]: x for x in analysis.verdicts}
    assert not v["n1"].precondition.met and v["n1"].status == "inconclusive"
    assert v["n1"].precondition.measured == pytest.approx(1.0)
    assert v["n2"].precondition.met and v["n2"].status == "held"


def test_presets_validate_and_build_the_planned_runs():
    assert studies.get("ntk-lazy-validity") is STUDY
    fast = {s.name: s.config for s in build_runs(STUDY.preset("fast"))}
    assert list(fast) == [
        f"s{k}_{c}" for k in range(5) for c in ("antisymmetric", "offset", "none")]  # fmt: skip
    assert {c.loop.steps for c in fast.values()} == {5000}
    assert fast["s3_none"].model_copy(update={"centering": "offset"}) == fast["s3_offset"]
    assert {c.seed for c in build_runs(STUDY.preset("fast"), seed=1000)
            for c in [c.config]} == {1000, 1001, 1002, 1003, 1004}  # fmt: skip
    full = {s.name: s.config for s in build_runs(STUDY.preset("full"))}
    assert list(full) == list(fast) and {c.loop.steps for c in full.values()} == {10_000}
    assert {k: c.model_copy(update={"loop": fast[k].loop}) for k, c in full.items()} == fast
    assert (
        STUDY.protocol.seeds["full"] == 5
        and "T = 100 (10,000 steps)" in (STUDY.protocol.presets["full"])
    )
    paper = {s.name: s.config for s in build_runs(STUDY.preset("paper"))}
    assert len(paper) == 16 and paper["eta_half"].loop.steps == 100_000
    assert paper["eta_half"].lr == pytest.approx(5e-3)
    with pytest.raises(ValidationError, match="alphas must all be > 0"):
        LazyRun(loop=loop(1), alphas=[1.0, -2.0])


def test_smoke_preset_end_to_end(smoke_out):
    _, out = smoke_out
    data = json.loads((out / "verdict.json").read_text())
    assert [c["claim"].split(":")[0] for c in data["claims"]] == [
        "n1", "n2", "n1-offset", "n2-offset"]  # fmt: skip
    assert all(r["status"] == "finished" for r in data["runs"])


def test_smoke_killed_midway_resumes_and_ends_as_an_uninterrupted_run(
    smoke_out, tmp_path, monkeypatch
):
    """Kept beside test_resume_every_study: it kills a run after a checkpoint (step 40), so
    the running sups restart from the checkpoint; the shared test's kill, at half the store
    writes, lands at step 9 of run s1_offset, before that run's first checkpoint (step 20)."""
    whole, out = smoke_out
    real, calls = runs_module._take_sups, {"n": 0}

    def dies_at_step_50(*args):
        calls["n"] += 1
        if calls["n"] == 50:  # first run, after its checkpoint at step 40
            raise Killed
        return real(*args)

    monkeypatch.setattr(runs_module, "_take_sups", dies_at_step_50)
    with pytest.raises(Killed):
        STUDY.run(preset="smoke", out=tmp_path / "cut")
    monkeypatch.setattr(runs_module, "_take_sups", real)
    done: dict[str, str] = {}

    def on_run(name, status, seconds, action):
        done[name] = action

    cut = STUDY.run(preset="smoke", out=tmp_path / "cut", on_run=on_run)
    assert done["s0_antisymmetric"] == "resumed" and "restarted" not in done.values()
    for name in done:
        assert stored_rows(tmp_path / "cut" / "runs" / name) == stored_rows(out / "runs" / name)
    assert [c.per_seed for c in cut.claims] == [c.per_seed for c in whole.claims]
