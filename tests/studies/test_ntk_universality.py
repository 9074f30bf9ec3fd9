"""Study ntk-universality: data, the runner's twin against a recomputation, the slope fit,
presets, and the smoke preset end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from dynascope import studies
from dynascope.probes.kernels import empirical_ntk, kernel_gd_predictions, model_function
from dynascope.store import load_run
from dynascope.studies.ntk_universality import STUDY, build_runs
from dynascope.studies.ntk_universality.analysis import _precondition
from dynascope.studies.ntk_universality.analysis import slope as _slope
from dynascope.studies.ntk_universality.protocol import PROTOCOL
from dynascope.studies.ntk_universality.runs import (
    UniversalityRun,
    build_model,
    build_universality,
    gd_lr,
    make_data,
)
from dynascope.train import Loop, SeedStreams, run_members

LOOP = Loop(steps=6, dtype="float64")


@pytest.mark.parametrize("arch", ["mlp", "rnn", "attention"])
def test_inputs_lie_on_the_sphere_and_data_depends_only_on_the_inputs_stream(arch):
    cfg = UniversalityRun(arch=arch, width=8, n_train=3, pos=4, seed=5, loop=LOOP)
    x, y = make_data(cfg, SeedStreams(5).generator("inputs"))
    assert x.shape == ((3, 8) if arch == "mlp" else (3, 4, 8)) and y.shape == (3,)
    torch.testing.assert_close(
        torch.linalg.vector_norm(x, dim=-1),
        torch.full(x.shape[:-1], math.sqrt(8.0), dtype=torch.float64),
    )
    x2, y2 = make_data(cfg.model_copy(update={"width": 32}), SeedStreams(5).generator("inputs"))
    assert torch.equal(x, x2) and torch.equal(y, y2)
    x3, _ = make_data(cfg, SeedStreams(6).generator("inputs"))
    assert not torch.equal(x, x3)


def test_runner_logs_the_kgd_deviation_of_its_own_trajectory(tmp_path):
    cfg = UniversalityRun(arch="rnn", width=10, n_train=4, kernel_steps=[0, 6], seed=3, loop=LOOP)
    run_members(build_universality, cfg, tmp_path / "r")
    run = load_run(tmp_path / "r")
    assert run.status == "finished"
    steps, f = run.tensors("f")  # [7, 4]
    assert f.shape == (7, 4)
    assert run.scalar("ntk.relative_change").loc[0] == 0.0
    # recompute: the same init (stream init), Theta_0, and kernel GD from the stored f_0
    streams = SeedStreams(3)
    x, y = make_data(cfg, streams.generator("inputs"))
    fn, params = model_function(build_model(cfg, streams.generator("init")))
    K0 = empirical_ntk(fn, params, x, mode="trace")
    torch.testing.assert_close(torch.as_tensor(f[0]), fn(params, x)[:, 0], rtol=0, atol=1e-12)
    f_kgd, _ = kernel_gd_predictions(
        None, K0, y, cfg.lr, cfg.loop.steps, f0_train=torch.as_tensor(f[0])
    )
    gap = np.linalg.norm(f - f_kgd[..., 0].numpy(), axis=-1)
    assert run.last("kgd.deviation") == pytest.approx(gap.max(), rel=1e-9)
    assert run.scalar("lr_lambda_max_over_N").iloc[0] < 2
    np.testing.assert_allclose(run.tensors("kgd.gap")[1][-1], gap, rtol=1e-9)


@pytest.mark.parametrize("arch", ["mlp", "rnn", "attention"])
def test_mup_arm_is_the_same_net_with_output_over_root_n_and_step_times_n(arch):
    """The ablation: same weight draw, f_muP = f_NTK / sqrt(n), lr x n, so the kernel-GD
    speed at init is the NTK net's: (lr n / N) Theta_muP = (lr / N) Theta_NTK."""
    ntk = UniversalityRun(arch=arch, width=12, n_train=3, pos=2, seed=1, loop=LOOP)
    mup = ntk.model_copy(update={"parametrization": "mup"})
    assert gd_lr(ntk) == ntk.lr and gd_lr(mup) == ntk.lr * 12
    x, _ = make_data(ntk, SeedStreams(1).generator("inputs"))
    nets = [build_model(c, SeedStreams(1).generator("init")) for c in (ntk, mup)]
    with torch.no_grad():
        torch.testing.assert_close(nets[1](x), nets[0](x) / math.sqrt(12), rtol=1e-12, atol=0)
    K = [empirical_ntk(*model_function(net), x, mode="trace") for net in nets]
    torch.testing.assert_close(gd_lr(mup) * K[1], gd_lr(ntk) * K[0], rtol=1e-10, atol=1e-12)


