"""Studies: each published finding as runs + analysis + verdict (see ``studies/base.py``).

``dynascope.studies.get("weight-decay-low-rank").run(preset="fast", out="out/")``.
"""

from __future__ import annotations

import importlib

from .base import Analysis as Analysis
from .base import RunSpec as RunSpec
from .base import Study as Study
from .base import StudyOutcome as StudyOutcome
from .verdict import Control as Control
from .verdict import Precondition as Precondition
from .verdict import Verdict as Verdict
from .verdict import judge as judge


def _registry() -> dict[str, Study]:
    from .autoencoder_greedy_rank import STUDY as autoencoder_greedy_rank
    from .bottleneck_acceleration import STUDY as bottleneck_acceleration
    from .compositional_icl_bottleneck import STUDY as compositional_icl_bottleneck
    from .fisher_kernel_low_rank import STUDY as fisher_kernel_low_rank
    from .gated_rnn_attention import STUDY as gated_rnn_attention
    from .gradual_rank import STUDY as gradual_rank
    from .hyla_fuzzy_logic import STUDY as hyla_fuzzy_logic
    from .hyper_ut_pvr import STUDY as hyper_ut_pvr
    from .modular_teacher_student import STUDY as modular_teacher_student
    from .mup_coordinate_check import STUDY as mup_coordinate_check
    from .ntk_lazy_validity import STUDY as ntk_lazy_validity
    from .ntk_universality import STUDY as ntk_universality
    from .permuted_initialisations import STUDY as permuted_initialisations
    from .randomized_algorithms import STUDY as randomized_algorithms
    from .sigma_reparam_entropy import STUDY as sigma_reparam_entropy
    from .slingshot import STUDY as slingshot
    from .weight_decay_low_rank import STUDY as weight_decay_low_rank

    return {
        s.name: s
        for s in (
            autoencoder_greedy_rank,
            bottleneck_acceleration,
            compositional_icl_bottleneck,
            fisher_kernel_low_rank,
            gated_rnn_attention,
            gradual_rank,
            hyper_ut_pvr,
            hyla_fuzzy_logic,
            modular_teacher_student,
            mup_coordinate_check,
            ntk_lazy_validity,
            ntk_universality,
            permuted_initialisations,
            randomized_algorithms,
            sigma_reparam_entropy,
            slingshot,
            weight_decay_low_rank,
        )
    }


def names() -> list[str]:
    """Registered study names, sorted."""
    return sorted(_registry())


def get(name: str) -> Study:
    """The study registered as ``name`` (a study of the generated catalog imports only its
    own module).

    Raises:
        ValueError: unknown name; the message lists the registered studies.
    """
    from dynascope._study_catalog import CATALOG

    if any(entry[0] == name for entry in CATALOG):
        return importlib.import_module(f"{__name__}.{name.replace('-', '_')}").STUDY
    registry = _registry()
    if name not in registry:
        raise ValueError(f"unknown study {name!r} (allowed: {', '.join(sorted(registry))})")
    return registry[name]
