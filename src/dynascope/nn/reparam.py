"""σReparam: every linear map divided by its spectral norm and scaled by a learned scalar.

Glossary:
    W:        a stored weight (the parametrization's ``original``), in its module's layout.
    M:        W viewed as a matrix ``[*batch, d_out, d_in]`` (rows = outputs), see ``layout``.
    σ(W):     spectral norm ``‖M‖₂``, the largest singular value of M.
    u, v:     persistent estimates of the top right (input side, ``[*batch, d_in]``) and left
              (output side, ``[*batch, d_out]``) singular vectors of M, buffers.
    γ:        learned scalar (one per matrix; per head with ``scope="per_head"``).
    Ŵ:        the weight the module computes with, ``Ŵ = (γ / σ(W)) · W`` (eq. 3 of Zhai et al.).

Each forward (every access of the parametrized attribute), in fp32 (fp64 for fp64 weights),
with autocast off, on ``M`` pre-divided by the power of two above ``max|M|`` (exact, so weights
of 1e30 or 1e-30 neither overflow nor underflow)::

    with no_grad: v ← normalize(M u);  u ← normalize(Mᵀ v)      # one power-iteration step
    σ = vᵀ M u                                                  # differentiable in W; u, v fixed
    Ŵ = W · γ / σ

u and v are written back (persistent across steps) only in training mode with gradients enabled,
so evaluation and probes (``torch.no_grad``) never move them, and the running ``sigma`` buffer
(the last training σ) is what training saw. At construction u, v and σ₀ come from an SVD of W₀,
so the first forward already uses exact singular vectors; with ``gamma_init="sigma0"`` (the
vision reference) γ = σ(W₀) and Ŵ = W at init; with ``"one"`` (the speech reference) ‖Ŵ‖₂ = 1.
The gradient of σ is ``v uᵀ`` (u, v detached), the exact gradient of ‖M‖₂ once u, v have
converged (S12; Miyato et al. 2018 use the same estimator).

Layouts (how a stored weight is a linear map; chosen by module class, never from shapes):
    ``"out_in"``:          torch ``nn.Linear`` ``[d_out, d_in]``; ``nn.Conv2d``
                           ``[d_out, d_in/groups, k, k]`` as ``[d_out, d_in/groups·k·k]``
                           (the reference's SNConv2d); torch MHA's ``in_proj_weight``
                           ``[3·d_model, d_model]`` (fused qkv: one σ, as timm).
    ``"in_out"``:          dynascope's right-multiplied ``[d_in, d_out]`` (``x @ W``): ViT and
                           Transformer ``W_in``, ``W_U``; MLP ``W_in``, ``W_out``. M = Wᵀ.
    ``"heads_split_out"``: ``W_Q, W_K, W_V: [n_heads, d_model, d_head]``; the heads split the
                           output, so the layer's map is ``x ↦ [x W[0] | … | x W[n_heads−1]]``,
                           ``M: [n_heads·d_head, d_model]``.
    ``"heads_split_in"``:  ``W_O: [n_heads, d_head, d_model]``; the heads split the input,
                           ``[z_0 | … | z_{n−1}] ↦ Σ_h z_h W_O[h]``,
                           ``M: [d_model, n_heads·d_head]``.

Per-head weights (our choice, S12 "Scope"): ``scope="per_matrix"`` (default) takes one σ per
attention matrix, the spectral norm of the whole linear map above, exactly what a separate
``nn.Linear`` q_proj/k_proj/v_proj/o_proj would get (the reference's speech ``disjoint_type=2``).
The vision reference (timm) fuses qkv into one Linear and so shares one σ over W_Q, W_K and W_V;
a parametrization acts on one tensor, and per-matrix σ is the unit that stays a linear map of the
residual stream in our layout. ``scope="per_head"`` (our extension) takes σ and γ per head,
``M_h: [d_head, d_model]`` (W_Q/K/V) or ``[d_model, d_head]`` (W_O), shapes ``[n_heads]``.
Parametrizations keep the attribute name, so ``module.W_Q`` is still
``[n_heads, d_model, d_head]`` (now Ŵ_Q) and :func:`dynascope.adapters.attention_views` and the
spectral probes read the effective weights unchanged.

Converted by :func:`convert_to_sigma_reparam`: ``nn.Linear`` and ``nn.Conv2d`` weights of any
model, ``torch.nn.MultiheadAttention``'s in-projection weights, and dynascope's raw matrices
(attention W_Q, W_K, W_V, W_O; MLP W_in, W_out; ViT/Transformer W_in, W_U). Not converted:
biases, embeddings looked up by index (``W_E``), positions (``W_pos``), the CLS token, norm gains.

Edge cases: an all-zero or non-finite W₀ is refused (σ(W₀) = 0 gives u no direction and γ = 0
would never move). If W reaches zero during training, Ŵ = 0 with finite (zero) gradients instead
of 0/0. Non-finite weights give non-finite Ŵ (a diverging run stays visible).

References:
    Zhai et al. (2023), "Stabilizing Transformer Training by Preventing Attention Entropy
    Collapse", ICML, arXiv 2303.06296: σReparam ``Ŵ = γ/σ(W) · W``, eq. (3), with σ estimated by
    one power-iteration step per training step (equation number as we read arXiv v2; not
    re-checked against the PDF here). Reference code apple/ml-sigma-reparam
    ``vision/layers.py`` (SpectralNormedWeight, SNLinear with γ = σ₀ and ``stats_only``,
    SNConv2d, convert_to_sn, remove_all_normalization_layers) and ``speech/layers.py`` (γ = 1).
    Miyato et al. (2018), "Spectral Normalization for Generative Adversarial Networks", ICLR,
    arXiv 1802.05957, Algorithm 1 (power iteration with a persistent u).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import parametrize

from ._sigma_reparam import GammaInit as GammaInit
from ._sigma_reparam import Layout as Layout
from ._sigma_reparam import Scope as Scope
from ._sigma_reparam import SigmaReparam as SigmaReparam
from .attention import MultiHeadAttention
from .transformer import MLP, Transformer
from .vit import ViT

__all__ = [
    "SigmaReparam",
    "convert_to_sigma_reparam",
    "register_sigma_reparam",
    "remove_norm_layers",
    "remove_sigma_reparam",
    "sigma_reparam_modules",
]


# Raw (non-nn.Linear) weights by module class: attribute -> layout. Checked with isinstance.
_RAW_WEIGHTS: tuple[tuple[type[nn.Module], dict[str, Layout]], ...] = (
    (
        MultiHeadAttention,
        {
            "W_Q": "heads_split_out",
            "W_K": "heads_split_out",
            "W_V": "heads_split_out",
            "W_O": "heads_split_in",
        },
    ),
    (MLP, {"W_in": "in_out", "W_out": "in_out"}),
    (ViT, {"W_in": "in_out", "W_U": "in_out"}),
    (Transformer, {"W_in": "in_out", "W_U": "in_out"}),
    (nn.Linear, {"weight": "out_in"}),
    (nn.Conv2d, {"weight": "out_in"}),
    (
        nn.MultiheadAttention,
        {
            "in_proj_weight": "out_in",
            "q_proj_weight": "out_in",
            "k_proj_weight": "out_in",
            "v_proj_weight": "out_in",
        },
    ),
)

_NORMS = (
    nn.LayerNorm,
    nn.GroupNorm,
    nn.RMSNorm,
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.InstanceNorm1d,
    nn.InstanceNorm2d,
    nn.InstanceNorm3d,
)


def register_sigma_reparam(
    module: nn.Module,
    name: str,
    *,
    layout: Layout = "out_in",
    scope: Scope = "per_matrix",
    gamma_init: GammaInit = "sigma0",
    stats_only: bool = False,
) -> SigmaReparam:
    """Parametrize ``module.<name>`` with :class:`SigmaReparam`; returns the parametrization.

    The stored weight becomes ``module.parametrizations[name].original``; ``module.<name>`` is Ŵ.

    Args:
        module: the module owning the weight.
        name: the parameter's attribute name (``"weight"``, ``"W_Q"``...).
        layout, scope, gamma_init, stats_only: as :class:`SigmaReparam`.
    Returns:
        The registered :class:`SigmaReparam`.
    Raises:
        ValueError: if ``module.<name>`` is not a parameter or already carries a
            :class:`SigmaReparam`; as :class:`SigmaReparam`.
    """
    if parametrize.is_parametrized(module, name):
        if any(isinstance(p, SigmaReparam) for p in module.parametrizations[name]):
            raise ValueError(f"{name} already carries a SigmaReparam (got a second one)")
        weight = module.parametrizations[name].original
    else:
        weight = getattr(module, name, None)
        if not isinstance(weight, nn.Parameter):
            raise ValueError(f"{name} must be a parameter of the module (got {type(weight)})")
    reparam = SigmaReparam(
        weight, layout=layout, scope=scope, gamma_init=gamma_init, stats_only=stats_only
    )
    reparam.to(weight.device)
    with torch.no_grad():  # registration runs one check forward: it must not move u
        parametrize.register_parametrization(module, name, reparam)
    return reparam


def sigma_reparam_modules(model: nn.Module) -> dict[str, SigmaReparam]:
    """Every :class:`SigmaReparam` of ``model``, keyed ``"<module>.<attribute>"`` (e.g.
    ``"blocks.0.attn.W_Q"``), in module order: read ``.sigma`` and ``.gamma`` from them."""
    found: dict[str, SigmaReparam] = {}
    for module_name, module in model.named_modules():
        if not parametrize.is_parametrized(module):
            continue
        for name, plist in module.parametrizations.items():
            for p in plist:
                if isinstance(p, SigmaReparam):
                    found[f"{module_name}.{name}".lstrip(".")] = p
    return found


def remove_norm_layers(model: nn.Module) -> nn.Module:
    """Replace every normalization layer (LayerNorm, RMSNorm, GroupNorm, BatchNorm*d,
    InstanceNorm*d) by ``nn.Identity``, in place; returns ``model``.

    References:
        apple/ml-sigma-reparam ``vision/layers.py`` ``remove_all_normalization_layers``.
    """
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, _NORMS):
                setattr(parent, child_name, nn.Identity())
    return model


def convert_to_sigma_reparam(
    model: nn.Module,
    remove_norms: bool = False,
    *,
    scope: Scope = "per_matrix",
    gamma_init: GammaInit = "sigma0",
    stats_only: bool = False,
) -> nn.Module:
    """σReparam every linear map of ``model`` in place (module docstring lists which); returns it.

    The outputs of an untrained model are unchanged by the conversion with
    ``gamma_init="sigma0"`` (Ŵ = W up to float rounding of σ/σ₀), unless ``remove_norms``.

    Args:
        model: any module; dynascope models, torch ``nn.Linear``/``nn.Conv2d`` anywhere inside.
        remove_norms: also replace normalization layers by ``nn.Identity``
            (:func:`remove_norm_layers`),
            the paper's LayerNorm-free ViT.
        scope: per-head attention weights: ``"per_matrix"`` or ``"per_head"`` (module
            docstring); other layouts always take one σ per matrix.
        gamma_init, stats_only: as :class:`SigmaReparam`.
    Returns:
        ``model``.
    Raises:
        ValueError: if ``model`` already carries a :class:`SigmaReparam`; if a weight is all zero
            or not finite (the message names it); as :class:`SigmaReparam`.
    References:
        apple/ml-sigma-reparam ``vision/layers.py`` ``convert_to_sn``.
    """
    if sigma_reparam_modules(model):
        raise ValueError("model already carries SigmaReparam parametrizations (convert once)")
    if remove_norms:
        remove_norm_layers(model)
    for module_name, module in list(model.named_modules()):
        for cls, weights in _RAW_WEIGHTS:
            if not isinstance(module, cls):
                continue
            for name, layout in weights.items():
                if not isinstance(getattr(module, name, None), nn.Parameter):
                    continue  # absent (W_in of a token Transformer, q_proj_weight of packed MHA)
                head_scope = scope if layout.startswith("heads_") else "per_matrix"
                try:
                    register_sigma_reparam(
                        module,
                        name,
                        layout=layout,
                        scope=head_scope,
                        gamma_init=gamma_init,
                        stats_only=stats_only,
                    )
                except ValueError as err:
                    where = f"{module_name}.{name}".lstrip(".")
                    raise ValueError(f"{where}: {err}") from None
            break
    return model


def remove_sigma_reparam(model: nn.Module) -> nn.Module:
    """Bake Ŵ into plain parameters and drop every :class:`SigmaReparam`, in place; returns it.

    The model then computes what it computed before under ``torch.no_grad`` (Ŵ from the stored
    u, in either mode), with ordinary parameters (``leave_parametrized=True``).
    """
    for module in list(model.modules()):
        if not parametrize.is_parametrized(module):
            continue
        for name in list(module.parametrizations):
            if any(isinstance(p, SigmaReparam) for p in module.parametrizations[name]):
                with torch.no_grad():  # no write-back of u: Ŵ from the stored u, in any mode
                    parametrize.remove_parametrizations(module, name, leave_parametrized=True)
    return model
