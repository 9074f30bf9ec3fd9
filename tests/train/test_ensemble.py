"""Ensembles' batched layers and stacked Adam (train/ensemble.py).

Oracles: each member's own forward (the batched forward of K members against K unbatched ones,
float64 to 1e-12); K lone runs (an FCN ensemble on batched layers against lone runs, float64
1e-12 relative, float32 1e-5, Adam and SGD, across a crash and resume); torch.optim.Adam
(StackedAdam's member k against a lone Adam with eps_k, float64 1e-12, Adam, L2 decay, AdamW).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.func import stack_module_state

from dynascope.config import ConfigError
from dynascope.nn.fcn import FCN
from dynascope.store import load_run
from dynascope.train import Engine, Loop, Member, Parts, SeedStreams
from dynascope.train.ensemble import Stack, StackedAdam, members_forward

F64 = dict(rtol=1e-12, atol=1e-12)


# -- batched layers against each member's own forward -------------------------------------------
@settings(deadline=None, max_examples=25)
@given(
    k=st.integers(1, 4),
    batch=st.integers(1, 5),
    hidden=st.lists(st.integers(1, 6), max_size=3),
    activation=st.sampled_from(["relu", "gelu", "tanh"]),
    scale=st.sampled_from([0.0, 1.0, 1e6]),
)
def test_fcn_forward_members_equals_each_members_forward(k, batch, hidden, activation, scale):
    torch.manual_seed(0)
    models = [FCN(6, hidden, 3, activation=activation).double() for _ in range(k)]
    params, _ = stack_module_state(models)
    x = scale * torch.randn(k, batch, 2, 3, dtype=torch.float64)  # [K, batch, n_ctx, d_patch]
    out = models[0].forward_members(params, x)
    expected = torch.stack([m(x[i]) for i, m in enumerate(models)])
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12 * max(scale, 1.0))


def test_fcn_forward_members_refuses_bad_inputs():
    model = FCN(4, (3,), 2)
    params, _ = stack_module_state([model, FCN(4, (3,), 2)])
    with pytest.raises(ValueError, match="x must be \\[K, batch, d_in\\]"):
        model.forward_members(params, torch.zeros(2, 4))
    with pytest.raises(ValueError, match="d_in=4"):
        model.forward_members(params, torch.zeros(2, 5, 3))


def test_sequential_of_linear_layers_gets_batched_layers():
    torch.manual_seed(1)

    def make():
        return nn.Sequential(
            nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 4, bias=False), nn.ReLU(), nn.Linear(4, 2)
        ).double()

    models = [make() for _ in range(3)]
    params, _ = stack_module_state(models)
    forward = members_forward(models[0])
    assert forward is not None
    x = torch.randn(3, 7, 5, dtype=torch.float64)
    expected = torch.stack([m(x[i]) for i, m in enumerate(models)])
    torch.testing.assert_close(forward(params, x), expected, **F64)
    # anything else keeps vmap: a LayerNorm, a lone Linear
    assert members_forward(nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2))) is None
    assert members_forward(nn.Linear(2, 2)) is None


# -- an FCN ensemble on batched layers against lone runs ------------------------------------------
class CountingFCN(FCN):
    """An FCN that counts calls of its own (unbatched) forward."""

    calls = 0

    def forward(self, x):
        CountingFCN.calls += 1
        return super().forward(x)


def _fcn_parts(optimizer: str, *, eps: float = 1e-8, via_x: bool = True):
    def build(streams: SeedStreams) -> Parts:
        model = CountingFCN(6, (5, 4), 3)
        g = streams.generator("task")
        x, y = torch.randn(24, 2, 3, generator=g), torch.randint(0, 3, (24,), generator=g)

        def loss(m, batch):
            inputs = batch["x"] if via_x else batch["x"] + 0.0  # not batch["x"]: m's forward
            penalty = 1e-2 * m.blocks[0].W.square().sum()  # a gradient that skips the output
            ce = F.cross_entropy(m(inputs), batch["y"])
            return ce + penalty, {"norm": m.W_U.detach().norm()}

        def make_opt(m):
            if optimizer == "sgd":
                return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
            if optimizer == "adamw":
                return torch.optim.AdamW(m.parameters(), lr=1e-2, eps=eps, weight_decay=0.1)
            return torch.optim.Adam(m.parameters(), lr=1e-2, eps=eps, weight_decay=1e-3)

        return Parts(model=model, data={"x": x, "y": y}, loss=loss, optimizer=make_opt)

    return build


def _loop(**kw) -> Loop:
    base = dict(steps=30, log_every=5, checkpoint_every=10, dtype="float64")
    return Loop(**{**base, **kw})


def _rows(path) -> pd.DataFrame:
    frame = load_run(path).scalars
    return frame.sort_values(["step", "key"]).reset_index(drop=True)


def _assert_runs_close(a, b, rtol):
    ra, rb = _rows(a), _rows(b)
    assert list(ra["step"]) == list(rb["step"]) and list(ra["key"]) == list(rb["key"])
    np.testing.assert_allclose(ra["value"], rb["value"], rtol=rtol, atol=rtol)


def _members(tmp_path, prefix, seeds):
    return [Member(tmp_path / f"{prefix}{s}", s, {"seed": s}) for s in seeds]


def _crashing_at_13(build):
    """``build`` with a probe that raises at step 13 (past the checkpoint at 10)."""

    def crash_at_13(model, ctx):
        if ctx.step == 13:
            raise RuntimeError("simulated crash")
        return {}

    def crashing(streams):
        parts = build(streams)
        parts.probes = [crash_at_13]
        return parts

    return crashing


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_fcn_ensemble_on_batched_layers_equals_lone_runs_across_a_resume(tmp_path, optimizer):
    seeds = [0, 1, 2]
    build = _fcn_parts(optimizer)
    for m in _members(tmp_path, "lone", seeds):
        Engine(m, build, _loop()).run()

    with_probe = _crashing_at_13(build)

    with pytest.raises(RuntimeError, match="simulated crash"):
        Engine(_members(tmp_path, "ens", seeds), with_probe, _loop(probe_every=1)).run()
    CountingFCN.calls = 0
    results = Engine(_members(tmp_path, "ens", seeds), build, _loop()).run(resume=True)
    assert [r.status for r in results] == ["finished"] * 3
    # 30 - 10 steps trained after the resume: the model's own forward ran for none of them
    assert CountingFCN.calls == 0
    for s in seeds:
        _assert_runs_close(tmp_path / f"lone{s}", tmp_path / f"ens{s}", rtol=1e-12)
        assert "resumed" in set(load_run(tmp_path / f"ens{s}").events["kind"])
    assert _rows(tmp_path / "ens0")["value"].tolist() != _rows(tmp_path / "ens1")["value"].tolist()


def test_fcn_ensemble_float32_is_within_rounding_of_lone_runs(tmp_path):
    build = _fcn_parts("adam")
    loop = _loop(dtype="float32")
    for m in _members(tmp_path, "lone", [0, 1]):
        Engine(m, build, loop).run()
    Engine(_members(tmp_path, "ens", [0, 1]), build, loop).run()
    for s in [0, 1]:
        _assert_runs_close(tmp_path / f"lone{s}", tmp_path / f"ens{s}", rtol=1e-5)


def test_a_loss_calling_the_model_on_other_inputs_runs_its_forward(tmp_path):
    build = _fcn_parts("adam", via_x=False)
    for m in _members(tmp_path, "lone", [0, 1]):
        Engine(m, build, _loop()).run()
    CountingFCN.calls = 0
    Engine(_members(tmp_path, "ens", [0, 1]), build, _loop()).run()
    assert CountingFCN.calls > 0  # the fallback: the model's forward, vectorized with vmap
    stack = Engine(_members(tmp_path, "again", [0, 1]), build, _loop()).stack
    assert stack is not None and stack._forward is not None
    batches = [build(SeedStreams(s)).data for s in (0, 1)]
    batches = [
        {k: v.double() if v.is_floating_point() else v for k, v in b.items()} for b in batches
    ]
    stack.losses(build(SeedStreams(0)).loss, batches)
    assert stack._forward is None  # unused after one step: not computed again
    for s in [0, 1]:
        _assert_runs_close(tmp_path / f"lone{s}", tmp_path / f"ens{s}", rtol=1e-12)


# -- per-member Adam eps --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kind", [dict(), dict(weight_decay=0.05), dict(weight_decay=0.05, decoupled_weight_decay=True)]
)
def test_stacked_adam_member_k_equals_a_lone_adam_with_eps_k(kind):
    eps = [1e-8, 1e-3, 0.3]
    torch.manual_seed(2)
    init = torch.randn(3, 4, 2, dtype=torch.float64)
    targets = torch.randn(60, 3, 4, 2, dtype=torch.float64)
    stacked = init.clone().requires_grad_()
    opt = StackedAdam([stacked], lr=0.05, betas=(0.8, 0.99), eps=eps, **kind)
    lone = [init[k].clone().requires_grad_() for k in range(3)]
    adam = torch.optim.AdamW if kind.get("decoupled_weight_decay") else torch.optim.Adam
    lone_kind = {k: v for k, v in kind.items() if k != "decoupled_weight_decay"}
    opts = [adam([p], lr=0.05, betas=(0.8, 0.99), eps=e, **lone_kind) for p, e in zip(lone, eps)]
    for t in range(60):
        ((stacked - targets[t]) ** 3).abs().sum().backward()
        opt.step()
        opt.zero_grad()
        for k in range(3):
            ((lone[k] - targets[t, k]) ** 3).abs().sum().backward()
            opts[k].step()
            opts[k].zero_grad()
    torch.testing.assert_close(stacked.detach(), torch.stack(lone).detach(), **F64)
    # eps matters here: members 0 and 2 from the same start would not agree
    assert not torch.allclose(stacked[0], stacked[2])


def test_stacked_adam_refuses_bad_settings():
    p = torch.zeros(2, 3, requires_grad=True)
    with pytest.raises(ValueError, match="eps must be K finite values > 0"):
        StackedAdam([p], eps=[1e-8, 0.0])
    with pytest.raises(ValueError, match="K = len\\(eps\\) = 3"):
        StackedAdam([p], eps=[1e-8] * 3)
    with pytest.raises(ValueError, match="betas must each lie in"):
        StackedAdam([p], eps=[1e-8] * 2, betas=(0.9, 1.0))
    models = [nn.Linear(2, 2) for _ in range(2)]
    with pytest.raises(ConfigError, match="amsgrad=True is not stacked"):
        Stack(models, [lambda m: torch.optim.Adam(m.parameters(), amsgrad=True)] * 2, [1.0] * 2)
    sgd = [
        lambda m, mom=mom: torch.optim.SGD(m.parameters(), lr=0.1, momentum=mom) for mom in (0, 1)
    ]
    with pytest.raises(ConfigError, match="optimizers differ in kind or settings"):
        Stack(models, sgd, [1.0] * 2)


def test_members_with_their_own_adam_eps_equal_lone_runs_across_a_resume(tmp_path):
    """Adam ε 1e-8 and 1e-1 in one ensemble: each equals its lone run, and each member's
    checkpoint holds its own ε (a resume from it, alone or in another ensemble, is that member)."""

    def build(streams):
        return _fcn_parts("adam", eps=1e-8 if streams.seed % 2 == 0 else 1e-1)(streams)

    seeds = [0, 1, 2, 3]
    for m in _members(tmp_path, "lone", seeds):
        Engine(m, build, _loop()).run()
    with pytest.raises(RuntimeError, match="simulated crash"):
        Engine(_members(tmp_path, "ens", seeds), _crashing_at_13(build), _loop(probe_every=1)).run()
    Engine(_members(tmp_path, "ens", [0, 1]), build, _loop()).run(resume=True)  # K = 2 now
    for s in (2, 3):  # the others go on alone from their checkpoints at step 10
        Engine(_members(tmp_path, "ens", [s])[0], build, _loop()).run(resume=True)
    for s in seeds:
        Engine(_members(tmp_path, "ens", [s])[0], build, _loop()).run(resume=True)
        _assert_runs_close(tmp_path / f"lone{s}", tmp_path / f"ens{s}", rtol=1e-12)
    a, b = _rows(tmp_path / "lone0"), _rows(tmp_path / "lone1")
    assert not np.allclose(a["value"], b["value"], rtol=1e-3)
