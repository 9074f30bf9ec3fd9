"""Rerunning a study resumes it: finished runs kept, interrupted ones resumed, missing ones
started; a directory holding other configs is refused; a run in use is refused.

The killed study and its rerun run in child processes forked from the test's (one intra-op
thread, as every test)."""

from __future__ import annotations

import json
import shutil
import signal
import sqlite3
import time
from contextlib import closing
from pathlib import Path

import pytest
from helpers import Forked, run_forked

from dynascope.config import validate_config
from dynascope.store import RunLock, RunLockedError, load_run
from dynascope.studies.base import Analysis, RunSpec, Study, Verdict
from dynascope.train import build_registry


def _config(name: str, steps: int):
    return validate_config(
        {
            "name": name,
            "model": {"n_layers": 1, "d_model": 12, "n_heads": 3, "d_mlp": 0},
            "task": {"name": "associative_recall", "n_keys": 6, "n_values": 5, "n_pairs": 3},
            "train": {
                "steps": steps,
                "batch_size": 4,
                "log_every": 5,
                "eval_every": 100,
                "eval_batches": 1,
                "checkpoint_every": 10,
            },
        }
    )


def _analyze(runs, figures_dir):
    n = sum(r.status == "finished" for r in runs.values())
    return Analysis([Verdict("all runs finished", "count", float(n), 3.0, n == 3)])


KILL_AND_RERUN = Study(
    name="kill-and-rerun",
    claim="three runs finish",
    source="tests",
    presets={"smoke": lambda: _config("x", 1)},
    build_runs=lambda preset, seed: [
        RunSpec("a", _config("a", 10), build_registry),
        RunSpec("b", _config("b", 200), build_registry),
        RunSpec("c", _config("c", 10), build_registry),
    ],
    analyze=_analyze,
)


def _run_and_print(out: Path) -> None:
    """The child of the kill-and-rerun test: run a three-run study into ``out`` and print JSON.

    Runs ``a`` (short), ``b`` (long, checkpoints every 10 steps) and ``c`` (short) in order with
    the in-process executor, on the registry build, so a rerun after a SIGKILL resumes ``b``
    from its last checkpoint. Prints ``{"runs": [...], "invoked": [...], "passed": ...}`` when
    the study completes.
    """
    outcome = KILL_AND_RERUN.run(preset="smoke", out=out)
    calls = {"started": "start", "resumed": "resume"}
    invoked = [
        f"{r['name']}:{calls[r['this_call']]}" for r in outcome.runs if r["this_call"] in calls
    ]
    print(json.dumps({"runs": outcome.runs, "invoked": invoked, "passed": outcome.passed}))


def _statuses(out: Path) -> dict[str, list[str]]:
    runs = {}
    for run_dir in sorted((out / "runs").iterdir()):
        events = load_run(run_dir).events
        runs[run_dir.name] = events[events["kind"] == "status"]["detail"].tolist()
    return runs


def _resumable(checkpoints: Path) -> list[Path]:
    """Checkpoints a resume starts from (step 0 is the initialisation: a fresh start)."""
    return [p for p in checkpoints.glob("step_*.pt") if p.name != "step_0.pt"]


@pytest.mark.slow
def test_a_killed_study_reruns_without_redoing_finished_runs(tmp_path):
    out = tmp_path / "study"
    child = Forked(_run_and_print, out)
    b_checkpoints = out / "runs" / "b" / "checkpoints"
    deadline = time.monotonic() + 120
    while not _resumable(b_checkpoints) and not child.poll():
        assert time.monotonic() < deadline, "run b never wrote a checkpoint"
        time.sleep(0.01)
    child.send_signal(signal.SIGKILL)  # mid-way through b: a finished, c not started
    assert child.wait().returncode == -signal.SIGKILL
    before = _statuses(out)
    assert before["a"] == ["running", "finished"] and before["b"] == ["running"]
    assert "c" not in before

    rerun = run_forked(_run_and_print, out, timeout_s=300)
    assert rerun.returncode == 0, rerun.stderr
    result = json.loads(rerun.stdout)
    assert result["invoked"] == ["b:resume", "c:start"]  # a is not run again
    assert [(r["name"], r["status"], r["this_call"]) for r in result["runs"]] == [
        ("a", "finished", "kept"),
        ("b", "finished", "resumed"),
        ("c", "finished", "started"),
    ]
    after = _statuses(out)
    assert after["a"] == before["a"]  # untouched
    b_events = load_run(out / "runs" / "b").events
    assert (b_events["kind"] == "resumed").sum() == 1
    b_scalars = load_run(out / "runs" / "b").scalars
    assert not b_scalars.duplicated(["step", "key"]).any()
    assert b_scalars["step"].max() == 200
    assert result["passed"]


