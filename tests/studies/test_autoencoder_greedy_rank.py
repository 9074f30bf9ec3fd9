"""Study autoencoder-greedy-rank: oracles for the loss and the engine run, the verdicts on
hand-built stores (known values), presets, and the smoke preset end to end, killed and
resumed."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dynascope import studies
from dynascope.nn import LinearAutoencoder
from dynascope.store import RunStore, load_run
from dynascope.studies.autoencoder_greedy_rank import (
    STUDY,
    AutoencoderRun,
    analyze,
    build_autoencoder,
    build_runs,
    reconstruction_loss,
    step_size,
    theory,
    verdicts_from_runs,
)
from dynascope.studies.autoencoder_greedy_rank.protocol import PROTOCOL
from dynascope.tasks.low_rank import LowRankGaussian
from dynascope.train import Loop, run_members


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def loop(steps: int) -> Loop:
    return Loop(steps=steps, log_every=10, dtype="float64")


def test_reconstruction_loss_equals_the_mean_squared_error_over_samples():
    """Dense oracle: ((X - X P)^2).sum(-1).mean() in float64, to 1e-12 relative."""
    x = torch.randn(37, 6, generator=gen(), dtype=torch.float64)
    P = torch.randn(6, 6, generator=gen(1), dtype=torch.float64)
    expected = (x - x @ P).square().sum(dim=-1).mean()
    torch.testing.assert_close(reconstruction_loss(P, x.T @ x / 37), expected, rtol=1e-12, atol=0)


def test_no_stack_noiseless_gd_learns_the_projection_onto_span_a():
    """S15's smoke oracle: L = 0, GD, noiseless data -> M restricted to span A is the projection.

    Directions outside span A carry no data, so they get no gradient; the oracle is therefore
    A A^T P = A A^T. The slowest mode (variance 1) contracts by about 1 - 2 * eta per step:
    1,000 steps of eta = 0.05 reach rounding.
    """
    task = LowRankGaussian(noise_std=0.0)
    g = gen(0)
    A = task.mixing_matrix(g)
    x = task.sample(A, 200, g)
    model = LinearAutoencoder(n_stack=0, generator=g, dtype=torch.float64)
    C = x.T @ x / x.shape[0]
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(1000):
        opt.zero_grad()
        reconstruction_loss(model.end_to_end(), C).backward()
        opt.step()
    with torch.no_grad():
        projector = A @ A.T
        torch.testing.assert_close(projector @ model.end_to_end(), projector, rtol=0, atol=1e-9)


def test_engine_run_logs_the_instruments_and_reaches_the_oracle(tmp_path):
    """L = 0, noiseless: every data-subspace gain and singular value reaches 1 (to 1e-4 after
    300 steps of eta = 0.05: the slowest mode contracts by 0.9 per step), none at init; the
    held-out data and codes have rank 5."""
    cfg = AutoencoderRun(loop=loop(300), noise_std=0.0, n_train=200, n_heldout=50, log_points=10)
    run_members(build_autoencoder, cfg, tmp_path / "run")
    run = load_run(tmp_path / "run")
    assert run.status == "finished"
    steps, gain = run.tensors("modes.gain")
    assert steps[0] == 0 and steps[-1] == 300 and list(steps[:10]) == list(range(10))
    torch.testing.assert_close(torch.from_numpy(gain[-1]), torch.ones(5), rtol=0, atol=1e-4)
    _, sigma = run.tensors("modes.sigma")
    torch.testing.assert_close(torch.from_numpy(sigma[-1]), torch.ones(5), rtol=0, atol=1e-4)
    assert (sigma[0] < 0.5).all()  # untrained: no data mode counts as learnt
    assert run.tensors("sigma")[1].shape[1] == 16
    assert run.tensors("modes.align")[1].shape[1:] == (5, 5)
    assert run.last("latent.rank_1e-2") == 5 and run.last("data.rank_1e-2") == 5
    assert run.last("train.loss") < 1e-6


def test_step_size_depth_rule_and_cap():
    base = AutoencoderRun(loop=loop(10), lr=0.05, init_scale=1.0, lr_rule="depth")
    assert step_size(base.model_copy(update={"n_stack": 0})) == 0.05
    assert step_size(base.model_copy(update={"n_stack": 8})) == pytest.approx(0.05 / 8)
    assert step_size(base.model_copy(update={"n_stack": 1})) == pytest.approx(2 * 0.05 / 3)
    small = base.model_copy(update={"n_stack": 4, "init_scale": 0.5})
    assert step_size(small) == pytest.approx(2 * 0.05 / 6)  # 0.05 / (4 * 0.5**6) is capped
    assert step_size(base.model_copy(update={"n_stack": 8, "lr_rule": "constant"})) == 0.05


def test_step_size_equal_time_rule_reads_the_judged_scale_and_is_capped():
    """equal_time: G(s^L, 1/2; L) / (2 L mode_time), from lr_scale when given; L = 0: eta_0."""
    cfg = AutoencoderRun(loop=loop(10), n_stack=4, init_scale=0.2, mode_time=1000.0)
    expected = theory.plateau_integral(0.2**4, 0.5, 4) / (2 * 4 * 1000.0)
    assert step_size(cfg) == pytest.approx(expected, rel=1e-12)
    control = cfg.model_copy(update={"init_scale": 1.0, "lr_scale": 0.2})
    assert step_size(control) == step_size(cfg)  # the control shares the judged arm's step
    assert step_size(cfg.model_copy(update={"mode_time": 1e-3})) == pytest.approx(2 * 0.05 / 6)
    assert step_size(cfg.model_copy(update={"n_stack": 0})) == 0.05


# -- the balanced-stack theory that fixes s and the step -----------------------------------------
@pytest.mark.parametrize("sigma0", [1e-9, 1e-3, 0.2])
def test_plateau_integral_matches_the_closed_forms_at_one_and_two_layers(sigma0):
    """L = 1: log((1 - a) / (1 - b)); L = 2: logit(b) - logit(a); to 1e-9 relative."""
    b = 0.7
    one = math.log((1 - sigma0) / (1 - b))
    two = math.log(b / (1 - b)) - math.log(sigma0 / (1 - sigma0))
    assert theory.plateau_integral(sigma0, b, 1) == pytest.approx(one, rel=1e-9)
    assert theory.plateau_integral(sigma0, b, 2) == pytest.approx(two, rel=1e-9)


def test_plateau_integral_matches_a_dense_quadrature_at_depth():
    """L = 8: trapezoid rule on 2e6 points in x (an independent discretisation), to 1e-4."""
    a, b = 1e-2, 0.5
    x = torch.linspace(a, b, 2_000_001, dtype=torch.float64)
    dense = torch.trapezoid(x ** (2 / 8 - 2) / (1 - x), x).item()
    assert theory.plateau_integral(a, b, 8) == pytest.approx(dense, rel=1e-4)


@pytest.mark.parametrize(("sigma0", "rho"), [(1e-3, 0.8), (1e-6, 0.5), (0.1, 0.9)])
def test_predicted_overlap_at_two_layers_is_the_logistic_closed_form(sigma0, rho):
    """L = 2 (logistic modes): the next mode is at 1 / (1 + ((1 - a) / a)^(1 - rho))."""
    closed = 1 / (1 + ((1 - sigma0) / sigma0) ** (1 - rho))
    assert theory.predicted_overlap(sigma0, 2, rho) == pytest.approx(closed, rel=1e-8)


def test_greedy_init_scale_meets_the_target_and_deeper_stacks_allow_a_larger_s():
    scales = [theory.greedy_init_scale(L, 0.8, 0.05) for L in (2, 3, 4, 8)]
    for L, s in zip((2, 3, 4, 8), scales):
        assert theory.predicted_overlap(s**L, L, 0.8) == pytest.approx(0.05, rel=1e-6)
    assert scales == sorted(scales)
    assert theory.greedy_init_scale(1, 0.8, 0.05) == 1e-4  # L = 1: no plateau, the floor


def test_theory_rejects_bad_input_with_the_field_named():
    with pytest.raises(ValueError, match="n_stack must be an integer >= 1"):
        theory.plateau_integral(0.1, 0.5, 0)
    with pytest.raises(ValueError, match="need 0 < sigma0 <= sigma < 1"):
        theory.plateau_integral(0.6, 0.5, 2)
    with pytest.raises(ValueError, match="rho must be in"):
        theory.predicted_overlap(0.1, 2, 1.0)
    with pytest.raises(ValueError, match="overlap must be in"):
        theory.greedy_init_scale(2, 0.8, 0.5)
    with pytest.raises(ValueError, match="init_scale must give 0 < s"):
        theory.equal_time_lr(2, 0.9, 100.0, 0.1)
    with pytest.raises(ValueError, match="mode_time must be > 0"):
        theory.equal_time_lr(2, 0.1, 0.0, 0.1)


# -- the verdicts on hand-built stores --------------------------------------------------------
STEPS = 100
LOGGED = [0, 1, 5, 20, 60, STEPS]


def write_run(
    path, *, seed, n_stack, init="orthogonal", s=0.5, arm="greedy", t_modes, dip, mid_rank=5,
    final_rank=5, noise=0.4,
):  # fmt: skip
    """A store as the engine run writes it: data PC k's gain jumps from 0 to 1 at step
    t_modes[k] (never if None) and the singular values of M_A are those gains sorted; the latent
    spectrum has 13 equal values at step 0, ``dip`` at step 20, ``mid_rank`` at step 60,
    ``final_rank`` at the end and 5 otherwise (effective rank = number of equal values); the
    held-out data has rank 32. Logged at every step where a value can change (each jump and
    the step before it, the latent steps, every 10th step), which reads as logging every step."""
    cfg = AutoencoderRun(
        loop=loop(STEPS), seed=seed, n_stack=n_stack, init=init, init_scale=s, arm=arm,
        noise_std=noise,
    )  # fmt: skip
    with RunStore(path) as store:
        store.write_config(cfg.model_dump(mode="json"))
        store.set_status(0, "running")
        jumps = {t + d for t in t_modes if t is not None for d in (-1, 0)}
        for step in sorted({*LOGGED, *jumps, *range(0, STEPS + 1, 10)}):  # all that can change
            on = torch.tensor([float(t is not None and step >= t) for t in t_modes])
            sigma = on.sort(descending=True).values
            values = {"modes.gain": on, "modes.sigma": sigma, "modes.align": torch.eye(5)}
            if step in LOGGED:
                ones = {0: 13, 20: dip, 60: mid_rank, STEPS: final_rank}.get(step, 5)
                spec = torch.zeros(16)
                spec[:ones] = 1.0
                values.update({"latent.spectrum": spec, "data.rank_1e-2": 32.0})
                values.update({"latent.rank_1e-2": ones, "latent.effective_rank": ones})
            if step % 10 == 0 and step > 0:
                values["train.loss"] = 4.3
            store.log(step, values)
        store.set_status(STEPS, "finished")
    return load_run(path)


GREEDY = [10, 20, 30, 40, 50]  # the 5th mode at 50: the latent at 60 is read as rank at t_5
AT_ONCE = [25, 25, 25, 25, 25]


def study_runs(tmp_path, **overrides):
    """Five seeds (the contract's minimum) of fast's arms: greedy stacks (s = 0.1) reaching
    rank 5; s = 0.5 stacks for d (deeper: lower dip); all-at-once s = 1 controls (dips 4, 5, 5:
    no depth order) at rank 16 (noise learnt); L = 0 at once and full rank; a slower default
    L = 8; r3's low-noise runs (L = 0 full rank, L = 8 greedy at rank 5); o's equal-variance
    stacks, all modes at once."""
    full = {"t_modes": AT_ONCE, "dip": 5, "mid_rank": 16, "final_rank": 16}
    arms = {
        "L0_orth": {"n_stack": 0, **full},
        "L8_default": {
            "n_stack": 8, "init": "default", "s": 1.0, "t_modes": [20, 40, 60, 80, 95], "dip": 1,
        },
        "L0_orth_quiet": {"n_stack": 0, "arm": "quiet", "noise": 0.01, **full},
        "L8_orth_quiet": {"n_stack": 8, "arm": "quiet", "noise": 0.01, "t_modes": GREEDY, "dip": 1},
    }  # fmt: skip
    for L, dip in ((2, 4), (4, 3), (8, 2)):
        arms[f"L{L}_orth"] = {"n_stack": L, "s": 0.1, "t_modes": GREEDY, "dip": 1}
        arms[f"L{L}_orth_s0.5"] = {"n_stack": L, "arm": "depth", "t_modes": GREEDY, "dip": dip}
        arms[f"L{L}_orth_s1"] = {
            "n_stack": L, "s": 1.0, "arm": "control", **full, "dip": 4 + (L > 2),
        }  # fmt: skip
        arms[f"L{L}_orth_flat"] = {"n_stack": L, "s": 0.1, "arm": "flat", **full}
    out = {}
    for seed in range(5):
        for arm, kw in arms.items():
            kw = {**kw, **overrides.get(arm, {})}
            name = f"{arm}_seed{seed}"
            key = (name, repr(sorted(kw.items())))  # a store is read-only once written: reuse it
            if key not in _WRITTEN:
                _WRITTEN[key] = write_run(tmp_path / name, seed=seed, **kw)
            out[name] = _WRITTEN[key]
    return out


_WRITTEN: dict = {}  # (run name, its arguments) -> the store written by an earlier call


def claims(runs):
    return {x.claim.split(":")[0]: x for x in verdicts_from_runs(runs)[0]}


def test_a_greedy_study_holds_with_known_values(tmp_path):
    analysis = analyze(study_runs(tmp_path / "runs"), tmp_path / "figures")
    v = {x.claim.split(":")[0]: x for x in analysis.verdicts}
    assert list(v) == ["r1", "r2", "o", "r3", "r4", "d"]
    assert PROTOCOL.check(analysis.verdicts)  # thresholds, directions, statistics: the protocol's
    five = tuple(range(5))
    assert all(x.n_seeds == 5 and x.seeds == five for x in analysis.verdicts)
    assert all(x.control.kind == "ablation" and x.control.n_seeds == 5 for x in analysis.verdicts)
    assert v["r1"].status == "held" and v["r1"].per_seed == (0.0,) * 5
    assert v["r1"].interval == (0.0, 0.0)
    assert v["r1"].control.status == "not held" and v["r1"].control.measured == 11.0
    assert "13/5/5" in v["r1"].detail  # rank 13 at init: the value at t_5 is not the init's
    assert v["r2"].status == "held" and v["r2"].per_seed == (0.0,) * 5
    assert v["r2"].control.status == "not held" and v["r2"].control.measured == 1.0
    # o's ablation: the equal-variance stacks (all modes at once: no pair in order)
    assert v["o"].status == "held" and v["o"].per_seed == (1.0,) * 5
    assert v["o"].control.status == "not held" and v["o"].control.measured == 0.0
    # r3 reads the low-noise runs (arm quiet), not the noise-0.4 L = 0 run
    assert v["r3"].status == "held" and v["r3"].per_seed == (16.0,) * 5
    assert v["r3"].control.status == "not held" and v["r3"].control.measured == 5.0
    assert v["r3"].precondition.met and v["r3"].precondition.measured == 5.0
    assert "noise std 0.01" in v["r3"].detail
    assert v["r4"].status == "held" and v["r4"].per_seed == (95.0 - 50.0,) * 5
    # r4's ablation: the s = 1 orthogonal L = 8 stack against the greedy one (25 - 50), not 0
    assert v["r4"].control.per_seed == {s: 25.0 - 50.0 for s in five}
    assert v["r4"].control.status == "not held"
    # d: min erank 5 at L = 0 and 2 at L = 8 (s = 0.5): (5 - 2) / (5 - 1); s = 1: 5 at L = 8
    assert v["d"].status == "held" and v["d"].per_seed == pytest.approx((0.75,) * 5)
    assert v["d"].control.per_seed == pytest.approx({s: 0.0 for s in five})
    assert v["d"].control.status == "not held"
    assert len(analysis.figures) == 2 and all(p.is_file() for p in analysis.figures)


def test_the_controls_read_their_ablation_arms(tmp_path):
    """r4's control moves with the L = 8 s = 1 runs and o's with the equal-variance runs; a
    control arm that did not learn its modes fails the fit precondition of the claims that read
    it."""
    slow = {"t_modes": [70, 75, 80, 85, 90]}
    v = claims(study_runs(tmp_path / "slow", L8_orth_s1=slow))
    assert v["r4"].control.per_seed == {s: 90.0 - 50.0 for s in range(5)}
    assert v["r4"].status == "inconclusive"  # the ablation holds too: no attribution
    assert v["r4"].control.status == "held"
    in_order = {"t_modes": GREEDY}
    v = claims(study_runs(tmp_path / "s1", **{f"L{L}_orth_s1": in_order for L in (2, 4, 8)}))
    assert v["o"].status == "held"  # the s = 1 stacks are not o's control
    v = claims(study_runs(tmp_path / "flat", **{f"L{L}_orth_flat": in_order for L in (2, 4, 8)}))
    assert v["o"].control.status == "held" and v["o"].status == "inconclusive"
    stuck = {"t_modes": [10, 20, 30, 40, None]}
    v = claims(study_runs(tmp_path / "stuck", L2_orth_s1=stuck))
    for claim in ("r1", "r2", "o"):
        assert not v[claim].precondition.met and v[claim].status == "inconclusive", claim
    assert v["r4"].precondition.met  # reads L = 8 only


def test_the_verdicts_see_overlap_disorder_noise_a_fast_default_and_no_depth_order(tmp_path):
    v = claims(
        study_runs(
            tmp_path / "runs",
            # L = 4: PC2 crosses 1/2 with PC1 (overlap 1); L = 8 at s = 0.5: no depth trend
            **{"L4_orth": {"t_modes": [10, 10, 30, 40, 50]}, "L8_orth_s0.5": {"dip": 4}},
            L8_default={"t_modes": [5, 6, 7, 8, 9]},  # default init learns first
        )
    )
    assert v["r2"].status == "not held" and v["r2"].per_seed == (1.0,) * 5
    assert v["o"].per_seed == (0.9,) * 5  # the tied pair is not "in order"
    assert v["r4"].status == "not held" and v["r4"].per_seed == (9.0 - 50.0,) * 5
    # min erank 4 at L = 8 against 5 at L = 0: a quarter of the way to one mode at a time
    assert v["d"].status == "not held" and v["d"].per_seed == pytest.approx((0.25,) * 5)
    # the PCs learnt in reverse order of variance, one at a time
    v = claims(study_runs(tmp_path / "reverse", L2_orth={"t_modes": GREEDY[::-1]}))
    assert v["r2"].status == "held"
    assert v["o"].per_seed == (0.0,) * 5 and v["o"].status == "not held"
    # the noise floor learnt by a judged stack: the latent ends above the true rank (r1 reads
    # the end of training: rank 5 at t_5 and 9 at the end fails)
    v = claims(study_runs(tmp_path / "noisy", L4_orth={"final_rank": 9}))
    assert v["r1"].per_seed == (4.0,) * 5 and v["r1"].status == "not held"
    # the low-noise L = 0 code at the data's rank 5: r3 not held
    v = claims(study_runs(tmp_path / "quiet", L0_orth_quiet={"final_rank": 5}))
    assert v["r3"].per_seed == (5.0,) * 5 and v["r3"].status == "not held"


def test_a_run_left_on_a_plateau_makes_the_greedy_claims_inconclusive(tmp_path):
    plateau = {"t_modes": [10, 20, 30, 40, None], "final_rank": 4}
    v = claims(study_runs(tmp_path / "runs", L8_orth=plateau))
    for claim in ("r1", "r2", "o"):
        assert v[claim].status == "inconclusive", claim
    assert v["r1"].precondition.measured == 4.0  # the fewest learnt modes
    assert v["r4"].status == "inconclusive"  # the orthogonal reference never reached 5


# -- presets, the smoke preset, resume ---------------------------------------------------------
def test_presets_build_the_planned_runs_in_ensembles_by_depth():
    assert studies.get("autoencoder-greedy-rank") is STUDY
    fast = build_runs(STUDY.preset("fast"))
    # per seed: 3 depths x 3 arms, L = 0, default L = 8, r3's low-noise L = 0 and 8, o's
    # equal-variance L = 2, 4, 8
    assert len(fast) == 5 * 16 and len({s.name for s in fast}) == len(fast)
    by_name = {s.name: s for s in fast}
    assert by_name["L8_default_seed2"].config.init == "default"
    assert by_name["L8_default_seed2"].group == by_name["L8_orth_seed0"].group == "L8"
    assert {s.config.loop.steps for s in fast} == {8000}
    # the judged s comes from theory, the control is s = 1, both at the judged arm's step
    for L in (2, 4, 8):
        judged, control = by_name[f"L{L}_orth_seed1"], by_name[f"L{L}_orth_s1_seed1"]
        depth = by_name[f"L{L}_orth_s0.5_seed1"]
        s = theory.greedy_init_scale(L, 0.8, 0.05)
        assert judged.config.init_scale == s and control.config.init_scale == 1.0
        assert (judged.config.arm, depth.config.arm, control.config.arm) == (
            "greedy", "depth", "control")  # fmt: skip
        assert step_size(judged.config) == step_size(control.config) == step_size(depth.config)
    assert step_size(by_name["L8_default_seed0"].config) == step_size(
        by_name["L8_orth_seed0"].config)  # fmt: skip
    # r3's runs: S15's data noise 0.01; o's control: equal variances; both at the greedy s, step
    for L, arm, field, value in (
        (0, "quiet", "noise_std", 0.01), (8, "quiet", "noise_std", 0.01),
        (4, "flat", "variances", [3.0] * 5),
    ):  # fmt: skip
        spec, ref = by_name[f"L{L}_orth_{arm}_seed3"], by_name[f"L{L}_orth_seed3"]
        assert getattr(spec.config, field) == value and getattr(ref.config, field) != value
        assert spec.config.arm == arm and spec.config.init_scale == ref.config.init_scale
        assert step_size(spec.config) == step_size(ref.config) and spec.group == ref.group
    assert {s.config.seed for s in fast} == {0, 1, 2, 3, 4}
    assert not any(s.config.init == "default" and s.config.n_stack == 0 for s in fast)
    assert {s.config.seed for s in build_runs(STUDY.preset("smoke"), seed=1000)} == {
        1000, 1001, 1002}  # fmt: skip
    paper = build_runs(STUDY.preset("paper"))
    assert len(paper) == 5 * (16 * 3 + 2 + 2 + 3)
    with pytest.raises(ValueError, match="preset must be one of smoke, fast, full, paper"):
        STUDY.preset("huge")


def test_full_preset_builds_fifteen_seeds_of_every_arm_at_the_protocol_sizes():
    """full: 15 seeds x 16 runs (>= 5 per arm), 9k steps, seeds base + k; sizes as the
    protocol's full text says."""
    preset = STUDY.preset("full")
    specs = build_runs(preset, seed=1000)
    assert PROTOCOL.seeds["full"] == preset.seeds == 15
    assert len(specs) == 15 * 16 and len({s.name for s in specs}) == len(specs)
    arms = {s.name.rsplit("_seed", 1)[0] for s in specs}
    assert len(arms) == 16 and "L0_orth_quiet" in arms and "L8_orth_flat" in arms
    for arm in arms:
        seeds = sorted(s.config.seed for s in specs if s.name.rsplit("_seed", 1)[0] == arm)
        assert seeds == list(range(1000, 1015)), arm
    assert {s.config.loop.steps for s in specs} == {9000}
    assert preset.depths == [0, 2, 4, 8] and preset.base.noise_std == 0.4
    assert "9k steps" in PROTOCOL.presets["full"] and "15 seeds" in PROTOCOL.presets["full"]


def test_smoke_preset_end_to_end(smoke_out):
    """The shared smoke run; its SIGKILL-resume is test_resume_every_study's (which kills at
    half the store writes, as the kill test here did: in the first ensemble, before its
    first checkpoint at step 200, and compares every stored tensor and the verdicts)."""
    _, out = smoke_out
    data = json.loads((out / "verdict.json").read_text())
    claims = {c["claim"].split(":")[0]: c for c in data["claims"]}
    assert list(claims) == ["r1", "r2", "o", "r3", "r4", "d"]
    assert all(c["status"] in ("held", "not held", "inconclusive") for c in data["claims"])
    assert all(r["status"] == "finished" for r in data["runs"])
    assert data["protocol"]["sha256"] == PROTOCOL.sha256
    assert len(data["protocol"]["amendments"]) == len(PROTOCOL.amendments)
    # smoke's 3 seeds are below the contract's 5: plumbing only, every verdict inconclusive
    assert {c["status"] for c in data["claims"]} == {"inconclusive"}
    for name in ("r1", "r2", "o", "r3", "r4"):  # every ablation is measured on its own runs
        control = claims[name]["control"]
        assert control["kind"] == "ablation" and control["n_seeds"] == 3, name
    assert claims["r4"]["control"]["per_seed"] != claims["r4"]["per_seed"]
    # per seed: L = 2 greedy, s = 0.5, s = 1, default, low-noise, equal-variance; L = 0 and
    # L = 0 low-noise
    assert len(list((out / "runs").iterdir())) == 3 * 8
