"""Study bottleneck-acceleration (S16): the nets against S16's formulas, the stability number
against a dense eigenvalue, the kernel-GD engine step against its closed form, verdicts on
hand-built rows, presets, and the smoke preset end to end, killed and resumed."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from helpers import Killed, stored_rows

from dynascope import studies
from dynascope.probes.kernels import analytic_ntk_relu, kernel_gd_predictions
from dynascope.store import load_run
from dynascope.studies.bottleneck_acceleration import (
    STUDY,
    BottleneckRun,
    add_lazy_ratios,
    build_bottleneck,
    build_runs,
    make_data,
    make_net,
    measure_run,
    verdicts_from_rows,
)
from dynascope.studies.bottleneck_acceleration import runs as runs_module
from dynascope.studies.bottleneck_acceleration.protocol import PROTOCOL
from dynascope.train import Loop, run_members

F64 = torch.float64


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def cfg(**kw) -> BottleneckRun:
    return BottleneckRun(loop=Loop(steps=20, log_every=1, dtype="float64"), **kw)


def test_bottleneck_net_is_s16s_formula():
    """z = W2 φ(W1 x / √16) / √n, F = vᵀ φ(W3 z / √d) / √n (right-multiplying, x @ W)."""
    c = cfg(width=24, bottleneck=3, n_train=5, n_kernel=2)
    net = make_net(c, gen(1), F64)
    x, _ = make_data(c, gen(0), F64)
    W1, W2, W3, v = (layer.weight for layer in net.layers)
    assert [tuple(W.shape) for W in (W1, W2, W3, v)] == [(16, 24), (24, 3), (3, 24), (24, 1)]
    with torch.no_grad():
        z = torch.relu(x @ W1 / 4) @ W2 / math.sqrt(24)
        F = torch.relu(z @ W3 / math.sqrt(3)) @ v / math.sqrt(24)
        torch.testing.assert_close(net(x), F, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(net.preactivations(x)[1], z, rtol=1e-12, atol=1e-12)
    assert all(layer.bias is None for layer in net.layers)


def test_all_wide_net_and_its_middle_layer():
    c = cfg(net="wide", width=10, n_train=4, n_kernel=2)
    net = make_net(c, gen(1), F64)
    x, _ = make_data(c, gen(0), F64)
    W1, W2, W3, v = (layer.weight for layer in net.layers)
    with torch.no_grad():
        H = torch.relu(x @ W1 / 4) @ W2 / math.sqrt(10)
        out = torch.relu(torch.relu(H) @ W3 / math.sqrt(10)) @ v / math.sqrt(10)
        torch.testing.assert_close(net(x), out, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(net.preactivations(x)[1], H, rtol=1e-12, atol=1e-12)


def test_power_iteration_matches_the_dense_ntk_eigenvalue():
    """λ_max(J Jᵀ) from a per-example autograd Jacobian (float64); power iteration to 1e-8."""
    c = cfg(net="wide", width=6, n_train=7, n_kernel=2)
    net = make_net(c, gen(1), F64)
    x, _ = make_data(c, gen(0), F64)
    rows = []
    for i in range(7):
        grads = torch.autograd.grad(net(x[i : i + 1]).sum(), list(net.parameters()))
        rows.append(torch.cat([g.reshape(-1) for g in grads]))
    J = torch.stack(rows)
    expected = torch.linalg.eigvalsh(J @ J.T)[-1]
    got = runs_module._lambda_max(net, x, 100, gen(3))
    torch.testing.assert_close(got, expected, rtol=1e-8, atol=0)


def test_kernel_gd_engine_step_is_the_closed_form(tmp_path):
    """The ``kernel`` arm's train.mse at step t is the MSE of kernel_gd_predictions' f_{t-1}
    (the engine logs the loss before each update), to 1e-12 in float64."""
    c = cfg(net="kernel", n_train=12, n_kernel=4)
    run_members(build_bottleneck, c, tmp_path / "run")
    run = load_run(tmp_path / "run")
    assert run.status == "finished"
    mse = run.scalar("train.mse")
    from dynascope.train import SeedStreams

    x, y = make_data(c, SeedStreams(0).generator("task"), F64)
    K = analytic_ntk_relu(x, depth=3)
    lr = 0.25 * 12 / float(torch.linalg.eigvalsh(K)[-1])  # kernel_step c = 0.25: lr = c N / λ_max
    assert run.last("stability.lr") == pytest.approx(lr, rel=1e-12)
    f, _ = kernel_gd_predictions(None, K, y, lr, 20)
    expected = (f[:, :, 0] - y).square().mean(-1)[:20]
    np.testing.assert_allclose(mse.to_numpy(), expected.numpy(), rtol=1e-12, atol=0)


def test_net_run_logs_every_step_and_its_instruments(tmp_path):
    c = cfg(width=16, n_train=12, n_kernel=6, log_points=5, power_iters=5)
    run_members(build_bottleneck, c, tmp_path / "run")
    run = load_run(tmp_path / "run")
    assert run.status == "finished" and list(run.scalar("train.mse").index) == list(range(1, 21))
    steps, layers = run.tensors("movement.layers")
    assert steps[0] == 0 and np.all(layers[0] == 0) and layers.shape[1] == 3
    assert run.last("movement") == pytest.approx(layers[-1, 1], rel=1e-6)
    assert run.tensors("latent.spectrum")[1][-1].shape == (4,)
    assert run.last("stability.eta_lambda_over_N") == pytest.approx(0.25, rel=1e-12)
    sharp = run.scalar("stability.sharpness")  # (lr/N) λ_max(Θ_t) on the log-spaced steps
    assert sharp.index[0] == 0 and sharp.index[-1] == 20 and len(sharp) >= 5
    assert sharp.iloc[0] == pytest.approx(0.25, rel=0.02)  # 5 power iterations from two starts


def test_each_arm_steps_at_c_over_its_own_top_eigenvalue():
    """lr = c N / λ_max(Θ_0): the net's from its dense eNTK (float64, 1e-8), the lazy twin's from
    eigvalsh of the same kernel; kernel_step=None falls back to the fixed lr."""
    c = cfg(width=12, n_train=9, n_kernel=3, kernel_step=0.7, power_iters=200)
    from dynascope.train import SeedStreams

    x, _ = make_data(c, SeedStreams(0).generator("task"), F64)
    net = make_net(c, SeedStreams(0).generator("model"), F64)
    rows_ = []
    for i in range(9):
        grads = torch.autograd.grad(net(x[i : i + 1]).sum(), list(net.parameters()))
        rows_.append(torch.cat([g.reshape(-1) for g in grads]))
    J = torch.stack(rows_)
    lam = float(torch.linalg.eigvalsh(J @ J.T)[-1])
    for net_kind in ("bottleneck", "bottleneck_lazy"):
        parts = build_bottleneck(c.model_copy(update={"net": net_kind}), SeedStreams(0))
        probe = parts.probes[-1][0]
        got = probe(parts.model, type("Ctx", (), {"step": 0})())
        assert got["stability.lr"] == pytest.approx(0.7 * 9 / lam, rel=1e-8), net_kind
        assert got["stability.eta_lambda_over_N"] == pytest.approx(0.7, rel=1e-12)
    assert runs_module.arm_lr(c.model_copy(update={"kernel_step": None, "lr": 0.3}), lam) == 0.3
    with pytest.raises(ValueError, match="kernel_step"):
        cfg(kernel_step=2.0)


def test_kernel_gd_steps_to_target_is_the_first_logged_step_of_the_iteration():
    """The closed form (eigenbasis, bisection) against kernel GD iterated step by step, in the
    engine's convention (the MSE logged at step t is the one before update t); a kernel GD
    that stalls (a zero mode with a residual) never gets there."""
    g = gen(3)
    J = torch.randn(10, 30, generator=g, dtype=F64)
    K, r0 = J @ J.T, torch.randn(10, generator=g, dtype=F64)
    lr = 0.25 * 10 / float(torch.linalg.eigvalsh(K)[-1])
    r, t = r0.clone(), 0
    while True:
        t += 1
        if r.square().mean() <= 1e-3:
            break
        r = r - lr / 10 * (K @ r)
    assert runs_module.kernel_gd_steps_to_target(K, r0, lr, 1e-3) == float(t)
    assert runs_module.kernel_gd_steps_to_target(K, r0 * 1e-3, lr, 1e-3) == 1.0
    flat = torch.diag(torch.tensor([1.0, 0.0], dtype=F64))
    stalled = torch.tensor([0.0, 1.0], dtype=F64)
    assert math.isinf(runs_module.kernel_gd_steps_to_target(flat, stalled, 0.5, 1e-3))
    with pytest.raises(ValueError, match="target must be > 0"):
        runs_module.kernel_gd_steps_to_target(K, r0, lr, 0.0)


SEEDS = range(5)  # the contract's minimum


def row(net, n, seed, steps=math.nan, budget=4001.0, movement=1.0, d=4, lazy_ratio=math.nan,
        sharp=1.0, mse=1e-4):  # fmt: skip
    reached = steps
    return {"run": f"{net}_{n}_{seed}", "net": net, "n": n, "d": d, "seed": seed,
            "status": "finished", "steps_to_target": reached,
            "steps_or_budget": budget if math.isnan(reached) else reached,
            "final mse": mse, "movement": movement, "ntk change": 0.1,
            "(lr/N) λ_max(Θ0)": 0.5, "max (lr/N) λ_max(Θt)": sharp,
            "MSE / limit's": lazy_ratio}  # fmt: skip


def rows(b_steps=(2000, 2400, 2800), lazy_steps=(math.nan,) * 3, wide_move=(0.4, 0.2, 0.1),
         wide_vs_limit=(0.9,) * 5, sharp=(1.0,) * 5):  # fmt: skip
    out = []
    for s in SEEDS:
        out.append(row("kernel", 256, s, steps=6000.0, budget=8001.0))
        for n, st, lz in zip((128, 256, 512), b_steps, lazy_steps):
            out.append(row("bottleneck", n, s, steps=float(st), movement=0.7 + 0.01 * n / 128,
                           sharp=sharp[s]))  # fmt: skip
            out.append(row("bottleneck_lazy", n, s, steps=lz))
        for n, m in zip((64, 128, 256), wide_move):
            out.append(row("wide", n, s, movement=m, budget=2001.0, lazy_ratio=wide_vs_limit[s]))
    return out


def test_verdicts_on_hand_built_rows_have_known_values():
    verdicts = verdicts_from_rows(rows())
    assert PROTOCOL.check(verdicts)  # thresholds, directions, statistics: the protocol's
    v = {x.claim.split(":")[0]: x for x in verdicts}
    assert v["b1"].status == "held" and v["b1"].per_seed == pytest.approx((2800 / 6000,) * 5)
    assert v["b1"].control.per_seed == pytest.approx({s: 4001 / 6000 for s in SEEDS})
    assert v["b1"].control.status == "not held" and v["b1"].n_seeds == 5
    assert v["b2"].status == "held" and v["b2"].per_seed == pytest.approx((0.74 / 0.71,) * 5)
    assert v["b2"].control.measured == pytest.approx(4.0)  # 0.4 / 0.1
    assert v["b3"].status == "held" and v["b3"].per_seed == pytest.approx((-1.0,) * 5)
    assert "Censored bottleneck runs" in v["b1"].detail and "none" in v["b1"].detail


def test_a_net_that_did_not_train_makes_the_claims_reading_it_inconclusive():
    """The fit bar (final train MSE <= FIT_MSE) on every net a claim reads, per run."""
    bad = rows()
    next(r for r in bad if r["net"] == "wide")["final mse"] = 0.3  # one all-wide run
    v = {x.claim.split(":")[0]: x for x in verdicts_from_rows(bad)}
    assert v["b1"].status == "held"  # b1 reads no all-wide net
    assert v["b2"].status == v["b3"].status == "inconclusive"
    assert v["b2"].precondition.measured == pytest.approx(0.3)


def test_a_lazy_twin_as_fast_makes_b1_inconclusive_and_a_slow_bottleneck_fails_it():
    fast_lazy = {x.claim.split(":")[0]: x for x in verdicts_from_rows(rows(lazy_steps=(1000,) * 3))}
    assert fast_lazy["b1"].status == "inconclusive" and "control" in fast_lazy["b1"].reason
    slow = {
        x.claim.split(":")[0]: x for x in verdicts_from_rows(rows(b_steps=(2000, 2400, math.nan)))
    }
    assert slow["b1"].status == "not held" and slow["b1"].measured == pytest.approx(4001 / 6000)
    flat = {x.claim.split(":")[0]: x for x in verdicts_from_rows(rows(wide_move=(0.3,) * 3))}
    assert flat["b3"].status == "not held" and flat["b3"].measured == pytest.approx(0.0, abs=1e-12)


def test_a_bottleneck_run_at_the_edge_of_stability_makes_b1_inconclusive():
    """b1 compares GD step counts, fair only while GD is stable along the run: a bottleneck
    run whose (lr/N) λ_max(Θ_t) reaches 2 (edge of stability) makes b1 inconclusive."""
    assert verdicts_from_rows(rows(sharp=(1.0, 1.99, 1.5, 1.0, 1.0)))[0].status == "held"
    b1 = verdicts_from_rows(rows(sharp=(1.0, 2.0, 1.5, 1.0, 1.0)))[0]
    assert b1.status == "inconclusive" and "edge of stability" in b1.reason


def test_b3_is_inconclusive_unless_the_widest_all_wide_net_is_near_its_limit():
    """Within a factor 2 of the kernel GD's MSE either way passes (0.5 and 2 included); a net
    2.1x faster or slower than its limit, in one seed, makes b3 inconclusive."""
    for ratios, status in (((0.5, 1.0, 2.0, 1.0, 1.0), "held"),
                           ((1.0, 1 / 2.1, 1.0, 1.0, 1.0), "inconclusive"),
                           ((1.0, 1.0, 2.1, 1.0, 1.0), "inconclusive")):  # fmt: skip
        b3 = verdicts_from_rows(rows(wide_vs_limit=ratios))[2]
        assert b3.status == status, (ratios, b3.reason)
        assert b3.precondition.measured == pytest.approx(max(max(ratios), 1 / min(ratios)))


def test_lazy_ratio_reads_both_runs_at_the_all_wide_nets_last_step(tmp_path):
    """add_lazy_ratios: the all-wide run's train.mse at its last step over the kernel run's at
    the same step (the kernel run is longer), from the stored runs."""
    c = cfg(net="kernel", n_train=12, n_kernel=4)
    run_members(build_bottleneck, c, tmp_path / "kernel")
    w = cfg(net="wide", width=8, n_train=12, n_kernel=4, log_points=3, power_iters=3)
    w = w.model_copy(update={"loop": Loop(steps=7, log_every=1, dtype="float64")})
    run_members(build_bottleneck, w, tmp_path / "wide")
    runs = {"kernel": load_run(tmp_path / "kernel"), "wide": load_run(tmp_path / "wide")}
    got = [measure_run(name, run) for name, run in runs.items()]
    add_lazy_ratios(got, runs)
    expected = runs["wide"].scalar("train.mse").loc[7] / runs["kernel"].scalar("train.mse").loc[7]
    assert got[1]["MSE / limit's"] == pytest.approx(expected, rel=1e-12)
    assert math.isnan(got[0]["MSE / limit's"])


def test_presets_build_the_planned_runs():
    assert studies.get("bottleneck-acceleration") is STUDY
    fast = build_runs(STUDY.preset("fast"))
    assert len(fast) == 5 * (1 + 3 + 2 * 3)
    by = {s.name: s for s in fast}
    assert by["kernel_seed0"].config.loop.steps == 5000 and by["kernel_seed0"].group is None
    assert by["bottleneck_d4_n512_seed2"].group == "bottleneck_d4_n512"
    assert by["bottleneck_d4_n512_seed2"].config.loop.steps == 3000
    assert by["wide_n256_seed1"].config.loop.steps == 1200
    assert {s.config.kernel_step for s in fast} == {0.25}
    assert {s.config.seed for s in build_runs(STUDY.preset("smoke"), seed=1000)} == {
        1000, 1001, 1002}  # fmt: skip


def test_full_preset_is_the_registered_protocol():
    """full: fast's arms with b1's bottleneck budget at 10k steps (no censoring on the
    calibration seeds), 5 seeds per arm, seeds base + k; no run trains here."""
    full = build_runs(STUDY.preset("full"), seed=1000)
    n_seeds = PROTOCOL.seeds["full"]
    assert n_seeds >= 5 and len(full) == n_seeds * (1 + 3 + 2 * 3)
    by = {s.name: s for s in full}
    for n in (128, 256, 512):
        for k in range(n_seeds):
            bott, lazy = by[f"bottleneck_d4_n{n}_seed{k}"], by[f"lazy_d4_n{n}_seed{k}"]
            assert bott.config.loop.steps == lazy.config.loop.steps == 10000
            assert bott.group == f"bottleneck_d4_n{n}" and bott.config.seed == 1000 + k
    assert {s.config.loop.steps for s in full if s.config.net == "wide"} == {1200}
    assert sorted({s.config.width for s in full if s.config.net == "wide"}) == [64, 128, 256]
    assert {s.config.loop.steps for s in full if s.config.net == "kernel"} == {5000}
    assert {s.config.kernel_step for s in full} == {0.25}
    assert {s.config.loop.device for s in full} == {"cpu"}
    assert "full" in PROTOCOL.presets and 10000 in PROTOCOL.calibration_seeds


def test_smoke_preset_end_to_end(smoke_out):
    whole, out = smoke_out
    data = json.loads((out / "verdict.json").read_text())
    assert [c["claim"].split(":")[0] for c in data["claims"]] == ["b1", "b2", "b3"]
    assert data["protocol"]["sha256"] == PROTOCOL.sha256
    # smoke's 3 seeds are below the contract's 5: plumbing only, every verdict inconclusive
    assert {c["status"] for c in data["claims"]} == {"inconclusive"}
    assert all(c["control"]["kind"] == "ablation" for c in data["claims"])
    # b1's control: each lazy twin's exact steps to the target (not its 200-step budget)
    b1 = whole.claims[0]
    for seed in b1.seeds:
        exact = [load_run(out / "runs" / f"lazy_d4_n{n}_seed{seed - b1.seeds[0]}")
                 .last("kgd.steps_to_target") for n in (32, 64)]  # fmt: skip
        kernel = load_run(out / "runs" / f"kernel_seed{seed - b1.seeds[0]}")
        k_steps = measure_run("kernel", kernel)["steps_to_target"]
        assert b1.control.per_seed[seed] == pytest.approx(max(exact) / k_steps, rel=1e-12)
        assert max(exact) > 201  # past the twin's budget: it would have been censored


def test_smoke_killed_in_the_kernel_run_resumes_and_ends_as_an_uninterrupted_run(
    smoke_out, tmp_path, monkeypatch
):
    """Kept beside test_resume_every_study: it kills the kernel-GD run (its own step, not the
    engine's nets), which runs first; the shared test's kill, at half the store writes, lands
    in a bottleneck net run."""
    whole, out = smoke_out
    real, calls = runs_module.KernelGD.__call__, {"n": 0}

    def dies_at_step_100(self, *args):
        calls["n"] += 1
        if calls["n"] == 100:  # the first kernel run, after its checkpoint at step 90
            raise Killed
        return real(self, *args)

    monkeypatch.setattr(runs_module.KernelGD, "__call__", dies_at_step_100)
    with pytest.raises(Killed):
        STUDY.run(preset="smoke", out=tmp_path / "cut")
    monkeypatch.setattr(runs_module.KernelGD, "__call__", real)
    done: dict[str, str] = {}

    def on_run(name, status, seconds, action):
        done[name] = action

    cut = STUDY.run(preset="smoke", out=tmp_path / "cut", on_run=on_run)
    assert done["kernel_seed0"] == "resumed" and "restarted" not in done.values()
    for name in done:
        assert stored_rows(tmp_path / "cut" / "runs" / name) == stored_rows(out / "runs" / name)
    assert [c.per_seed for c in cut.claims] == [c.per_seed for c in whole.claims]
