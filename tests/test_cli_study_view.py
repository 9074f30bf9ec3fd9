"""``dynascope show STUDY_DIR [--follow]`` and the progress bar of ``dynascope study run``
(cli/_study_view.py): the table on hand-built states, following a study that a thread (or a
real smoke study in another process) executes, and bad input."""

from __future__ import annotations

import io
import json
import math
import re
import signal
import threading
import time
from pathlib import Path

import pytest
from helpers import Forked, cli_main, run_forked
from rich.console import Console
from typer.testing import CliRunner

from dynascope.cli import _study_view, app
from dynascope.store import RunStore
from dynascope.studies.progress import RunProgress, StudyProgress, executing_study

runner = CliRunner()


def invoke(*args: str | Path):
    return runner.invoke(app, [str(a) for a in args])


def rendered(table) -> str:
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(table)
    return console.file.getvalue()


def test_format_eta_is_hours_minutes_seconds():
    assert _study_view.format_eta(3725.4) == "1:02:05"
    assert _study_view.format_eta(0.0) == "0:00:00"
    assert _study_view.format_eta(None) == "—"
    assert _study_view.format_eta(math.inf) == "—"


def test_study_table_has_a_row_per_run_and_a_summary_title():
    runs = [
        RunProgress("arm_a_s0", "done", 10, 10, 0.25, 0.0),
        RunProgress("arm_b_s0", "running", 4, 10, 1.5, 65.0),
        RunProgress("arm_c_s0", "failed", 2, None, None, 0.0),
        RunProgress("arm_d_s0", "pending", None, 5, None, None),
    ]
    progress = StudyProgress("hand", "smoke", runs, active=True, verdict=None, eta_s=125.0)
    text = rendered(_study_view.study_table(progress))
    rows = [line.split("│")[1:-1] for line in text.splitlines() if line.startswith("│")]
    cells = [[c.strip() for c in row] for row in rows]
    assert cells == [
        ["arm_a_s0", "done", "10/10", "0.25", ""],
        ["arm_b_s0", "running", "4/10", "1.5", "0:01:05"],
        ["arm_c_s0", "failed", "2/?", "", ""],
        ["arm_d_s0", "pending", "—/5", "", ""],
    ]
    # steps over the runs with a known budget: 10 + 4 + 0 of 10 + 10 + 5
    title = "hand (smoke): 1 running, 1 done, 1 failed, 1 pending; 14/25 steps; ETA 0:02:05"
    assert title in " ".join(text.split())
    ended = StudyProgress("hand", "smoke", runs[:1], active=False, verdict="held", eta_s=0.0)
    text = " ".join(rendered(_study_view.study_table(ended)).split())
    assert "hand (smoke): 1 done; 10/10 steps; verdict: held" in text


def make_study(out: Path, names: list[str], steps: int = 4) -> None:
    out.mkdir(parents=True)
    runs = {name: {"seed": 0, "loop": {"steps": steps}} for name in names}
    (out / "study.json").write_text(json.dumps({"study": "hand", "preset": "smoke", "runs": runs}))


def train(out: Path, name: str, steps: int, status: str = "finished") -> None:
    with RunStore(out / "runs" / name) as store:
        store.set_status(0, "running")
        for step in range(1, steps + 1):
            store.log(step, {"train.loss": 1.0 / step})
        store.set_status(steps, status)


def test_show_study_prints_the_table_once(tmp_path: Path):
    study = tmp_path / "study"
    make_study(study, ["r0", "r1"])
    train(study, "r0", 4)
    result = invoke("show", study)
    assert result.exit_code == 0, result.output
    assert re.search(r"│ r0 +│ done +│ +4/4 │ +0\.25 │", result.stdout), result.stdout
    assert re.search(r"│ r1 +│ pending +│ +—/4 │", result.stdout), result.stdout


def test_follow_ends_when_the_study_ends_and_prints_plain_lines(tmp_path: Path):
    study = tmp_path / "study"
    make_study(study, ["r0", "r1"])
    started, release = threading.Event(), threading.Event()

    def execute() -> None:  # what Study.run does to the directory, slowly enough to be seen
        with executing_study(study):
            started.set()
            release.wait(10)
            for name in ("r0", "r1"):
                train(study, name, 4)
            (study / "verdict.json").write_text(json.dumps({"status": "inconclusive"}))

    thread = threading.Thread(target=execute)
    thread.start()
    started.wait(10)
    threading.Timer(0.3, release.set).start()
    try:
        result = invoke("show", study, "--follow", "--interval", "0.05", "--timeout", "10")
    finally:
        release.set()
        thread.join()
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "hand (smoke): 2 pending; 0/8 steps; ETA —"  # the first summary
    assert "run r0: done (step 4/4, loss 0.25)" in lines
    assert "run r1: done (step 4/4, loss 0.25)" in lines
    final = result.stdout[result.stdout.index("┏") :]  # the table at the end
    assert "2 done; 8/8 steps; verdict: inconclusive" in " ".join(result.stdout.split())
    assert len(re.findall(r"│ r\d +│ done +│ +4/4 │", final)) == 2, final


