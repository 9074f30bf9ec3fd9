"""Study ntk-lazy-validity: the net against MLP, centering, the twin's closed-form oracle, the
slope fit, presets, and the smoke preset end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from dynascope import studies
from dynascope.nn.mlp import MLP
from dynascope.store import load_run
from dynascope.studies._ntk_lazy_runner import build_h, two_layer
from dynascope.studies.ntk_lazy_validity import (
    STUDY,
    LazyRunConfig,
    _slope,
    build_runs,
    run_lazy,
)

F64 = torch.float64


def test_two_layer_is_the_ntk_mlp_of_depth_one():
    g = torch.Generator().manual_seed(0)
    net = MLP(5, 13, 1, depth=1, parametrization="ntk", activation="tanh", generator=g, dtype=F64)
    x = torch.randn(7, 5, generator=g, dtype=F64)
    w = {"W": net.layers[0].weight.detach(), "v": net.layers[1].weight.detach()}
    torch.testing.assert_close(two_layer(w, x, "tanh"), net(x).detach(), rtol=0, atol=1e-14)
    # a leading alpha axis computes each copy independently
    wb = {k: torch.stack([v, 2 * v]) for k, v in w.items()}
    out = two_layer(wb, x, "tanh")
    torch.testing.assert_close(out[0], net(x).detach(), rtol=0, atol=1e-14)


@pytest.mark.parametrize("centering", ["antisymmetric", "offset"])
def test_h_vanishes_at_init_and_moves_after(centering):
    cfg = LazyRunConfig(width=9, n_train=4, alphas=[1.0], centering=centering)
    h_fn, w0 = build_h(cfg, torch.Generator().manual_seed(1), F64, torch.device("cpu"))
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(2), dtype=F64)
    torch.testing.assert_close(h_fn(w0, x), torch.zeros(4, 1, dtype=F64), rtol=0, atol=0)
    first = next(iter(w0))  # "a.W" (antisymmetric) or "W": moving one copy breaks the symmetry
    moved = {**w0, first: w0[first] + 0.1}
    assert h_fn(moved, x).abs().max() > 1e-3


def test_runner_twin_matches_the_closed_form_and_logs_sups(tmp_path):
    cfg = LazyRunConfig(width=12, n_train=6, alphas=[2.0, 16.0], steps=60, kernel_points=2,
                        log_every=1)  # fmt: skip
    run_lazy(cfg, tmp_path / "run")
    run = load_run(tmp_path / "run")
    assert run.status == "finished"
    steps, D = run.tensors("D")  # [n, 2]
    assert len(steps) == 61 and D.shape == (61, 2)
    np.testing.assert_array_equal(D[0], [0.0, 0.0])  # h(w0) = hbar(w0) = 0
    assert np.all(np.diff(D, axis=0) >= 0)  # a running sup
    assert run.tensors("oracle_error")[1][-1].max() <= 1e-10
    np.testing.assert_array_equal(run.tensors("param_dist")[1][0], [0.0, 0.0])
    # GD on the alpha-scaled objective moves the weights by O(1/alpha)
    dist = run.tensors("param_dist")[1][-1]
    assert 0.5 < dist[0] * 2.0 / (dist[1] * 16.0) < 2.0


def test_slope_recovers_a_power_law_and_needs_ten_points():
    t = np.arange(1, 5001) * 0.01
    assert _slope(t, 3.0 * t**1.7, 1.0, 50.0) == pytest.approx(1.7, abs=1e-9)
    assert math.isnan(_slope(t[:150], t[:150], 1.0, 50.0))  # t in [1, 1.5]: too few distinct


def test_presets_validate_and_match_the_registry():
    assert studies.get("ntk-lazy-validity") is STUDY
    names = [s.name for s in build_runs(STUDY.preset("fast"))]
    assert names == ["s0_antisymmetric", "s0_offset", "eta_half"]
    fast = {s.name: s.config for s in build_runs(STUDY.preset("fast"))}
    assert fast["s0_antisymmetric"].steps == 5000 and fast["eta_half"].steps == 10_000
    assert fast["eta_half"].lr == pytest.approx(5e-3) and fast["eta_half"].alphas == [32.0]
    assert (
        fast["s0_offset"].model_copy(update={"centering": "antisymmetric"})
        == fast["s0_antisymmetric"]
    )
    assert len(build_runs(STUDY.preset("paper"))) == 11
    with pytest.raises(ValidationError, match="alphas must all be > 0"):
        LazyRunConfig(alphas=[1.0, -2.0])


def test_smoke_preset_end_to_end(tmp_path):
    outcome = STUDY.run(preset="smoke", out=tmp_path)
    data = json.loads((tmp_path / "verdict.json").read_text(), parse_constant=pytest.fail)
    assert [c["claim"].split(":")[0] for c in data["claims"]] == [
        "n1", "n2", "n1-offset", "n2-offset", "n0 (oracle)"
    ]  # fmt: skip
    assert all(r["status"] == "finished" for r in data["runs"])
    oracle = data["claims"][-1]
    assert oracle["passed"] and oracle["measured"] <= 1e-10
    for claim in data["claims"]:
        assert claim["measured"] is None or isinstance(claim["measured"], float)
    assert len(list((tmp_path / "figures").glob("*.png"))) == 1
    assert outcome.passed == all(c["passed"] for c in data["claims"])
