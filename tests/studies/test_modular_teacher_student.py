"""Study modular-teacher-student: the smoke preset end to end, the oracle student (teacher with
mixed codes, permuted and positively rescaled hidden units) identified through the runner's own
evaluation and analysis, and verdicts that follow the frozen thresholds."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dynascope import studies
from dynascope.nn.multitask_hypernet import MultitaskHypernet
from dynascope.store import RunStore, load_run
from dynascope.studies._modular_teacher_run import ModularStudentConfig, evaluate
from dynascope.studies.modular_teacher_student import (
    BLESSED_SET,
    DOOMED_SET,
    _verdicts,
    analyze_run,
)
from dynascope.tasks.modular_teacher import ModularTeacher

STUDY = studies.get("modular-teacher-student")


def test_smoke_preset_runs_end_to_end(tmp_path):
    outcome = STUDY.run("smoke", tmp_path)
    info = json.loads((tmp_path / "verdict.json").read_text())
    assert [c["claim"][:2] for c in info["claims"]] == ["s1", "s2", "gu"]
    assert all(r["status"] == "finished" for r in info["runs"])
    for claim in outcome.claims[:2]:
        assert math.isfinite(claim.measured)
    assert (tmp_path / "figures" / "identification.png").is_file()
    row = analyze_run(load_run(tmp_path / "runs" / "one_hots_plus_ring_s0"))
    assert -1 <= row["align_min"] <= row["align_mean"] <= row["align_max"] <= 1


def _oracle_student(teacher: ModularTeacher, g: torch.Generator) -> MultitaskHypernet:
    """Codes z_hat = z B (B: [6, 12]), modules B⁺ theta, hidden units permuted (each teacher
    unit twice) and positively rescaled, readout divided by the scales (second copy silent)."""
    n_hid = teacher.network.n_hidden
    B = torch.randn(6, 12, generator=g)
    mixed = torch.einsum("jm,mio->jio", torch.linalg.pinv(B), teacher.network.modules_of(0))
    units = torch.cat([torch.randperm(n_hid, generator=g), torch.randperm(n_hid, generator=g)])
    scale = torch.exp(0.5 * torch.randn(2 * n_hid, generator=g))
    student = MultitaskHypernet(16, 2 * n_hid, 4, 12, generator=g)
    with torch.no_grad():
        student.theta[0].copy_((mixed[:, :, units] * scale).reshape(12, -1))
        head = teacher.network.W_head[units] / scale[:, None]
        head[n_hid:] = 0
        student.W_head.copy_(head)
    x, z = teacher.sample_x(3, 5, g), teacher.sample_codes("eval_0.500", 3, g)
    torch.testing.assert_close(student(x, z @ B).detach(), teacher(x, z), rtol=1e-4, atol=1e-5)
    return student


def test_oracle_student_is_identified_through_the_runners_evaluation(tmp_path):
    # The inner loop must find the codes (600 Adam steps at 3e-2 reach relative loss ~1e-5);
    # R² of h = 6 is the least well conditioned (z_m in (0.5, 0.6) there), hence the 0.98.
    cfg = ModularStudentConfig(
        n_hidden=8,
        inner_steps=600,
        inner_lr=3e-2,
        inner_batch=16,
        inner_fresh_x=False,
        eval_tasks=32,
        eval_batch=16,
    )
    teacher = ModularTeacher(cfg.task_set, n_hidden=8)
    g = torch.Generator().manual_seed(0)
    student = _oracle_student(teacher, g)
    out = evaluate(
        student, teacher, cfg, torch.randn(12, generator=g), torch.Generator().manual_seed(1)
    )
    with RunStore(tmp_path / "oracle") as store:
        store.write_config(cfg.model_dump(mode="json"))
        store.log(1, {"outer.loss": 0.0} | out)
        store.set_status(1, "finished")
    row = analyze_run(load_run(tmp_path / "oracle"))
    assert row["align_mean"] >= 0.99 and row["align_min"] >= 0.95
    assert row["r2_ood"] >= 0.98
    assert row["gw_avr"] >= 0.99
    assert row["relative_loss.eval_0.500"] <= 1e-3


def _rows(align_b, align_d, r2_b, r2_d, loss_b=1e-3, loss_d=1e-3):
    return [
        {
            "task_set": BLESSED_SET,
            "seed": 0,
            "align_mean": align_b,
            "r2_ood": r2_b,
            "train_loss": loss_b,
        },
        {
            "task_set": DOOMED_SET,
            "seed": 0,
            "align_mean": align_d,
            "r2_ood": r2_d,
            "train_loss": loss_d,
        },
    ]


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        (_rows(0.95, 0.70, 0.95, 0.60), [True, True, True]),
        (_rows(0.95, 0.85, 0.95, 0.85), [False, False, True]),  # gaps below 0.15
        (_rows(0.85, 0.50, 0.85, 0.50), [False, False, True]),  # Blessed below 0.9
        (_rows(0.95, 0.70, 0.95, 0.60, loss_d=3e-3), [False, False, False]),  # undertrained
    ],
)
def test_verdicts_follow_the_frozen_thresholds(rows, expected):
    verdicts = _verdicts(rows)
    assert [v.passed for v in verdicts] == expected
    torch.testing.assert_close(verdicts[0].measured, rows[0]["align_mean"] - rows[1]["align_mean"])
    if not expected[2]:
        assert "undertrained" in verdicts[0].detail and verdicts[2].measured == pytest.approx(3.0)


def test_presets_follow_s05():
    fast = STUDY.preset("fast").base
    assert (fast.outer_steps, fast.meta_batch, fast.inner_batch) == (2000, 32, 64)
    assert (fast.eval_tasks, fast.eval_batch) == (256, 256)
    assert fast.inner_steps * fast.inner_lr == pytest.approx(1.0)
    paper = STUDY.preset("paper")
    assert paper.base == ModularStudentConfig()  # the reference configuration
    assert (paper.base.outer_steps, paper.base.inner_steps, paper.base.inner_lr) == (
        60_000,
        300,
        3e-3,
    )
    assert paper.seeds == [100, 101, 102]
    smoke = STUDY.preset("smoke").base
    assert (smoke.n_hidden, smoke.outer_steps, smoke.inner_steps, smoke.meta_batch) == (8, 20, 5, 4)
    with pytest.raises(ValueError, match="task_set must be one of"):
        ModularStudentConfig(task_set="0,1;1,2")


@pytest.mark.parametrize(
    "update",
    [
        {"student": "monolithic"},
        {"second_order": True, "code_init": "normal", "inner_fresh_x": True},
    ],
)
def test_runner_variants_finish_and_analyze(tmp_path, update):
    from dynascope.studies._modular_teacher_run import run_modular_student

    base = STUDY.preset("smoke").base.model_dump()
    cfg = ModularStudentConfig.model_validate(base | {"outer_steps": 4, "log_every": 2} | update)
    run_modular_student(cfg, tmp_path / "run")
    run = load_run(tmp_path / "run")
    assert run.status == "finished"
    row = analyze_run(run)
    assert math.isfinite(row["r2_ood"]) and math.isfinite(row["train_loss"])
    assert math.isnan(row["align_mean"]) == (cfg.student == "monolithic")


def test_paper_shaped_preset_analyzes_sweep_and_baseline(tmp_path):
    from dynascope.studies._hyperteacher_run import HyperteacherRunConfig, run_hyperteacher
    from dynascope.studies.base import RunSpec
    from dynascope.studies.modular_teacher_student import (
        ModularTeacherStudentPreset,
        SweepPoint,
        analyze,
        build_runs,
    )

    base = STUDY.preset("smoke").base.model_copy(update={"outer_steps": 2, "log_every": 1})
    preset = ModularTeacherStudentPreset(
        base=base,
        sweep=[
            SweepPoint(hidden_factor=1, code_factor=1),
            SweepPoint(hidden_factor=2, code_factor=1),
        ],
        monolithic_baseline=True,
    )
    specs = build_runs(preset, 0)
    assert [s.name for s in specs][2:] == [
        "sweep_h1_c1_wd0_s0",
        "sweep_h2_c1_wd0_s0",
        "monolithic_one_hots_plus_ring_s0",
    ]
    tiny = {"d_hidden": 8, "inner_steps": 2, "outer_steps": 2, "meta_batch": 2,
            "shots_support": 4, "shots_query": 4, "eval_tasks": 3, "log_every": 1}  # fmt: skip
    for learner in ("anil", "hnet_linear"):
        cfg = HyperteacherRunConfig(learner=learner, **tiny)
        specs.append(RunSpec(f"hyper_{learner}_M4K2_s0", cfg, run_hyperteacher))
    for spec in specs:
        spec.runner(spec.config, tmp_path / spec.name)
    runs = {s.name: load_run(tmp_path / s.name) for s in specs}
    analysis = analyze(runs, tmp_path)
    assert {p.name for p in analysis.figures} == {
        "identification.png",
        "train_loss.png",
        "overparameterisation.png",
        "hyperteacher_ood_accuracy.png",
    }
    assert len(analysis.verdicts) == 3  # s1, s2, guard from the Blessed and Doomed runs only
    hyper = analysis.tables["hyperteacher: OOD accuracy by learner and (M, K)"]
    assert [r["paper_ood_accuracy_%"] for r in hyper] == [60.8, 76.4]  # S5's Table 1 values
    assert all(0 <= r["ood_accuracy_%"] <= 100 for r in hyper)
