"""Spectra of factored products: ranks of W_QK and W_OV, the L2-nuclear gap, balancedness.

Glossary (per attention head, dynascope layout, right-multiplying ``x @ W``):

    W_Q, W_K, W_V: [d_model, d_head]      W_O: [d_head, d_model]
    W_QK = W_Q @ W_K^T   (factors A = W_Q, B = W_K)          [d_model, d_model]
    W_OV = W_V @ W_O     (factors A = W_V, B = W_O^T)        [d_model, d_model]
    s:   singular values, descending, length d_head (rank <= d_head)

Papers write the transposes (W_K^T W_Q, P W_V); the spectra are the same. Every function here is
pure and batched over leading dimensions ``...``: no ``.item()``, no device moves. Spectra come
from the factors (reduced QR of each, then the SVD of a small core); the dense ``d_model x
d_model`` product is never formed (it is the test oracle).

References:
    Roy & Vetterli (2007), "The effective rank: a measure of effective dimensionality", EUSIPCO.
    Kobayashi, Akram & von Oswald (2024), "Weight decay induces low-rank attention layers",
    NeurIPS, arXiv 2410.23819 (the L2 term bounds the nuclear norm, with equality iff balanced).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from dynascope.adapters import AttentionView, attention_views, stack_views
from dynascope.probes.base import Probe, ProbeContext, register_probe

__all__ = [
    "DeltaSpectrum",
    "OVSpectrum",
    "QKSpectrum",
    "balancedness",
    "delta_factors",
    "delta_ov_factors",
    "delta_ov_singular_values",
    "delta_qk_factors",
    "delta_qk_singular_values",
    "effective_rank",
    "factor_singular_values",
    "l2_nuclear_gap",
    "l2_term",
    "normalized_spectrum",
    "nuclear_norm",
    "ov_factors",
    "ov_singular_values",
    "qk_factors",
    "qk_singular_values",
    "rank_above",
    "rank_at",
    "snapshot_views",
    "stable_rank",
]


def _check_factors(A: Tensor, B: Tensor) -> None:
    if A.ndim < 2 or B.ndim < 2:
        raise ValueError(
            f"A and B must be [..., m, r] and [..., n, r] (got A {tuple(A.shape)}, "
            f"B {tuple(B.shape)})"
        )
    if A.shape[-1] != B.shape[-1]:
        raise ValueError(
            f"A and B must share their last dim r (got A {tuple(A.shape)}, B {tuple(B.shape)})"
        )


def _compute_dtype(*tensors: Tensor) -> torch.dtype:
    """float64 stays float64; everything else (float32, half, bfloat16) is computed in float32."""
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return torch.float64 if dtype == torch.float64 else torch.float32


def _pow2_scale(X: Tensor) -> Tensor:
    """``[..., 1, 1]``: the power of two at or above max|X| per matrix (1 if zero or non-finite).

    Dividing by it is exact in floating point and keeps the core ``R_A R_B^T`` from overflowing
    when the factors are huge (e.g. a diverging run).
    """
    peak = X.abs().amax(dim=(-2, -1), keepdim=True)
    _, exponent = torch.frexp(peak)
    scale = torch.ldexp(torch.ones_like(peak), exponent)
    return torch.where((peak > 0) & torch.isfinite(peak), scale, torch.ones_like(peak))


def factor_singular_values(A: Tensor, B: Tensor) -> Tensor:
    """Singular values of the product ``A @ B^T``, computed from the factors.

    With reduced QR ``A = Q_A R_A`` and ``B = Q_B R_B`` (orthonormal columns), ``A B^T = Q_A
    (R_A R_B^T) Q_B^T``, so the singular values of ``A B^T`` are those of the small core ``R_A
    R_B^T`` (``[k_A, k_B]`` with ``k_A = min(m, r)``, ``k_B = min(n, r)``). Cost is O(m r^2 + n
    r^2), not O(m n r); the ``m x n`` product is never formed. Accuracy is backward-stable: an
    absolute error of order ``eps * ||A||_2 * ||B||_2`` per singular value, as for the dense SVD.

    Args:
        A: ``[..., m, r]``, real floating point.
        B: ``[..., n, r]``, leading dims broadcastable with ``A``'s.
    Returns:
        ``[..., r]`` singular values, descending, non-negative; zero-padded to length ``r`` when
        ``min(m, n) < r``. Computed in float64 if either input is float64, else float32.
        Each factor is first divided by a power of two (exact), so huge factors give ``inf``
        only where the singular value itself overflows the dtype.
    Raises:
        ValueError: if ``A`` or ``B`` has fewer than 2 dims, or their last dims differ.
        torch.linalg.LinAlgError: if a factor holds NaN or inf.
    """
    _check_factors(A, B)
    dtype = _compute_dtype(A, B)
    A, B = A.to(dtype), B.to(dtype)
    scale_A, scale_B = _pow2_scale(A), _pow2_scale(B)  # exact: powers of two
    _, R_A = torch.linalg.qr(A / scale_A, mode="r")  # [..., k_A, r]
    _, R_B = torch.linalg.qr(B / scale_B, mode="r")  # [..., k_B, r]
    s = torch.linalg.svdvals(R_A @ R_B.mT)  # [..., min(k_A, k_B)], descending
    s = s * (scale_A * scale_B)[..., 0]  # inf if the product overflows the dtype
    r = A.shape[-1]
    if s.shape[-1] < r:
        s = torch.nn.functional.pad(s, (0, r - s.shape[-1]))
    return s


def _stack(views: Sequence[AttentionView], field: str) -> Tensor:
    if len(views) == 0:
        raise ValueError("views must hold at least one AttentionView (got 0 layers)")
    return stack_views(list(views), field)  # raises ValueError if layer shapes differ


def qk_factors(views: Sequence[AttentionView]) -> tuple[Tensor, Tensor]:
    """``(A, B) = (W_Q, W_K)`` stacked over layers, each ``[n_layers, n_heads, d_model, d_head]``.

    Raises:
        ValueError: if ``views`` is empty or the layers' shapes differ.
    """
    return _stack(views, "W_Q"), _stack(views, "W_K")


def ov_factors(views: Sequence[AttentionView]) -> tuple[Tensor, Tensor]:
    """``(A, B) = (W_V, W_O^T)`` stacked over layers, each ``[n_layers, n_heads, d_model, d_head]``.

    Raises:
        ValueError: if ``views`` is empty or the layers' shapes differ.
    """
    return _stack(views, "W_V"), _stack(views, "W_O").mT


def qk_singular_values(views: Sequence[AttentionView]) -> Tensor:
    """Singular values of every head's ``W_QK = W_Q @ W_K^T``, from the factors.

    Args:
        views: one :class:`AttentionView` per layer, all of the same shape.
    Returns:
        ``[n_layers, n_heads, d_head]``, descending along the last dim, zero-padded if
        ``d_head > d_model``.
    Raises:
        ValueError: if ``views`` is empty or the layers' shapes differ.
    """
    return factor_singular_values(*qk_factors(views))


def ov_singular_values(views: Sequence[AttentionView]) -> Tensor:
    """Singular values of every head's ``W_OV = W_V @ W_O``, from the factors.

    Args:
        views: one :class:`AttentionView` per layer, all of the same shape.
    Returns:
        ``[n_layers, n_heads, d_head]``, descending along the last dim, zero-padded if
        ``d_head > d_model``.
    Raises:
        ValueError: if ``views`` is empty or the layers' shapes differ.
    """
    return factor_singular_values(*ov_factors(views))


def rank_at(s: Tensor, rel_tol: float = 1e-3) -> Tensor:
    """Relative-threshold rank ``#{i : s_i > rel_tol * max_j s_j}`` along the last dim.

    Args:
        s: ``[..., k]`` singular values, non-negative (not checked), any order.
        rel_tol: threshold relative to the row's largest value, ``0 <= rel_tol``.
    Returns:
        ``[...]`` counts, dtype ``torch.long``. An all-zero row gives 0; a row holding NaN
        gives 0 (NaN compares false).
    Raises:
        ValueError: if ``rel_tol`` is negative or NaN.
    """
    if not rel_tol >= 0:
        raise ValueError(f"rel_tol must be >= 0 (got {rel_tol})")
    threshold = rel_tol * s.amax(dim=-1, keepdim=True)
    return (s > threshold).sum(dim=-1)


def rank_above(s: Tensor, abs_tol: float) -> Tensor:
    """Absolute-threshold rank ``#{i : s_i > abs_tol}`` along the last dim.

    Args:
        s: ``[..., k]`` singular values, any order.
        abs_tol: absolute threshold, same unit as ``s``, ``0 <= abs_tol``.
    Returns:
        ``[...]`` counts, dtype ``torch.long``.
    Raises:
        ValueError: if ``abs_tol`` is negative or NaN.
    """
    if not abs_tol >= 0:
        raise ValueError(f"abs_tol must be >= 0 (got {abs_tol})")
    return (s > abs_tol).sum(dim=-1)


def _check_singular_values(s: Tensor) -> None:
    bad_negative = int((s < 0).sum())
    bad_nan = int(s.isnan().sum())
    bad_inf = int(s.isinf().sum())
    if bad_negative or bad_nan or bad_inf:
        raise ValueError(
            f"s must be finite and non-negative (got {bad_negative} negative, {bad_nan} NaN, "
            f"{bad_inf} infinite entries)"
        )


def _normalized(s: Tensor) -> tuple[Tensor, Tensor]:
    """``(s / max(s), max(s) > 0)`` per row; all-zero rows give zeros. Avoids overflow at 1e30."""
    s_max = s.amax(dim=-1, keepdim=True)
    nonzero = s_max > 0
    return s / torch.where(nonzero, s_max, torch.ones_like(s_max)), nonzero.squeeze(-1)


def effective_rank(s: Tensor) -> Tensor:
    """Effective rank ``exp(H(p))``, ``p_i = s_i / sum_j s_j``, H in nats; ``1 <= erank <= rank``.

    ``0 log 0 = 0``. Scale invariant: ``s`` is divided by its row maximum first, so values up
    to the dtype's maximum neither overflow nor underflow.

    Args:
        s: ``[..., k]`` singular values, non-negative, any order. An all-zero row gives 0.
    Returns:
        ``[...]`` effective rank per row, dimensionless, in ``s``'s dtype.
    Raises:
        ValueError: if any entry of ``s`` is negative, NaN or infinite.
    References:
        Roy & Vetterli (2007), "The effective rank: a measure of effective dimensionality",
        EUSIPCO, eq. (3)-(4).
    """
    _check_singular_values(s)
    t, nonzero = _normalized(s)
    total = t.sum(dim=-1, keepdim=True)
    p = t / torch.where(total > 0, total, torch.ones_like(total))
    entropy = -torch.special.xlogy(p, p).sum(dim=-1)
    return torch.where(nonzero, entropy.exp(), torch.zeros_like(entropy))


def stable_rank(s: Tensor) -> Tensor:
    """Stable rank ``sum_i s_i^2 / max_i s_i^2 = ||W||_F^2 / ||W||_2^2``; ``1 <= srank <= rank``.

    Args:
        s: ``[..., k]`` singular values, non-negative (not checked), any order. An all-zero row
            gives 0. Computed on ``s / max(s)``, so large scales do not overflow.
    Returns:
        ``[...]`` stable rank per row, dimensionless.
    """
    t, nonzero = _normalized(s)
    return torch.where(nonzero, t.square().sum(dim=-1), torch.zeros_like(t[..., 0]))


def nuclear_norm(s: Tensor) -> Tensor:
    """Nuclear norm ``||W||_* = sum_i s_i`` from singular values ``s`` ``[..., k]`` -> ``[...]``."""
    return s.sum(dim=-1)


def l2_term(A: Tensor, B: Tensor) -> Tensor:
    """L2 term ``(||A||_F^2 + ||B||_F^2) / 2`` of the factors, per leading index.

    Args:
        A: ``[..., m, r]``. B: ``[..., n, r]``.
    Returns:
        ``[...]``, in the factors' unit squared; float64 if either factor is float64, else
        float32.
    Raises:
        ValueError: if the shapes are not ``[..., m, r]`` and ``[..., n, r]``.
    References:
        Kobayashi, Akram & von Oswald (2024), arXiv 2410.23819.
    """
    _check_factors(A, B)
    dtype = _compute_dtype(A, B)
    A, B = A.to(dtype), B.to(dtype)
    return 0.5 * (A.square().sum(dim=(-2, -1)) + B.square().sum(dim=(-2, -1)))


def _gap(A: Tensor, B: Tensor, s: Tensor) -> tuple[Tensor, Tensor]:
    l2 = l2_term(A, B)
    return l2 - nuclear_norm(s), l2


def l2_nuclear_gap(A: Tensor, B: Tensor) -> Tensor:
    """L2-nuclear gap ``(||A||_F^2 + ||B||_F^2) / 2 - ||A B^T||_*``, per leading index.

    Always ``>= 0`` (up to rounding, of order ``eps`` times the L2 term; not clamped), with
    equality iff the factors are balanced (``A^T A = B^T B``) up to the core's null space.
    Under weight decay on the factors, gradient flow drives it to 0 exponentially, so the L2
    penalty becomes a nuclear-norm penalty on the product.

    Args:
        A: ``[..., m, r]``. B: ``[..., n, r]``.
    Returns:
        ``[...]``; float64 if either factor is float64, else float32.
    Raises:
        ValueError: if the shapes are not ``[..., m, r]`` and ``[..., n, r]``.
    References:
        Kobayashi, Akram & von Oswald (2024), "Weight decay induces low-rank attention layers",
        NeurIPS, arXiv 2410.23819.
    """
    return _gap(A, B, factor_singular_values(A, B))[0]


def balancedness(A: Tensor, B: Tensor) -> Tensor:
    """Imbalance ``||A^T A - B^T B||_F`` of the factors of ``A B^T``, per leading index.

    Zero iff balanced. Under gradient flow on ``L(A B^T) + (lambda/2)(||A||^2 + ||B||^2)``,
    ``d/dt (A^T A - B^T B) = -2 lambda (A^T A - B^T B)`` exactly, so it decays as
    ``exp(-2 lambda t)``. Invariant under ``A -> A R, B -> B R`` with orthogonal ``R`` (which
    also leaves ``A B^T`` unchanged): the ``r x r`` difference becomes ``R^T (.) R``.

    Args:
        A: ``[..., m, r]``. B: ``[..., n, r]``.
    Returns:
        ``[...]``, in the factors' unit squared; float64 if either factor is float64, else
        float32.
    Raises:
        ValueError: if the shapes are not ``[..., m, r]`` and ``[..., n, r]``.
    References:
        Kobayashi, Akram & von Oswald (2024), arXiv 2410.23819.
    """
    _check_factors(A, B)
    dtype = _compute_dtype(A, B)
    A, B = A.to(dtype), B.to(dtype)
    return torch.linalg.matrix_norm(A.mT @ A - B.mT @ B, ord="fro")


def _format_tol(tol: float) -> str:
    """``0.01 -> "1e-2"``, ``0.005 -> "5e-3"``, ``0.25 -> "2.5e-1"``: short, stable key names."""
    mantissa, exponent = f"{tol:e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"


class _FactorSpectrum(Probe):
    """Shared body of :class:`QKSpectrum` and :class:`OVSpectrum`."""

    product = ""

    def __init__(
        self,
        *,
        rel_tols: Sequence[float] = (1e-2, 1e-3),
        abs_tol: float = 1e-3,
        per_head: bool = True,
    ) -> None:
        rel_tols = tuple(float(t) for t in rel_tols)
        if not all(t >= 0 for t in rel_tols):
            raise ValueError(f"rel_tols must all be >= 0 (got {rel_tols})")
        names = [_format_tol(t) for t in rel_tols]
        if len(set(names)) != len(names):
            raise ValueError(f"rel_tols must be distinct (got {rel_tols})")
        if not abs_tol >= 0:
            raise ValueError(f"abs_tol must be >= 0 (got {abs_tol})")
        self.rel_tols = rel_tols
        self.abs_tol = float(abs_tol)
        self.per_head = per_head
        self._metric_names = [f"rank_{n}" for n in names] + [
            "rank_abs",
            "effective_rank",
            "stable_rank",
            "nuclear_norm",
            "gap",
            "gap_rel",
            "balancedness",
        ]

    def factors(self, views: Sequence[AttentionView]) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def measure(self, model: nn.Module, ctx: ProbeContext) -> dict[str, Tensor | float]:
        return self.measure_views(attention_views(model))

    def measure_views(self, views: Sequence[AttentionView]) -> dict[str, Tensor | float]:
        """The measurements from ``views`` directly (layer index = position in ``views``).

        Returns:
            ``L{layer}.H{head}.{product}.{metric}`` floats (if ``per_head``), head means
            ``{product}.mean.{metric}`` (over layers and heads), and
            ``{product}.singular_values``: ``[n_layers, n_heads, d_head]`` float32 on CPU.
        Raises:
            ValueError: if ``views`` is empty or the layers' shapes differ.
        """
        A, B = self.factors(views)  # [n_layers, n_heads, d_model, d_head] each
        if not (torch.isfinite(A).all() and torch.isfinite(B).all()):
            return self._not_finite(A)
        s = factor_singular_values(A, B)  # [n_layers, n_heads, d_head]
        if not torch.isfinite(s).all():  # a diverging model: report NaN, never crash training
            return self._not_finite(A)
        gap, l2 = _gap(A, B, s)
        per_metric = [rank_at(s, t).to(s.dtype) for t in self.rel_tols] + [
            rank_above(s, self.abs_tol).to(s.dtype),
            effective_rank(s),
            stable_rank(s),
            nuclear_norm(s),
            gap,
            torch.where(l2 > 0, gap / torch.where(l2 > 0, l2, 1.0), 0.0),
            balancedness(A, B).to(s.dtype),
        ]
        metrics = torch.stack(per_metric)  # [n_metrics, n_layers, n_heads]
        means = metrics.mean(dim=(1, 2))  # [n_metrics]
        n_layers, n_heads = metrics.shape[1:]
        flat = torch.cat([means, metrics.flatten()]).tolist()  # one host transfer
        n_metrics = len(self._metric_names)
        out: dict[str, Tensor | float] = {}
        for i, metric in enumerate(self._metric_names):
            out[f"{self.product}.mean.{metric}"] = flat[i]
        if self.per_head:
            values = flat[n_metrics:]
            for i, metric in enumerate(self._metric_names):
                for layer in range(n_layers):
                    for head in range(n_heads):
                        key = f"L{layer}.H{head}.{self.product}.{metric}"
                        out[key] = values[(i * n_layers + layer) * n_heads + head]
        out[f"{self.product}.singular_values"] = s.detach().to("cpu", torch.float32)
        return out

    def _not_finite(self, A: Tensor) -> dict[str, Tensor | float]:
        """Every key NaN (same keys as a finite measurement), for non-finite weights."""
        n_layers, n_heads, _, d_head = A.shape
        out: dict[str, Tensor | float] = {}
        for metric in self._metric_names:
            out[f"{self.product}.mean.{metric}"] = float("nan")
            if self.per_head:
                for layer in range(n_layers):
                    for head in range(n_heads):
                        out[f"L{layer}.H{head}.{self.product}.{metric}"] = float("nan")
        out[f"{self.product}.singular_values"] = torch.full((n_layers, n_heads, d_head), math.nan)
        return out


@register_probe("qk_spectrum")
class QKSpectrum(_FactorSpectrum):
    """Per-head spectrum of ``W_QK = W_Q @ W_K^T``: ranks, effective and stable rank, nuclear
    norm, L2-nuclear gap (absolute and relative to the L2 term) and balancedness.

    Args:
        rel_tols: relative thresholds for ``rank_{tol}`` keys (``1e-2 -> "rank_1e-2"``).
        abs_tol: absolute threshold for the ``rank_abs`` key.
        per_head: also emit ``L{layer}.H{head}.qk.*`` keys (head means are always emitted).
    Raises:
        ValueError: if a threshold is negative or two ``rel_tols`` give the same key.
    References:
        Kobayashi, Akram & von Oswald (2024), arXiv 2410.23819.
    """

    product = "qk"

    def factors(self, views: Sequence[AttentionView]) -> tuple[Tensor, Tensor]:
        return qk_factors(views)


@register_probe("ov_spectrum")
class OVSpectrum(_FactorSpectrum):
    """Per-head spectrum of ``W_OV = W_V @ W_O`` (factors ``W_V``, ``W_O^T``); keys and
    arguments as :class:`QKSpectrum`, with ``ov`` in place of ``qk``.
    """

    product = "ov"

    def factors(self, views: Sequence[AttentionView]) -> tuple[Tensor, Tensor]:
        return ov_factors(views)


# --- ΔW spectra: the change of W_QK and W_OV since initialisation (S10) -------------------------


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
        rel_tols = tuple(float(t) for t in rel_tols)
        if not all(t >= 0 for t in rel_tols):
            raise ValueError(f"rel_tols must all be >= 0 (got {rel_tols})")
        names = [_format_tol(t) for t in rel_tols]
        if len(set(names)) != len(names):
            raise ValueError(f"rel_tols must be distinct (got {rel_tols})")
        if not abs_tol >= 0:
            raise ValueError(f"abs_tol must be >= 0 (got {abs_tol})")
        self.rel_tols = rel_tols
        self.abs_tol = float(abs_tol)
        self.per_head = per_head
        self._metric_names = [f"rank_{n}" for n in names] + [
            "rank_abs",
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
