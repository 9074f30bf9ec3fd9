"""The 5x5 matrix-factorization toy of study S01: weight decay on factors soft-thresholds.

Glossary:
    n           size of the target, ``len(diag)`` (5 by default).
    r           inner dimension of the factors (rank budget); the study uses r = n.
    D           ``[n, n]`` target, ``diag(d_1..d_n)``, default ``diag(0.2, 0.4, 0.6, 0.8, 1.0)``.
    A, B        factors ``[..., n, r]``; the product is ``W = A B^T`` ``[..., n, n]``.
    lam         weight decay lambda ``[...]`` (a float or a tensor broadcasting over ``...``).
    s           ``data_scale``, the weight of the data term.
    G           gradient of the data term w.r.t. W: ``G = 2 s (A B^T - D)``.
    sigma_i     singular values of ``A B^T``.
    c           ``threshold_constant = 1 / (2 s)``.

Objective (batched over the leading dims ``...``, e.g. one row per lambda)::

    L(A, B; lam) = s * ||A B^T - D||_F^2 + (lam / 2) * (||A||_F^2 + ||B||_F^2)

Closed-form gradients::

    grad_A = G B + lam A,      grad_B = G^T A + lam B

The ablation ``penalty="product"`` puts the same lam on the product instead of the factors,
``(lam / 2) ||A B^T||_F^2``: then ``grad_A = (G + lam W) B``, ``grad_B = (G + lam W)^T A`` with
``W = A B^T``; gradient flow conserves ``A^T A - B^T B`` (the loss depends on ``W`` alone) and
the minimum is the shrinkage ``sigma_i = d_i / (1 + c lam)``, no mode is zeroed.

With the factor penalty, gradient flow gives ``d/dt (A^T A - B^T B) = -2 lam (A^T A - B^T B)``
(the G terms cancel), so
balancedness decays as ``exp(-2 lam t)``; for balanced factors the penalty equals
``lam * ||A B^T||_*`` (nuclear norm). Minimising ``s (sigma - d)^2 + lam sigma`` over
``sigma >= 0`` gives the soft-threshold ``sigma_i = max(d_i - c lam, 0)`` with ``c = 1/(2s)``:
``c = 1/2`` for ``s = 1`` and ``c = 1`` for ``s = 1/2`` (the convention under which mode i
vanishes once ``lam >= d_i``). This holds for ``r >= n`` (no rank budget binds).

This is not a ``Task`` (there is no data stream and no model): it provides the exact loss,
gradient and predicted end point for plain full-batch gradient descent on the factors.

References:
    Kobayashi, Akram & von Oswald (2024), "Weight decay induces low-rank attention layers",
    NeurIPS, arXiv 2410.23819 (toy of Section 3; dynascope SYSTEMS.md S01 (a)).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from .base import _check_float, _check_int


class MatrixFactorization:
    """Factor a diagonal target, ``A B^T ~ D``, under L2 weight decay on ``A`` and ``B``.

    Args:
        diag: diagonal of ``D``; non-empty, finite, every entry ``>= 0``.
        data_scale: weight ``s`` of the data term, finite, ``> 0``.
        penalty: ``factors`` (weight decay on ``A`` and ``B``, the paper's setting) or
            ``product`` (the same ``lam`` as ``(lam/2)||A B^T||_F^2``: the ablation control).
    Raises:
        ValueError: if ``diag`` is empty or has a negative or non-finite entry,
            ``data_scale`` is not a finite number ``> 0``, or ``penalty`` is not ``factors``
            or ``product``.
    """

    def __init__(
        self,
        *,
        diag: Sequence[float] = (0.2, 0.4, 0.6, 0.8, 1.0),
        data_scale: float = 1.0,
        penalty: str = "factors",
    ) -> None:
        if penalty not in ("factors", "product"):
            raise ValueError(f"penalty must be one of factors, product (got {penalty!r})")
        self.penalty = penalty
        diag = tuple(diag)
        if len(diag) == 0:
            raise ValueError("diag must be non-empty (got diag=())")
        for d in diag:
            is_number = isinstance(d, (int, float)) and not isinstance(d, bool)
            if not is_number or not math.isfinite(d) or d < 0:
                raise ValueError(f"diag entries must be finite numbers >= 0 (got diag={diag!r})")
        _check_float("data_scale", data_scale, positive=True)
        self.diag = tuple(float(d) for d in diag)
        self.data_scale = float(data_scale)
        self.n = len(diag)

    @property
    def threshold_constant(self) -> float:
        """``c = 1 / (2 data_scale)``: predicted ``sigma_i = max(d_i - c lam, 0)``."""
        return 1.0 / (2.0 * self.data_scale)

    def target(
        self, dtype: torch.dtype = torch.float64, device: torch.device | None = None
    ) -> Tensor:
        """The target ``D = diag(d)``, ``[n, n]``."""
        return torch.diag(torch.tensor(self.diag, dtype=dtype, device=device))

    def _check_factors(self, A: Tensor, B: Tensor) -> None:
        if A.ndim < 2 or A.shape[-2] != self.n or A.shape != B.shape:
            raise ValueError(
                f"A and B must both have shape [..., n, r] with n={self.n} "
                f"(got A.shape={list(A.shape)}, B.shape={list(B.shape)})"
            )

    def _residual(self, A: Tensor, B: Tensor) -> Tensor:
        """``A B^T - D``, ``[..., n, n]``."""
        return A @ B.mT - self.target(A.dtype, A.device)

    def loss(self, A: Tensor, B: Tensor, lam: Tensor | float) -> Tensor:
        """``s ||A B^T - D||_F^2 + (lam/2)(||A||_F^2 + ||B||_F^2)`` (``penalty="product"``:
        ``+ (lam/2)||A B^T||_F^2`` instead).

        Args:
            A, B: factors ``[..., n, r]``.
            lam: weight decay, a float or a tensor ``[...]``.
        Returns:
            Loss per leading index, ``[...]`` (a 0-dim tensor for unbatched factors).
        Raises:
            ValueError: if ``A`` and ``B`` are not both ``[..., n, r]``.
        """
        self._check_factors(A, B)
        lam = torch.as_tensor(lam, dtype=A.dtype, device=A.device)
        data = self._residual(A, B).square().sum(dim=(-2, -1))
        if self.penalty == "product":
            l2 = (A @ B.mT).square().sum(dim=(-2, -1))
        else:
            l2 = A.square().sum(dim=(-2, -1)) + B.square().sum(dim=(-2, -1))
        return self.data_scale * data + 0.5 * lam * l2

    def gradients(self, A: Tensor, B: Tensor, lam: Tensor | float) -> tuple[Tensor, Tensor]:
        """Closed-form ``(grad_A, grad_B)`` of ``loss``, each ``[..., n, r]``.

        ``G = 2 s (A B^T - D)``, ``grad_A = G B + lam A``, ``grad_B = G^T A + lam B``
        (``penalty="product"``: ``G + lam A B^T`` in place of ``G`` and no ``lam A``, ``lam B``).
        """
        self._check_factors(A, B)
        lam = torch.as_tensor(lam, dtype=A.dtype, device=A.device)[..., None, None]
        G = 2.0 * self.data_scale * self._residual(A, B)  # [..., n, n]
        if self.penalty == "product":
            G = G + lam * (A @ B.mT)
            return G @ B, G.mT @ A
        return G @ B + lam * A, G.mT @ A + lam * B

    def gradient_step(
        self, A: Tensor, B: Tensor, lam: Tensor | float, lr: float
    ) -> tuple[Tensor, Tensor]:
        """One full-batch plain gradient-descent step: ``(A - lr grad_A, B - lr grad_B)``.

        Args:
            A, B: factors ``[..., n, r]``.
            lam: weight decay, a float or a tensor ``[...]``.
            lr: step size (eta).
        Returns:
            New ``(A, B)``, same shapes; the inputs are not modified.
        """
        grad_A, grad_B = self.gradients(A, B, lam)
        return A - lr * grad_A, B - lr * grad_B

    def predicted_singular_values(self, lam: Tensor | float) -> Tensor:
        """Predicted end point ``max(d_i - c lam, 0)``, sorted descending like ``svdvals``.

        Args:
            lam: weight decay, a float or a tensor ``[...]`` (float64 if a float).
        Returns:
            ``[..., n]`` singular values of ``A B^T`` at the minimum (for ``r >= n``).
        """
        if not isinstance(lam, Tensor):
            lam = torch.tensor(float(lam), dtype=torch.float64)
        elif not lam.is_floating_point():
            lam = lam.to(torch.float64)
        d = torch.tensor(sorted(self.diag, reverse=True), dtype=lam.dtype, device=lam.device)
        return (d - self.threshold_constant * lam[..., None]).clamp(min=0.0)

    def init_factors(
        self,
        n_lambda: int,
        generator: torch.Generator,
        std: float = 0.3,
        dtype: torch.dtype = torch.float64,
    ) -> tuple[Tensor, Tensor]:
        """Independent Gaussian factors, so balancedness starts non-zero.

        ``A`` is drawn first, then ``B``, each entry ``N(0, std^2)``, on ``generator.device``.

        Args:
            n_lambda: leading batch size (one row per lambda), ``>= 1``.
            generator: source of randomness.
            std: entry standard deviation, finite, ``> 0``.
            dtype: floating dtype of the factors.
        Returns:
            ``(A, B)``, each ``[n_lambda, n, n]``.
        Raises:
            ValueError: if ``n_lambda < 1`` or ``std`` is not a finite number ``> 0``.
        """
        _check_int("n_lambda", n_lambda, 1)
        _check_float("std", std, positive=True)
        shape = (n_lambda, self.n, self.n)
        kw = {"generator": generator, "device": generator.device, "dtype": dtype}
        A = torch.randn(shape, **kw) * std
        B = torch.randn(shape, **kw) * std
        return A, B
