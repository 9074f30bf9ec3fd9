"""The engine: one loop for lone runs and ensembles.

Oracles: an ensemble of K members against K lone runs of the same seeds (float64: 1e-12
relative; float32: 1e-5 relative, the rounding of batched against unbatched products), a
resumed run against an uninterrupted one (bitwise), the schedule against its closed form, and
seed streams against their definition.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from dynascope.config import ConfigError
from dynascope.nn import Transformer
from dynascope.store import load_run
from dynascope.train import (
    Engine,
    Loop,
    LRSchedule,
    Member,
    Parts,
    SeedStreams,
    lr_factor,
    stream_seed,
)

W_TEACHER = torch.linspace(-1.0, 1.0, 15).reshape(5, 3)


def _mlp_parts(optimizer: str, dtype=torch.float64, lr: float = 0.05):
    def build(streams: SeedStreams) -> Parts:
        model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))

        def data(g):
            x = torch.randn(16, 5, generator=g)
            return {"x": x, "y": torch.sin(x @ W_TEACHER)}

        def loss(m, batch):
            err = m(batch["x"]) - batch["y"]
            return err.square().mean(), {"max_err": err.abs().amax()}

        def make_opt(m):
            if optimizer == "sgd":
                return torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9)
            return torch.optim.Adam(m.parameters(), lr=lr / 10)

        val_x = torch.randn(32, 5, generator=streams.generator("val")).to(dtype)

        def evaluate(m):
            return {"val.loss": (m(val_x) - torch.sin(val_x @ W_TEACHER.to(dtype))).square().mean()}

        return Parts(model=model, data=data, loss=loss, optimizer=make_opt, evaluate=evaluate)

    return build


def _transformer_parts(streams: SeedStreams) -> Parts:
    model = Transformer(d_model=12, n_heads=3, n_layers=1, d_vocab=11, n_ctx=7, d_out=11)

    def data(g):
        x = torch.randint(0, 11, (4, 7), generator=g)
        return {"x": x, "y": torch.roll(x, 1, dims=1)}

    def loss(m, batch):
        logits = m(batch["x"])
        return nn.functional.cross_entropy(logits.flatten(0, 1), batch["y"].flatten())

    return Parts(
        model=model,
        data=data,
        loss=loss,
        optimizer=lambda m: torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.1),
    )


def _members(tmp_path, prefix, seeds, lr_scales=None):
    scales = lr_scales or [1.0] * len(seeds)
    return [
        Member(tmp_path / f"{prefix}{seed}", seed, {"seed": seed, "lr_scale": scale}, scale)
        for seed, scale in zip(seeds, scales, strict=True)
    ]


def _loop(**kw) -> Loop:
    base = dict(steps=30, log_every=5, eval_every=10, checkpoint_every=10, dtype="float64")
    return Loop(**{**base, **kw})


def _rows(path) -> pd.DataFrame:
    frame = load_run(path).scalars
    return frame.sort_values(["step", "key"]).reset_index(drop=True)


def _assert_runs_close(a, b, rtol):
    ra, rb = _rows(a), _rows(b)
    assert list(ra["step"]) == list(rb["step"]) and list(ra["key"]) == list(rb["key"])
    np.testing.assert_allclose(ra["value"], rb["value"], rtol=rtol, atol=rtol)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_mlp_ensemble_equals_lone_runs_float64(tmp_path, optimizer):
    seeds = [3, 4, 5]
    build = _mlp_parts(optimizer)
    for m in _members(tmp_path, "lone", seeds):
        Engine(m, build, _loop(grad_clip=0.5)).run()
    results = Engine(_members(tmp_path, "ens", seeds), build, _loop(grad_clip=0.5)).run()
    assert [r.status for r in results] == ["finished"] * 3
    for seed in seeds:
        _assert_runs_close(tmp_path / f"lone{seed}", tmp_path / f"ens{seed}", rtol=1e-12)
    # the members really differ (their own seeds), so equality is not trivial
    assert _rows(tmp_path / "ens3")["value"].tolist() != _rows(tmp_path / "ens4")["value"].tolist()


def test_transformer_ensemble_with_a_resume_equals_lone_runs(tmp_path):
    seeds = [0, 1, 2]
    loop = _loop(steps=20, eval_every=None)
    for m in _members(tmp_path, "lone", seeds):
        Engine(m, _transformer_parts, loop).run()

    calls = {"n": 0}

    def crashing(streams):
        parts = _transformer_parts(streams)
        draw = parts.data

        def data(g):
            calls["n"] += 1
            if calls["n"] == 3 * 13:  # step 13 of member 2: past checkpoint 10
                raise RuntimeError("simulated crash")
            return draw(g)

        parts.data = data
        return parts

    with pytest.raises(RuntimeError, match="simulated crash"):
        Engine(_members(tmp_path, "ens", seeds), crashing, loop).run()
    assert load_run(tmp_path / "ens0").status == "running"
    results = Engine(_members(tmp_path, "ens", seeds), _transformer_parts, loop).run(resume=True)
    assert [r.status for r in results] == ["finished"] * 3
    for seed in seeds:
        _assert_runs_close(tmp_path / f"lone{seed}", tmp_path / f"ens{seed}", rtol=1e-12)
        events = load_run(tmp_path / f"ens{seed}").events
        assert "resumed" in set(events["kind"])


def test_float32_ensemble_is_within_rounding_of_lone_runs(tmp_path):
    build = _mlp_parts("adam", dtype=torch.float32)
    loop = _loop(dtype="float32")
    for m in _members(tmp_path, "lone", [0, 1]):
        Engine(m, build, loop).run()
    Engine(_members(tmp_path, "ens", [0, 1]), build, loop).run()
    for seed in [0, 1]:
        _assert_runs_close(tmp_path / f"lone{seed}", tmp_path / f"ens{seed}", rtol=1e-5)


def test_member_lr_scale_equals_a_lone_run_at_that_rate(tmp_path):
    Engine(_members(tmp_path, "lone", [7])[0], _mlp_parts("sgd", lr=0.025), _loop()).run()
    members = _members(tmp_path, "ens", [6, 7], lr_scales=[1.0, 0.5])
    Engine(members, _mlp_parts("sgd", lr=0.05), _loop()).run()
    lone, ens = _rows(tmp_path / "lone7"), _rows(tmp_path / "ens7")
    np.testing.assert_allclose(ens["value"], lone["value"], rtol=1e-10, atol=1e-12)


def test_members_built_with_their_own_lr_equal_lone_runs_at_that_lr(tmp_path):
    def build(streams):
        return _mlp_parts("adam", lr=0.05 * (1 + streams.seed))(streams)

    for m in _members(tmp_path, "lone", [0, 2]):
        Engine(m, build, _loop()).run()
    Engine(_members(tmp_path, "ens", [0, 2]), build, _loop()).run()
    for seed in [0, 2]:
        _assert_runs_close(tmp_path / f"lone{seed}", tmp_path / f"ens{seed}", rtol=1e-10)


def test_a_diverged_member_is_frozen_and_the_others_go_on(tmp_path):
    Engine(_members(tmp_path, "lone", [1])[0], _mlp_parts("sgd"), _loop(log_every=1)).run()
    members = _members(tmp_path, "ens", [0, 1], lr_scales=[1e12, 1.0])
    results = Engine(members, _mlp_parts("sgd"), _loop(log_every=1)).run()
    assert [r.status for r in results] == ["diverged", "finished"]
    run = load_run(tmp_path / "ens0")
    assert run.status == "diverged"
    assert "is not finite" in run.events[run.events["kind"] == "diverged"]["detail"].iloc[0]
    _assert_runs_close(tmp_path / "lone1", tmp_path / "ens1", rtol=1e-12)


def test_custom_step_checkpoints_its_state_and_resumes_bitwise(tmp_path):
    class ClosedFormGD:
        """w <- w - lr * grad of 0.5 ||w - target||^2, with a noisy target (step generator)."""

        def __init__(self):
            self.calls = 0

        def __call__(self, model, batch, ctx):
            noise = torch.randn(3, generator=ctx.generator, dtype=torch.float64)
            with torch.no_grad():
                w = model.weight
                loss = 0.5 * (w - batch["target"] - 0.1 * noise).square().sum()
                w -= 0.1 * ctx.lr_factor * (w - batch["target"] - 0.1 * noise)
            self.calls += 1
            return loss, {"calls": torch.tensor(float(self.calls))}

        def state_dict(self):
            return {"calls": self.calls}

        def load_state_dict(self, state):
            self.calls = state["calls"]

    def build(streams):
        model = nn.Linear(3, 1, bias=False)
        target = torch.ones(1, 3)
        return Parts(model=model, data={"target": target}, step=ClosedFormGD())

    loop = _loop(schedule=LRSchedule(kind="cosine", warmup_steps=4))
    Engine(Member(tmp_path / "full", 0, {}), build, loop).run()

    class Crashing(ClosedFormGD):
        def __call__(self, model, batch, ctx):
            if ctx.step == 17:
                raise RuntimeError("simulated crash")
            return super().__call__(model, batch, ctx)

    def crashing(streams):
        parts = build(streams)
        parts.step = Crashing()
        return parts

    with pytest.raises(RuntimeError, match="simulated crash"):
        Engine(Member(tmp_path / "cut", 0, {}), crashing, loop).run()
    Engine(Member(tmp_path / "cut", 0, {}), build, loop).run(resume=True)
    pd.testing.assert_frame_equal(_rows(tmp_path / "full"), _rows(tmp_path / "cut"))
    calls = load_run(tmp_path / "cut").scalar("train.calls")
    assert calls.iloc[-1] == pytest.approx(28.0)  # mean of calls 26..30 (state kept over resume)


def test_engine_refuses_bad_parts_with_one_line_errors(tmp_path):
    def no_step(streams):
        return Parts(model=nn.Linear(2, 2), data={"x": torch.zeros(1, 2)})

    with pytest.raises(ConfigError, match="exactly one of loss= and step="):
        Engine(Member(tmp_path / "a", 0, {}), no_step, _loop())

    def no_optimizer(streams):
        return Parts(model=nn.Linear(2, 2), data={"x": torch.zeros(1, 2)}, loss=lambda m, b: 0)

    with pytest.raises(ConfigError, match="loss= needs optimizer="):
        Engine(Member(tmp_path / "a", 0, {}), no_optimizer, _loop())
    members = [Member(tmp_path / "a", 0, {}), Member(tmp_path / "a", 1, {})]
    with pytest.raises(ConfigError, match="share a run directory"):
        Engine(members, _mlp_parts("sgd"), _loop())

    def other_width(streams):
        parts = _mlp_parts("sgd")(streams)
        if streams.seed == 1:
            parts.model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
        return parts

    members = [Member(tmp_path / "a", 0, {}), Member(tmp_path / "b", 1, {})]
    with pytest.raises(ConfigError, match="differ in parameter names or shapes"):
        Engine(members, other_width, _loop())


# -- schedule and seeds ------------------------------------------------------------------------
@given(
    t=st.integers(0, 500),
    total=st.integers(1, 500),
    warmup=st.integers(0, 50),
    final=st.floats(0, 1),
)
def test_lr_factor_matches_its_closed_form(t, total, warmup, final):
    for kind in ("constant", "cosine", "linear"):
        f = lr_factor(t, total, kind, warmup, final)
        if warmup and t < warmup:
            assert f == (t + 1) / warmup
            continue
        u = min(1.0, (t - warmup) / max(1, total - warmup))
        expected = {
            "constant": 1.0,
            "cosine": final + (1 - final) * (1 + math.cos(math.pi * u)) / 2,
            "linear": 1 - (1 - final) * u,
        }[kind]
        assert f == pytest.approx(expected, rel=1e-15, abs=1e-15)
        assert min(final, 1.0) - 1e-12 <= f <= 1.0 + 1e-12


def test_lr_factor_rejects_unknown_kind():
    with pytest.raises(ValueError, match="schedule kind must be one of constant, cosine, linear"):
        lr_factor(3, 10, "step")  # type: ignore[arg-type]


def test_seed_streams_are_named_deterministic_and_distinct():
    assert stream_seed(5, "init") == 5 and stream_seed(5, "data") == 5
    names = ["val", "step", "noise", "teacher", "data/rank1"]
    seeds = {stream_seed(s, n) for s in range(50) for n in names}
    assert len(seeds) == 50 * len(names)
    assert stream_seed(5, "val") == stream_seed(5, "val")
    assert all(0 <= s < 2**63 for s in seeds)
    g1, g2 = SeedStreams(5).generator("val"), SeedStreams(5).generator("val")
    assert torch.equal(torch.rand(4, generator=g1), torch.rand(4, generator=g2))
    with pytest.raises(ValueError, match="seed must lie in"):
        stream_seed(-1, "val")
    with pytest.raises(ValueError, match="stream name must be non-empty"):
        stream_seed(1, "")
