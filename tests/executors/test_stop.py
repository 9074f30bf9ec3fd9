"""Ctrl-C / SIGTERM during ``dynascope study run`` when the run's runner is a custom one
(no engine, no signal handling of its own): the run is marked ``interrupted`` at its last
logged step, one line says which run stopped and how to continue, the CLI exits 130 / 143, and
the same command again keeps the finished run and resumes the stopped one.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from dynascope import studies
from dynascope.cli import app
from dynascope.store import load_run

HERE = Path(__file__).parent
CHILD = HERE / "_stop_child.py"
STEPS, SLEEP_S = 30, 0.05  # the stopped run would take 1.5 s


def _cli(out: Path, *options: str) -> list[str]:
    return [sys.executable, str(CHILD), str(STEPS), str(SLEEP_S), "--preset", "smoke",
            "--out", str(out), "--no-progress", *options]  # fmt: skip


def _stop_mid_run(out: Path, signum: int, *options: str, group: bool = False):
    """Start the study, send ``signum`` once run r1_slow has logged 3 rows; return the result."""
    child = subprocess.Popen(
        _cli(out, *options),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=group,
    )
    try:
        deadline = time.monotonic() + 60
        while child.poll() is None and _rows(out / "runs" / "r1_slow") < 3:
            assert time.monotonic() < deadline, "run r1_slow never logged 3 rows"
            time.sleep(0.01)
        if group:
            os.killpg(child.pid, signum)  # Ctrl-C at a terminal reaches the whole group
        else:
            child.send_signal(signum)
        stdout, stderr = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    return child.returncode, stdout, stderr


def _rows(run_dir: Path) -> int:
    try:
        return len(load_run(run_dir).scalars.query("key == 'x'"))
    except Exception:  # not created yet, or its tables not yet written
        return 0


def _assert_interrupted(out: Path, signal_name: str, stderr: str) -> None:
    run = load_run(out / "runs" / "r1_slow")
    assert run.status == "interrupted", stderr
    stops = run.events.query("kind == 'interrupted'")
    x = run.scalars.query("key == 'x'")
    assert stops["detail"].tolist() == [signal_name]
    assert stops["step"].tolist() == [int(x["step"].max())]  # at the last logged step
    assert x["step"].tolist() == list(range(len(x)))  # the committed rows, intact, in order
    assert load_run(out / "runs" / "r0_ok").status == "finished"
    lines = stderr.strip().splitlines()
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"study stopped: run r1_slow interrupted by {signal_name} at step")
    assert lines[0].endswith("run the same command again to resume it")


@pytest.mark.slow
def test_sigterm_stops_a_custom_runner_cleanly_and_a_rerun_resumes_it(
    stub_study, monkeypatch, tmp_path
):
    out = tmp_path / "study"
    code, _, stderr = _stop_mid_run(out, signal.SIGTERM)  # what a scheduler sends
    assert code == 143, stderr
    _assert_interrupted(out, "SIGTERM", stderr)
    assert not (out / "verdict.json").exists()
    kept = len(load_run(out / "runs" / "r1_slow").scalars.query("key == 'x'"))

    # the same command again (in this process, with the child's registry: faster)
    study = stub_study.make_study(("ok", "slow"), steps=STEPS, sleep_s=SLEEP_S)
    monkeypatch.setattr(studies, "_registry", lambda: {"stub": study})
    rerun = CliRunner().invoke(app, ["study", "run", "stub", *_cli(out)[4:]])
    assert rerun.exit_code == 0, rerun.output
    assert re.search(r"run r0_ok: finished \(kept\)", rerun.stdout), rerun.stdout
    assert re.search(r"run r1_slow: finished in [\d.]+ s \(resumed\)", rerun.stdout)
    rows = {r["name"]: r for r in json.loads((out / "verdict.json").read_text())["runs"]}
    assert rows["r0_ok"]["this_call"] == "kept" and rows["r1_slow"]["this_call"] == "resumed"
    run = load_run(out / "runs" / "r1_slow")
    assert len(run.events.query("kind == 'resumed'")) == 1 and 0 < kept <= STEPS
    x = run.scalars.query("key == 'x'")
    generator = torch.Generator().manual_seed(1)  # run r1's seed: an uninterrupted run's rows
    assert x["step"].tolist() == list(range(STEPS + 1))
    assert x["value"].tolist() == [float(torch.randn((), generator=generator)) for _ in x["step"]]


@pytest.mark.slow
def test_ctrl_c_stops_custom_runners_under_the_process_executor(tmp_path):
    options = ("--executor", "process", "--workers", "2")
    code, _, stderr = _stop_mid_run(tmp_path, signal.SIGINT, *options, group=True)
    assert code == 130, stderr
    run = load_run(tmp_path / "runs" / "r1_slow")
    assert run.status == "interrupted" and "Traceback" not in stderr, stderr  # a clean stop
    stops = run.events.query("kind == 'interrupted'")
    assert stops["detail"].tolist() == ["SIGINT"]
    assert stops["step"].tolist() == [int(run.scalars.query("key == 'x'")["step"].max())]
