"""Study autoencoder-greedy-rank: oracles for the runner, the analysis on hand-built stores,
presets, and the smoke preset end to end."""

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
    AutoencoderRunConfig,
    analyze,
    build_runs,
    reconstruction_loss,
    run_autoencoder,
    step_size,
    verdicts_from_runs,
)
from dynascope.tasks.low_rank import LowRankGaussian


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_reconstruction_loss_equals_the_mean_squared_error_over_samples():
    """Dense oracle: ((X - X P)^2).sum(-1).mean() in float64, to 1e-12 relative."""
    x = torch.randn(37, 6, generator=gen(), dtype=torch.float64)
    P = torch.randn(6, 6, generator=gen(1), dtype=torch.float64)
    expected = (x - x @ P).square().sum(dim=-1).mean()
    torch.testing.assert_close(reconstruction_loss(P, x.T @ x / 37), expected, rtol=1e-12, atol=0)


def test_no_stack_noiseless_gd_learns_the_projection_onto_span_a():
    """S15's smoke oracle: L = 0, GD, noiseless data -> M restricted to span A is the projection.

    Directions outside span A carry no data, so they get no gradient; the oracle is therefore
    A A^T P = A A^T (every x in span A is reconstructed exactly). The slowest mode (variance 1)
    contracts by about 1 - 2 * eta * 1 per step: 1,000 steps of eta = 0.05 reach rounding.
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


def test_runner_logs_the_instruments_and_reaches_the_oracle(tmp_path):
    cfg = AutoencoderRunConfig(noise_std=0.0, n_train=200, n_heldout=50, steps=300, log_points=10)
    run_autoencoder(cfg, tmp_path / "run")
    run = load_run(tmp_path / "run")
    assert run.status == "finished"
    steps, gain = run.tensors("gain")
    assert list(steps) == list(range(301))
    torch.testing.assert_close(torch.from_numpy(gain[-1]), torch.ones(5), rtol=0, atol=1e-4)
    assert run.tensors("sigma")[1].shape == (301, 16)
    assert run.tensors("align")[1].shape == (301, 5, 5)
    lat_steps, spectrum = run.tensors("latent.spectrum")
    assert lat_steps[0] == 0 and lat_steps[-1] == 300 and spectrum.shape[1] == 16
    assert run.last("latent.rank_1e-2") == 5  # noiseless data of rank 5
    assert run.last("loss") < 1e-6


def test_step_size_depth_rule_and_cap():
    base = AutoencoderRunConfig(lr=0.05)
    assert step_size(base.model_copy(update={"n_stack": 0})) == 0.05
    assert step_size(base.model_copy(update={"n_stack": 8})) == pytest.approx(0.05 / 8)
    assert step_size(base.model_copy(update={"n_stack": 1})) == pytest.approx(2 * 0.05 / 3)
    small = base.model_copy(update={"n_stack": 4, "init_scale": 0.5})
    assert step_size(small) == pytest.approx(2 * 0.05 / 6)  # 0.05 / (4 * 0.5**6) is capped
    assert step_size(base.model_copy(update={"n_stack": 8, "lr_rule": "constant"})) == 0.05


# -- the analysis on hand-built stores --------------------------------------------------------
STEPS = 100
LOGGED = [0, 1, 5, 20, 60, STEPS]


def _spectrum(ones: int) -> torch.Tensor:
    s = torch.zeros(16)
    s[:ones] = 1.0
    return s


def write_run(
    path,
    *,
    n_stack,
    init="orthogonal",
    t_modes,
    order=(0, 1, 2, 3, 4),
    dip,
    final,
    dips=None,
    status="finished",
):
    """A store as run_autoencoder writes it: the k-th mode's sigma jumps from 0.1 to 1 at
    t_modes[k] and points at data PC order[k]; the latent spectrum has ``dip`` equal values at
    step 20 and ``final`` at the end (effective rank = number of equal values)."""
    cfg = AutoencoderRunConfig(n_stack=n_stack, init=init, steps=STEPS)
    with RunStore(path) as store:
        store.write_config(cfg.model_dump(mode="json"))
        store.set_status(0, "running")
        for step in range(STEPS + 1):
            sigma = torch.full((16,), 0.1)
            align = torch.zeros(5, 5)
            gain = torch.zeros(5)
            for k, tk in enumerate(t_modes):
                if dips and step in dips.get(k, ()):
                    continue  # a mode that is lost again for a step
                if step >= tk:
                    sigma[k] = 1.0
                    gain[order[k]] = 1.0
                align[k, order[k]] = 1.0
            values = {"loss": 1.0 / (1 + step), "sigma": sigma, "align": align, "gain": gain}
            if step in LOGGED:
                ones = dip if step == 20 else (final if step == STEPS else 5)
                spec = _spectrum(ones)
                values.update(
                    {
                        "latent.spectrum": spec,
                        "latent.rank_1e-2": float(ones),
                        "latent.effective_rank": float(ones),
                    }
                )
            store.log(step, values)
        store.set_status(STEPS, status)
    return load_run(path)


def greedy_runs(tmp_path, **overrides):
    spec = {
        "L0_orth_seed0": {"n_stack": 0, "t_modes": [2, 4, 6, 8, 10], "dip": 4, "final": 16},
        "L2_orth_seed0": {"n_stack": 2, "t_modes": [3, 9, 15, 21, 27], "dip": 3, "final": 5},
        "L4_orth_seed0": {"n_stack": 4, "t_modes": [4, 12, 20, 28, 36], "dip": 2, "final": 5},
        "L8_orth_seed0": {"n_stack": 8, "t_modes": [5, 15, 25, 35, 45], "dip": 1, "final": 5},
        "L8_default_seed0": {
            "n_stack": 8,
            "init": "default",
            "t_modes": [10, 30, 50, 70, 90],
            "dip": 1,
            "final": 5,
        },
    }
    for name, change in overrides.items():
        spec[name] = {**spec[name], **change}
    return {name: write_run(tmp_path / name, **kw) for name, kw in spec.items()}


def test_analysis_of_an_ideal_greedy_study_passes_with_known_values(tmp_path):
    analysis = analyze(greedy_runs(tmp_path / "runs"), tmp_path / "figures")
    by_name = {v.claim.split(":")[0]: v for v in analysis.verdicts}
    assert list(by_name) == ["r1", "r2", "r3", "r4", "d"]
    assert all(v.passed for v in analysis.verdicts), [v.detail for v in analysis.verdicts]
    assert by_name["r1"].measured == 3 and by_name["r2"].measured == 3
    assert by_name["r3"].measured == 16
    assert by_name["r4"].measured == 90 - 45  # t_5(default) - t_5(orthogonal)
    assert by_name["d"].measured == pytest.approx(-1.0)  # min erank 4, 3, 2, 1 over L
    assert len(analysis.figures) == 3 and all(p.is_file() for p in analysis.figures)
    (table,) = analysis.tables.values()
    assert [row["L"] for row in table] == [0, 2, 4, 8, 8]


def test_analysis_sees_a_lost_mode_a_wrong_order_and_a_fast_control(tmp_path):
    runs = greedy_runs(
        tmp_path / "runs",
        L4_orth_seed0={"dips": {1: (40,)}},  # count 5 -> 4 -> 5 at step 40: not monotone
        L2_orth_seed0={"order": (1, 0, 2, 3, 4)},  # PC2 learnt first
        L8_default_seed0={"t_modes": [1, 2, 3, 4, 5]},  # default learns first
        L8_orth_seed0={"dip": 3},  # d: min erank 4, 3, 2, 3 -> rise of 1
    )
    by_name = {v.claim.split(":")[0]: v for v in verdicts_from_runs(runs)[0]}
    assert by_name["r1"].passed and by_name["r1"].measured == 3
    assert not by_name["r2"].passed and by_name["r2"].measured == 1  # only L = 8 is clean
    assert not by_name["r4"].passed and by_name["r4"].measured == 5 - 45
    assert not by_name["d"].passed and by_name["d"].measured == pytest.approx(1.0)


def test_a_control_that_never_learns_five_modes_passes_r4_with_a_lower_bound(tmp_path):
    runs = greedy_runs(tmp_path / "runs", L8_default_seed0={"t_modes": [10, 30, 50, 70]})
    r4 = next(v for v in verdicts_from_runs(runs)[0] if v.claim.startswith("r4"))
    assert r4.passed and r4.measured == STEPS + 1 - 45
    assert "never reached 5 (lower bound)" in r4.detail


# -- presets and the smoke preset -------------------------------------------------------------
def test_presets_validate_and_build_the_planned_runs():
    assert "autoencoder-greedy-rank" in studies.names()
    assert studies.get("autoencoder-greedy-rank") is STUDY
    fast = {s.name: s.config for s in build_runs(STUDY.preset("fast"))}
    assert list(fast) == [
        "L0_orth_seed0",
        "L2_orth_seed0",
        "L4_orth_seed0",
        "L8_orth_seed0",
        "L8_default_seed0",
    ]
    assert fast["L8_default_seed0"].init == "default"
    assert {c.steps for c in fast.values()} == {5000}
    assert {c.seed for c in fast.values()} == {0}  # same data, encoder and decoder
    assert [s.name for s in build_runs(STUDY.preset("smoke"), seed=3)] == [
        "L0_orth_seed0",
        "L2_orth_seed0",
        "L2_default_seed0",
    ]
    assert build_runs(STUDY.preset("smoke"), seed=3)[0].config.seed == 3
    paper = build_runs(STUDY.preset("paper"))
    assert len(paper) == 5 * (17 + 16 + 1)  # s = 0.5 skips L = 0 (no stack)
    assert len({s.name for s in paper}) == len(paper)
    with pytest.raises(ValueError, match="preset must be one of smoke, fast, paper"):
        STUDY.preset("huge")


def test_smoke_preset_end_to_end(tmp_path):
    outcome = studies.get("autoencoder-greedy-rank").run(preset="smoke", out=tmp_path)
    data = json.loads((tmp_path / "verdict.json").read_text(), parse_constant=pytest.fail)
    assert data["study"] == "autoencoder-greedy-rank" and data["preset"] == "smoke"
    assert [c["claim"].split(":")[0] for c in data["claims"]] == ["r1", "r2", "r3", "r4", "d"]
    for claim in data["claims"]:
        assert claim["measured"] is None or isinstance(claim["measured"], float)
        assert isinstance(claim["passed"], bool)
    assert all(r["status"] == "finished" for r in data["runs"])
    assert len(list((tmp_path / "figures").glob("*.png"))) == 3
    assert (tmp_path / "report.html").read_text().count("data:image/png;base64") == 3
    assert outcome.passed == all(c["passed"] for c in data["claims"])
    assert not math.isnan(outcome.claims[2].measured)  # r3: L = 0's final rank is measured
