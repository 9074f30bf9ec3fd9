"""Instruments: pure functions on tensors, and thin :class:`Probe` classes that read a model.

``probe(model, ctx) -> dict[str, Tensor | float]``; see :mod:`dynascope.probes.base` for the
contract and the registry (:data:`PROBES`, :func:`register_probe`, :func:`make_probe`).
"""

from .base import PROBES as PROBES
from .base import Probe as Probe
from .base import ProbeContext as ProbeContext
from .base import isolated as isolated
from .base import make_probe as make_probe
from .base import register_probe as register_probe
from .norms import ParameterNorms as ParameterNorms
from .norms import frobenius_norms as frobenius_norms
from .spectral import OVSpectrum as OVSpectrum
from .spectral import QKSpectrum as QKSpectrum
from .spectral import balancedness as balancedness
from .spectral import effective_rank as effective_rank
from .spectral import factor_singular_values as factor_singular_values
from .spectral import l2_nuclear_gap as l2_nuclear_gap
from .spectral import l2_term as l2_term
from .spectral import nuclear_norm as nuclear_norm
from .spectral import ov_factors as ov_factors
from .spectral import ov_singular_values as ov_singular_values
from .spectral import qk_factors as qk_factors
from .spectral import qk_singular_values as qk_singular_values
from .spectral import rank_above as rank_above
from .spectral import rank_at as rank_at
from .spectral import stable_rank as stable_rank
