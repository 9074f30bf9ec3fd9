"""Every study survives a SIGKILL: its smoke run, killed half-way through its store writes and
run again into the same directory, resumes (never restarts) and ends with the same metrics and
verdicts as an uninterrupted run, bit for bit (one intra-op thread, CPU).

The uninterrupted run is the session's shared smoke run (``smoke_run``), which also counted
its store writes; the killed run is a child process (forked from the test's, so it does not
import torch again) that SIGKILLs itself at half that count.
Every stored row is compared: each scalar's float bits and each tensor's bytes, in every run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import counting_store_writes, run_forked, stored_rows
from matplotlib.figure import Figure

from dynascope import studies
from dynascope.store import VERDICT_FILE


def _run_until_killed(name: str, out, kill_at: int) -> None:
    """The child: ``name``'s smoke run into ``out``, SIGKILLed at its ``kill_at``-th write."""
    with counting_store_writes(kill_at=kill_at):
        studies.get(name).run(preset="smoke", out=out)


def _blank_png(fig, fname, *args, **kwargs) -> None:
    """``Figure.savefig`` that writes an empty file and renders nothing."""
    Path(fname).write_bytes(b"")


@pytest.mark.slow
@pytest.mark.parametrize("name", studies.names())
def test_killed_smoke_study_resumes_to_identical_metrics(smoke_run, tmp_path, monkeypatch, name):
    full, cut = smoke_run(name), tmp_path / "cut"
    killed = run_forked(_run_until_killed, name, cut, smoke_run.writes(name) // 2)
    assert killed.returncode == -9, killed.stderr[-2000:]

    # The resumed run's figures are not compared (its rows and claims are) and rendering them
    # is a large part of its time; the uninterrupted run (smoke_run) draws them all.
    monkeypatch.setattr(Figure, "savefig", _blank_png)

    actions: dict[str, str] = {}
    with pytest.warns(RuntimeWarning, match="taking over the lock"):  # the killed run's lock
        studies.get(name).run(
            preset="smoke",
            out=cut,
            on_run=lambda run, status, seconds, action: actions.__setitem__(run, action),
        )
    assert "restarted" not in actions.values(), actions
    assert "resumed" in actions.values(), actions
    names = sorted(p.name for p in (full / "runs").iterdir())
    assert sorted(p.name for p in (cut / "runs").iterdir()) == names
    for run in names:
        assert stored_rows(cut / "runs" / run) == stored_rows(full / "runs" / run), run
    claims = [json.loads((d / VERDICT_FILE).read_text())["claims"] for d in (full, cut)]
    assert claims[1] == claims[0]
