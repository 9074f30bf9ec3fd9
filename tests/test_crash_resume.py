"""Crash safety: SIGKILL anywhere (5 steps drawn at random, and inside a store commit), SIGINT
and SIGTERM; each resumed run must equal the uninterrupted run exactly.

The killed runs execute in a child process forked from the test's (``_crashing_cli_run``, the
real CLI); the uninterrupted run and the resumes run here. Both use one intra-op thread, under which CPU
training is bitwise reproducible (dynascope/train.py), so tables are compared for equality.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from helpers import run_forked

from dynascope import store as store_module
from dynascope.config import validate_config
from dynascope.store import load_run, lock_is_free
from dynascope.tasks import AssociativeRecall
from dynascope.train import Trainer

STEPS = 60
CONFIG = {
    "name": "crash",
    "model": {"n_layers": 2, "d_model": 12, "n_heads": 3, "d_mlp": 8},
    "task": {"name": "associative_recall", "n_keys": 6, "n_values": 5, "n_pairs": 3},
    "optimizer": {"name": "adamw", "lr": 1e-2, "weight_decay": {"attention": 0.1}},
    "train": {
        "steps": STEPS,
        "batch_size": 8,
        "log_every": 3,
        "eval_every": 7,
        "eval_batches": 2,
        "checkpoint_every": 10,
    },
    "monitor": {
        # stateful probes too: their snapshots must travel in the checkpoint
        "probes": [
            "qk_spectrum",
            "ov_spectrum",
            "parameter_norms",
            "update_norms",
            "gradient_norms",
            "delta_spectrum",
            "attention_entropy",
        ],
        "schedule": "every",
        "every": 4,
    },
}
# Five kill steps drawn once from a fixed seed (not hand-picked), spread over the run.
KILL_STEPS = sorted(random.Random(20261201).sample(range(2, STEPS + 1), 5))


def _table(path: Path) -> pd.DataFrame:
    return load_run(path).scalars.sort_values(["step", "key"]).reset_index(drop=True)


@pytest.fixture(scope="module")
def config_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cfg") / "crash.json"
    path.write_text(json.dumps(CONFIG))
    return path


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> pd.DataFrame:
    run_dir = tmp_path_factory.mktemp("full") / "run"
    assert Trainer(validate_config(CONFIG), run_dir).run().status == "finished"
    return _table(run_dir)


class _SmallBatchStore(store_module.RunStore):
    """Commits every 50 rows (not 2000): rows after the last checkpoint are on disk when the
    kill comes, and resume must drop them."""

    def __init__(self, path, **kwargs):
        super().__init__(path, **{**kwargs, "flush_every": 50})


class _KillBeforeCommit:
    """A connection proxy whose ``with`` block is SIGKILLed before it commits."""

    def __init__(self, db, from_step: int, owner) -> None:
        self._db, self._from_step, self._owner = db, from_step, owner

    def __getattr__(self, name):
        return getattr(self._db, name)

    def __enter__(self):
        self._armed = any(r[0] >= self._from_step for r in self._owner._scalars)
        return self._db.__enter__()

    def __exit__(self, *exc):
        if self._armed and exc[0] is None:
            assert self._db.in_transaction  # the INSERTs ran; nothing is committed yet
            os.kill(os.getpid(), signal.SIGKILL)
        return self._db.__exit__(*exc)


def _crashing_cli_run(config_path: Path, run_dir: Path, mode: str, step: int) -> None:
    """The child: ``dynascope run CONFIG --out RUN_DIR`` (the real CLI, its store committing
    every 50 rows), killed or signalled on purpose. ``mode``:

    - ``sigkill-step``: SIGKILL itself when the batch of train step ``step`` is drawn (steps
      < ``step`` are done, their rows partly committed);
    - ``sigkill-commit``: SIGKILL itself inside the first store transaction that holds a row
      of step >= ``step``, after the INSERTs and before the COMMIT;
    - ``sigterm-step`` / ``sigint-step``: send itself SIGTERM / SIGINT at step ``step`` and
      exit with the CLI's code (the run should checkpoint and stop).
    """
    import dynascope.train.engine as train_module
    from dynascope.cli import main as cli_main

    store_module.RunStore = train_module.RunStore = _SmallBatchStore  # this child's only
    if mode == "sigkill-commit":
        init = _SmallBatchStore.__init__

        def init_with_proxy(self, path, **kwargs):
            init(self, path, **kwargs)
            self._db = _KillBeforeCommit(self._db, step, self)

        _SmallBatchStore.__init__ = init_with_proxy
    else:
        sig = {
            "sigkill-step": signal.SIGKILL,
            "sigterm-step": signal.SIGTERM,
            "sigint-step": signal.SIGINT,
        }[mode]
        batch = AssociativeRecall.batch
        calls = {"train": 0}

        def batch_with_signal(self, split, *args, **kwargs):
            if split == "train":
                calls["train"] += 1
                if calls["train"] == step:
                    os.kill(os.getpid(), sig)
            return batch(self, split, *args, **kwargs)

        AssociativeRecall.batch = batch_with_signal
    sys.argv = ["dynascope", "run", str(config_path), "--out", str(run_dir), "--no-progress"]
    cli_main()


def _child(config_file: Path, run_dir: Path, mode: str, step: int) -> subprocess.CompletedProcess:
    return run_forked(_crashing_cli_run, config_file, run_dir, mode, step, timeout_s=300)


def _assert_committed_rows_are_correct(run_dir: Path, uninterrupted: pd.DataFrame) -> None:
    """The killed store opens, and every row it holds is the uninterrupted run's row."""
    partial = _table(run_dir)
    assert not partial.empty
    assert not partial.duplicated(["step", "key"]).any()
    merged = partial.merge(uninterrupted, on=["step", "key"], how="left", suffixes=("", "_full"))
    pd.testing.assert_series_equal(
        merged["value"], merged["value_full"], check_names=False, check_exact=True
    )


