"""Study autoencoder-greedy-rank: oracles for the loss and the engine run, the verdicts on
hand-built stores (known values), presets, and the smoke preset end to end, killed and
resumed."""

from __future__ import annotations

import json

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
    verdicts_from_runs,
)
from dynascope.studies.autoencoder_greedy_rank import runs as runs_module
from dynascope.studies.engine_runs import run_members
from dynascope.tasks.low_rank import LowRankGaussian
from dynascope.train import Loop


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
    base = AutoencoderRun(loop=loop(10), lr=0.05, init_scale=1.0)
    assert step_size(base.model_copy(update={"n_stack": 0})) == 0.05
    assert step_size(base.model_copy(update={"n_stack": 8})) == pytest.approx(0.05 / 8)
    assert step_size(base.model_copy(update={"n_stack": 1})) == pytest.approx(2 * 0.05 / 3)
    small = base.model_copy(update={"n_stack": 4, "init_scale": 0.5})
    assert step_size(small) == pytest.approx(2 * 0.05 / 6)  # 0.05 / (4 * 0.5**6) is capped
    assert step_size(base.model_copy(update={"n_stack": 8, "lr_rule": "constant"})) == 0.05


# -- the verdicts on hand-built stores --------------------------------------------------------
STEPS = 100
LOGGED = [0, 1, 5, 20, 60, STEPS]


def write_run(path, *, seed, n_stack, init="orthogonal", s=0.5, t_modes, dip, final_loss=0.003):
    """A store as the engine run writes it: data mode k's gain and singular value jump from 0
    to 1 at step t_modes[k] (never if None); the latent spectrum has ``dip`` equal values at
    step 20 and 5 otherwise (effective rank = number of equal values); data rank 5."""
    cfg = AutoencoderRun(loop=loop(STEPS), seed=seed, n_stack=n_stack, init=init, init_scale=s)
    with RunStore(path) as store:
        store.write_config(cfg.model_dump(mode="json"))
        store.set_status(0, "running")
        for step in range(STEPS + 1):
            on = torch.tensor([float(t is not None and step >= t) for t in t_modes])
            values = {"modes.gain": on, "modes.sigma": on, "modes.align": torch.eye(5)}
            if step in LOGGED:
                ones = dip if step == 20 else 5
                spec = torch.zeros(16)
                spec[:ones] = 1.0
                values.update({"latent.spectrum": spec, "data.rank_1e-2": 5.0})
                values.update({"latent.rank_1e-2": ones, "latent.effective_rank": ones})
            if step % 10 == 0 and step > 0:
                values["train.loss"] = final_loss
            store.log(step, values)
        store.set_status(STEPS, "finished")
    return load_run(path)


GREEDY = [10, 20, 30, 40, 50]
AT_ONCE = [10, 10, 10, 10, 10]


def study_runs(tmp_path, **overrides):
    """Three seeds of fast's arms: greedy s = 0.5 stacks (deeper: lower dip), all-at-once
    s = 1 controls (dips 4, 5, 5: no depth order), L = 0 at once, a slower default L = 8."""
    arms = {
        "L0_orth": {"n_stack": 0, "t_modes": AT_ONCE, "dip": 5},
        "L0_default": {"n_stack": 0, "init": "default", "s": 1.0, "t_modes": AT_ONCE, "dip": 5},
        "L8_default": {
            "n_stack": 8,
            "init": "default",
            "s": 1.0,
            "t_modes": [20, 40, 60, 80, 95],
            "dip": 1,
        },  # fmt: skip
    }
    for L, dip in ((2, 4), (4, 3), (8, 2)):
        arms[f"L{L}_orth_s0.5"] = {"n_stack": L, "t_modes": GREEDY, "dip": dip}
        arms[f"L{L}_orth_s1"] = {"n_stack": L, "s": 1.0, "t_modes": AT_ONCE, "dip": 4 + (L > 2)}
    out = {}
    for seed in range(3):
        for arm, kw in arms.items():
            kw = {**kw, **overrides.get(arm, {})}
            name = f"{arm}_seed{seed}"
            out[name] = write_run(tmp_path / name, seed=seed, **kw)
    return out


def test_a_greedy_study_holds_with_known_values(tmp_path):
    analysis = analyze(study_runs(tmp_path / "runs"), tmp_path / "figures")
    v = {x.claim.split(":")[0]: x for x in analysis.verdicts}
    assert list(v) == ["r1", "r2", "r3", "r4", "d"]
    assert v["r1"].status == "held" and v["r1"].per_seed == (5.0, 5.0, 5.0)
    assert v["r1"].control.per_seed == {0: 0.0, 1: 0.0, 2: 0.0}  # untrained: no mode
    assert v["r2"].status == "held" and v["r2"].per_seed == (0.0, 0.0, 0.0)
    assert v["r2"].control.status == "not held" and v["r2"].control.measured == 1.0
    # r3: rank-5 data cannot give a full-rank code: inconclusive, never judged held
    assert v["r3"].status == "inconclusive" and "precondition" in v["r3"].reason
    assert v["r3"].precondition.measured == 5.0
    assert v["r4"].status == "held" and v["r4"].per_seed == (95.0 - 50.0,) * 3
    assert v["r4"].control.per_seed == {0: 0.0, 1: 0.0, 2: 0.0}
    assert v["d"].status == "held" and v["d"].per_seed == pytest.approx((-1.0,) * 3)
    assert v["d"].control.per_seed == pytest.approx({0: 1.0, 1: 1.0, 2: 1.0})  # 5, 4, 5, 5
    assert len(analysis.figures) == 2 and all(p.is_file() for p in analysis.figures)


