"""Latent covariance spectrum and its ranks (S15, S16): how many directions a latent code uses.

Glossary:
    n:          number of latent codes (samples), ``>= 2``.
    d_latent:   width of a latent code.
    z:          ``[..., n, d_latent]`` latent codes, one per row (batched over ``...``).
    C:          ``[..., d_latent, d_latent]`` sample covariance
                ``(z - mean)^T (z - mean) / (n - 1)`` (``np.cov(z.T)``, IRMAE's ``singular.py``).
    lambda_i:   eigenvalues of ``C``, descending, ``>= 0``.

The spectrum is computed from the centred codes, not from ``C``: ``lambda_i = s_i^2 / (n - 1)``
with ``s_i`` the singular values of ``z - mean``. This keeps small eigenvalues to a relative
accuracy of about ``eps * s_1 / s_i`` instead of ``eps * lambda_1 / lambda_i`` (forming ``C``
squares the condition number); the explicit ``eigvalsh(C)`` is the test oracle. Codes are first
divided by a power of two at or above ``max |z|`` (exact), so the normalised spectrum is the same
at any scale up to the dtype's maximum.

Every function is pure and batched: no ``.item()``, no device moves.

References:
    Jing, Zbontar & LeCun (2020), "Implicit Rank-Minimizing Autoencoder", NeurIPS,
    arXiv 2010.00679 (``singular.py``: SVD of ``np.cov`` of test latents, normalised by the top
    value).
    Sun, Thilak, Littwin, Saremi & Susskind (2021), "Implicit Greedy Rank Learning in
    Autoencoders via Overparameterized Linear Networks", arXiv 2107.01301.
    Roy & Vetterli (2007), "The effective rank: a measure of effective dimensionality", EUSIPCO.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dynascope.probes.spectral import _normalized, effective_rank, rank_at

__all__ = [
    "latent_covariance",
    "latent_covariance_spectrum",
    "latent_effective_rank",
    "latent_rank",
]


def _check_codes(z: Tensor) -> None:
    if z.ndim < 2:
        raise ValueError(f"z must be [..., n, d_latent] (got shape {tuple(z.shape)})")
    if z.shape[-2] < 2:
        raise ValueError(f"z needs n >= 2 codes for a covariance (got n={z.shape[-2]})")
    if not z.is_floating_point():
        raise ValueError(f"z must be a floating-point tensor (got dtype {z.dtype})")
    bad_nan, bad_inf = int(z.isnan().sum()), int(z.isinf().sum())
    if bad_nan or bad_inf:
        raise ValueError(f"z must be finite (got {bad_nan} NaN and {bad_inf} infinite entries)")


def _centred_scaled(z: Tensor) -> tuple[Tensor, Tensor]:
    """``(z - mean) / scale`` and ``scale`` ``[..., 1, 1]`` (a power of two, 1 for all-zero z)."""
    dtype = torch.float64 if z.dtype == torch.float64 else torch.float32
    z = z.to(dtype)
    peak = z.abs().amax(dim=(-2, -1), keepdim=True)
    _, exponent = torch.frexp(peak)
    scale = torch.where(
        peak > 0, torch.ldexp(torch.ones_like(peak), exponent), torch.ones_like(peak)
    )
    z = z / scale  # exact
    return z - z.mean(dim=-2, keepdim=True), scale


def latent_covariance(z: Tensor) -> Tensor:
    """Sample covariance ``C = (z - mean)^T (z - mean) / (n - 1)`` of codes ``z``.

    Args:
        z: ``[..., n, d_latent]``, floating point, finite, ``n >= 2``.
    Returns:
        ``[..., d_latent, d_latent]``, symmetric PSD, in ``z``'s unit squared; float64 for
        float64 input, else float32 (overflows to ``inf`` only where ``C`` itself does).
    Raises:
        ValueError: if ``z`` has fewer than 2 dims, fewer than 2 rows, is not floating point, or
            holds NaN or inf.
    """
    _check_codes(z)
    zc, scale = _centred_scaled(z)
    n = z.shape[-2]
    return (zc.mT @ zc) / (n - 1) * scale.square()


def latent_covariance_spectrum(z: Tensor, *, normalize: bool = True) -> Tensor:
    """Eigenvalues of the codes' sample covariance, descending, from the SVD of the centred codes.

    ``lambda_i = s_i(z - mean)^2 / (n - 1)``; with ``normalize`` they are divided by
    ``lambda_1`` (IRMAE's ``singular.py`` convention), so the first is 1 unless all are 0.

    Args:
        z: ``[..., n, d_latent]``, floating point, finite, ``n >= 2``.
        normalize: divide by the largest eigenvalue (scale-free; an all-zero or constant
            ``z`` gives all zeros).
    Returns:
        ``[..., d_latent]`` eigenvalues, descending, ``>= 0``; zero-padded when
        ``n - 1 < d_latent`` (a sample of n codes spans at most n - 1 directions).
        Normalised: dimensionless. Unnormalised: ``z``'s unit squared (may overflow to inf in
        float32 for huge codes). float64 for float64 input, else float32.
    Raises:
        ValueError: if ``z`` has fewer than 2 dims, fewer than 2 rows, is not floating point, or
            holds NaN or inf.
    References:
        Jing, Zbontar & LeCun (2020), arXiv 2010.00679, ``singular.py``.
    """
    _check_codes(z)
    zc, scale = _centred_scaled(z)
    s = torch.linalg.svdvals(zc)  # [..., min(n, d_latent)], descending
    d_latent = z.shape[-1]
    if s.shape[-1] < d_latent:
        s = torch.nn.functional.pad(s, (0, d_latent - s.shape[-1]))
    if normalize:
        t, _ = _normalized(s)
        return t.square()
    n = z.shape[-2]
    return s.square() / (n - 1) * scale[..., 0].square()


def latent_rank(z: Tensor, rel_tol: float = 1e-2) -> Tensor:
    """``rank_{rel_tol}``: number of covariance eigenvalues above ``rel_tol * lambda_1``.

    Args:
        z: ``[..., n, d_latent]``, floating point, finite, ``n >= 2``.
        rel_tol: threshold relative to the largest eigenvalue (of the covariance, not of its
            square root: S15's ``rank_{1e-2}`` counts ``lambda_i / lambda_1 > 1e-2``), >= 0.
    Returns:
        ``[...]`` counts, ``torch.long``; 0 for all-zero or constant codes.
    Raises:
        ValueError: as :func:`latent_covariance_spectrum`, or if ``rel_tol`` is negative or NaN.
    """
    return rank_at(latent_covariance_spectrum(z), rel_tol)


def latent_effective_rank(z: Tensor) -> Tensor:
    """Effective rank ``exp(H(p))``, ``p_i = lambda_i / sum_j lambda_j``, of the latent covariance.

    Args:
        z: ``[..., n, d_latent]``, floating point, finite, ``n >= 2``.
    Returns:
        ``[...]`` effective rank, dimensionless, in ``[1, d_latent]`` (0 for constant codes).
    Raises:
        ValueError: as :func:`latent_covariance_spectrum`.
    References:
        Roy & Vetterli (2007), EUSIPCO, eq. (3)-(4).
    """
    return effective_rank(latent_covariance_spectrum(z))
