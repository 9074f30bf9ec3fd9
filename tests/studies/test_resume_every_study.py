"""Every study survives a SIGKILL: its smoke run, killed half-way through its store writes and
run again into the same directory, resumes (never restarts) and ends with the same metrics as
an uninterrupted run, bit for bit (one intra-op thread, CPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from dynascope import studies
from dynascope.store import load_run

CHILD = Path(__file__).with_name("_kill_child.py")


def _child(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CHILD), *args], capture_output=True, text=True, timeout=900
    )


def _scalars(run_dir: Path) -> pd.DataFrame:
    frame = load_run(run_dir).scalars
    return frame.sort_values(["step", "key"]).reset_index(drop=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", studies.names())
def test_killed_smoke_study_resumes_to_identical_metrics(tmp_path, name):
    full, cut, count = tmp_path / "full", tmp_path / "cut", tmp_path / "count.txt"
    done = _child(name, "count", str(full), str(count))
    assert done.returncode == 0, done.stderr[-2000:]
    writes = int(count.read_text())
    killed = _child(name, "kill", str(cut), str(writes // 2))
    assert killed.returncode == -9, killed.stderr[-2000:]

    actions: dict[str, str] = {}
    with pytest.warns(RuntimeWarning, match="taking over the lock"):  # the killed run's lock
        studies.get(name).run(
            preset="smoke",
            out=cut,
            on_run=lambda run, status, seconds, action: actions.__setitem__(run, action),
        )
    assert "restarted" not in actions.values(), actions
    assert "resumed" in actions.values(), actions
    for run_dir in sorted((full / "runs").iterdir()):
        pd.testing.assert_frame_equal(_scalars(run_dir), _scalars(cut / "runs" / run_dir.name))
