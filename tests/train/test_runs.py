"""Study runs on the engine: specs of one group train as one ensemble, every member keeps its
own run, an interrupted group resumes, and ``dynascope resume`` continues a member alone.

Oracle: the same runs trained without groups (lone runs), compared row by row (float64, 1e-12).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from dynascope.cli import app
from dynascope.store import load_run
from dynascope.studies.base import Analysis, RunSpec, Study
from dynascope.train import RUNNER_FILE, EngineRunConfig, Loop, Parts, resume_run

CRASH = {"at": None}


class ToyRun(EngineRunConfig):
    width: int = 6
    lr: float = 0.05


def build_toy(config: ToyRun, streams) -> Parts:
    model = nn.Sequential(nn.Linear(3, config.width), nn.Tanh(), nn.Linear(config.width, 1))

    def data(g):
        if CRASH["at"] is not None:
            CRASH["left"] -= 1
            if CRASH["left"] == 0:
                raise SystemExit("simulated crash")  # propagates, as a kill would
        x = torch.randn(8, 3, generator=g)
        return {"x": x, "y": x.sum(-1, keepdim=True).sin()}

    return Parts(
        model=model,
        data=data,
        loss=lambda m, b: (m(b["x"]) - b["y"]).square().mean(),
        optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=config.lr, momentum=0.5),
    )


def _study(grouped: bool) -> Study:
    loop = Loop(steps=30, log_every=3, checkpoint_every=10, dtype="float64")

    def build_runs(preset, seed):
        return [
            RunSpec(
                f"toy_lr{lr}_s{s}",
                ToyRun(seed=seed + s, loop=loop, lr=lr),
                build_toy,
                group=f"lr{lr}" if grouped else None,
            )
            for lr in (0.05, 0.1)
            for s in range(3)
        ]

    return Study(
        name="toy",
        claim="c",
        source="s",
        presets={"smoke": lambda: None, "fast": lambda: None, "paper": lambda: None},
        build_runs=build_runs,
        analyze=lambda runs, figures: Analysis([]),
    )


def _rows(path: Path):
    frame = load_run(path).scalars
    return frame.sort_values(["step", "key"]).reset_index(drop=True)


@pytest.fixture(autouse=True)
def _no_crash():
    CRASH["at"] = None
    yield
    CRASH["at"] = None


def test_groups_train_as_ensembles_equal_to_lone_runs_and_resume(tmp_path):
    _study(grouped=False).run("smoke", tmp_path / "lone")
    actions = {}
    CRASH.update(at=True, left=3 * 17)  # the first group's step 17: past checkpoint 10
    with pytest.raises(SystemExit, match="simulated crash"):
        _study(grouped=True).run("smoke", tmp_path / "ens")
    CRASH["at"] = None
    _study(grouped=True).run(  # the same process: its locks were released on the way out
        "smoke",
        tmp_path / "ens",
        on_run=lambda run, status, seconds, action: actions.__setitem__(run, action),
    )
    assert {a for n, a in actions.items() if "lr0.05" in n} == {"resumed"}
    assert {a for n, a in actions.items() if "lr0.1" in n} == {"started"}
    for run_dir in sorted((tmp_path / "lone" / "runs").iterdir()):
        lone, ens = _rows(run_dir), _rows(tmp_path / "ens" / "runs" / run_dir.name)
        assert list(lone["key"]) == list(ens["key"]) and list(lone["step"]) == list(ens["step"])
        np.testing.assert_allclose(ens["value"], lone["value"], rtol=1e-12, atol=1e-14)
        assert (tmp_path / "ens" / "runs" / run_dir.name / RUNNER_FILE).is_file()


def test_resume_continues_a_study_member_alone(tmp_path):
    _study(grouped=False).run("smoke", tmp_path / "full")
    CRASH.update(at=True, left=3 * 25)
    with pytest.raises(SystemExit, match="simulated crash"):
        _study(grouped=True).run("smoke", tmp_path / "cut")
    CRASH["at"] = None
    member = tmp_path / "cut" / "runs" / "toy_lr0.05_s1"
    assert load_run(member).status == "running"
    result = resume_run(member)
    assert result.status == "finished"
    lone, resumed = _rows(tmp_path / "full" / "runs" / member.name), _rows(member)
    np.testing.assert_allclose(resumed["value"], lone["value"], rtol=1e-12, atol=1e-14)


def test_cli_resume_of_a_study_run_and_a_broken_runner_file(tmp_path):
    _study(grouped=True).run("smoke", tmp_path / "s")
    member = tmp_path / "s" / "runs" / "toy_lr0.1_s2"
    result = CliRunner().invoke(app, ["resume", str(member), "--no-progress"])
    assert result.exit_code == 0, result.output
    (member / RUNNER_FILE).write_text('{"build": "nowhere:build", "config": "nowhere:Config"}')
    result = CliRunner().invoke(app, ["resume", str(member), "--no-progress"])
    assert result.exit_code == 2
    assert "names no importable build and config class (ModuleNotFoundError" in result.output


def test_dynascope_run_of_a_study_runs_config_gives_its_metrics_bitwise(smoke_run, tmp_path):
    # one kind of run directory: a study's run (its own build, or the registry build) trains
    # again from its config.yaml alone, row for row
    runs = sorted((smoke_run("gradual-rank") / "runs").iterdir())
    builds = {json.loads((r / RUNNER_FILE).read_text())["build"] for r in runs}
    assert builds == {
        "dynascope.studies.gradual_rank.runs:build_toy",
        "dynascope.train.registry:build_registry",
    }
    for run_dir in runs:
        again = tmp_path / "again" / run_dir.name
        args = ["run", str(run_dir / "config.yaml"), "--out", str(again), "--no-progress"]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        pd.testing.assert_frame_equal(_rows(again), _rows(run_dir), check_exact=True)
        assert (again / "config.yaml").read_text() == (run_dir / "config.yaml").read_text()
