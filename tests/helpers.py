"""Helpers the test files share, importable as ``helpers`` (pyproject's pytest ``pythonpath``
puts ``tests/`` on ``sys.path``; a child process started from a test inserts it itself).

- :class:`Killed`: an exception that stands in for SIGKILL inside the test process.
- :func:`counting_store_writes`: counts (or SIGKILLs at) the calls of ``RunStore.log``.
- :class:`Forked`, :func:`run_forked`, :func:`cli_main`: a function (the CLI) run in a child
  process forked from the test process (a real process to kill, without a fresh
  interpreter's ~4 s of CPU of imports).
- :class:`SmokeRuns`: each study's smoke preset run once per test session, shared between the
  xdist workers under a file lock (the ``smoke_run`` fixture of ``tests/conftest.py``).
- :func:`stored_rows`: every scalar and tensor row of a run, to compare two runs bit for bit.
- :data:`TINY`, :func:`invoke`, :func:`assert_one_line_error`: a tiny run config and the CLI
  called in-process, with the check that a refusal is one ``error:`` line and exit 2.
- :func:`tiny_transformer`: a seeded float64 :class:`~dynascope.nn.Transformer` with small,
  pairwise-distinct sizes.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import select
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager, suppress
from pathlib import Path
from typing import NoReturn

import pytest
import torch
from filelock import FileLock

import dynascope.store as store_module
from dynascope import studies
from dynascope.nn import Transformer
from dynascope.studies.base import StudyOutcome


class Killed(BaseException):
    """Stands in for SIGKILL: not an ``Exception``, so no handler of the engine, a runner or the
    study catches it and no run is recorded as failed."""


@contextmanager
def counting_store_writes(kill_at: int | None = None) -> Iterator[dict[str, int]]:
    """Count the calls of :meth:`dynascope.store.RunStore.log` made inside the block.

    Args:
        kill_at: SIGKILL this process at the ``kill_at``-th call, before it writes anything
            (``None``: only count).
    Yields:
        ``{"n": calls so far}``, updated as the block runs.
    """
    calls = {"n": 0}
    log = store_module.RunStore.log

    def counting_log(self, step, values):
        calls["n"] += 1
        if calls["n"] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return log(self, step, values)

    store_module.RunStore.log = counting_log
    try:
        yield calls
    finally:
        store_module.RunStore.log = log


class Forked:
    """``target(*args)`` running in a child process forked from this one; :meth:`wait` for it.

    The child is a real process: it can SIGKILL itself, and its open files and locks die with
    it. It starts with this process's imports (a fresh interpreter spends ~4 s of CPU importing
    torch and dynascope) and torch thread count, and with a fresh interpreter's warning filters
    (not pytest's "error"), printed to its stderr. Its file descriptors 1 and 2 (and
    ``sys.stdout``, ``sys.stderr``) go to files that :meth:`wait` reads. It never returns
    into pytest: it leaves by ``os._exit`` (no atexit handlers) with 0 if ``target`` returned,
    the code of a ``SystemExit`` (as a CLI's ``main`` leaves), or 1 with the traceback on its
    stderr if ``target`` raised.

    Not for a child that starts processes with :mod:`multiprocessing` (the process executor):
    it would inherit this process's forkserver, which is not its child; start a fresh
    interpreter for it (tests/executors/test_stop.py).

    Args:
        target: the function the child calls.
        args: its arguments.
        cwd: the child's working directory (``None``: this process's).
    """

    def __init__(self, target: Callable[..., object], *args: object, cwd: Path | None = None):
        self.name = getattr(target, "__name__", repr(target))
        # torch imports torch._dynamo at the first optimizer a process builds (~1-2 s of CPU):
        # import it once here, before the fork, not once in every child
        import torch._dynamo  # noqa: F401

        self._out, self._err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        self.pid = os.fork()
        if self.pid == 0:
            self._child(target, args, cwd)
        self._pidfd = os.pidfd_open(self.pid)
        self._ended: subprocess.CompletedProcess | None = None

    def _child(self, target: Callable[..., object], args: tuple, cwd: Path | None) -> NoReturn:
        code = 1
        try:
            os.dup2(self._out.fileno(), 1)
            os.dup2(self._err.fileno(), 2)
            sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
            sys.stderr = open(2, "w", encoding="utf-8", buffering=1, closefd=False)  # noqa: SIM115
            _fresh_warning_filters()
            if cwd is not None:
                os.chdir(cwd)
            target(*args)
            code = 0
        except SystemExit as exit_:
            if exit_.code is None or isinstance(exit_.code, int):
                code = exit_.code or 0
            else:
                print(exit_.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        finally:
            with suppress(BaseException):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)

    def poll(self) -> bool:
        """Whether the child has ended (it stays unreaped until :meth:`wait`)."""
        return self._ended is not None or bool(select.select([self._pidfd], [], [], 0)[0])

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the child, unless :meth:`wait` reaped it (until then its pid is not
        reused)."""
        if self._ended is None:
            signal.pidfd_send_signal(self._pidfd, sig)

    def wait(self, timeout_s: float = 900) -> subprocess.CompletedProcess:
        """Wait for the child to end; its exit code (``-N``: killed by signal N), stdout, stderr
        (the same object on every call).

        Raises:
            TimeoutError: if it runs longer than ``timeout_s`` (it is SIGKILLed first).
        """
        if self._ended is not None:
            return self._ended
        try:
            ended, _, _ = select.select([self._pidfd], [], [], timeout_s)
            if not ended:
                self.send_signal(signal.SIGKILL)
            status = os.waitpid(self.pid, 0)[1]
        finally:
            os.close(self._pidfd)
        out, err = (self._read(f) for f in (self._out, self._err))
        code = os.waitstatus_to_exitcode(status)
        self._ended = subprocess.CompletedProcess(self.name, code, out, err)
        if not ended:
            raise TimeoutError(f"the forked {self.name} ran longer than {timeout_s} s: {err}")
        return self._ended

    @staticmethod
    def _read(file) -> str:
        with file:
            file.seek(0)
            return file.read().decode("utf-8", errors="replace")


