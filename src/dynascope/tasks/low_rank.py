"""Synthetic low-rank data for autoencoders (S15): ``x = A s + noise_std * eps``.

Glossary (dimensions and symbols):
    n:          number of samples.
    d_in:       data width (32 in S15).
    r:          true rank, ``len(variances)`` (5 in S15).
    A:          ``[d_in, r]`` mixing matrix with orthonormal columns (reduced QR of a Gaussian
                matrix, signs fixed so that ``diag(R) > 0``), so the data's principal directions
                are exactly A's columns, in order.
    variances:  ``[r]`` variances of the sources ``s ~ N(0, diag(variances))``, default
                ``(5, 4, 3, 2, 1)``: the principal variances of the signal, descending.
    eps:        ``[d_in]`` standard Gaussian noise; ``noise_std`` 0.01 gives variance 1e-4 per
                coordinate.
    x:          ``[n, d_in]`` samples, one per row: ``x = s @ A^T + noise_std * eps``.

Population covariance ``Sigma = A diag(variances) A^T + noise_std^2 I``: eigenvalues
``variances + noise_std^2`` along A's columns and ``noise_std^2`` on the other ``d_in - r``
directions.

This is not a :class:`dynascope.tasks.Task` (no sequence axis and no stream of batches): S15
trains full-batch on a fixed sample. Everything is drawn from the ``torch.Generator`` it is
given, so one seed gives one dataset.

References:
    Sun, Thilak, Littwin, Saremi & Susskind (2021), "Implicit Greedy Rank Learning in
    Autoencoders via Overparameterized Linear Networks", ICML workshop, arXiv 2107.01301
    (synthetic linear data; dynascope SYSTEMS.md S15).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from .base import _check_float, _check_int

__all__ = ["LowRankGaussian"]


class LowRankGaussian:
    """Samples ``x = s @ A^T + noise_std * eps`` with ``s ~ N(0, diag(variances))``.

    Args:
        d_in: data width (>= ``len(variances)``).
        variances: source variances, non-empty, finite, each > 0 (any order; the principal
            directions are A's columns in the order given).
        noise_std: standard deviation of the isotropic noise, finite, >= 0.
    Raises:
        ValueError: if ``variances`` is empty or holds a value that is not a finite number > 0,
            ``d_in < len(variances)``, or ``noise_std`` is negative or not finite.
    """

    def __init__(
        self,
        *,
        d_in: int = 32,
        variances: Sequence[float] = (5.0, 4.0, 3.0, 2.0, 1.0),
        noise_std: float = 0.01,
    ) -> None:
        variances = tuple(variances)
        if len(variances) == 0:
            raise ValueError("variances must be non-empty (got variances=())")
        for v in variances:
            is_number = isinstance(v, int | float) and not isinstance(v, bool)
            if not is_number or not math.isfinite(v) or v <= 0:
                raise ValueError(f"variances must be finite numbers > 0 (got {variances!r})")
        _check_int("d_in", d_in, minimum=len(variances))
        _check_float("noise_std", noise_std, positive=False)
        self.d_in = d_in
        self.variances = tuple(float(v) for v in variances)
        self.rank = len(variances)
        self.noise_std = float(noise_std)

    def mixing_matrix(
        self, generator: torch.Generator, dtype: torch.dtype = torch.float64
    ) -> Tensor:
        """``A`` ``[d_in, r]`` with orthonormal columns, drawn from ``generator``."""
        g = torch.randn(self.d_in, self.rank, generator=generator, dtype=dtype)
        q, r = torch.linalg.qr(g)
        return q * torch.sign(torch.diagonal(r))  # unique: diag(R) > 0

    def sample(self, A: Tensor, n: int, generator: torch.Generator) -> Tensor:
        """``n`` samples ``[n, d_in]`` in ``A``'s dtype (sources first, then noise).

        Raises:
            ValueError: if ``n < 1`` or ``A`` is not ``[d_in, r]``.
        """
        _check_int("n", n, minimum=1)
        if tuple(A.shape) != (self.d_in, self.rank):
            raise ValueError(f"A must be [{self.d_in}, {self.rank}] (got {tuple(A.shape)})")
        std = torch.tensor(self.variances, dtype=A.dtype).sqrt()
        s = torch.randn(n, self.rank, generator=generator, dtype=A.dtype) * std
        eps = torch.randn(n, self.d_in, generator=generator, dtype=A.dtype)
        return s @ A.T + self.noise_std * eps

    def covariance(self, A: Tensor) -> Tensor:
        """Population covariance ``A diag(variances) A^T + noise_std^2 I`` ``[d_in, d_in]``."""
        v = torch.tensor(self.variances, dtype=A.dtype)
        eye = torch.eye(self.d_in, dtype=A.dtype)
        return (A * v) @ A.T + self.noise_std**2 * eye
