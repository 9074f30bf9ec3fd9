"""Study hyla-fuzzy-logic (notes: docs/studies/hyla-fuzzy-logic.md)."""

from dynascope.studies.hyla_fuzzy_logic.study import STUDY

__all__ = ["STUDY"]