def _fresh_warning_filters() -> None:
    """A fresh interpreter's warning filters (Python's documented defaults, no ``-W``), shown
    on ``sys.stderr``, in place of pytest's (``filterwarnings = error``, recorded)."""
    warnings.resetwarnings()
    warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
    for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
        warnings.filterwarnings("ignore", category=category, append=True)

    def show(message, category, filename, lineno, file=None, line=None):
        text = warnings.formatwarning(message, category, filename, lineno, line)
        (file or sys.stderr).write(text)

    warnings.showwarning = show


def run_forked(
    target: Callable[..., object], *args: object, cwd: Path | None = None, timeout_s: float = 900
) -> subprocess.CompletedProcess:
    """:class:`Forked` ``target(*args)`` and wait for it (like ``subprocess.run``)."""
    return Forked(target, *args, cwd=cwd).wait(timeout_s)


def cli_main(*args: str | Path) -> None:
    """``dynascope ARGS`` as the installed script runs it (``sys.argv``, exits by
    ``SystemExit``): the target of a :class:`Forked` CLI process."""
    from dynascope.cli import main

    sys.argv = ["dynascope", *map(str, args)]
    main()


def stored_rows(run_dir: Path) -> dict[str, list[tuple]]:
    """Every ``scalars`` and ``tensors`` row of a run's ``metrics.sqlite``, sorted, each scalar as
    its float's hex (bits: -0.0 differs from 0.0; SQLite stores NaN as NULL) and each tensor as
    its raw bytes: two runs with equal rows stored the same metrics bit for bit."""
    # a read-write connection reads only, and (as the last one to close) removes the WAL files
    with closing(sqlite3.connect(run_dir / store_module.METRICS_FILE)) as db:
        scalars = db.execute("SELECT step, key, value FROM scalars ORDER BY 1, 2").fetchall()
        tensors = db.execute("SELECT step, key, dtype, shape, data FROM tensors ORDER BY 1, 2")
        return {
            "scalars": [(s, k, None if v is None else float(v).hex()) for s, k, v in scalars],
            "tensors": tensors.fetchall(),
        }


def _files(out: Path) -> list[tuple[str, int]]:
    """``(path, mtime_ns)`` of every file under ``out`` that a reader never writes (SQLite's
    read-only connections may create and remove ``-wal``/``-shm`` files and touch the database)."""
    return sorted(
        (str(p.relative_to(out)), p.stat().st_mtime_ns)
        for p in out.rglob("*")
        if p.is_file() and not p.name.startswith(store_module.METRICS_FILE)
    )


