"""StudyWatcher (studies/progress.py) on a hand-built study directory: states, steps, losses and
ETAs against values worked out by hand from the rows written, with a scripted clock."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from dynascope.store import RunStore
from dynascope.studies.progress import (
    StudyWatcher,
    executing_study,
    study_is_active,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def write_manifest(out: Path, runs: dict[str, dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"study": "hand", "preset": "smoke", "seed": 0, "runs": runs}
    (out / "study.json").write_text(json.dumps(manifest))


def write_run(out: Path, name: str, status: str | None, losses: dict[int, float]) -> None:
    with RunStore(out / "runs" / name) as store:
        if status is not None:
            store.set_status(0, "running")
        for step, loss in losses.items():
            store.log(step, {"train.loss": loss})
        if status not in (None, "running"):
            store.set_status(max(losses, default=0), status)


@pytest.fixture
def study(tmp_path: Path) -> Path:
    """Five planned runs: done (10 steps), running at step 4 of 10, failed at 2 of 8 (a
    registry config: ``train.steps``), diverged at 3 of 6 and pending (no store) of 5."""
    out = tmp_path / "study"
    loop = lambda steps: {"seed": 0, "loop": {"steps": steps}}  # noqa: E731
    write_manifest(
        out,
        {
            "a_done": loop(10),
            "b_running": loop(10),
            "c_failed": {"train": {"steps": 8}},
            "d_diverged": loop(6),
            "e_pending": loop(5),
        },
    )
    write_run(out, "a_done", "finished", {5: 0.5, 10: 0.25})
    write_run(out, "b_running", "running", {2: 2.0, 4: 1.5})
    write_run(out, "c_failed", "failed", {2: 3.0})
    write_run(out, "d_diverged", "diverged", {3: math.nan})
    return out


def test_states_steps_and_losses_of_a_live_study(study: Path):
    with executing_study(study):
        progress = StudyWatcher(study, Clock()).read()
    assert progress.study == "hand" and progress.preset == "smoke" and progress.active
    rows = [(r.name, r.state, r.step, r.total, r.loss) for r in progress.runs]
    assert rows[:3] == [
        ("a_done", "done", 10, 10, 0.25),
        ("b_running", "running", 4, 10, 1.5),
        ("c_failed", "failed", 2, 8, 3.0),
    ]
    name, state, step, total, loss = rows[3]
    assert (name, state, step, total) == ("d_diverged", "diverged", 3, 6) and math.isnan(loss)
    assert rows[4] == ("e_pending", "pending", None, 5, None)
    # ended runs count their whole budget: 10 + 4 + 8 + 6 + 0 of 10 + 10 + 8 + 6 + 5
    assert progress.steps == (28, 39)
    assert progress.eta_s is None  # no step seen to pass yet
    assert progress.verdict is None


def test_etas_follow_the_rate_seen_since_the_first_read(study: Path):
    clock = Clock()
    with executing_study(study):
        watcher = StudyWatcher(study, clock)
        first = watcher.read()
        assert first.runs[1].eta_s is None
        with RunStore(study / "runs" / "b_running") as store:
            store.log(7, {"train.loss": 1.0})  # 3 steps in 3 s: 1 step/s
        clock.now += 3.0
        second = watcher.read()
    running = second.runs[1]
    assert (running.step, running.loss) == (7, 1.0)
    assert running.eta_s == pytest.approx(3.0, abs=1e-12)  # (10 - 7) / (1 step/s)
    # the study: 31 of 39 steps done, 3 steps in 3 s -> 8 s left
    assert second.steps == (31, 39)
    assert second.eta_s == pytest.approx(8.0, abs=1e-12)
    assert [r.eta_s for r in second.runs if r.state in ("done", "failed")] == [0.0, 0.0]


def test_a_running_run_of_a_study_nobody_executes_reads_interrupted(study: Path):
    assert not study_is_active(study)
    progress = StudyWatcher(study, Clock()).read()
    assert not progress.active
    assert progress.runs[1].state == "interrupted"


def test_the_study_lock_is_shared_and_gone_with_its_block(tmp_path: Path):
    with executing_study(tmp_path), executing_study(tmp_path):  # two holders at once
        assert study_is_active(tmp_path)
    assert not study_is_active(tmp_path)


def test_verdict_counts_only_when_newer_than_the_manifest(study: Path):
    verdict = study / "verdict.json"
    verdict.write_text(json.dumps({"status": "held"}))
    manifest_ns = (study / "study.json").stat().st_mtime_ns
    os.utime(verdict, ns=(manifest_ns - 10**9, manifest_ns - 10**9))  # from an earlier run
    assert StudyWatcher(study).read().verdict is None
    os.utime(verdict, ns=(manifest_ns + 10**9, manifest_ns + 10**9))
    assert StudyWatcher(study).read().verdict == "held"


def test_runs_found_only_on_disk_come_last(study: Path):
    write_run(study, "0_extra", "finished", {1: 0.1})
    names = [r.name for r in StudyWatcher(study).read().runs]
    assert names == ["a_done", "b_running", "c_failed", "d_diverged", "e_pending", "0_extra"]


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({}, r"^STUDY_DIR: '.*missing' does not exist$"),
        (
            {"missing/x": "x"},
            r"^STUDY_DIR: '.*missing' is not a study directory \(no study\.json\)$",
        ),
        ({"missing/study.json": "{"}, r"^STUDY_DIR: '.*study\.json' is not readable \(.*\)$"),
        ({"missing/study.json": "[]"}, r"^STUDY_DIR: '.*study\.json' is not a study manifest"),
    ],
)
def test_a_bad_study_dir_is_refused_in_one_line(tmp_path: Path, files: dict, message: str):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=message):
        StudyWatcher(tmp_path / "missing")


def test_a_run_is_read_again_only_when_its_files_change(study: Path, monkeypatch):
    from dynascope.studies import progress

    opened, real = [], progress.peek_run
    monkeypatch.setattr(progress, "peek_run", lambda path: opened.append(path.name) or real(path))
    watcher = StudyWatcher(study)
    watcher.read()
    assert sorted(opened) == ["a_done", "b_running", "c_failed", "d_diverged", "e_pending"]
    opened.clear()
    assert watcher.read().runs[1].step == 4
    assert opened == ["e_pending"]  # no store: looked for each time; the others unchanged
    opened.clear()
    with RunStore(study / "runs" / "b_running") as store:
        store.log(6, {"train.loss": 1.25})
    assert watcher.read().runs[1].step == 6
    assert opened == ["b_running", "e_pending"]
