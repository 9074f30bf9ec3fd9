"""Study modular-teacher-student: the smoke preset end to end on the engine (verdict contract),
the oracle student (teacher with mixed codes, permuted and positively rescaled hidden units)
identified by the study's own instruments, verdicts that follow the frozen thresholds, controls
and preconditions, and the paper preset's runs."""

from __future__ import annotations

import json

import pytest
import torch

from dynascope import studies
from dynascope.nn.multitask_hypernet import MultitaskHypernet
from dynascope.studies.modular_teacher_student.analysis import BLESSED_SET, DOOMED_SET, verdicts
from dynascope.studies.modular_teacher_student.protocol import FIT_MAX, PROTOCOL
from dynascope.studies.modular_teacher_student.runs import (
    Student,
    TeacherStudentRun,
    component_masks,
    evaluate,
)
from dynascope.studies.modular_teacher_student.study import (
    ModularTeacherStudentPreset,
    SweepPoint,
    build_runs,
)
from dynascope.tasks.modular_teacher import ModularTeacher
from dynascope.train import Loop, run_members

STUDY = studies.get("modular-teacher-student")


def test_smoke_preset_runs_end_to_end_with_the_verdict_contract(smoke_out):
    _, out = smoke_out
    info = json.loads((out / "verdict.json").read_text())
    claims = info["claims"]
    assert [c["claim"][:2] for c in claims] == ["s1", "s2"]
    assert all(r["status"] == "finished" for r in info["runs"])
    assert len(info["runs"]) == 6
    for claim in claims:
        assert claim["status"] in ("held", "not held", "inconclusive")
        assert len(claim["per_seed"]) == 3 and claim["control"]["status"] is not None
        assert claim["precondition"]["text"].startswith("every Blessed and Doomed run")
        # smoke has 3 seeds (< 5): plumbing only, never held or not held
        assert claim["status"] == "inconclusive" and claim["n_seeds"] == 3
        spec = PROTOCOL.claim(claim["claim"][:2])
        assert (claim["threshold"], claim["direction"]) == (spec.threshold, spec.direction)
        # the control reads the within-component metric of the same runs, not the claim's
        assert claim["control"]["kind"] == "ablation"
        assert claim["control"]["per_seed"] != claim["per_seed"]
    assert info["protocol"]["sha256"] == PROTOCOL.sha256
    assert (out / "figures" / "identification.png").is_file()


def test_component_masks_split_the_two_triangles():
    masks = component_masks(6)
    assert masks["cross"].shape == (49, 6) and masks["within"].shape == (8, 6)
    left = masks["cross"][:, :3].sum(1)
    right = masks["cross"][:, 3:].sum(1)
    assert bool(((left > 0) & (right > 0)).all())
    w = masks["within"]
    assert bool(((w[:, :3].sum(1) == 0) | (w[:, 3:].sum(1) == 0)).all())
    assert bool((w.sum(1) >= 2).all())


def _oracle_student(teacher: ModularTeacher, config: TeacherStudentRun, g) -> Student:
    """Codes z_hat = z B (B: [6, 12]), modules B⁺ theta, hidden units permuted (each teacher
    unit twice) and positively rescaled, readout divided by the scales (second copy silent)."""
    n_hid = teacher.network.n_hidden
    B = torch.randn(6, 12, generator=g)
    mixed = torch.einsum("jm,mio->jio", torch.linalg.pinv(B), teacher.network.modules_of(0))
    units = torch.cat([torch.randperm(n_hid, generator=g), torch.randperm(n_hid, generator=g)])
    scale = torch.exp(0.5 * torch.randn(2 * n_hid, generator=g))
    student = Student(config, g)
    with torch.no_grad():
        student.net.theta[0].copy_((mixed[:, :, units] * scale).reshape(12, -1))
        head = teacher.network.W_head[units] / scale[:, None]
        head[n_hid:] = 0
        student.net.W_head.copy_(head)
    x, z = teacher.sample_x(3, 5, g), teacher.sample_codes("eval_0.500", 3, g)
    torch.testing.assert_close(student(x, z @ B).detach(), teacher(x, z), rtol=1e-4, atol=1e-5)
    return student


def test_oracle_student_is_identified_by_the_studys_instruments():
    # The inner loop must find the codes: 600 Adam steps at 3e-2 reach relative loss ~1e-5.
    config = TeacherStudentRun(
        n_hidden=8,
        eval_inner_steps=600,
        eval_inner_lr=3e-2,
        eval_tasks=32,
        eval_support=16,
        eval_batch=16,
        loop=Loop(steps=1),
    )
    teacher = ModularTeacher(config.task_set, n_hidden=8)
    student = _oracle_student(teacher, config, torch.Generator().manual_seed(0))
    out = evaluate(student, teacher, config, seed=1)
    assert isinstance(student.net, MultitaskHypernet)
    for kind in ("fit", "cross", "within", "eval_0.333"):
        assert out[f"{kind}.relative_loss"] <= 1e-3, (kind, out[f"{kind}.relative_loss"])
    assert out["cross.r2"] >= 0.98 and out["within.r2"] >= 0.98
    assert out["align"] >= 0.99


