"""Runs that survive: locks, concurrent runs, refused checkpoints, names, RNG, divergence.

Crash/resume under SIGKILL, SIGINT and SIGTERM is in tests/test_crash_resume.py; malformed
input in tests/test_bad_input.py.
"""

from __future__ import annotations

import os
import pickle
import random
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from helpers import Forked, cli_main, run_forked
from hypothesis import given
from hypothesis import strategies as st

from dynascope.config import ConfigError, validate_config
from dynascope.store import (
    RunLock,
    RunLockedError,
    RunStore,
    create_run_dir,
    load_run,
    lock_is_free,
    safe_name,
)
from dynascope.studies.base import Analysis, RunSpec, Study, Verdict
from dynascope.train import Engine, Member, Trainer, build_registry, loop_of

TINY = {
    "name": "tiny",
    "model": {"d_model": 12, "n_heads": 3, "d_mlp": 0},
    "task": {"name": "associative_recall", "n_keys": 6, "n_values": 5, "n_pairs": 3},
    "train": {"steps": 6, "batch_size": 4, "eval_every": 3, "checkpoint_every": 3},
}


def _cli(*args, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """``dynascope ARGS`` in a child process (forked: one intra-op thread, as every test)."""
    return run_forked(cli_main, *args, cwd=cwd, timeout_s=timeout)


# -- names and directories ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "name", ["..", ".", "../x", "a/b", "/abs", "a\\b", ".hidden", "", "x" * 101, "a b", "é"]
)
def test_unsafe_names_are_refused(name):
    with pytest.raises(ValueError, match=r"must be 1-100 characters from A-Z a-z 0-9 _ \. = \+ -"):
        safe_name(name, "run name")


@given(st.text(max_size=120))
def test_a_safe_name_is_exactly_one_path_component(name):
    try:
        safe_name(name)
    except ValueError:
        return
    assert Path(name).name == name and len(Path(name).parts) == 1
    assert not name.startswith(".") and "/" not in name and "\\" not in name


def test_run_spec_refuses_a_path_as_name():
    with pytest.raises(ValueError, match=r"run name must be .* \(got '\.\./escape'\)"):
        RunSpec("../escape", validate_config(TINY), build_registry)


def test_create_run_dir_is_atomic_under_concurrency(tmp_path):
    with ThreadPoolExecutor(8) as pool:
        paths = list(pool.map(lambda _: create_run_dir(tmp_path, "same"), range(16)))
    names = sorted(p.name for p in paths)
    assert len(set(names)) == 16
    assert set(names) == {"same", *(f"same-{n}" for n in range(2, 17))}


# -- locks ---------------------------------------------------------------------------------------
def test_a_live_lock_refuses_a_second_writer(tmp_path):
    with RunStore(tmp_path / "r", lock=True):
        assert (tmp_path / "r" / ".lock").read_text().split()[0] == str(os.getpid())
        with pytest.raises(RunLockedError, match=rf"in use by pid {os.getpid()} on "):
            RunStore(tmp_path / "r", lock=True)
    assert lock_is_free(tmp_path / "r")
    RunStore(tmp_path / "r", lock=True).close()  # free again


def test_a_stale_lock_of_a_dead_pid_is_taken_over_with_a_warning(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / ".lock").write_text(f"{dead.pid} {os.uname().nodename}\n")
    with pytest.warns(RuntimeWarning, match=rf"left by pid {dead.pid}, which is no longer"):
        lock = RunLock(tmp_path)
    assert (tmp_path / ".lock").read_text().split()[0] == str(os.getpid())
    lock.release()


