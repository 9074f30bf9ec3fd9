"""Checkpoint history: step 0 and every power of two kept beside the latest, under a budget.

Oracles: the closed form of the history steps ({0} and 2^k), a second implementation of the
keep rule (prefix sums in step order) under hypothesis, Adam's own step count in each
checkpoint, and the initial model built the way the engine builds it (step 0 = the
initialisation, compared exactly).
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

import dynascope as ds
from dynascope.cli import app
from dynascope.config import validate_config
from dynascope.store import load_run
from dynascope.train import SeedStreams, Trainer, build_registry
from dynascope.train._checkpoints import is_history_step, kept_steps
from dynascope.train.seeding import seed_everything

DOCS_CLI = Path(__file__).parents[2] / "docs" / "cli.md"
TINY = {
    "name": "tiny",
    "task": {"name": "associative_recall", "n_keys": 6, "n_values": 5, "n_pairs": 3},
    "model": {"name": "transformer", "d_model": 12, "n_heads": 3, "d_mlp": 0},
    "monitor": {"probes": []},
}


def _steps(run_dir: Path) -> list[int]:
    return sorted(int(p.stem.removeprefix("step_")) for p in (run_dir / "checkpoints").glob("*.pt"))


def _train(run_dir: Path, steps: int = 20, **train) -> None:
    config = validate_config({**TINY, "train": {"steps": steps, "batch_size": 4, **train}})
    assert Trainer(config, run_dir).run().status == "finished"


# -- the rule -------------------------------------------------------------------------------
def test_history_steps_are_zero_and_the_powers_of_two():
    expected = {0} | {2**k for k in range(13)}
    assert {n for n in range(5000) if is_history_step(n)} == expected
    with pytest.raises(ValueError, match=r"^step must be >= 0 \(got -1\)$"):
        is_history_step(-1)


def _naive_kept(sizes, keep_last, history, budget):
    """The rule written again: prefix sums of the history outside the latest, in step order."""
    ordered = sorted(sizes)
    latest = {s for s, _ in ordered[-keep_last:]}
    if not history:
        return latest
    older = [(s, b) for s, b in ordered if s not in latest and (s == 0 or s & (s - 1) == 0)]
    totals = itertools.accumulate(b for _, b in older)
    fits = itertools.takewhile(lambda t: budget is None or t[1] <= budget, zip(older, totals))
    return latest | {s for (s, _), _ in fits}


@given(
    steps=st.sets(st.integers(0, 300), max_size=40),
    size=st.integers(1, 10),
    keep_last=st.integers(1, 4),
    history=st.booleans(),
    budget=st.none() | st.integers(0, 60),
)
def test_kept_steps_equals_the_rule_written_again(steps, size, keep_last, history, budget):
    sizes = [(s, size + s % 3) for s in steps]  # sizes differ a little, as real ones do
    kept = kept_steps(sizes, keep_last=keep_last, history=history, budget_bytes=budget)
    assert kept == _naive_kept(sizes, keep_last, history, budget)
    latest = sorted(steps)[-keep_last:]
    assert set(latest) <= kept  # resume always finds the last checkpoint
    older = kept - set(latest)
    assert all(is_history_step(s) for s in older)
    if budget is not None:
        assert sum(b for s, b in sizes if s in older) <= budget


@given(
    total=st.integers(1, 600),
    every=st.integers(1, 100),
    keep_last=st.integers(1, 3),
    budget=st.none() | st.integers(0, 40),
)
def test_a_run_never_loses_a_kept_history_checkpoint(total, every, keep_last, budget):
    """Replay the engine: write each due checkpoint, prune; history once kept stays kept."""
    on_disk: dict[int, int] = {}
    settled: set[int] = set()  # history steps kept after leaving the latest
    for step in range(total + 1):
        if not (step % every == 0 and step > 0 or step == total or is_history_step(step)):
            continue
        on_disk[step] = 5 + step % 2
        kept = kept_steps(on_disk.items(), keep_last=keep_last, history=True, budget_bytes=budget)
        on_disk = {s: b for s, b in on_disk.items() if s in kept}
        assert settled <= set(on_disk)
        settled |= set(on_disk) - set(sorted(on_disk)[-keep_last:])
    history = [s for s in range(total + 1) if is_history_step(s)]
    if budget is None:
        assert set(history) <= set(on_disk)
    assert len(on_disk) <= len(history) + keep_last


def test_kept_steps_refuses_bad_arguments():
    with pytest.raises(ValueError, match=r"^keep_last must be >= 1 \(got 0\)$"):
        kept_steps([(1, 1)], keep_last=0, history=True, budget_bytes=None)
    with pytest.raises(ValueError, match=r"^budget_bytes must be >= 0 or None \(got -1\)$"):
        kept_steps([(1, 1)], keep_last=1, history=True, budget_bytes=-1)


# -- the engine ------------------------------------------------------------------------------
def test_a_run_keeps_step_0_the_powers_of_two_and_the_last_two(tmp_path: Path):
    _train(tmp_path / "run", steps=20, checkpoint_every=6)
    # every 6 steps: 6, 12, 18, then 20 (the end); the latest two of those are 18 and 20
    assert _steps(tmp_path / "run") == [0, 1, 2, 4, 8, 16, 18, 20]
    for step in (0, 4, 20):  # each with its optimizer state: Adam counts its own steps
        state = torch.load(tmp_path / "run" / "checkpoints" / f"step_{step}.pt")
        assert state["step"] == step
        counts = {int(s["step"]) for s in state["optimizer"]["state"].values()}
        assert counts == (set() if step == 0 else {step})


def test_budget_and_no_history(tmp_path: Path):
    _train(tmp_path / "tight", checkpoint_budget_mb=0)
    assert _steps(tmp_path / "tight") == [16, 20]
    events = load_run(tmp_path / "tight").events.query("kind == 'checkpoint_budget'")
    removed = [re.search(r"step_(\d+)\.pt", d).group(1) for d in events["detail"]]
    assert sorted(map(int, removed)) == [0, 1, 2, 4, 8]
    assert events["detail"].str.contains("checkpoint_budget_mb=0").all()
    (tmp_path / "none" / "checkpoints").mkdir(parents=True)
    torch.save({}, tmp_path / "none" / "checkpoints" / "step_999.pt")  # a run started over
    _train(tmp_path / "none", checkpoint_history="none")
    assert _steps(tmp_path / "none") == [20]


def test_the_docs_recall_config_holds_its_history_and_inspect_shows_the_series(tmp_path: Path):
    """Done-when of issue 31 part 2: a fresh `dynascope run` of docs/cli.md's recall config
    (shortened to 20 steps) holds step 0 and log-spaced checkpoints; `inspect RUN` reads them
    as a series, and its step-0 rows are those of the untrained model."""
    text = DOCS_CLI.read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.DOTALL) if "recall" in b]
    (tmp_path / "recall.yaml").write_text(block)
    run_dir = tmp_path / "run"
    args = ["run", str(tmp_path / "recall.yaml"), "--out", str(run_dir), "--no-progress"]
    args += ["--set", "train.steps=20", "--set", "train.batch_size=8"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert _steps(run_dir) == [0, 1, 2, 4, 8, 16, 20]
    shown = CliRunner().invoke(app, ["inspect", str(run_dir)])
    assert shown.exit_code == 0, shown.output
    rows = re.findall(r"^│\s*(\d+)\s*│\s*(\d+)\s*│", shown.stdout, re.MULTILINE)
    assert [int(step) for step, layer in rows if layer == "0"] == [0, 1, 2, 4, 8, 16, 20]
    series = ds.inspect(run_dir)
    config = validate_config(yaml.safe_load((run_dir / "config.yaml").read_text()))
    streams = SeedStreams(config.seed)
    with torch.random.fork_rng(devices=[]):
        seed_everything(streams("init"))  # as the engine does before it builds
        initial = build_registry(config, streams).model.eval()
    first = series[series["step"] == 0].drop(columns="step").reset_index(drop=True)
    pd.testing.assert_frame_equal(first, ds.inspect(initial), check_exact=True)
    assert not first.equals(series[series["step"] == 20].drop(columns="step"))