def test_a_directory_with_other_configs_is_refused_and_fresh_starts_over(stub_study, tmp_path):
    stub_study.make_study(("ok", "ok"), steps=4).run(preset="smoke", out=tmp_path)
    other = stub_study.make_study(("ok", "ok"), steps=5)
    with pytest.raises(ValueError, match=r"holds runs made with other configs \(r0_ok, r1_ok: "):
        other.run(preset="smoke", out=tmp_path)
    assert load_run(tmp_path / "runs" / "r0_ok").scalars["step"].max() == 4  # nothing mixed
    with pytest.raises(ValueError, match="holds study 'stub', not 'other'"):
        stub_study.make_study(("ok",), name="other").run(preset="smoke", out=tmp_path)
    outcome = other.run(preset="smoke", out=tmp_path, fresh=True)
    assert [r["this_call"] for r in outcome.runs] == ["started", "started"]
    assert load_run(tmp_path / "runs" / "r0_ok").scalars["step"].max() == 5


def test_runs_of_a_directory_without_study_json_are_replaced(stub_study, tmp_path):
    """Runs written before study.json existed (or by hand) are cleared, not resumed or mixed
    (moved here from weight-decay-low-rank's smoke test, which now reads a shared run)."""
    (tmp_path / "runs" / "stale_run").mkdir(parents=True)
    outcome = stub_study.make_study(("ok",)).run(preset="smoke", out=tmp_path)
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["r0_ok"]
    assert [r["this_call"] for r in outcome.runs] == ["started"]


def test_failed_runs_start_again_and_finished_runs_are_kept(stub_study, tmp_path):
    study = stub_study.make_study(("ok", "raise"))
    study.run(preset="smoke", out=tmp_path)
    outcome = study.run(preset="smoke", out=tmp_path)
    assert [(r["status"], r["this_call"]) for r in outcome.runs] == [
        ("finished", "kept"),
        ("failed", "started"),
    ]
    kept, started = (load_run(tmp_path / "runs" / n).events for n in ("r0_ok", "r1_raise"))
    assert kept[kept["kind"] == "status"]["detail"].tolist() == ["running", "finished"]
    assert (started["kind"] == "error").sum() == 1  # started again: its old store cleared


def test_a_kept_run_keeps_its_report_and_a_rerun_run_gets_a_new_one(stub_study, tmp_path):
    study = stub_study.make_study(("ok", "raise"))
    study.run(preset="smoke", out=tmp_path, run_reports=True)
    reports = {n: tmp_path / "runs" / n / "report.html" for n in ("r0_ok", "r1_raise")}
    for p in reports.values():  # mark the files: a rewrite replaces the marker
        p.write_text(p.read_text() + "<!-- marker -->")
    study.run(preset="smoke", out=tmp_path, run_reports=True)
    assert reports["r0_ok"].read_text().endswith("<!-- marker -->")  # kept: not redrawn
    assert not reports["r1_raise"].read_text().endswith("<!-- marker -->")  # started again
    reports["r0_ok"].unlink()  # a kept run without a report gets one
    study.run(preset="smoke", out=tmp_path, run_reports=True)
    assert reports["r0_ok"].is_file()


def test_a_run_in_use_by_another_process_is_refused(stub_study, tmp_path):
    study = stub_study.make_study(("ok", "raise"))
    study.run(preset="smoke", out=tmp_path)
    lock = RunLock(tmp_path / "runs" / "r1_raise")
    try:
        with pytest.raises(RunLockedError, match="r1_raise' is in use by another process"):
            study.run(preset="smoke", out=tmp_path)
    finally:
        lock.release()


def _untabled_store(run_dir: Path) -> None:
    """What a writer stopped between creating metrics.sqlite and its schema leaves behind."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with closing(sqlite3.connect(run_dir / "metrics.sqlite")) as db:
        db.execute("PRAGMA journal_mode=WAL")


def test_a_run_stopped_while_creating_its_store_starts_on_rerun(stub_study, tmp_path):
    """A Ctrl-C between ``sqlite3.connect`` and the schema left an empty metrics.sqlite, and
    every rerun crashed on it (`no such table: scalars`) until --fresh."""
    study = stub_study.make_study(("ok", "ok"))
    study.run(preset="smoke", out=tmp_path)
    before = load_run(tmp_path / "runs" / "r0_ok").scalars
    run_dir = tmp_path / "runs" / "r1_ok"
    shutil.rmtree(run_dir)
    _untabled_store(run_dir)
    outcome = study.run(preset="smoke", out=tmp_path)
    assert [(r["status"], r["this_call"]) for r in outcome.runs] == [
        ("finished", "kept"),
        ("finished", "started"),
    ]
    assert load_run(tmp_path / "runs" / "r0_ok").scalars.equals(before)
    assert load_run(run_dir).scalars["step"].max() == 4