def _rows(cross_b, cross_d, within_b, within_d, r2=(0.95, 0.6, 0.95, 0.95), fit=0.01, bad=None):
    """Blessed and Doomed rows for seeds 0-4; ``bad``: (task set, seed) of a run that did not
    fit its training tasks."""
    rows = []
    for seed in range(5):
        for name, cross, within, rc, rw in (
            (BLESSED_SET, cross_b, within_b, r2[0], r2[2]),
            (DOOMED_SET, cross_d, within_d, r2[1], r2[3]),
        ):
            f = 2 * FIT_MAX if (name, seed) == bad else fit
            rows.append({"task_set": name, "seed": seed, "fit.relative_loss": f, "status": "finished",
                         "cross.relative_loss": cross + 0.001 * seed,
                         "within.relative_loss": within, "cross.r2": rc, "within.r2": rw})  # fmt: skip
    return rows


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        (_rows(0.01, 0.20, 0.01, 0.01), ["held", "held"]),
        (_rows(0.01, 0.03, 0.01, 0.01, r2=(0.95, 0.9, 0.95, 0.95)), ["not held", "not held"]),
        # the control (within-component tasks) shows the same gap: the metric cannot tell
        (_rows(0.01, 0.20, 0.01, 0.20, r2=(0.95, 0.6, 0.95, 0.6)), ["inconclusive"] * 2),
        # the students do not fit their training tasks
        (_rows(0.01, 0.20, 0.01, 0.01, fit=2 * FIT_MAX), ["inconclusive"] * 2),
        # one Doomed run (seed 3) does not fit: every run is checked, not the mean
        (_rows(0.01, 0.20, 0.01, 0.01, bad=(DOOMED_SET, 3)), ["inconclusive"] * 2),
        (_rows(0.01, 0.20, 0.01, 0.01, bad=(BLESSED_SET, 0)), ["inconclusive"] * 2),
    ],
)
def test_verdicts_follow_the_frozen_thresholds_control_and_precondition(rows, expected):
    judged = verdicts(rows)
    assert [v.status for v in judged] == expected
    assert judged[0].seeds == (0, 1, 2, 3, 4)
    torch.testing.assert_close(
        torch.tensor(judged[0].per_seed, dtype=torch.float64),
        torch.tensor([r["cross.relative_loss"] for r in rows[1::2]], dtype=torch.float64)
        - torch.tensor([r["cross.relative_loss"] for r in rows[0::2]], dtype=torch.float64),
    )
    if expected[0] == "inconclusive":
        assert judged[0].reason


def test_presets_follow_s05():
    fast = STUDY.preset("fast")
    assert fast.seeds == PROTOCOL.seeds["fast"] == 5 and fast.base.loop.steps == 750
    assert (fast.base.meta_batch, fast.base.inner_batch) == (32, 64)
    assert fast.base.inner_steps * fast.base.inner_lr == pytest.approx(1.0)
    assert (fast.base.eval_inner_steps, fast.base.eval_inner_lr) == (200, 2e-2)
    specs = build_runs(fast, 0)
    assert {s.group for s in specs} == {"main"} and len(specs) == 10
    assert STUDY.preset("paper").seeds == 5 and STUDY.protocol is PROTOCOL
    paper = STUDY.preset("paper")
    assert paper.base.loop.steps == 60_000
    assert (paper.base.inner_steps, paper.base.inner_lr, paper.base.inner_fresh_x) == (
        300,
        3e-3,
        True,
    )
    assert paper.base.loop.device == "cpu"  # --device cuda overrides it
    smoke = STUDY.preset("smoke").base
    assert (smoke.n_hidden, smoke.loop.steps, smoke.inner_steps, smoke.meta_batch) == (8, 20, 5, 4)
    with pytest.raises(ValueError, match="task_set must be one of"):
        TeacherStudentRun(task_set="0,1;1,2", loop=Loop(steps=1))


def test_paper_shaped_preset_trains_sweep_and_monolithic_baseline(tmp_path):
    base = STUDY.preset("smoke").base.model_copy(update={"loop": Loop(steps=2, log_every=1)})
    preset = ModularTeacherStudentPreset(
        base=base,
        seeds=1,
        sweep=[SweepPoint(hidden_factor=1, code_factor=1)],
        monolithic_baseline=True,
    )
    specs = build_runs(preset, 0)
    assert [s.name for s in specs][2:] == ["sweep_h1_c1_wd0_s0", "monolithic_one_hots_plus_ring_s0"]
    assert specs[3].group is None
    for spec in specs[2:]:
        result = run_members(spec.build, spec.config, tmp_path / spec.name)
        assert result.status == "finished"


def test_second_order_inner_loop_trains(tmp_path):
    spec = build_runs(STUDY.preset("smoke"), 0)[0]
    config = spec.config.model_copy(
        update={"second_order": True, "inner_fresh_x": True, "loop": Loop(steps=2, log_every=1)}
    )
    assert run_members(spec.build, config, tmp_path / "so").status == "finished"


def test_full_preset_is_the_protocols_sizes():
    # protocol.presets["full"]: fast's inner loops and sizes, meta-batch 8, 6,000 outer steps,
    # 5 seeds × {Blessed, Doomed} as one ensemble (no full run here)
    full, fast = STUDY.preset("full"), STUDY.preset("fast")
    assert full.seeds == PROTOCOL.seeds["full"] == 5
    assert (full.base.loop.steps, full.base.meta_batch) == (6000, 8)
    assert full.base.loop.schedule == fast.base.loop.schedule
    same = fast.base.model_dump(exclude={"meta_batch", "loop"})
    assert full.base.model_dump(exclude={"meta_batch", "loop"}) == same
    specs = build_runs(full, 1000)
    assert len(specs) == 10 and {s.group for s in specs} == {"main"}
    for name in (BLESSED_SET, DOOMED_SET):
        seeds = sorted(s.config.seed for s in specs if s.config.task_set == name)
        assert seeds == [1000, 1001, 1002, 1003, 1004]
    assert "6,000 outer steps" in PROTOCOL.presets["full"]
