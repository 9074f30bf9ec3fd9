"""Studies: each published finding as runs + analysis + verdict (see ``studies/base.py``).

``dynascope.studies.get("weight-decay-low-rank").run(preset="fast", out="out/")``.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator, Mapping

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


class _StudyPackages(Mapping[str, Study]):
    """name -> :class:`Study`: one per public sub-package ``studies/<name>/`` (``-`` for ``_``
    in the name), each package imported when its study is first read."""

    def _packages(self) -> dict[str, str]:
        return {
            info.name.replace("_", "-"): f"{__name__}.{info.name}"
            for info in pkgutil.iter_modules(__path__)
            if info.ispkg and not info.name.startswith("_")
        }

    def __getitem__(self, name: str) -> Study:
        return importlib.import_module(self._packages()[name]).STUDY

    def __iter__(self) -> Iterator[str]:
        return iter(self._packages())

    def __len__(self) -> int:
        return len(self._packages())

    def __contains__(self, name: object) -> bool:
        return name in self._packages()


def _registry() -> Mapping[str, Study]:
    """The registry: the study packages themselves (tests substitute a dict here)."""
    return _StudyPackages()


def names() -> list[str]:
    """Registered study names, sorted."""
    return sorted(_registry())


def get(name: str) -> Study:
    """The study registered as ``name``, importing only its own package.

    Raises:
        ValueError: unknown name; the message lists the registered studies.
    """
    registry = _registry()
    if name not in registry:
        raise ValueError(f"unknown study {name!r} (allowed: {', '.join(sorted(registry))})")
    return registry[name]


def catalog_entries() -> tuple[CatalogEntry, ...]:
    """Every registered study as the catalog records it (``dynascope study catalog --write``
    writes these to :data:`dynascope.catalog.CATALOG_FILE`); imports every study."""
    entries = []
    for name in names():
        study = get(name)
        reproduces = reproduces_clause(study.protocol.reproduces) if study.protocol else ""
        entries.append(CatalogEntry(name, tuple(study.presets), study.claim, reproduces))
    return tuple(entries)