def test_follow_of_a_study_nobody_executes_ends_after_a_second_read(tmp_path: Path):
    study = tmp_path / "study"
    make_study(study, ["r0"])
    start = time.monotonic()
    result = invoke("show", study, "--follow", "--interval", "0.05")
    assert result.exit_code == 0, result.output
    assert time.monotonic() - start < 5
    assert re.search(r"│ r0 +│ pending", result.stdout), result.stdout


def test_on_a_terminal_the_table_is_redrawn_in_place(tmp_path: Path, monkeypatch):
    terminal = Console(file=io.StringIO(), force_terminal=True, width=120, color_system=None)
    monkeypatch.setattr(_study_view, "console", terminal)
    study = tmp_path / "study"
    make_study(study, ["r0"])
    train(study, "r0", 4)
    (study / "verdict.json").write_text(json.dumps({"status": "held"}))  # concluded: one read
    result = invoke("show", study, "--follow", "--interval", "0.05")
    assert result.exit_code == 0, result.output
    drawn = terminal.file.getvalue()
    assert "\x1b[?25l" in drawn  # rich.live hides the cursor while it redraws
    assert re.search(r"│ r0 +│ done +│ +4/4 │", drawn) and "verdict: held" in drawn


def test_ctrl_c_ends_the_follow_cleanly_with_the_table(tmp_path: Path, monkeypatch):
    study = tmp_path / "study"
    make_study(study, ["r0"])

    def interrupt(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(_study_view.time, "sleep", interrupt)
    with executing_study(study):  # a live study: only Ctrl-C (or --timeout) ends the follow
        result = invoke("show", study, "--follow")
    assert result.exit_code == 0, result.output
    assert re.search(r"│ r0 +│ pending", result.stdout), result.stdout


@pytest.mark.parametrize(
    ("files", "pattern"),
    [
        ({"study.json": "{not json"}, r"^error: STUDY_DIR: '.*study\.json' is not readable"),
        ({"study.json": "[1]"}, r"^error: STUDY_DIR: '.*study\.json' is not a study manifest"),
        ({"study.json": "{}", "runs/r0/metrics.sqlite": "junk"}, r"^error: STUDY_DIR: a run's"),
    ],
)
def test_a_bad_study_dir_exits_2_with_one_line(tmp_path: Path, files: dict, pattern: str):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    result = invoke("show", tmp_path, "--follow")
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert re.search(pattern, result.stderr), result.stderr


def test_a_missing_dir_exits_2_with_one_line(tmp_path: Path):
    result = invoke("show", tmp_path / "nowhere", "--follow")
    assert result.exit_code == 2 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr


def test_study_progress_bar_draws_the_study_and_its_running_runs(tmp_path, monkeypatch):
    terminal = Console(file=io.StringIO(), force_terminal=True, width=120, color_system=None)
    monkeypatch.setattr(_study_view, "console", terminal)
    study = tmp_path / "study"
    make_study(study, ["r0", "r1"])
    with executing_study(study), _study_view.study_progress_bar(study, period_s=0.02):
        with RunStore(study / "runs" / "r0") as store:
            store.set_status(0, "running")
            store.log(2, {"train.loss": 0.5})
        time.sleep(0.3)
        train(study, "r0", 4)
        time.sleep(0.3)
    drawn = terminal.file.getvalue()
    assert "runs 0/2" in drawn and "r0" in drawn and "loss 0.5" in drawn
    assert re.search(r"runs 1/2 .* 4/8 steps", drawn), drawn


@pytest.mark.slow
def test_show_follow_of_a_running_smoke_study(tmp_path: Path):
    """A real study (the cheapest smoke preset) in one process, ``show --follow`` in another
    (both forked from the test's, the real CLI): it ends when the study ends, exit 0, every run
    done."""
    study = tmp_path / "study"
    running = Forked(cli_main, "study", "run", "modular-teacher-student", "--preset", "smoke",
                     "--out", study)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (study / "study.json").is_file():
            assert not running.poll(), running.wait().stderr
            assert time.monotonic() < deadline, "the study wrote no study.json in 60 s"
            time.sleep(0.05)
        shown = run_forked(cli_main, "show", study, "--follow", "--interval", "0.5",
                           "--timeout", "120", timeout_s=180)  # fmt: skip
        ran = running.wait(timeout_s=60)
        assert ran.returncode == 0, ran.stderr
    finally:
        running.send_signal(signal.SIGKILL)
        running.wait()
    assert shown.returncode == 0, shown.stderr
    assert (study / "verdict.json").is_file()
    final = shown.stdout[shown.stdout.rindex("┏") :]
    rows = re.findall(r"^│ (\S+) +│ (\S+) +│ +(\d+)/(\d+) │", final, re.MULTILINE)
    planned = json.loads((study / "study.json").read_text())["runs"]
    assert sorted(name for name, *_ in rows) == sorted(planned)
    assert all(state == "done" and step == total for _, state, step, total in rows), final
    assert "verdict: " in " ".join(shown.stdout.split())
