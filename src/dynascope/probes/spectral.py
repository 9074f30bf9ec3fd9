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

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from dynascope.adapters import AttentionView, attention_views, stack_views
from dynascope.probes.base import Probe, ProbeContext, register_probe

__all__ = [
    "OVSpectrum",
    "QKSpectrum",
    "balancedness",
    "effective_rank",
    "factor_singular_values",
    "l2_nuclear_gap",
    "l2_term",
    "nuclear_norm",
    "ov_factors",
    "ov_singular_values",
    "qk_factors",
    "qk_singular_values",
    "rank_above",
    "rank_at",
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


def _rank_thresholds(
    rel_tols: Sequence[float], abs_tol: float
) -> tuple[tuple[float, ...], float, list[str]]:
    """Checked ``(rel_tols, abs_tol)`` and the metric names ``rank_{tol}`` ... ``rank_abs``.

    Raises:
        ValueError: if a threshold is negative or two ``rel_tols`` give the same key.
    """
    rel_tols = tuple(float(t) for t in rel_tols)
    if not all(t >= 0 for t in rel_tols):
        raise ValueError(f"rel_tols must all be >= 0 (got {rel_tols})")
    names = [f"rank_{_format_tol(t)}" for t in rel_tols]
    if len(set(names)) != len(names):
        raise ValueError(f"rel_tols must be distinct (got {rel_tols})")
    if not abs_tol >= 0:
        raise ValueError(f"abs_tol must be >= 0 (got {abs_tol})")
    return rel_tols, float(abs_tol), [*names, "rank_abs"]


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
        self.rel_tols, self.abs_tol, rank_names = _rank_thresholds(rel_tols, abs_tol)
        self.per_head = per_head
        self._metric_names = [
            *rank_names,
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
