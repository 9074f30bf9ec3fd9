"""Study bottleneck-acceleration (S16): the nets against S16's formulas, the stability number
against a dense eigenvalue, verdict logic on hand-built rows, presets, smoke end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from dynascope import studies
from dynascope.store import load_run
from dynascope.studies.bottleneck_acceleration import (
    STUDY,
    BottleneckRunConfig,
    build_runs,
    make_data,
    make_net,
    ntk_lambda_max,
    run_bottleneck,
    verdicts_from_rows,
)

F64 = torch.float64


def test_bottleneck_net_is_s16s_formula():
    """z = W2 φ(W1 x / √16) / √n, F = vᵀ φ(W3 z / √d) / √n (right-multiplying, x @ W)."""
    cfg = BottleneckRunConfig(width=24, bottleneck=3, n_train=5, n_kernel=2)
    net = make_net(cfg, F64)
    x, _, _ = make_data(cfg, F64)
    W1, W2, W3, v = (layer.weight for layer in net.layers)
    assert [tuple(W.shape) for W in (W1, W2, W3, v)] == [(16, 24), (24, 3), (3, 24), (24, 1)]
    with torch.no_grad():
        z = torch.relu(x @ W1 / 4) @ W2 / math.sqrt(24)
        F = torch.relu(z @ W3 / math.sqrt(3)) @ v / math.sqrt(24)
        torch.testing.assert_close(net(x), F, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(net.preactivations(x)[1], z, rtol=1e-12, atol=1e-12)
    assert all(layer.bias is None for layer in net.layers)


def test_all_wide_net_and_its_middle_layer():
    cfg = BottleneckRunConfig(net="wide", width=10, n_train=4, n_kernel=2)
    net = make_net(cfg, F64)
    x, _, _ = make_data(cfg, F64)
    W1, W2, W3, v = (layer.weight for layer in net.layers)
    with torch.no_grad():
        H = torch.relu(x @ W1 / 4) @ W2 / math.sqrt(10)
        out = torch.relu(torch.relu(H) @ W3 / math.sqrt(10)) @ v / math.sqrt(10)
        torch.testing.assert_close(net(x), out, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(net.preactivations(x)[1], H, rtol=1e-12, atol=1e-12)


def test_data_is_a_single_index_target_shared_by_nets_and_widths():
    a = make_data(BottleneckRunConfig(n_train=9, width=8, net="wide", n_kernel=2), F64)
    b = make_data(BottleneckRunConfig(n_train=9, width=32, n_kernel=2), F64)
    for p, q in zip(a, b):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    x, y, u = a
    torch.testing.assert_close(u.norm(), torch.tensor(1.0, dtype=F64))
    torch.testing.assert_close(y, torch.sin(3 * (x @ u)), rtol=0, atol=1e-15)  # one rounding


def test_power_iteration_matches_the_dense_ntk_eigenvalue():
    """λ_max(J Jᵀ) from a per-example autograd Jacobian (float64); power iteration to 1e-8."""
    cfg = BottleneckRunConfig(net="wide", width=6, n_train=7, n_kernel=2)
    net = make_net(cfg, F64)
    x, _, _ = make_data(cfg, F64)
    rows = []
    for i in range(7):
        grads = torch.autograd.grad(net(x[i : i + 1]).sum(), list(net.parameters()))
        rows.append(torch.cat([g.reshape(-1) for g in grads]))
    J = torch.stack(rows)
    expected = torch.linalg.eigvalsh(J @ J.T)[-1]
    torch.testing.assert_close(ntk_lambda_max(net, x, iters=100), expected, rtol=1e-8, atol=0)


def test_runner_logs_every_step_and_starts_from_the_nets_own_loss(tmp_path):
    cfg = BottleneckRunConfig(
        width=16, n_train=12, steps=20, n_kernel=6, log_points=5, power_iters=5, dtype="float64"
    )
    run_bottleneck(cfg, tmp_path / "run")
    run = load_run(tmp_path / "run")
    assert run.status == "finished"
    mse = run.scalar("train.mse")
    assert list(mse.index) == list(range(21))
    x, y, _ = make_data(cfg, F64)
    with torch.no_grad():
        mse0 = (make_net(cfg, F64)(x)[:, 0] - y).square().mean()
    assert mse.iloc[0] == pytest.approx(float(mse0), rel=1e-12)
    steps, layers = run.tensors("movement.layers")
    assert steps[0] == 0 and np.all(layers[0] == 0) and layers.shape[1] == 3
    assert run.last("movement") == pytest.approx(layers[-1, 1], rel=1e-6)
    assert run.tensors("latent.spectrum")[1][-1].shape == (4,)
    assert 0 < run.last("stability.eta_lambda_over_N") < 2


def _row(net, n, reached, movement, steps=2000, status="finished", d=4):
    budget = float(steps) if reached is None else float(reached)
    if net == "bottleneck":
        budget = float(reached) if status == "finished" and reached is not None else math.inf
    return {
        "run": f"{net}{n}",
        "net": net,
        "n": n,
        "d": d if net == "bottleneck" else None,
        "seed": 0,
        "status": status,
        "steps_to_target": reached,
        "steps_for_ratio": budget,
        "movement": movement,
        "final mse": 0.5,
    }


def test_verdicts_on_hand_built_rows():
    rows = [
        _row("wide", 128, None, 0.2),  # never: counts as 2000
        _row("wide", 512, 1500, 0.1),
        _row("bottleneck", 128, 900, 0.5),
        _row("bottleneck", 512, 700, 0.6),
        _row("bottleneck", 512, None, 9.9, d=1),  # not gated: d != 4
    ]
    b1, b2, b3 = verdicts_from_rows(rows)
    assert b1.measured == pytest.approx(700 / 1500) and b1.passed
    assert b2.measured == pytest.approx(1.2) and b2.passed
    assert b3.measured == pytest.approx(-0.5) and b3.passed  # 0.2 -> 0.1 over a factor 4
    rows[2] = _row("bottleneck", 128, None, 0.05)
    rows[1] = _row("wide", 512, None, 0.2, status="diverged")
    b1, b2, b3 = verdicts_from_rows(rows)
    assert b1.measured == math.inf and not b1.passed
    assert b2.measured == pytest.approx(12.0) and not b2.passed
    assert b3.measured == pytest.approx(0.0) and not b3.passed
    assert "diverged" in b1.detail


def test_config_rejects_more_kernel_points_than_training_points():
    with pytest.raises(ValidationError, match="n_kernel must be <= n_train"):
        BottleneckRunConfig(n_train=10, n_kernel=11)
    with pytest.raises(ValidationError, match="net"):
        BottleneckRunConfig(net="deep")


def test_presets_validate_and_match_the_registry():
    assert studies.get("bottleneck-acceleration") is STUDY
    fast = build_runs(STUDY.preset("fast"))
    assert {(s.config.net, s.config.width) for s in fast} == {
        (net, n) for net in ("wide", "bottleneck") for n in (128, 256, 512)
    }
    assert all(s.config.steps == 2000 and s.config.lr == 1.0 for s in fast)
    assert len(build_runs(STUDY.preset("paper"))) == 3 * 4 * (1 + 4)


def test_smoke_preset_end_to_end(tmp_path):
    outcome = STUDY.run(preset="smoke", out=tmp_path)
    data = json.loads((tmp_path / "verdict.json").read_text())
    assert [c["claim"].split(":")[0] for c in data["claims"]] == ["b1", "b2", "b3"]
    assert all(r["status"] == "finished" for r in data["runs"])
    for claim in data["claims"]:  # b1 is null (inf) when no bottleneck run reaches 1e-3
        assert claim["measured"] is None or isinstance(claim["measured"], float)
        assert isinstance(claim["passed"], bool)
    assert len(list((tmp_path / "figures").glob("*.png"))) == 2
    assert outcome.passed == all(c["passed"] for c in data["claims"])
