"""Side-by-side comparison of two run directories or two study directories.

Glossary:
    A, B:   the two directories, in the order given.
    delta:  ``B - A`` for a metric both hold (``nan`` when either is missing or not finite).

Runs are compared by the last logged value of every scalar (per-head keys ``L*.H*`` left out,
as in ``dynascope show``) plus their status and last step; studies by each claim's measured
value, threshold, verdict, status and control value (the base seed too), and each run's
status. :func:`config_differences` lists the config fields that differ (for studies, per run
present in both).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from dynascope.store import load_run, read_json

__all__ = ["compare_dirs", "config_differences"]


def _kind(path: Path) -> str:
    if (path / "verdict.json").is_file():
        return "study"
    if (path / "metrics.sqlite").is_file():
        return "run"
    raise ValueError(
        f"DIR: {str(path)!r} is neither a run directory (metrics.sqlite) nor a study directory "
        "(verdict.json)"
    )


def _run_values(path: Path) -> dict[str, float | str]:
    run = load_run(path)
    values: dict[str, float | str] = {"status": str(run.status)}
    if run.scalars.empty:
        return values
    values["last step"] = float(run.scalars["step"].max())
    last = run.scalars.groupby("key").tail(1)
    for key, value in zip(last["key"], last["value"]):
        if not (key.startswith("L") and ".H" in key):
            values[key] = float(value)
    return values


def _study_values(path: Path) -> dict[str, float | str]:
    info = read_json(path / "verdict.json")
    values: dict[str, float | str] = {"study": info["study"], "preset": info["preset"]}
    if info.get("seed") is not None:
        values["seed"] = float(info["seed"])
    for claim in info["claims"]:
        cid = claim["claim"].split(":")[0].strip()
        measured = claim["measured"]
        values[f"{cid} measured"] = math.nan if measured is None else float(measured)
        values[f"{cid} threshold"] = float(claim["threshold"])
        values[f"{cid} passed"] = "yes" if claim["passed"] else "no"
        if "status" in claim:
            values[f"{cid} status"] = claim["status"]
        control = claim.get("control")
        if control:
            values[f"{cid} control"] = (
                math.nan if control["measured"] is None else control["measured"]
            )
    for row in info["runs"]:
        values[f"run {row['name']}"] = str(row["status"])
    return values


def compare_dirs(a: Path, b: Path) -> tuple[str, list[dict[str, Any]]]:
    """Rows ``{key, a, b, delta}`` over the union of both directories' metrics.

    Returns:
        ``(kind, rows)`` with kind ``"run"`` or ``"study"``; keys in first-seen order (A's,
        then B's new ones); a missing value is ``None``.
    Raises:
        ValueError: if a directory is neither kind, or one is a run and the other a study.
    """
    kind_a, kind_b = _kind(a), _kind(b)
    if kind_a != kind_b:
        raise ValueError(
            f"DIR_B: cannot compare a {kind_a} directory with a {kind_b} directory "
            f"(got {str(a)!r} and {str(b)!r})"
        )
    read = _run_values if kind_a == "run" else _study_values
    va, vb = read(a), read(b)
    rows = []
    for key in list(va) + [k for k in vb if k not in va]:
        x, y = va.get(key), vb.get(key)
        delta = math.nan
        if isinstance(x, float) and isinstance(y, float) and math.isfinite(x) and math.isfinite(y):
            delta = y - x
        rows.append({"key": key, "a": x, "b": y, "delta": delta})
    return kind_a, rows


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists and scalars are leaves."""
    if not isinstance(data, dict):
        return {prefix: data}
    flat: dict[str, Any] = {}
    for key, value in data.items():
        flat.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def _configs(path: Path) -> dict[str, Any]:
    """Flattened config fields: a run's own, or every run of a study prefixed ``RUN/``."""
    if _kind(path) == "run":
        file = path / "config.yaml"
        return _flatten(yaml.safe_load(file.read_text()) or {}) if file.is_file() else {}
    flat: dict[str, Any] = {}
    for file in sorted(path.glob("runs/*/config.yaml")) or sorted(path.glob("*/config.yaml")):
        for key, value in _flatten(yaml.safe_load(file.read_text()) or {}).items():
            flat[f"{file.parent.name}/{key}"] = value
    return flat


def config_differences(a: Path, b: Path) -> list[dict[str, Any]]:
    """Config fields whose values differ between two run (or two study) directories.

    For studies, runs are matched by name; a run present in only one directory shows up as
    fields missing on the other side.

    Returns:
        Rows ``{key, a, b}`` (dotted keys, ``RUN/key`` for studies), in A's order then B's new
        keys; a field missing on one side is ``None`` there.
    Raises:
        ValueError: if a directory is neither a run nor a study directory.
    """
    ca, cb = _configs(a), _configs(b)
    keys = list(ca) + [k for k in cb if k not in ca]
    return [
        {"key": k, "a": ca.get(k), "b": cb.get(k)}
        for k in keys
        if k not in ca or k not in cb or ca[k] != cb[k]
    ]
