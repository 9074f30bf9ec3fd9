"""Private helper of :mod:`dynascope.probes.hessian_density`: m-step Lanczos from one start
vector, with full reorthogonalization, and the Gauss quadrature it defines.

Glossary:
    A:      a symmetric ``[P, P]`` operator, used only through ``matvec(v [P]) -> A v [P]``.
    q_j:    the Lanczos vectors, orthonormal, ``q_1 = start / ‖start‖``; kept as rows of a
            float64 ``[m, P]`` basis so every new vector is orthogonalized against all of them.
    T:      the ``[j, j]`` tridiagonal ``Qᵀ A Q`` with diagonal ``α`` and off-diagonal ``β``.
    θ, τ:   Ritz values (eigenvalues of T) and Gauss weights ``τ_i = (e_1ᵀ s_i)²`` (squared first
            components of T's unit eigenvectors ``s_i``); ``Σ_i τ_i = 1``.

``Σ_i τ_i f(θ_i)`` is the j-node Gauss quadrature of ``∫ f dμ`` for the spectral measure
``μ = Σ_k (u_kᵀ q_1)² δ_{λ_k}`` of ``A`` seen from ``q_1``: exact for polynomials of degree
``≤ 2j − 1`` (Golub & Meurant 2010, "Matrices, Moments and Quadrature with Applications", Thm. 6.6).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["gauss_quadrature", "lanczos_tridiagonal"]


def lanczos_tridiagonal(
    matvec: Callable[[Tensor], Tensor], start: Tensor, steps: int, *, rel_tol: float
) -> tuple[Tensor, Tensor]:
    """``(α [j], β [j−1])``, float64: the Lanczos tridiagonal after ``j ≤ steps`` products.

    Full reorthogonalization (twice against the whole basis, Kahan–Parlett), so no ghost Ritz
    values appear. It stops early, with ``j < steps``, when the new residual norm is at most
    ``rel_tol`` times the largest ``‖A q‖`` so far (an invariant subspace: the quadrature is
    then exact for ``q_1``'s spectral measure). ``steps`` is clamped to ``P``.

    Args:
        matvec: ``v [P] float64 -> A v [P] float64``.
        start: ``[P]``, non-zero.
        steps: most products (>= 1).
        rel_tol: breakdown tolerance relative to the largest ``‖A q‖`` so far (>= 0).
    """
    n = start.numel()
    steps = min(steps, n)
    Q = torch.zeros(steps, n, dtype=torch.float64, device=start.device)
    alpha: list[Tensor] = []
    beta: list[Tensor] = []
    q = start.double() / start.double().norm()
    scale = 0.0
    for j in range(steps):
        Q[j] = q
        w = matvec(q)
        scale = max(scale, float(w.norm()))
        alpha.append(q @ w)
        for _ in range(2):
            w = w - (Q[: j + 1] @ w) @ Q[: j + 1]
        norm = w.norm()
        if j == steps - 1 or not bool(norm > rel_tol * scale):
            break
        beta.append(norm)
        q = w / norm
    off = torch.stack(beta).cpu() if beta else torch.zeros(0, dtype=torch.float64)
    return torch.stack(alpha).cpu(), off


def gauss_quadrature(alpha: Tensor, beta: Tensor) -> tuple[Tensor, Tensor]:
    """``(θ [j], τ [j])``: Ritz values ascending and their Gauss weights (sum 1), float64."""
    T = torch.diag(alpha) + torch.diag(beta, 1) + torch.diag(beta, -1)
    theta, S = torch.linalg.eigh(T)
    return theta, S[0] ** 2