def test_slope_is_the_power_law_exponent():
    w = np.array([64.0, 128.0, 256.0, 512.0])
    assert _slope(w, 2.0 * w**-0.5) == pytest.approx(-0.5, abs=1e-12)
    assert math.isnan(_slope(w, np.array([1.0, np.nan, np.nan, 0.0])))


def test_presets_validate_and_match_the_registry():
    assert studies.get("ntk-universality") is STUDY
    fast = build_runs(STUDY.preset("fast"))
    assert len(fast) == 2 * 3 * 4 * 5  # NTK and the muP ablation
    assert {s.config.parametrization for s in fast} == {"ntk", "mup"}
    by_name = {s.name: s for s in fast}
    assert by_name["rnn_mup_n256_s3"].config.parametrization == "mup"
    assert by_name["rnn_mup_n256_s3"].group == "rnn_mup_n256"
    assert by_name["rnn_n256_s3"].config.seed == by_name["rnn_mup_n256_s3"].config.seed == 3
    assert {s.config.arch for s in fast} == {"mlp", "rnn", "attention"}
    assert {s.config.width for s in fast} == {64, 128, 256, 512}
    assert [s.group for s in fast[:5]] == ["mlp_n64"] * 5  # a width's seeds: one ensemble
    assert [s.config.seed for s in build_runs(STUDY.preset("fast"), 1000)[:5]] == list(
        range(1000, 1005)
    )
    assert len(build_runs(STUDY.preset("paper"))) == 2 * 3 * 8 * 10


def test_full_preset_sizes_are_the_protocols():
    """full: MLP widths 64-1024 x 24 seeds, RNN and attention 64-512 x 8 seeds (>= the
    protocol's seeds per arm), attention on d_in = 32 tokens, NTK and muP arms alike."""
    runs = build_runs(STUDY.preset("full"), 1000)
    assert PROTOCOL.seeds["full"] == 8 and "24 seeds" in PROTOCOL.presets["full"]
    sizes = {"mlp": ([64, 128, 256, 512, 1024], 24), "rnn": ([64, 128, 256, 512], 8),
             "attention": ([64, 128, 256, 512], 8)}  # fmt: skip
    for arch, (widths, seeds) in sizes.items():
        for parametrization in ("ntk", "mup"):
            mine = [s for s in runs if s.config.arch == arch
                    and s.config.parametrization == parametrization]  # fmt: skip
            assert sorted({s.config.width for s in mine}) == widths
            assert sorted({s.config.seed for s in mine}) == list(range(1000, 1000 + seeds))
            assert len(mine) == len(widths) * seeds
            assert {s.config.d_in for s in mine} == {32 if arch == "attention" else 8}
            assert {(s.config.lr, s.config.loop.steps, s.config.logit_scale) for s in mine} == {
                (0.5, 200, "1/n")
            }
    assert len({s.name for s in runs}) == len(runs) == 2 * (5 * 24 + 2 * 4 * 8)
    assert {s.config.d_in for s in build_runs(STUDY.preset("fast"))} == {8}  # fast unchanged


def test_smoke_preset_end_to_end(smoke_out):
    outcome, out = smoke_out
    data = json.loads((out / "verdict.json").read_text(), parse_constant=pytest.fail)
    assert [c["claim"].split(":")[0] for c in data["claims"]] == [
        "u1-mlp", "u1-rnn", "u1-attention", "u2-mlp", "u2-rnn", "u2-attention"
    ]  # fmt: skip
    assert all(r["status"] == "finished" for r in data["runs"]) and len(data["runs"]) == 36
    assert data["protocol"]["sha256"] == PROTOCOL.sha256
    for claim in data["claims"]:
        assert isinstance(claim["measured"], float) and isinstance(claim["passed"], bool)
        assert claim["seeds"] == [0, 1, 2] and claim["direction"] == "<="
        assert claim["legacy"] is False and claim["control"]["kind"] == "ablation"
        # smoke's 3 seeds are below the contract's 5: plumbing only
        assert claim["status"] == "inconclusive"
    assert len(list((out / "figures").glob("*.png"))) == 1
    assert outcome.passed == all(c["passed"] for c in data["claims"])


