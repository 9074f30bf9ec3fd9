"""Study hyla-fuzzy-logic (notes: docs/studies/hyla-fuzzy-logic.md)."""
