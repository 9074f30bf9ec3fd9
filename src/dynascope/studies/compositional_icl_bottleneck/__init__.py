"""Study compositional-icl-bottleneck (notes: docs/studies/compositional-icl-bottleneck.md)."""

from dynascope.studies.compositional_icl_bottleneck.study import STUDY

__all__ = ["STUDY"]
