"""RunStore: one run directory, with metrics in SQLite and checkpoints beside them.

Layout of a run directory::

    RUN_DIR/
      config.yaml            the validated config (``model_dump(mode="json")``)
      metrics.sqlite         tables scalars(step, key, value)
                                    tensors(step, key, dtype, shape, data)
                                    events(id, step, kind, detail)
      checkpoints/step_N.pt  loaded with ``torch.load(..., weights_only=True)``
      figures/  report.html  written by ``dynascope.report``

Rows are buffered in memory and committed in one transaction per :meth:`RunStore.flush`
(every ``flush_every`` rows, at least every ``flush_seconds`` while rows are logged, and always
before writing a checkpoint), so a run killed at any moment keeps every committed row, and a
reader (``dynascope show --follow``) sees a run's progress within seconds. ``(step, key)`` is
the primary key of ``scalars`` and ``tensors``: logging the same key at the same step again
replaces the row, so a resumed run never duplicates rows. The database uses WAL journaling.

The run's lifecycle is recorded in ``events`` rows of kind ``status`` whose detail is one of
``running``, ``finished``, ``diverged``, ``interrupted``, ``failed``; :attr:`RunStore.status`
reads the latest.

Crash safety: a row is durable once its transaction commits (``synchronous=NORMAL`` in WAL
mode survives a killed process; a power cut may lose the last commits, never corrupt the
file). A transaction cut short by SIGKILL is rolled back when the database is next opened.
Checkpoints are written to a temporary file, ``fsync``-ed, then renamed over the target, so
``checkpoints/`` only ever holds complete files.

Concurrency: a writer holds an exclusive ``flock`` on ``RUN_DIR/.lock`` (which records its pid
and host); a second writer is refused with :class:`RunLockedError`; the operating system drops
the lock of a killed process, and its leftover record is taken over with a
:class:`RuntimeWarning`. Readers
(:func:`load_run`) never lock. :func:`create_run_dir` makes a fresh directory under a shared
parent atomically (``os.mkdir``), adding ``-2``, ``-3``, ... when the name is taken.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import sqlite3
import time
import warnings
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import yaml
from torch import Tensor

from dynascope.keys import HEAD_COLUMN, parse_key

__all__ = [
    "CONFIG_FILE",
    "CorruptFileError",
    "FIGURES_DIR",
    "METRICS_FILE",
    "REPORT_FILE",
    "STATUSES",
    "VERDICT_FILE",
    "load_study",
    "Run",
    "RunLock",
    "RunLockedError",
    "RunStore",
    "STUDY_FILE",
    "read_json",
    "read_yaml",
    "UnsafeCheckpointError",
    "create_run_dir",
    "load_run",
    "stored_run",
    "lock_is_free",
    "peek_run",
    "RunPeek",
    "safe_name",
]

STATUSES = ("running", "finished", "diverged", "interrupted", "failed")

# file names of a run directory (the layout above), and the verdict a study directory adds
CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.sqlite"
REPORT_FILE = "report.html"
FIGURES_DIR = "figures"
VERDICT_FILE = "verdict.json"
STUDY_FILE = "study.json"  # a study directory's manifest (dynascope.studies._plan)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS scalars (
    step INTEGER NOT NULL, key TEXT NOT NULL, value REAL,
    PRIMARY KEY (step, key));
CREATE TABLE IF NOT EXISTS tensors (
    step INTEGER NOT NULL, key TEXT NOT NULL, dtype TEXT NOT NULL, shape TEXT NOT NULL,
    data BLOB NOT NULL, PRIMARY KEY (step, key));
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, step INTEGER NOT NULL, kind TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT '');
"""


_SAFE_NAME = re.compile(r"^[A-Za-z0-9_=+-][A-Za-z0-9_.=+-]{0,99}$")


def safe_name(name: str, field: str = "name") -> str:
    """Check that a user-given name can be used as one path component, and return it.

    Allowed: 1-100 characters from ``A-Z a-z 0-9 _ . = + -``, not starting with ``.`` (so
    no ``..``, no hidden files, no path separators, no absolute paths).

    Raises:
        ValueError: naming ``field``, the value and the allowed characters.
    """
    if not isinstance(name, str) or not _SAFE_NAME.match(name):
        raise ValueError(
            f"{field} must be 1-100 characters from A-Z a-z 0-9 _ . = + - and must not start "
            f"with '.' (got {name!r})"
        )
    return name


