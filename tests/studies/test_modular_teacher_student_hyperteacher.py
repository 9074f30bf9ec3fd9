"""The hyperteacher run of modular-teacher-student (paper preset) on the engine: a tiny run
learns above chance, resumes bitwise after a crash, and the paper preset builds its specs."""

from __future__ import annotations

import numpy as np
import pytest

from dynascope.store import load_run
from dynascope.studies.modular_teacher_student import STUDY
from dynascope.studies.modular_teacher_student import hyperteacher as ht
from dynascope.train import run_members


def _tiny(steps: int) -> ht.HyperteacherRunConfig:
    cfg = ht.hyperteacher_config("hnet_linear", 4, 2, seed=0, steps=steps)
    loop = cfg.loop.model_copy(update={"log_every": 2, "checkpoint_every": 2})
    return cfg.model_copy(
        update={
            "d_mlp": 16,
            "n_hidden_layers": 1,
            "inner_steps": 2,
            "meta_batch": 4,
            "shots_support": 8,
            "shots_query": 8,
            "eval_tasks": 6,
            "loop": loop,
        }
    )


def test_reference_defaults_become_the_config_and_the_loop():
    cfg = ht.hyperteacher_config("anil", 8, 4, seed=3)
    assert (cfg.learner, cfg.n_experts, cfg.num_hot, cfg.seed) == ("anil", 8, 4, 3)
    assert cfg.d_mlp == 512 and cfg.inner_steps == 100 and cfg.loop.grad_clip == 2.0
    assert cfg.loop.steps == 200_000


def test_tiny_run_finishes_and_resumes_bitwise_after_a_crash(tmp_path, monkeypatch):
    cfg = _tiny(5)
    run_members(ht.build_hyperteacher, cfg, tmp_path / "full")
    full = load_run(tmp_path / "full")
    assert full.status == "finished"
    for key in ("train.accuracy", "ood.accuracy"):
        assert 0.0 <= full.last(key) <= 1.0
    assert np.isfinite(full.last("train.loss")) and np.isfinite(full.last("train.query_accuracy"))

    original = ht._episode
    calls = {"n": 0}

    def crash_on_the_fourth_step(learner, config, batch, second_order):
        calls["n"] += 1
        if calls["n"] == 4:
            raise RuntimeError("planted crash")
        return original(learner, config, batch, second_order)

    monkeypatch.setattr(ht, "_episode", crash_on_the_fourth_step)
    with pytest.raises(RuntimeError, match="planted crash"):
        run_members(ht.build_hyperteacher, cfg, tmp_path / "cut")
    monkeypatch.setattr(ht, "_episode", original)
    assert run_members(ht.build_hyperteacher, cfg, tmp_path / "cut", resume=True).status == (
        "finished"
    )
    cut = load_run(tmp_path / "cut")
    assert "resumed" in set(cut.events["kind"])
    key = ["step", "key"]
    a, b = full.scalars.sort_values(key), cut.scalars.sort_values(key)
    assert list(a["key"]) == list(b["key"])
    np.testing.assert_array_equal(a["value"].to_numpy(), b["value"].to_numpy())


def test_paper_preset_builds_the_hyperteacher_table_on_the_engine():
    specs = [s for s in STUDY.build_runs(STUDY.preset("paper"), 0) if s.name.startswith("hyper_")]
    assert len(specs) == 3 * 6 * 5  # learners x (M, K) x seeds
    assert all(s.group is None for s in specs)  # the inner loop's autograd: lone runs
    assert {type(s.config) for s in specs} == {ht.HyperteacherRunConfig}