def test_the_verdicts_see_overlap_a_plateau_a_fast_default_and_no_depth_order(tmp_path):
    runs = study_runs(
        tmp_path / "runs",
        # L = 4: PC2 crosses 1/2 with PC1 (overlap 1); L = 8 (dip 2 -> 4): no depth trend
        **{"L4_orth_s0.5": {"t_modes": [10, 10, 30, 40, 50]}, "L8_orth_s0.5": {"dip": 4}},
        L8_default={"t_modes": [5, 6, 7, 8, 9]},  # default init learns first
    )
    v = {x.claim.split(":")[0]: x for x in verdicts_from_runs(runs)[0]}
    assert v["r2"].status == "not held" and v["r2"].per_seed == (1.0, 1.0, 1.0)
    assert v["r4"].status == "not held" and v["r4"].per_seed == (9.0 - 50.0,) * 3
    assert v["d"].status == "not held" and v["d"].per_seed == pytest.approx((1.0,) * 3)


def test_a_run_left_on_a_plateau_makes_r1_and_r2_inconclusive(tmp_path):
    plateau = {"t_modes": [10, 20, 30, 40, None], "final_loss": 0.95}
    v = {x.claim.split(":")[0]: x for x in verdicts_from_runs(
        study_runs(tmp_path / "runs", **{"L8_orth_s0.5": plateau}))[0]}  # fmt: skip
    assert v["r1"].per_seed == (4.0, 4.0, 4.0)
    assert v["r1"].status == "inconclusive" and v["r2"].status == "inconclusive"
    assert v["r1"].precondition.measured == 0.95
    assert v["r4"].status == "inconclusive"  # the orthogonal reference never reached 5


# -- presets, the smoke preset, resume ---------------------------------------------------------
def test_presets_build_the_planned_runs_in_ensembles_by_depth():
    assert studies.get("autoencoder-greedy-rank") is STUDY
    fast = build_runs(STUDY.preset("fast"))
    assert len(fast) == 3 * 9 and len({s.name for s in fast}) == len(fast)
    by_name = {s.name: s for s in fast}
    assert by_name["L8_default_seed2"].config.init == "default"
    assert by_name["L8_default_seed2"].group == by_name["L8_orth_s0.5_seed0"].group == "L8"
    assert {s.config.loop.steps for s in fast} == {10_000}
    assert {s.config.seed for s in fast} == {0, 1, 2}
    assert {s.config.seed for s in build_runs(STUDY.preset("smoke"), seed=1000)} == {
        1000, 1001, 1002}  # fmt: skip
    paper = build_runs(STUDY.preset("paper"))
    assert len(paper) == 5 * (16 * 2 + 3)
    with pytest.raises(ValueError, match="preset must be one of smoke, fast, paper"):
        STUDY.preset("huge")


class Killed(BaseException):
    """Stands in for SIGKILL: no handler of the engine or the study catches it."""


def test_smoke_killed_midway_resumes_and_ends_as_an_uninterrupted_run(tmp_path, monkeypatch):
    whole = STUDY.run(preset="smoke", out=tmp_path / "whole")
    data = json.loads((tmp_path / "whole" / "verdict.json").read_text())
    assert [c["claim"].split(":")[0] for c in data["claims"]] == ["r1", "r2", "r3", "r4", "d"]
    assert all(c["status"] in ("held", "not held", "inconclusive") for c in data["claims"])
    assert all(r["status"] == "finished" for r in data["runs"])

    real = runs_module.effective_rank
    calls = {"n": 0}

    def dies_mid_way(spectrum):
        calls["n"] += 1
        if calls["n"] == 80:  # latent probe ~step 48 of 200, first ensemble (6 members)
            raise Killed
        return real(spectrum)

    monkeypatch.setattr(runs_module, "effective_rank", dies_mid_way)
    with pytest.raises(Killed):
        STUDY.run(preset="smoke", out=tmp_path / "cut")
    monkeypatch.setattr(runs_module, "effective_rank", real)
    done: dict[str, str] = {}

    def on_run(name, status, seconds, action):
        done[name] = action

    cut = STUDY.run(preset="smoke", out=tmp_path / "cut", on_run=on_run)
    assert "resumed" in done.values() and "restarted" not in done.values()
    names = sorted(p.name for p in (tmp_path / "whole" / "runs").iterdir())
    assert len(names) == 15  # per seed: L = 2 at s = 0.5, 1 and default; L = 0 orth, default
    for name in names:
        a, b = (
            load_run(tmp_path / "whole" / "runs" / name),
            load_run(tmp_path / "cut" / "runs" / name),
        )
        for key in ("modes.gain", "latent.spectrum"):
            torch.testing.assert_close(
                torch.from_numpy(b.tensors(key)[1]),
                torch.from_numpy(a.tensors(key)[1]),
                rtol=0,
                atol=0,
            )
    assert [c.per_seed for c in cut.claims] == [c.per_seed for c in whole.claims]