def create_run_dir(parent: str | os.PathLike[str], name: str) -> Path:
    """Create a new, empty run directory ``parent/name`` atomically; never reuse one.

    When ``parent/name`` exists, tries ``name-2``, ``name-3``, ... ``os.mkdir`` either creates
    the directory or fails, so concurrent processes asking for the same name under one
    parent each get their own directory.

    Raises:
        ValueError: if ``name`` is not a :func:`safe_name`.
    """
    safe_name(name, "run name")
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 100_000):
        path = parent / (name if n == 1 else f"{name}-{n}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"no free run directory name under {str(parent)!r} for {name!r}")


class UnsafeCheckpointError(ValueError):
    """A checkpoint holds objects that ``torch.load(weights_only=True)`` refuses to build."""


class RunLockedError(RuntimeError):
    """Another live process writes to this run directory."""


class CorruptFileError(ValueError):
    """A run or study file (``config.yaml``, ``study.json``, ``verdict.json``) does not parse."""


def read_yaml(path: Path) -> Any:
    """``yaml.safe_load`` of a file the project wrote.

    Raises:
        CorruptFileError: the file is not valid YAML (one line: the file, the line, the problem).
    """
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or type(err).__name__
        raise CorruptFileError(f"{str(path)!r} is not valid YAML{where} ({problem})") from None


def read_json(path: Path) -> Any:
    """``json.loads`` of a file the project wrote.

    Raises:
        CorruptFileError: the file is not valid JSON (one line: the file, the line, the problem).
    """
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise CorruptFileError(
            f"{str(path)!r} is not valid JSON at line {err.lineno} ({err.msg})"
        ) from None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class RunLock:
    """``RUN_DIR/.lock``: one writer per run directory (see the module docstring).

    The lock is an exclusive ``fcntl.flock`` on the file, which the operating system releases
    when its process dies (SIGKILL included), so two processes can never both hold it, even
    when both find a lock left behind by a killed run. The file records the holder's pid and
    host for messages; a record left by a dead process is taken over with a warning. (``flock``
    is per host: on a network file system shared by several hosts, run each run on one host.)

    Args:
        run_dir: an existing run directory.
    Raises:
        RunLockedError: if another live process holds the lock.
    """

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.path = Path(run_dir) / ".lock"
        self._fd: int | None = None
        self._acquire()

    def _acquire(self) -> None:
        import fcntl

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            owner = self._owner()
            who = f"pid {owner[0]} on {owner[1]}" if owner else "another process"
            raise RunLockedError(
                f"run directory {str(self.path.parent)!r} is in use by {who} "
                f"(lock file {self.path.name}); wait for it to finish"
            ) from None
        owner = self._owner()
        if owner is not None and owner[0] != os.getpid():
            warnings.warn(
                f"taking over the lock of {str(self.path.parent)!r} left by pid {owner[0]}, "
                "which is no longer running",
                RuntimeWarning,
                stacklevel=3,
            )
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        self._fd = fd

    def _owner(self) -> tuple[int, str] | None:
        try:
            pid, host = self.path.read_text().split()
            return int(pid), host
        except (FileNotFoundError, ValueError):
            return None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def release(self) -> None:
        """Clear the record and release the lock (the file stays: removing it could let two
        processes lock two different files)."""
        if self._fd is None:
            return
        import fcntl

        try:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            os.close(self._fd)
            self._fd = None


def lock_is_free(run_dir: str | os.PathLike[str]) -> bool:
    """True if no live process holds ``RUN_DIR/.lock`` (for tests and tools)."""
    import fcntl

    path = Path(run_dir) / ".lock"
    if not path.exists():
        return True
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def _to_float(value: Any) -> float:
    if isinstance(value, Tensor):
        return float(value.detach().double().cpu())
    return float(value)


class RunStore:
    """Writer for one run directory (see the module docstring for the layout).

    Args:
        path: the run directory; created (with parents) if missing.
        flush_every: buffered rows that trigger a commit on :meth:`log`.
        flush_seconds: seconds after the last commit after which :meth:`log` commits the
            buffer whatever its size (``None``: by rows only).
        lock: take ``RUN_DIR/.lock`` for the store's lifetime (:class:`RunLock`).
    Raises:
        RunLockedError: with ``lock=True``, if another live process holds the run.
        sqlite3.DatabaseError: if ``metrics.sqlite`` exists but is not a database.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        flush_every: int = 2000,
        flush_seconds: float | None = 2.0,
        lock: bool = False,
    ) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.flush_every = flush_every
        self.flush_seconds = flush_seconds
        self._committed_at = time.monotonic()
        self._lock = RunLock(self.path) if lock else None
        db_path = self.path / "metrics.sqlite"
        created = not db_path.exists()
        db = None
        try:
            db = sqlite3.connect(db_path, timeout=30.0)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(_SCHEMA)
            db.commit()
        except BaseException:  # a signal too: leave no store without its tables behind
            if db is not None:
                db.close()
            if created:
                for suffix in ("", "-wal", "-shm"):
                    db_path.with_name(db_path.name + suffix).unlink(missing_ok=True)
            if self._lock is not None:
                self._lock.release()
            raise
        self._db = db
        self._scalars: list[tuple[int, str, float]] = []
        self._tensors: list[tuple[int, str, str, str, bytes]] = []

    # -- metrics -------------------------------------------------------------------------
    def log(self, step: int, values: dict[str, Tensor | float | int]) -> None:
        """Buffer metrics for ``step``: scalars (floats, 0-d/1-element tensors) and tensors.

        Tensors with more than one element go to the ``tensors`` table as float32 or their
        own dtype (as raw bytes, C order). Commits when the buffer reaches ``flush_every`` rows
        or ``flush_seconds`` have passed since the last commit.
        """
        for key, value in values.items():
            if isinstance(value, Tensor) and value.numel() != 1:
                array = value.detach().cpu().contiguous().numpy()
                self._tensors.append(
                    (step, key, str(array.dtype), json.dumps(list(array.shape)), array.tobytes())
                )
            else:
                self._scalars.append((step, key, _to_float(value)))
        if len(self._scalars) + len(self._tensors) >= self.flush_every or (
            self.flush_seconds is not None
            and time.monotonic() - self._committed_at >= self.flush_seconds
        ):
            self.flush()

    def flush(self) -> None:
        """Commit buffered rows in one transaction."""
        self._committed_at = time.monotonic()
        if not self._scalars and not self._tensors:
            return
        with self._db:
            self._db.executemany(
                "INSERT OR REPLACE INTO scalars(step, key, value) VALUES (?, ?, ?)",
                [(s, k, None if math.isnan(v) else v) for s, k, v in self._scalars],
            )
            self._db.executemany(
                "INSERT OR REPLACE INTO tensors(step, key, dtype, shape, data) "
                "VALUES (?, ?, ?, ?, ?)",
                self._tensors,
            )
        self._scalars.clear()
        self._tensors.clear()

    def event(self, step: int, kind: str, detail: str = "") -> None:
        """Append an ``events`` row and commit it (with any buffered metrics) at once."""
        self.flush()
        with self._db:
            self._db.execute(
                "INSERT INTO events(step, kind, detail) VALUES (?, ?, ?)", (step, kind, detail)
            )

    def set_status(self, step: int, status: str) -> None:
        """Record the run's status (one of :data:`STATUSES`).

        Raises:
            ValueError: for an unknown status.
        """
        if status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)} (got {status!r})")
        self.event(step, "status", status)

    @property
    def status(self) -> str | None:
        """The latest recorded status, or ``None`` for a run that never started."""
        return _latest_status(self._db)

    def truncate_after(self, step: int) -> None:
        """Delete every metric and event row logged after ``step`` (used on resume)."""
        self._scalars = [r for r in self._scalars if r[0] <= step]
        self._tensors = [r for r in self._tensors if r[0] <= step]
        with self._db:
            for table in ("scalars", "tensors", "events"):
                self._db.execute(f"DELETE FROM {table} WHERE step > ?", (step,))

    # -- config and checkpoints ------------------------------------------------------------
    def write_config(self, config: dict[str, Any]) -> None:
        """Write ``config.yaml`` atomically."""
        _atomic_write_text(self.path / "config.yaml", yaml.safe_dump(config, sort_keys=False))

    def read_config(self) -> dict[str, Any]:
        """Read ``config.yaml`` with ``yaml.safe_load``."""
        return read_yaml(self.path / "config.yaml") or {}

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / "checkpoints"

    def save_checkpoint(self, step: int, state: dict[str, Any]) -> Path:
        """Flush metrics, then write ``checkpoints/step_N.pt`` atomically (tmp file + rename).

        ``state`` must hold only tensors, numbers, strings and containers of them, so that it
        loads with ``weights_only=True``.
        """
        self.flush()
        self.checkpoint_dir.mkdir(exist_ok=True)
        target = self.checkpoint_dir / f"step_{step}.pt"
        tmp = target.with_suffix(".pt.tmp")
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
        return target

    def checkpoints(self) -> list[tuple[int, Path]]:
        """``(step, path)`` of every complete checkpoint, in step order."""
        if not self.checkpoint_dir.is_dir():
            return []
        found = []
        for p in self.checkpoint_dir.glob("step_*.pt"):
            try:
                found.append((int(p.stem.removeprefix("step_")), p))
            except ValueError:
                continue
        return sorted(found)

    def load_checkpoint(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        """Load a checkpoint with ``weights_only=True`` (no pickled code is ever run).

        Raises:
            UnsafeCheckpointError: if the file holds anything but tensors, numbers, strings
                and containers (for example a pickled callable), or is not a checkpoint.
        """
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # torch raises UnpicklingError for disallowed globals
            raise UnsafeCheckpointError(
                f"checkpoint {str(path)!r} was refused: it holds objects other than tensors "
                f"and plain data ({type(err).__name__})"
            ) from None

    def close(self) -> None:
        """Flush and close the database; release the lock."""
        try:
            self.flush()
            self._db.close()
        finally:
            if self._lock is not None:
                self._lock.release()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _latest_status(db: sqlite3.Connection) -> str | None:
    row = db.execute(
        "SELECT detail FROM events WHERE kind = 'status' ORDER BY id DESC LIMIT 1"
    ).fetchone()
    return None if row is None else row[0]


class _ReadOnlyConnection(sqlite3.Connection):
    """A read-only connection that leaves the run directory as it found it.

    Reading a WAL database creates ``-wal``/``-shm`` files, and a read-only connection cannot
    remove them when it closes. If they were absent when it opened (no writer held the
    database), :meth:`close` opens one read-write connection and closes it: the last connection
    to close checkpoints the WAL and deletes both files (SQLite does nothing while another
    connection, e.g. a writer that started meanwhile, is still open).
    """

    tidy_path: Path | None = None

    def close(self) -> None:
        super().close()
        if self.tidy_path is not None:
            path, self.tidy_path = self.tidy_path, None
            try:
                with closing(sqlite3.connect(path, timeout=30.0)) as db:
                    db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
            except sqlite3.Error:  # a read-only directory: nothing was created there either
                pass


def _connect_ro(db_path: Path) -> sqlite3.Connection:
    fresh = not db_path.with_name(db_path.name + "-wal").exists()
    # as_uri() percent-encodes '?' and '#' in the path, which a raw "file:" URI would misread
    db = sqlite3.connect(
        f"{db_path.resolve().as_uri()}?mode=ro",
        uri=True,
        timeout=30.0,
        factory=_ReadOnlyConnection,
    )
    if fresh:
        db.tidy_path = db_path
    return db


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@dataclass
class Run:
    """A finished or running run, read back from its directory (see :func:`load_run`).

    Attributes:
        path: the run directory.
        config: the parsed ``config.yaml`` (a dict).
        scalars: DataFrame with columns ``step, key, value``, sorted by step then key, and the
            key's parts (:func:`dynascope.keys.parse_key`): ``layer`` and ``head_index``
            (nullable ``Int64``, ``<NA>`` where the key has none; ``head`` before dynascope
            0.2) and ``metric`` (the key without them).
        events: DataFrame with columns ``step, kind, detail`` in insertion order.
        status: latest status (``finished``, ``diverged``, ...) or ``None``.
    """

    path: Path
    config: dict[str, Any]
    scalars: pd.DataFrame
    events: pd.DataFrame
    status: str | None

    @property
    def name(self) -> str:
        return self.path.name

    def scalar(self, key: str) -> pd.Series:
        """One scalar key as a Series indexed by step."""
        rows = self.scalars[self.scalars["key"] == key]
        return pd.Series(rows["value"].to_numpy(), index=rows["step"].to_numpy(), name=key)

    def last(self, key: str) -> float:
        """The value of ``key`` at its last logged step.

        Raises:
            KeyError: if the run never logged ``key``.
        """
        series = self.scalar(key)
        if series.empty:
            raise KeyError(f"run {self.name!r} has no scalar {key!r}")
        return float(series.iloc[-1])

    def tensors(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """All logged values of tensor ``key``: ``(steps [n], values [n, *shape])``.

        Raises:
            KeyError: if the run never logged ``key``.
        """
        with closing(_connect_ro(self.path / "metrics.sqlite")) as db:
            rows = db.execute(
                "SELECT step, dtype, shape, data FROM tensors WHERE key = ? ORDER BY step", (key,)
            ).fetchall()
        if not rows:
            raise KeyError(f"run {self.name!r} has no tensor {key!r}")
        steps = np.array([r[0] for r in rows])
        values = np.stack([np.frombuffer(r[3], dtype=r[1]).reshape(json.loads(r[2])) for r in rows])
        return steps, values


def load_run(path: str | os.PathLike[str]) -> Run:
    """Read a run directory into pandas DataFrames.

    Args:
        path: a run directory written by :class:`RunStore`.
    Returns:
        :class:`Run` with ``.config``, ``.scalars``, ``.events``, ``.status`` and
        ``.tensors(key)``.
    Raises:
        FileNotFoundError: if ``path`` does not exist, holds no ``metrics.sqlite``, or holds
            one without the store's tables (a writer stopped between creating the file and
            its schema: a run that never started).
    """
    path = Path(path)
    db_path = path / "metrics.sqlite"
    if not path.exists():
        raise FileNotFoundError(f"no such directory: {str(path)!r}")
    if not db_path.is_file():
        raise FileNotFoundError(f"not a run directory (no metrics.sqlite): {str(path)!r}")
    config = {}
    if (path / "config.yaml").is_file():
        config = read_yaml(path / "config.yaml") or {}
    with closing(_connect_ro(db_path)) as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not {"scalars", "events"} <= tables:
            raise FileNotFoundError(
                f"not a run yet (metrics.sqlite has no tables: stopped while it was being "
                f"created): {str(path)!r}"
            )
        scalars = pd.read_sql_query("SELECT step, key, value FROM scalars ORDER BY step, key", db)
        scalars["value"] = scalars["value"].astype("float64")  # NULL (a NaN logged) -> NaN
        _add_key_parts(scalars)
        events = pd.read_sql_query("SELECT step, kind, detail FROM events ORDER BY id", db)
        status = _latest_status(db)
    return Run(path=path, config=config, scalars=scalars, events=events, status=status)


def stored_run(path: str | os.PathLike[str]) -> Run | None:
    """:func:`load_run`, or ``None`` where it raises FileNotFoundError: no ``metrics.sqlite``,
    or one stopped before its tables were written (a run that never started)."""
    try:
        return load_run(path)
    except FileNotFoundError:
        return None


@dataclass(frozen=True)
class RunPeek:
    """Where a run stands, as its committed rows say (see :func:`peek_run`).

    Attributes:
        status: the latest status (:data:`STATUSES`), or ``None`` before the first.
        step: the last step of any committed scalar or event row (``None``: no row yet).
        loss: the last committed ``train.loss`` (``None``: none yet; ``nan`` if it was NaN).
    """

    status: str | None
    step: int | None
    loss: float | None


def peek_run(path: str | os.PathLike[str]) -> RunPeek | None:
    """A run's status, last step and last training loss, from three indexed queries: cheap
    enough to poll every second while the run writes (:func:`load_run` reads every row).

    Args:
        path: a run directory.
    Returns:
        :class:`RunPeek`, or ``None`` where there is no run yet (no ``metrics.sqlite``, or one
        without the store's tables).
    Raises:
        sqlite3.DatabaseError: if ``metrics.sqlite`` is not a database.
    """
    db_path = Path(path) / METRICS_FILE
    if not db_path.is_file():
        return None
    with closing(_connect_ro(db_path)) as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not {"scalars", "events"} <= tables:
            return None
        steps = [
            db.execute(f"SELECT max(step) FROM {t}").fetchone()[0] for t in ("scalars", "events")
        ]
        loss = db.execute(
            "SELECT value FROM scalars WHERE key = 'train.loss' ORDER BY step DESC LIMIT 1"
        ).fetchone()
        status = _latest_status(db)
    known = [s for s in steps if s is not None]
    if loss is not None:  # a NaN is stored as NULL
        loss = math.nan if loss[0] is None else float(loss[0])
    return RunPeek(status, max(known) if known else None, loss)


def _add_key_parts(scalars: pd.DataFrame) -> None:
    """Add ``layer``, ``head_index`` (Int64) and ``metric`` columns parsed from ``key``."""
    codes, unique = pd.factorize(scalars["key"])  # parse each distinct key once
    parts = [parse_key(key) for key in unique]

    def nullable(values: list[int | None]) -> pd.arrays.IntegerArray:
        data = np.array([-1 if v is None else v for v in values], dtype=np.int64)
        missing = np.array([v is None for v in values], dtype=bool)
        return pd.arrays.IntegerArray(data[codes], missing[codes])

    scalars["layer"] = nullable([p.layer for p in parts])
    scalars[HEAD_COLUMN] = nullable([p.head for p in parts])
    metric = np.array([p.metric for p in parts] or [""], dtype=object)[codes]
    scalars["metric"] = pd.Series(metric, index=scalars.index, dtype=str)


def _flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists become tuples (hashable, for groupby)."""
    flat: dict[str, Any] = {}
    for name, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{name}."))
        else:
            flat[f"{prefix}{name}"] = tuple(value) if isinstance(value, list) else value
    return flat


_STUDY_COLUMNS = ("run", "status", "step", "key", "value", "layer", HEAD_COLUMN, "metric")


def load_study(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Every scalar of every run in a study directory, with each run's config as columns.

    The runs are the run directories (holding ``metrics.sqlite``) under ``path/runs/`` (what
    ``dynascope study run --out PATH`` writes), or else directly under ``path``. A run's config
    is its ``config.yaml``, or its entry in ``path/study.json`` when it has none; nested fields
    are flattened with dots (``optimizer.lr``; lists become tuples). A config field whose name
    is one of the other columns is prefixed ``config.``. Runs without a config field get
    ``NaN`` in that column.

    Args:
        path: a study directory (or any directory of run directories).
    Returns:
        DataFrame, one row per logged scalar: ``run`` (the run directory's name), ``status``,
        ``step, key, value, layer, head_index, metric`` (as :attr:`Run.scalars`), then the config
        columns in order of first appearance. A run that logged no scalar (only tensors, or
        nothing yet) has one row with missing ``step``/``key``/``value``, so that its status
        and config still show. Sorted by run, then step, then key.
    Raises:
        FileNotFoundError: if ``path`` holds no run directory.
    """
    path = Path(path)
    base = path / "runs" if (path / "runs").is_dir() else path
    run_dirs = (
        sorted(p for p in base.iterdir() if (p / "metrics.sqlite").is_file())
        if (base.is_dir())
        else []
    )
    if not run_dirs:
        raise FileNotFoundError(
            f"no run directories (with metrics.sqlite) under {str(path)!r} or its runs/"
        )
    manifest: dict[str, Any] = {}
    if (path / STUDY_FILE).is_file():
        manifest = read_json(path / STUDY_FILE).get("runs", {}) or {}
    frames = []
    for run_dir in run_dirs:
        run = load_run(run_dir)
        config = _flatten(run.config or manifest.get(run_dir.name) or {})
        frame = run.scalars.copy()
        if frame.empty:  # a run that logged only tensors (or nothing yet) still shows
            frame = frame.reindex([0]).astype({"step": "Int64"})
        frame.insert(0, "run", run_dir.name)
        frame.insert(1, "status", run.status)
        for name, value in config.items():
            column = f"config.{name}" if name in _STUDY_COLUMNS else name
            frame[column] = [value] * len(frame)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)
