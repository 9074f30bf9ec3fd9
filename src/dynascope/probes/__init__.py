"""Instruments: pure functions on tensors, and thin :class:`Probe` classes that read a model.

``probe(model, ctx) -> dict[str, Tensor | float]``; see :mod:`dynascope.probes.base` for the
contract and the registry (:data:`PROBES`, :func:`register_probe`, :func:`make_probe`).
"""

from .attention import COLLAPSE_THRESHOLD_NATS as COLLAPSE_THRESHOLD_NATS
from .attention import AttentionEntropy as AttentionEntropy
from .attention import attention_entropy as attention_entropy
from .attention import entropy_collapsed as entropy_collapsed
from .attention import head_entropy as head_entropy
from .attention import normalized_attention_entropy as normalized_attention_entropy
from .base import PROBES as PROBES
from .base import Probe as Probe
from .base import ProbeContext as ProbeContext
from .base import isolated as isolated
from .base import make_probe as make_probe
from .base import register_probe as register_probe
from .delta import DeltaSpectrum as DeltaSpectrum
from .delta import delta_factors as delta_factors
from .delta import delta_ov_factors as delta_ov_factors
from .delta import delta_ov_singular_values as delta_ov_singular_values
from .delta import delta_qk_factors as delta_qk_factors
from .delta import delta_qk_singular_values as delta_qk_singular_values
from .delta import normalized_spectrum as normalized_spectrum
from .delta import snapshot_views as snapshot_views
from .latent import latent_covariance as latent_covariance
from .latent import latent_covariance_spectrum as latent_covariance_spectrum
from .latent import latent_effective_rank as latent_effective_rank
from .latent import latent_rank as latent_rank
from .norms import GradientNorms as GradientNorms
from .norms import LastLayerNorm as LastLayerNorm
from .norms import ParameterGroupNorms as ParameterGroupNorms
from .norms import ParameterNorms as ParameterNorms
from .norms import UpdateNorms as UpdateNorms
from .norms import difference_norms as difference_norms
from .norms import frobenius_norms as frobenius_norms
from .norms import group_norms as group_norms
from .norms import last_layer_name as last_layer_name
from .norms import layer_groups as layer_groups
from .norms import role_groups as role_groups
from .slingshot import SlingshotCycle as SlingshotCycle
from .slingshot import detect_slingshots as detect_slingshots
from .slingshot import grok_step as grok_step
from .slingshot import onset_distance as onset_distance
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
