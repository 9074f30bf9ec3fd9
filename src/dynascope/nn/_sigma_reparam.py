"""The σReparam parametrization of one weight, ``Ŵ = γ/σ(W) · W`` with σ from one power-iteration
step per training step (glossary, layouts and scopes in :mod:`dynascope.nn.reparam`, which
re-exports it and converts whole models).

References:
    Zhai et al. (2023), "Stabilizing Transformer Training by Preventing Attention Entropy
    Collapse", ICML, arXiv 2303.06296, eq. (3). Miyato et al. (2018), "Spectral Normalization
    for Generative Adversarial Networks", ICLR, arXiv 1802.05957, Algorithm 1.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

Layout = Literal["out_in", "in_out", "heads_split_out", "heads_split_in"]
Scope = Literal["per_matrix", "per_head"]
GammaInit = Literal["sigma0", "one"]
_LAYOUTS = ("out_in", "in_out", "heads_split_out", "heads_split_in")
_SCOPES = ("per_matrix", "per_head")
_GAMMA_INITS = ("sigma0", "one")


def _pow2_scale(M: Tensor) -> Tensor:
    """``[*batch, 1, 1]``: the power of two at or above ``max|M|`` per matrix (1 if zero/inf)."""
    peak = M.abs().amax(dim=(-2, -1), keepdim=True)
    _, exponent = torch.frexp(peak)
    scale = torch.ldexp(torch.ones_like(peak), exponent)
    return torch.where((peak > 0) & torch.isfinite(peak), scale, torch.ones_like(peak))


def _compute_dtype(weight: Tensor) -> torch.dtype:
    return torch.float64 if weight.dtype == torch.float64 else torch.float32


class SigmaReparam(nn.Module):
    """Parametrization ``W ↦ Ŵ = (γ / σ(W)) · W`` with one power-iteration step per forward.

    Register it with :func:`register_sigma_reparam` (or
    ``torch.nn.utils.parametrize.register_parametrization(module, name, SigmaReparam(W))``); the
    module then computes with Ŵ under the same attribute name. See the module docstring for the
    algorithm, the layouts and the per-head choice.

    Buffers (in the state dict, so checkpoints resume the power iteration exactly):
        ``u``: ``[*batch, d_in]``, ``v``: ``[*batch, d_out]`` unit vectors;
        ``sigma``: ``[*batch]`` the last σ computed in training mode (σ₀ before any).
    ``*batch`` is empty for ``scope="per_matrix"`` and ``[n_heads]`` for ``"per_head"``.

    Args:
        weight: the initial weight W₀ in the layout named by ``layout``; floating point, finite.
        layout: how ``weight`` is a linear map (module docstring).
        scope: ``"per_matrix"`` (one σ, γ) or ``"per_head"`` (``heads_*`` layouts only).
        gamma_init: ``"sigma0"`` (γ = σ(W₀), so Ŵ = W at init) or ``"one"`` (‖Ŵ‖₂ = 1).
        stats_only: measure σ (``sigma`` buffer) but compute with W unchanged; no γ.
    Raises:
        ValueError: if ``layout``, ``scope`` or ``gamma_init`` is unknown; if ``scope="per_head"``
            with a non-head layout; if ``weight`` is not floating point, has the wrong number of
            dims for ``layout``, is not finite, or has a zero spectral norm (all zero; per head
            with ``scope="per_head"``).
    References:
        Zhai et al. (2023), arXiv 2303.06296, eq. (3); apple/ml-sigma-reparam
        ``vision/layers.py`` (SpectralNormedWeight, SNLinear with ``stats_only``).
    """

    u: Tensor
    v: Tensor
    sigma: Tensor

    def __init__(
        self,
        weight: Tensor,
        *,
        layout: Layout = "out_in",
        scope: Scope = "per_matrix",
        gamma_init: GammaInit = "sigma0",
        stats_only: bool = False,
    ) -> None:
        super().__init__()
        if layout not in _LAYOUTS:
            raise ValueError(f"layout must be one of {_LAYOUTS} (got layout={layout!r})")
        if scope not in _SCOPES:
            raise ValueError(f"scope must be one of {_SCOPES} (got scope={scope!r})")
        if gamma_init not in _GAMMA_INITS:
            raise ValueError(
                f"gamma_init must be one of {_GAMMA_INITS} (got gamma_init={gamma_init!r})"
            )
        if scope == "per_head" and not layout.startswith("heads_"):
            raise ValueError(
                f"scope='per_head' needs a per-head layout (heads_split_out or heads_split_in; "
                f"got layout={layout!r})"
            )
        ndim = {"out_in": None, "in_out": 2, "heads_split_out": 3, "heads_split_in": 3}[layout]
        if not (isinstance(weight, Tensor) and weight.is_floating_point()):
            raise ValueError(f"weight must be a floating-point tensor (got {weight!r:.60})")
        if (ndim is not None and weight.ndim != ndim) or weight.ndim < 2:
            raise ValueError(
                f"weight must have {ndim or '2 or more'} dims for layout={layout!r} "
                f"(got shape {tuple(weight.shape)})"
            )
        if not bool(torch.isfinite(weight).all()):
            raise ValueError("weight must be finite (got NaN or infinite entries)")
        self.layout = layout
        self.scope = scope
        self.gamma_init = gamma_init
        self.stats_only = stats_only
        with torch.no_grad():
            M = self.matrix(weight.detach()).to(_compute_dtype(weight))
            scale = _pow2_scale(M)
            U, S, Vh = torch.linalg.svd(M / scale, full_matrices=False)
            sigma0 = S[..., 0] * scale[..., 0, 0]  # [*batch]
        if not bool((sigma0 > 0).all()):
            raise ValueError(
                "weight must not be all zero (got spectral norm 0: u has no direction and "
                "γ = σ(W₀) = 0 would never move)"
            )
        self.register_buffer("u", Vh[..., 0, :].contiguous())  # [*batch, d_in]
        self.register_buffer("v", U[..., :, 0].contiguous())  # [*batch, d_out]
        self.register_buffer("sigma", sigma0.clone())
        self.gamma: nn.Parameter | None
        if stats_only:
            self.register_parameter("gamma", None)
        else:
            start = sigma0 if gamma_init == "sigma0" else torch.ones_like(sigma0)
            self.gamma = nn.Parameter(start.clone())

    def extra_repr(self) -> str:
        return (
            f"layout={self.layout!r}, scope={self.scope!r}, gamma_init={self.gamma_init!r}, "
            f"stats_only={self.stats_only}"
        )

    def matrix(self, weight: Tensor) -> Tensor:
        """``weight`` as the matrix ``M: [*batch, d_out, d_in]`` whose spectral norm is σ."""
        if self.layout == "out_in":
            return weight.flatten(1)
        if self.layout == "in_out":
            return weight.mT
        n_heads, rows, cols = weight.shape
        if self.scope == "per_head":  # W_Q/K/V: [h, d_head, d_model]; W_O: [h, d_model, d_head]
            return weight.mT
        if self.layout == "heads_split_out":  # -> [n_heads·d_head, d_model]
            return weight.permute(0, 2, 1).reshape(n_heads * cols, rows)
        return weight.reshape(n_heads * rows, cols).mT  # -> [d_model, n_heads·d_head]

    def forward(self, weight: Tensor) -> Tensor:
        """Ŵ = W · γ / σ(W) (or W itself when ``stats_only``), same shape and dtype as W.

        Args:
            weight: the stored weight W, in the layout given at construction.
        Returns:
            Ŵ, shape and dtype of ``weight``.
        """
        update = self.training and torch.is_grad_enabled()
        dtype = _compute_dtype(weight)
        with torch.autocast(device_type=weight.device.type, enabled=False):
            M = self.matrix(weight).to(dtype)
            scale = _pow2_scale(M.detach())  # exact power of two, detached
            M_scaled = M / scale
            with torch.no_grad():
                u, v = self.u.to(dtype), self.v.to(dtype)
                v = F.normalize((M_scaled @ u.unsqueeze(-1)).squeeze(-1), dim=-1)
                u = F.normalize((M_scaled.mT @ v.unsqueeze(-1)).squeeze(-1), dim=-1)
                if update:
                    self.u.copy_(u)
                    self.v.copy_(v)
            # σ = vᵀ M u: gradient v uᵀ w.r.t. M; u, v are fresh tensors (never written in place)
            sigma = torch.einsum("...m,...mn,...n->...", v, M_scaled, u) * scale[..., 0, 0]
            if update:
                self.sigma.copy_(sigma.detach())
            if self.gamma is None:
                return weight
            positive = sigma > 0
            factor = self.gamma.to(dtype) / torch.where(positive, sigma, torch.ones_like(sigma))
            shape = factor.shape + (1,) * (weight.ndim - factor.ndim)  # per head: [n_heads, 1, 1]
            out = weight.to(dtype) * factor.reshape(shape)
            out = torch.where(positive.reshape(shape), out, torch.zeros_like(out))
        return out.to(weight.dtype)
