"""Studies: each published finding as runs + analysis + verdict (see ``studies/base.py``).

``dynascope.studies.get("weight-decay-low-rank").run(preset="fast", out="out/")``.
"""

from __future__ import annotations

from .base import Analysis as Analysis
from .base import RunSpec as RunSpec
from .base import Study as Study
from .base import StudyOutcome as StudyOutcome
from .base import Verdict as Verdict


def _registry() -> dict[str, Study]:
    from .autoencoder_greedy_rank import STUDY as autoencoder_greedy_rank
    from .gradual_rank import STUDY as gradual_rank
    from .sigma_reparam_entropy import STUDY as sigma_reparam_entropy
    from .slingshot import STUDY as slingshot
    from .weight_decay_low_rank import STUDY as weight_decay_low_rank

    return {
        s.name: s
        for s in (
            autoencoder_greedy_rank,
            gradual_rank,
            sigma_reparam_entropy,
            slingshot,
            weight_decay_low_rank,
        )
    }


def names() -> list[str]:
    """Registered study names, sorted."""
    return sorted(_registry())


def get(name: str) -> Study:
    """The study registered as ``name``.

    Raises:
        ValueError: unknown name; the message lists the registered studies.
    """
    registry = _registry()
    if name not in registry:
        raise ValueError(f"unknown study {name!r} (allowed: {', '.join(sorted(registry))})")
    return registry[name]
