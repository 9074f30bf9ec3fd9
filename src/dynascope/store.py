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
(the Trainer flushes every few hundred rows and always before writing a checkpoint), so a run
killed at any moment keeps every committed row. ``(step, key)`` is the primary key of
``scalars`` and ``tensors``: logging the same key at the same step again replaces the row, so
a resumed run never duplicates rows. The database uses WAL journaling.

The run's lifecycle is recorded in ``events`` rows of kind ``status`` whose detail is one of
``running``, ``finished``, ``diverged``, ``interrupted``, ``failed``; :attr:`RunStore.status`
reads the latest.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import yaml
from torch import Tensor

__all__ = ["Run", "RunStore", "load_run", "STATUSES"]

STATUSES = ("running", "finished", "diverged", "interrupted", "failed")

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


def _to_float(value: Any) -> float:
    if isinstance(value, Tensor):
        return float(value.detach().double().cpu())
    return float(value)


class RunStore:
    """Writer for one run directory (see the module docstring for the layout).

    Args:
        path: the run directory; created (with parents) if missing.
        flush_every: buffered rows that trigger a commit on :meth:`log`.
    Raises:
        sqlite3.DatabaseError: if ``metrics.sqlite`` exists but is not a database.
    """

    def __init__(self, path: str | os.PathLike[str], *, flush_every: int = 2000) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.flush_every = flush_every
        self._db = sqlite3.connect(self.path / "metrics.sqlite", timeout=30.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._db.commit()
        self._scalars: list[tuple[int, str, float]] = []
        self._tensors: list[tuple[int, str, str, str, bytes]] = []

    # -- metrics -------------------------------------------------------------------------
    def log(self, step: int, values: dict[str, Tensor | float | int]) -> None:
        """Buffer metrics for ``step``: scalars (floats, 0-d/1-element tensors) and tensors.

        Tensors with more than one element go to the ``tensors`` table as float32 or their
        own dtype (as raw bytes, C order). Commits when the buffer exceeds ``flush_every``.
        """
        for key, value in values.items():
            if isinstance(value, Tensor) and value.numel() != 1:
                array = value.detach().cpu().contiguous().numpy()
                self._tensors.append(
                    (step, key, str(array.dtype), json.dumps(list(array.shape)), array.tobytes())
                )
            else:
                self._scalars.append((step, key, _to_float(value)))
        if len(self._scalars) + len(self._tensors) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        """Commit buffered rows in one transaction."""
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
        return yaml.safe_load((self.path / "config.yaml").read_text()) or {}

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
        torch.save(state, tmp)
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
            ValueError: if the file holds anything but tensors, numbers, strings and
                containers (for example a pickled callable).
        """
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # torch raises UnpicklingError for disallowed globals
            raise ValueError(
                f"checkpoint {str(path)!r} was refused: it holds objects other than tensors "
                f"and plain data ({type(err).__name__})"
            ) from None

    def close(self) -> None:
        """Flush and close the database."""
        self.flush()
        self._db.close()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _latest_status(db: sqlite3.Connection) -> str | None:
    row = db.execute(
        "SELECT detail FROM events WHERE kind = 'status' ORDER BY id DESC LIMIT 1"
    ).fetchone()
    return None if row is None else row[0]


def _connect_ro(db_path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=30.0)


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@dataclass
class Run:
    """A finished or running run, read back from its directory (see :func:`load_run`).

    Attributes:
        path: the run directory.
        config: the parsed ``config.yaml`` (a dict).
        scalars: DataFrame with columns ``step, key, value``, sorted by step then key.
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
        FileNotFoundError: if ``path`` holds no ``metrics.sqlite``.
    """
    path = Path(path)
    db_path = path / "metrics.sqlite"
    if not db_path.is_file():
        raise FileNotFoundError(f"not a run directory (no metrics.sqlite): {str(path)!r}")
    config = {}
    if (path / "config.yaml").is_file():
        config = yaml.safe_load((path / "config.yaml").read_text()) or {}
    with closing(_connect_ro(db_path)) as db:
        scalars = pd.read_sql_query("SELECT step, key, value FROM scalars ORDER BY step, key", db)
        scalars["value"] = scalars["value"].astype("float64")  # NULL (a NaN logged) -> NaN
        events = pd.read_sql_query("SELECT step, kind, detail FROM events ORDER BY id", db)
        status = _latest_status(db)
    return Run(path=path, config=config, scalars=scalars, events=events, status=status)