class SmokeRuns:
    """Each study's smoke preset, run once per test session and shared by every test.

    ``smoke_runs(name)`` returns the study directory of ``studies.get(name).run("smoke", ...)``
    (default seed, executor and device, one intra-op thread as in every test). The first
    caller, in whichever xdist worker, runs it under a file lock in ``root`` (the session's
    base temp directory, shared by the workers); later callers wait for the lock and read the
    finished run. Files in ``root``: ``NAME/`` the study directory, ``NAME.pickle`` the
    :class:`StudyOutcome` the run returned, ``NAME.json`` the number of store writes and the
    directory's file list (written last: the run is complete), ``NAME.failed`` the traceback
    of a run that raised (every later caller fails with it instead of running it again).

    The directory is read-only to tests: a test that writes (resume, reanalyze, a stale run)
    copies it first (:meth:`copy`). :meth:`check_untouched` fails the session where a file in
    it changed.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._used: dict[str, list[tuple[str, int]]] = {}

    def __call__(self, name: str) -> Path:
        return self._ensure(name)["out"]

    def outcome(self, name: str) -> StudyOutcome:
        """The :class:`StudyOutcome` of the shared run (its ``out`` is the shared directory)."""
        self._ensure(name)
        return pickle.loads((self.root / f"{name}.pickle").read_bytes())

    def writes(self, name: str) -> int:
        """How many times the shared run called ``RunStore.log`` (every run of the study)."""
        return self._ensure(name)["writes"]

    def copy(self, name: str, to: Path) -> Path:
        """A writable copy of the shared study directory at ``to``; returns ``to``."""
        return Path(shutil.copytree(self(name), to))

    def _ensure(self, name: str) -> dict:
        out, done = self.root / name, self.root / f"{name}.json"
        with FileLock(self.root / f"{name}.lock", timeout=1800):
            if (failed := self.root / f"{name}.failed").is_file():
                pytest.fail(f"the shared smoke run of {name} failed:\n{failed.read_text()}")
            if not done.is_file():
                self._run(name, out, done)
        info = json.loads(done.read_text())
        self._used.setdefault(name, [tuple(f) for f in info["files"]])
        return {"out": out, "writes": info["writes"]}

    def _run(self, name: str, out: Path, done: Path) -> None:
        shutil.rmtree(out, ignore_errors=True)
        try:
            with counting_store_writes() as calls:
                outcome = studies.get(name).run(preset="smoke", out=out)
        except Exception:
            (self.root / f"{name}.failed").write_text(traceback.format_exc())
            raise
        (self.root / f"{name}.pickle").write_bytes(pickle.dumps(outcome))
        done.write_text(json.dumps({"writes": calls["n"], "files": _files(out)}))

    def check_untouched(self) -> None:
        """Fail where a test wrote into a shared directory this process used."""
        changed = [name for name, files in self._used.items() if _files(self.root / name) != files]
        if changed:
            pytest.fail(f"tests wrote into the shared smoke runs of {changed}: copy them first")


def tiny_transformer(*, seed: int = 0, **overrides) -> Transformer:
    """A float64 :class:`Transformer` with 2 layers, d_model 12, n_heads 3, d_mlp 7, d_vocab 11,
    d_out 5, n_ctx 7 (pairwise-distinct sizes), initialized from ``torch.manual_seed(seed)``;
    ``overrides`` replace any constructor argument."""
    torch.manual_seed(seed)
    config = dict(n_layers=2, d_model=12, n_heads=3, d_mlp=7, d_vocab=11, d_out=5, n_ctx=7)
    return Transformer(**(config | overrides)).double()


TINY = """\
name: tiny
task: {name: associative_recall, n_keys: 6, n_values: 5, n_pairs: 3}
model: {name: transformer, d_model: 12, n_heads: 3, d_mlp: 0}
train: {steps: 6, batch_size: 4, eval_every: 3, checkpoint_every: 3}
"""


def invoke(*args: str | Path):
    """``dynascope ARGS`` in this process (typer's CliRunner); returns its ``Result``."""
    from typer.testing import CliRunner

    from dynascope.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def assert_one_line_error(result, pattern: str) -> None:
    """Exit 2, nothing on stdout, exactly one stderr line ``error: ...`` matching ``pattern``."""
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert re.search(pattern, lines[0]), lines[0]
