"""The catalog of registered studies, read without importing them (hence without torch).

Glossary:
    registry:  the study packages themselves: every public sub-package ``studies/<name>/``
               holds one study, ``STUDY``, named ``<name>`` with ``-`` for ``_``
               (:func:`dynascope.studies.names`, :func:`dynascope.studies.get`).
    catalog:   a data file, ``studies/catalog.json`` (:data:`CATALOG_FILE`), that records each
               study's name, presets, claim and reproducing clause, so that ``dynascope --help``,
               ``dynascope study list`` and a refused ``study run`` start without importing the
               studies. ``dynascope study catalog --write`` writes it from the registry
               (:func:`dynascope.studies.catalog_entries`); ``tests/test_catalog.py`` fails
               when the file differs from what that command would write.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

__all__ = ["CATALOG_FILE", "CatalogEntry", "catalog_text", "check", "read_catalog"]

CATALOG_FILE = Path(__file__).parent / "studies" / "catalog.json"


class CatalogEntry(NamedTuple):
    """One registered study as the catalog records it."""

    name: str
    """The study's registered name (``weight-decay-low-rank``)."""
    presets: tuple[str, ...]
    """Its presets, cheapest first (:data:`dynascope.presets.PRESETS` order)."""
    claim: str
    """The finding it tests, one sentence."""
    reproduces: str
    """The opening clause of its protocol's ``reproduces``
    (:func:`dynascope.presets.reproduces_clause`); ``""`` without a protocol."""


def catalog_text(entries: Iterable[CatalogEntry]) -> str:
    """The catalog file's text for ``entries``: a JSON list of objects, sorted by name, one
    key per line, UTF-8 kept as written (so that a diff of the file reads)."""
    rows = [entry._asdict() | {"presets": list(entry.presets)} for entry in entries]
    return (
        json.dumps(sorted(rows, key=lambda row: row["name"]), indent=1, ensure_ascii=False) + "\n"
    )


def read_catalog(path: Path | None = None) -> tuple[CatalogEntry, ...]:
    """The catalog in ``path`` (default :data:`CATALOG_FILE`), sorted by name.

    Raises:
        ValueError: if the file is missing, is not JSON, or an entry lacks a field; the message
            names the file and says how to write it again.
    """
    path = CATALOG_FILE if path is None else path
    redo = "write it with `dynascope study catalog --write`"
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
        return tuple(
            CatalogEntry(row["name"], tuple(row["presets"]), row["claim"], row["reproduces"])
            for row in rows
        )
    except FileNotFoundError:
        raise ValueError(f"{path}: the study catalog is missing ({redo})") from None
    except (json.JSONDecodeError, TypeError, KeyError) as err:
        raise ValueError(f"{path}: not a study catalog ({err!r}; {redo})") from None


def check(name: str, preset: str | None = None) -> None:
    """Refuse an unknown study name or preset before anything heavy is imported.

    Raises:
        ValueError: ``name`` is not a registered study, or ``preset`` is not one of its
            presets; the message lists the allowed values.
    """
    presets = {entry.name: entry.presets for entry in read_catalog()}
    if name not in presets:
        raise ValueError(f"unknown study {name!r} (allowed: {', '.join(sorted(presets))})")
    if preset is not None and preset not in presets[name]:
        raise ValueError(f"preset must be one of {', '.join(presets[name])} (got {preset!r})")