def test_a_live_lock_wins_over_a_stale_record_and_an_empty_lock_file_is_free(tmp_path):
    """The race a killed run leaves: a stale record, then two takers; only one may win."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / ".lock").write_text(f"{dead.pid} {os.uname().nodename}\n")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, warnings; warnings.simplefilter('ignore'); "
         "from dynascope.store import RunLock; RunLock(sys.argv[1]); print('held', flush=True); "
         "sys.stdin.read()", str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunLockedError, match=rf"in use by pid {holder.pid} on "):
            RunLock(tmp_path)
        assert not lock_is_free(tmp_path)
    finally:
        holder.communicate("")
    assert lock_is_free(tmp_path)  # the OS dropped it with the process
    (tmp_path / ".lock").write_text("")  # an empty record (killed while writing it) is no lock
    RunLock(tmp_path).release()


def test_second_process_resuming_a_running_run_is_refused_then_sigterm_stops_the_first(
    tmp_path,
):
    """Process A trains; B's `resume` is refused (exit 2); SIGTERM makes A checkpoint, 143."""
    config = tmp_path / "long.yaml"
    long = {**TINY, "train": {**TINY["train"], "steps": 1_000_000, "checkpoint_every": 10**6}}
    config.write_text(yaml.safe_dump(long))
    run_dir = tmp_path / "run"
    first = Forked(cli_main, "run", config, "--out", run_dir, "--no-progress", cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not (run_dir / "checkpoints").exists() and not _status_is_running(run_dir):
            assert time.monotonic() < deadline, "the first run never started"
            assert not first.poll(), first.wait().stderr
            time.sleep(0.1)
        second = _cli("resume", run_dir, "--no-progress", cwd=tmp_path)
        assert second.returncode == 2, second.stderr
        assert re.fullmatch(
            rf"error: run directory '.*run' is in use by pid {first.pid} on \S+ \(lock file "
            r"\.lock\); wait for it to finish\n",
            second.stderr,
        ), second.stderr
        first.send_signal(signal.SIGTERM)
        ended = first.wait(timeout_s=60)
        assert ended.returncode == 143, ended.stderr
    finally:
        if not first.poll():
            first.send_signal(signal.SIGKILL)
            first.wait()
    stderr = ended.stderr
    assert re.match(r"run interrupted by SIGTERM at step \d+; checkpoint written", stderr)
    run = load_run(run_dir)
    assert run.status == "interrupted"
    step = int(run.events.query("kind == 'interrupted'")["step"].iloc[0])
    assert (run_dir / "checkpoints" / f"step_{step}.pt").is_file()
    assert lock_is_free(run_dir)


def _status_is_running(run_dir: Path) -> bool:
    try:
        return load_run(run_dir).status == "running"
    except Exception:  # not created yet, or mid-creation
        return False


def test_eight_concurrent_runs_in_one_parent_all_complete_intact(tmp_path):
    """Eight processes, same config name, no --out: eight distinct directories under runs/."""
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    procs = [Forked(cli_main, "run", config, "--no-progress", cwd=tmp_path) for _ in range(8)]
    ended = [p.wait(timeout_s=300) for p in procs]
    assert [e.returncode for e in ended] == [0] * 8, [e.stderr for e in ended]
    outputs = [(e.stdout, e.stderr) for e in ended]
    dirs = sorted((tmp_path / "runs").iterdir())
    assert [d.name for d in dirs] == sorted(["tiny", *(f"tiny-{n}" for n in range(2, 9))])
    reference = None
    for d in dirs:
        run = load_run(d)
        assert run.status == "finished"
        assert lock_is_free(d)
        table = run.scalars.sort_values(["step", "key"]).reset_index(drop=True)
        assert not table.duplicated(["step", "key"]).any()
        if reference is None:
            reference = table
        else:  # same config and seed: identical metrics (1 thread each)
            assert table.equals(reference)
    printed = sorted(re.search(r"finished 6 steps in (\S+):", o[0]).group(1) for o in outputs)
    assert printed == sorted(str(Path("runs") / d.name) for d in dirs)


# -- refused checkpoints and runs -----------------------------------------------------------------
class _WritesAFile:
    """Unpickling this with plain pickle would create ``target``."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        return (Path.touch, (self.target,))


def test_resume_refuses_a_crafted_pickle_checkpoint_and_runs_no_code(tmp_path):
    run_dir = tmp_path / "run"
    Trainer(validate_config(TINY), run_dir).run()
    before = load_run(run_dir).scalars
    evil = tmp_path / "pwned"
    torch.save({"step": 6, "model": _WritesAFile(evil)}, run_dir / "checkpoints" / "step_9.pt",
               pickle_module=pickle)  # fmt: skip
    result = _cli("resume", run_dir, "--no-progress", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert re.fullmatch(
        r"error: checkpoint '.*step_9\.pt' was refused: it holds objects other than tensors "
        r"and plain data \(UnpicklingError\)\n",
        result.stderr,
    ), result.stderr
    assert not evil.exists()
    after = load_run(run_dir)
    assert after.scalars.equals(before) and after.status == "finished"
    assert lock_is_free(run_dir)


def test_a_fresh_run_into_a_directory_with_a_different_run_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    Trainer(validate_config(TINY), run_dir).run()
    before = load_run(run_dir).scalars
    other = validate_config(TINY, ["seed=7"])
    with pytest.raises(ConfigError, match=r"run_dir: '.*run' already holds a different run"):
        Trainer(other, run_dir).run()
    assert load_run(run_dir).scalars.equals(before)
    # the same config starts it over and reproduces it
    Trainer(validate_config(TINY), run_dir).run()
    assert load_run(run_dir).scalars.equals(before)


# -- RNG state -----------------------------------------------------------------------------------
def test_checkpoint_restores_torch_python_and_numpy_rng(tmp_path):
    config = validate_config(TINY)
    engine = Engine(
        Member(tmp_path / "r", config.seed, config.model_dump(mode="json")),
        lambda streams: build_registry(config, streams),
        loop_of(config),
    )
    random.seed(11)
    np.random.seed(12)
    torch.manual_seed(13)
    np.random.standard_normal()  # leaves a cached Gaussian in numpy's state
    with RunStore(tmp_path / "r") as store:
        engine.states[0].store = store
        engine._checkpoint(1)
        expected = (random.random(), np.random.standard_normal(3), torch.rand(3))
        random.seed(0)
        np.random.seed(0)
        torch.manual_seed(0)
        engine._restore([store.load_checkpoint(store.checkpoints()[-1][1])])
    assert random.random() == expected[0]
    np.testing.assert_array_equal(np.random.standard_normal(3), expected[1])
    torch.testing.assert_close(torch.rand(3), expected[2], rtol=0, atol=0)


# -- divergence ------------------------------------------------------------------------------------
def test_divergence_is_recorded_with_the_tensor_and_the_store_stays_intact(tmp_path):
    cfg = validate_config(TINY, ["optimizer.lr=1e30", "optimizer.name=sgd", "train.log_every=1"])
    result = Trainer(cfg, tmp_path / "div").run()
    assert result.status == "diverged"
    run = load_run(tmp_path / "div")
    assert run.status == "diverged"
    rows = run.events.query("kind == 'diverged'")
    assert len(rows) == 1
    assert rows["step"].iloc[0] == result.step
    assert re.fullmatch(
        r"(train\.loss|val\.loss|parameter \S+) is not finite", rows["detail"].iloc[0]
    )
    assert run.scalar("val.loss").index.tolist()[0] == 0  # rows before divergence are kept
    for _, path in RunStore(tmp_path / "div").checkpoints():  # no checkpoint holds inf/NaN
        state = torch.load(path, weights_only=True)
        assert all(torch.isfinite(t).all() for t in state["model"].values())
    assert lock_is_free(tmp_path / "div")


def _analyze_statuses(runs, figures_dir):
    statuses = {name: run.status for name, run in runs.items()}
    n_ok = sum(s == "finished" for s in statuses.values())
    return Analysis(
        verdicts=[Verdict("runs finished", "count", float(n_ok), 2.0, n_ok >= 2)],
        tables={"statuses": [statuses]},
    )


def test_a_diverged_run_in_a_study_is_data_and_the_others_go_on(tmp_path):
    ok = validate_config(TINY)
    bad = validate_config(TINY, ["optimizer.lr=1e30", "optimizer.name=sgd"])
    study = Study(
        name="divergence-is-data",
        claim="two of three runs finish",
        source="test",
        presets={"smoke": lambda: ok},
        build_runs=lambda preset, seed: [
            RunSpec("a", ok, build_registry),
            RunSpec("b", bad, build_registry),
            RunSpec("c", ok, build_registry),
        ],
        analyze=_analyze_statuses,
    )
    outcome = study.run(preset="smoke", out=tmp_path / "study")
    assert [r["status"] for r in outcome.runs] == ["finished", "diverged", "finished"]
    assert outcome.tables["statuses"] == [{"a": "finished", "b": "diverged", "c": "finished"}]
    assert outcome.passed
