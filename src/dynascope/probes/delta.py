"""ΔW spectra (S10): singular values and ranks of W_QK(t) − W_QK(0) and W_OV(t) − W_OV(0).

The update of a per-head product has rank <= 2·d_head; its spectrum is computed from stacked
factors of width 2·d_head through :func:`dynascope.probes.spectral.factor_singular_values`,
never by forming the d_model x d_model difference.

References:
    Abbe, Boix-Adserà, Littwin, Bengio & Susskind (2023), "Transformers learn through gradual
    rank increase", NeurIPS, arXiv 2306.07042.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from dynascope.adapters import AttentionView, attention_views
from dynascope.probes.base import Probe, ProbeContext, register_probe
from dynascope.probes.spectral import (  # the shared internals of the factored spectra
    _check_factors,
    _compute_dtype,
    _normalized,
    _rank_thresholds,
    effective_rank,
    factor_singular_values,
    ov_factors,
    qk_factors,
    rank_above,
    rank_at,
    stable_rank,
)

__all__ = [
    "DeltaSpectrum",
    "delta_factors",
    "delta_ov_factors",
    "delta_ov_singular_values",
    "delta_qk_factors",
    "delta_qk_singular_values",
    "normalized_spectrum",
    "snapshot_views",
]


def snapshot_views(views: Sequence[AttentionView]) -> list[AttentionView]:
    """Detached copies of ``views``' weights (same device and dtype), e.g. the step-0 reference.

    Returns:
        One :class:`AttentionView` per layer, equal to the input's except that ``W_Q, W_K,
        W_V, W_O`` and the biases are detached clones and ``module`` is ``None``; later updates
        to the model do not change them.
    """

    def copy(t: Tensor | None) -> Tensor | None:
        return None if t is None else t.detach().clone()

    fields = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")
    return [
        dataclasses.replace(v, module=None, **{f: copy(getattr(v, f)) for f in fields})
        for v in views
    ]


def delta_factors(A: Tensor, B: Tensor, A0: Tensor, B0: Tensor) -> tuple[Tensor, Tensor]:
    """Factors ``(C, D)`` of width ``2r`` with ``C @ D^T = A @ B^T - A0 @ B0^T``.

    ``C = [A - A0, A0]``, ``D = [B, B - B0]``: ``C D^T = (A - A0) B^T + A0 (B - B0)^T``. This is
    the same width-``2r`` factorisation as ``[A, -A0] [B, B0]^T`` (S10), arranged so that
    nothing cancels: every term of the small core is of the size of the update, so a small
    update keeps its relative accuracy (the other arrangement subtracts two ``||A|| ||B||``-sized
    cores, an absolute error of ``eps ||A|| ||B||``). When nothing moved (``A == A0``,
    ``B == B0``) the core is exactly zero, so every singular value is exactly 0.

    Args:
        A, A0: ``[..., m, r]``, current and initial left factors.
        B, B0: ``[..., n, r]``, current and initial right factors.
    Returns:
        ``(C [..., m, 2r], D [..., n, 2r])``, float64 if any input is float64, else float32.
    Raises:
        ValueError: if ``A``, ``B`` are not ``[..., m, r]``, ``[..., n, r]``, or ``A0``, ``B0``
            differ in shape from ``A``, ``B``.
    References:
        Abbe et al. (2023), "Transformers learn through gradual rank increase", NeurIPS,
        arXiv 2306.07042 (rank of ``Δ`` at most ``2 d_head``).
    """
    _check_factors(A, B)
    if A0.shape != A.shape or B0.shape != B.shape:
        raise ValueError(
            f"A0, B0 must have the shapes of A, B (got A {tuple(A.shape)}, A0 "
            f"{tuple(A0.shape)}, B {tuple(B.shape)}, B0 {tuple(B0.shape)})"
        )
    dtype = _compute_dtype(A, B, A0, B0)
    A, B, A0, B0 = (t.to(dtype) for t in (A, B, A0, B0))
    return torch.cat([A - A0, A0], dim=-1), torch.cat([B, B - B0], dim=-1)


def _check_init(views: Sequence[AttentionView], init: Sequence[AttentionView]) -> None:
    if len(init) != len(views):
        raise ValueError(
            f"init must hold one view per layer (got {len(init)} init views, {len(views)} layers)"
        )
    for view, ref in zip(views, init):
        for field in ("W_Q", "W_K", "W_V", "W_O"):
            now, then = getattr(view, field).shape, getattr(ref, field).shape
            if now != then:
                raise ValueError(
                    f"init {field} of layer {view.name!r} must match the model's shape "
                    f"(got init {tuple(then)}, model {tuple(now)})"
                )


def delta_qk_factors(
    views: Sequence[AttentionView], init: Sequence[AttentionView]
) -> tuple[Tensor, Tensor]:
    """Factors of every head's ``Δ_QK = W_QK - W_QK(0)``, each ``[n_layers, n_heads, d_model,
    2 d_head]`` (see :func:`delta_factors`).

    Raises:
        ValueError: if ``views`` is empty, the layers' shapes differ, or ``init`` does not match
            ``views`` (layer count or shapes).
    """
    _check_init(views, init)
    return delta_factors(*qk_factors(views), *qk_factors(init))


def delta_ov_factors(
    views: Sequence[AttentionView], init: Sequence[AttentionView]
) -> tuple[Tensor, Tensor]:
    """Factors of every head's ``Δ_OV = W_OV - W_OV(0)``, each ``[n_layers, n_heads, d_model,
    2 d_head]`` (see :func:`delta_factors`).

    Raises:
        ValueError: as :func:`delta_qk_factors`.
    """
    _check_init(views, init)
    return delta_factors(*ov_factors(views), *ov_factors(init))


def delta_qk_singular_values(
    views: Sequence[AttentionView], init: Sequence[AttentionView]
) -> Tensor:
    """Singular values of every head's ``Δ_QK = W_Q W_K^T - W_Q(0) W_K(0)^T``, from factors.

    Args:
        views: current weights, one :class:`AttentionView` per layer.
        init: the reference weights (e.g. :func:`snapshot_views` at step 0), same shapes.
    Returns:
        ``[n_layers, n_heads, 2 d_head]``, descending; rank ``<= 2 d_head``, zero-padded where
        ``2 d_head > d_model``. All zero (exactly) where nothing moved.
    Raises:
        ValueError: as :func:`delta_qk_factors`.
        torch.linalg.LinAlgError: if a weight holds NaN or inf.
    References:
        Abbe et al. (2023), arXiv 2306.07042.
    """
    return factor_singular_values(*delta_qk_factors(views, init))


def delta_ov_singular_values(
    views: Sequence[AttentionView], init: Sequence[AttentionView]
) -> Tensor:
    """Singular values of every head's ``Δ_OV = W_V W_O - W_V(0) W_O(0)``, from factors; shape
    and errors as :func:`delta_qk_singular_values`.
    """
    return factor_singular_values(*delta_ov_factors(views, init))


def normalized_spectrum(s: Tensor) -> Tensor:
    """``s / max(s)`` along the last dim (S10, Fig. 1); an all-zero row stays all zero.

    Args:
        s: ``[..., k]`` singular values, non-negative (not checked).
    Returns:
        ``[..., k]`` in ``[0, 1]``, dimensionless; no overflow for huge ``s``.
    """
    return _normalized(s)[0]


@register_probe("delta_spectrum")
class DeltaSpectrum(Probe):
    """Spectra of each head's update since initialisation, ``Δ_QK`` and ``Δ_OV`` (S10).

    ``Δ_QK = W_Q W_K^T - W_Q(0) W_K(0)^T`` and ``Δ_OV = W_V W_O - W_V(0) W_O(0)``, rank
    ``<= 2 d_head``, computed from width-``2 d_head`` factors (:func:`delta_factors`); the
    ``d_model x d_model`` matrices are never formed.

    The reference ``W(0)`` is ``init`` if given (a model, snapshotted at construction, or views),
    else a snapshot of the model's weights at the probe's first call (``init_step`` records that
    step; a run resumed from a checkpoint must pass the step-0 weights as ``init``, or the
    reference would be the resumed weights). Call :meth:`reset` to take a new reference.

    Keys, per product ``p`` in ``dqk``, ``dov`` and metric ``m`` in ``rank_{tol}`` (per
    ``rel_tols``), ``rank_abs``, ``effective_rank``, ``stable_rank``, ``spectral_norm``
    (``s_1``), ``frobenius_norm`` (``sqrt(sum s_i^2)``):
        ``L{l}.H{h}.{p}.{m}`` (if ``per_head``); ``L{l}.{p}.mean.{m}`` and ``L{l}.{p}.std.{m}``
        (mean and population std over the heads of layer ``l``); ``{p}.mean.{m}`` (over layers
        and heads); ``{p}.singular_values`` and ``{p}.normalized_singular_values`` (``s /
        s_1``): ``[n_layers, n_heads, 2 d_head]`` float32 CPU tensors.
    Zero update (``t = 0``): all singular values exactly 0, so every rank, the stable rank
    (``srank(0) := 0``, S10; as :func:`stable_rank`), the effective rank and the normalised
    spectrum are 0. Non-finite weights, or singular values overflowing the dtype: every key NaN
    (as :class:`QKSpectrum`).

    Args:
        init: reference weights: an ``nn.Module`` (its views are snapshotted now), views (copied),
            or ``None`` (snapshot at the first call).
        rel_tols: relative thresholds for ``rank_{tol}`` (``1e-2 -> "rank_1e-2"``).
        abs_tol: absolute threshold for ``rank_abs``, in the weights' unit squared.
        per_head: also emit the ``L{l}.H{h}.*`` keys.
    Raises:
        ValueError: if a threshold is negative or two ``rel_tols`` give the same key; (call) if
            the model's views do not match the reference's shapes.
    References:
        Abbe, Boix-Adserà, Littwin, Bengio & Susskind (2023), "Transformers learn through
        gradual rank increase", NeurIPS, arXiv 2306.07042 (Fig. 1 spectra of Δ, Fig. 4 stable
        rank per head).
    """

    def __init__(
        self,
        *,
        init: nn.Module | Sequence[AttentionView] | None = None,
        rel_tols: Sequence[float] = (1e-2, 1e-3),
        abs_tol: float = 1e-3,
        per_head: bool = True,
    ) -> None:
        self.rel_tols, self.abs_tol, rank_names = _rank_thresholds(rel_tols, abs_tol)
        self.per_head = per_head
        self._metric_names = [
            *rank_names,
            "effective_rank",
            "stable_rank",
            "spectral_norm",
            "frobenius_norm",
        ]
        self.init: list[AttentionView] | None = None
        self.init_step: int | None = None
        if isinstance(init, nn.Module):
            self.init = snapshot_views(attention_views(init))
        elif init is not None:
            self.init = snapshot_views(init)

    def reset(self) -> None:
        """Forget the reference; the next call snapshots the model's weights as ``W(0)``."""
        self.init, self.init_step = None, None

    _FIELDS = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")

    def state_dict(self) -> dict:
        """The reference ``W(0)`` (per layer: name and weights) and the step it was taken at."""
        if self.init is None:
            return {}
        layers = [
            {
                "name": v.name,
                **{f: getattr(v, f) for f in self._FIELDS if getattr(v, f) is not None},
            }
            for v in self.init
        ]
        return {"init_step": self.init_step, "layers": layers}

    def load_state_dict(self, state: dict) -> None:
        """Restore the reference saved by :meth:`state_dict` (``{}`` forgets it)."""
        if not state:
            self.reset()
            return
        self.init = [
            AttentionView(**{k: layer.get(k) for k in ("name", *self._FIELDS)})
            for layer in state["layers"]
        ]
        self.init_step = state["init_step"]

    def measure(self, model: nn.Module, ctx: ProbeContext) -> dict[str, Tensor | float]:
        views = attention_views(model)
        if self.init is None:
            self.init, self.init_step = snapshot_views(views), ctx.step
        elif self.init[0].W_Q.device != views[0].W_Q.device:  # restored from a CPU checkpoint
            device = views[0].W_Q.device
            self.init = [
                dataclasses.replace(
                    v,
                    **{
                        f: getattr(v, f).to(device)
                        for f in self._FIELDS
                        if getattr(v, f) is not None
                    },
                )
                for v in self.init
            ]
        return self.measure_views(views)

    def measure_views(self, views: Sequence[AttentionView]) -> dict[str, Tensor | float]:
        """The measurements of ``views`` against the held reference (layer = position).

        Raises:
            ValueError: if no reference is held (construct with ``init`` or call the probe on
                a model first), or as :func:`delta_qk_factors`.
        """
        if self.init is None:
            raise ValueError("DeltaSpectrum has no reference W(0) (got init=None, never called)")
        out: dict[str, Tensor | float] = {}
        for product, factors in (("dqk", delta_qk_factors), ("dov", delta_ov_factors)):
            out.update(self._measure_product(product, *factors(views, self.init)))
        return out

    def _measure_product(self, product: str, C: Tensor, D: Tensor) -> dict[str, Tensor | float]:
        n_layers, n_heads, _, width = C.shape
        s = None
        if torch.isfinite(C).all() and torch.isfinite(D).all():
            s = factor_singular_values(C, D)  # [n_layers, n_heads, 2 d_head]
        if s is None or not torch.isfinite(s).all():  # diverging run: NaN, never crash
            metrics = torch.full((len(self._metric_names), n_layers, n_heads), math.nan)
            s = torch.full((n_layers, n_heads, width), math.nan)
            normalized = s
        else:
            t, _ = _normalized(s)
            s_max = s.amax(dim=-1)
            per_metric = [rank_at(s, tol).to(s.dtype) for tol in self.rel_tols] + [
                rank_above(s, self.abs_tol).to(s.dtype),
                effective_rank(s),
                stable_rank(s),
                s_max,
                s_max * t.square().sum(dim=-1).sqrt(),  # no overflow of sum s_i^2
            ]
            metrics = torch.stack(per_metric)  # [n_metrics, n_layers, n_heads]
            normalized = t
        metrics = metrics.double()
        summary = torch.stack(
            [metrics.mean(dim=(1, 2))[:, None].expand(-1, n_layers)]
            + [metrics.mean(dim=2), metrics.std(dim=2, correction=0)]
        )  # [3, n_metrics, n_layers]: global mean (repeated), layer mean, layer std
        flat = torch.cat([summary.flatten(), metrics.flatten()]).tolist()  # one host transfer
        n_metrics = len(self._metric_names)
        out: dict[str, Tensor | float] = {}
        for i, metric in enumerate(self._metric_names):
            out[f"{product}.mean.{metric}"] = flat[i * n_layers]
            for layer in range(n_layers):
                out[f"L{layer}.{product}.mean.{metric}"] = flat[(n_metrics + i) * n_layers + layer]
                out[f"L{layer}.{product}.std.{metric}"] = flat[
                    (2 * n_metrics + i) * n_layers + layer
                ]
        if self.per_head:
            values = flat[3 * n_metrics * n_layers :]
            for i, metric in enumerate(self._metric_names):
                for layer in range(n_layers):
                    for head in range(n_heads):
                        key = f"L{layer}.H{head}.{product}.{metric}"
                        out[key] = values[(i * n_layers + layer) * n_heads + head]
        out[f"{product}.singular_values"] = s.detach().to("cpu", torch.float32)
        out[f"{product}.normalized_singular_values"] = normalized.detach().to("cpu", torch.float32)
        return out
