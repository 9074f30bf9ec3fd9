"""Studies: each published finding as runs + analysis + verdict (see ``studies/base.py``).

``dynascope.studies.get("weight-decay-low-rank").run(preset="fast", out="out/")``.
"""

from __future__ import annotations

import importlib
import pkgutil

from dynascope.catalog import CatalogEntry
from dynascope.presets import reproduces_clause

from .base import Analysis as Analysis
from .base import RunSpec as RunSpec
from .base import Study as Study
from .base import StudyOutcome as StudyOutcome
from .verdict import Control as Control
from .verdict import Precondition as Precondition
from .verdict import Verdict as Verdict
from .verdict import judge as judge


def names() -> list[str]:
    """Registered study names, sorted: the registry is the study packages themselves, every
    public sub-package ``studies/<name>/`` (``-`` for ``_`` in the name)."""
    return sorted(
        info.name.replace("_", "-")
        for info in pkgutil.iter_modules(__path__)
        if info.ispkg and not info.name.startswith("_")
    )


def get(name: str) -> Study:
    """The study registered as ``name``, importing only its own package.

    Raises:
        ValueError: unknown name; the message lists the registered studies.
    """
    registered = names()
    if name not in registered:
        raise ValueError(f"unknown study {name!r} (allowed: {', '.join(registered)})")
    return importlib.import_module(f"{__name__}.{name.replace('-', '_')}").STUDY


def catalog_entries() -> tuple[CatalogEntry, ...]:
    """Every registered study as the catalog records it (``dynascope study catalog --write``
    writes these to :data:`dynascope.catalog.CATALOG_FILE`); imports every study."""
    entries = []
    for name in names():
        study = get(name)
        reproduces = reproduces_clause(study.protocol.reproduces) if study.protocol else ""
        entries.append(CatalogEntry(name, tuple(study.presets), study.claim, reproduces))
    return tuple(entries)