def test_verdicts_are_per_seed_slopes_recomputed_from_the_stores(smoke_out):
    outcome, out = smoke_out
    u2_rnn = next(v for v in outcome.claims if v.claim.startswith("u2-rnn"))
    for seed, slope in zip(u2_rnn.seeds, u2_rnn.per_seed):
        dev = [load_run(out / "runs" / f"rnn_n{w}_s{seed}").last("kgd.deviation") for w in (16, 64)]
        assert slope == pytest.approx(math.log(dev[1] / dev[0]) / math.log(4.0), rel=1e-9)
    assert u2_rnn.measured == pytest.approx(np.mean(u2_rnn.per_seed))


def test_each_control_is_the_same_slope_on_the_mup_runs(smoke_out):
    """The control is the claim's metric on the muP arm (not a distance to an untrained net):
    recomputed from the muP stores, and not the claim's own value."""
    outcome, out = smoke_out
    for verdict in outcome.claims:
        tag, arch = verdict.claim.split(":")[0].split("-")
        key = {"u1": None, "u2": "kgd.deviation"}[tag]
        for seed in verdict.seeds:
            runs = [load_run(out / "runs" / f"{arch}_mup_n{w}_s{seed}") for w in (16, 64)]
            if key is None:
                vals = [float(r.scalar("ntk.relative_change").max()) for r in runs]
            else:
                vals = [r.last(key) for r in runs]
            expected = math.log(vals[1] / vals[0]) / math.log(4.0)
            assert verdict.control.per_seed[seed] == pytest.approx(expected, rel=1e-9)
        assert verdict.control.per_seed != dict(zip(verdict.seeds, verdict.per_seed))


def test_precondition_needs_finished_stable_runs_over_a_4x_width_span():
    def rows(widths=(16, 64), stability=0.1, status="finished", fit=0.2):
        return [{"arch": "mlp", "width": w, "status": status, "lr_lambda_max_over_N": stability,
                 "final / initial mse": fit, "parametrization": p}
                for w in widths for p in ("ntk", "mup")]  # fmt: skip

    assert _precondition(rows(), "mlp").met
    assert _precondition(rows(), "mlp").measured == pytest.approx(0.2)  # the worst fit
    assert not _precondition(rows(widths=(16, 32)), "mlp").met  # 2x span
    assert not _precondition(rows(stability=2.0), "mlp").met  # kernel GD unstable
    assert not _precondition(rows(status="diverged"), "mlp").met
    assert not _precondition(rows(fit=0.6), "mlp").met  # did not fit its targets
    assert _precondition(rows(fit=0.6), "mlp").measured == pytest.approx(0.6)


@pytest.mark.parametrize(("logit_scale", "rank"), [("1/n", 8), ("1/sqrt(n)", 16)])
def test_attention_ntk_rank_at_width_depends_on_the_logit_scale(logit_scale, rank):
    """Why ``full`` scales attention logits by 1/sqrt(n): with 1/n the logits vanish at width,
    the W_Q/W_K part of the eNTK is O(1/n), and Theta_0 of the attention net is a linear kernel
    on the token mean (rank d_in = 8 < N = 16), so kernel GD cannot fit 16 random targets;
    with 1/sqrt(n) the logits stay O(1) and Theta_0 has full rank N (oracle: rank count of the
    eigenvalues above 1e-3 lambda_max; the 1/n gap measured ~1e-4 at width 512)."""
    cfg = UniversalityRun(arch="attention", width=256, seed=20000, loop=LOOP,
                          logit_scale=logit_scale)  # fmt: skip
    x, _ = make_data(cfg, SeedStreams(20000).generator("inputs"))
    net = build_model(cfg, SeedStreams(20000).generator("init"))
    eigenvalues = torch.linalg.eigvalsh(empirical_ntk(*model_function(net), x, mode="trace"))
    assert x.shape == (16, 5, 8)
    assert int((eigenvalues > 1e-3 * eigenvalues[-1]).sum()) == rank