def _resume_and_compare(
    run_dir: Path, uninterrupted: pd.DataFrame, *, stale_lock: bool = False
) -> pd.DataFrame:
    trainer = Trainer(validate_config(CONFIG), run_dir)
    if stale_lock:  # the killed process could not remove its lock file: it is taken over
        assert (run_dir / ".lock").is_file()
        with pytest.warns(RuntimeWarning, match=r"taking over the lock of .* left by pid \d+"):
            result = trainer.run(resume=True)
    else:
        result = trainer.run(resume=True)
    assert result.status == "finished"
    resumed = _table(run_dir)
    assert not resumed.duplicated(["step", "key"]).any()
    pd.testing.assert_frame_equal(resumed, uninterrupted, check_exact=True)
    return resumed


@pytest.mark.parametrize("kill_step", KILL_STEPS)
def test_sigkill_at_a_step_then_resume_equals_uninterrupted(
    kill_step, config_file, uninterrupted, tmp_path
):
    run_dir = tmp_path / "run"
    proc = _child(config_file, run_dir, "sigkill-step", kill_step)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    run = load_run(run_dir)
    assert run.status == "running"  # killed: nobody could record anything else
    assert run.scalars["step"].max() < kill_step
    _assert_committed_rows_are_correct(run_dir, uninterrupted)
    _resume_and_compare(run_dir, uninterrupted, stale_lock=True)
    # the last checkpoint before the kill: every 10 steps, or the history (1, 2, 4, 8, ...)
    last_checkpoint = max(s for s in range(1, kill_step) if s % 10 == 0 or s & (s - 1) == 0)
    resumed = load_run(run_dir).events.query("kind == 'resumed'")
    assert resumed["detail"].tolist() == [f"from checkpoint step {last_checkpoint}"]


def test_sigkill_inside_a_store_commit_then_resume_equals_uninterrupted(
    config_file, uninterrupted, tmp_path
):
    run_dir = tmp_path / "run"
    proc = _child(config_file, run_dir, "sigkill-commit", 33)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    partial = _table(run_dir)
    # the transaction holding step >= 33 was cut short: none of its rows were kept
    assert partial["step"].max() < 33
    _assert_committed_rows_are_correct(run_dir, uninterrupted)
    _resume_and_compare(run_dir, uninterrupted, stale_lock=True)


@pytest.mark.parametrize(("mode", "code", "name"), [("sigterm-step", 143, "SIGTERM"),
                                                    ("sigint-step", 130, "SIGINT")])  # fmt: skip
def test_signal_checkpoints_marks_interrupted_and_resumes_exactly(
    mode, code, name, config_file, uninterrupted, tmp_path
):
    run_dir = tmp_path / "run"
    proc = _child(config_file, run_dir, mode, 25)
    assert proc.returncode == code, proc.stderr
    assert proc.stderr.strip() == (
        f"run interrupted by {name} at step 25; checkpoint written; "
        f"continue with `dynascope resume {run_dir}`"
    )
    run = load_run(run_dir)
    assert run.status == "interrupted"
    assert run.events.query("kind == 'interrupted'")[["step", "detail"]].values.tolist() == [
        [25, name]
    ]
    assert (run_dir / "checkpoints" / "step_25.pt").is_file()
    assert lock_is_free(run_dir)  # released on the way out
    _assert_committed_rows_are_correct(run_dir, uninterrupted)
    _resume_and_compare(run_dir, uninterrupted)
    assert load_run(run_dir).events.query("kind == 'resumed'")["detail"].tolist() == [
        "from checkpoint step 25"
    ]
