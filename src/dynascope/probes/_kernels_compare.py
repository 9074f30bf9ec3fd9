"""Comparing kernels: the relative change of an empirical NTK, kernel-target alignment and
centred kernel alignment (CKA). Public names are re-exported by
:mod:`dynascope.probes.kernels` (glossary there).

A kernel is ``[n, n]`` (e.g. trace mode) or ``[n, n, d_out, d_out]`` (full mode, read as its
``[n d_out, n d_out]`` matrix).
"""

from __future__ import annotations

import torch
from torch import Tensor


def ntk_relative_change(K_t: Tensor, K_0: Tensor) -> Tensor:
    """Relative kernel change ``||K_t - K_0||_F / ||K_0||_F`` over all entries (S17).

    Args:
        K_t: the kernel now, any shape (e.g. ``[n, n]`` or ``[n, n, d_out, d_out]``).
        K_0: the reference kernel, same shape.
    Returns:
        Scalar tensor, dimensionless; NaN if either kernel has a NaN.
    Raises:
        ValueError: if the shapes differ or ``K_0`` is all zero.
    """
    if K_t.shape != K_0.shape:
        raise ValueError(
            f"K_t and K_0 must have the same shape (got {tuple(K_t.shape)}, {tuple(K_0.shape)})"
        )
    ref = torch.linalg.vector_norm(K_0)
    if ref == 0:
        raise ValueError("K_0 must not be all zero (its Frobenius norm is the denominator)")
    return torch.linalg.vector_norm(K_t - K_0) / ref


def _gram(K: Tensor, name: str) -> Tensor:
    """A kernel as an ``[n d_out, n d_out]`` matrix (full mode) or as is (``[n, n]``)."""
    if K.ndim == 4 and K.shape[0] == K.shape[1] and K.shape[2] == K.shape[3]:
        n, _, d, _ = K.shape
        return K.permute(0, 2, 1, 3).reshape(n * d, n * d)
    if K.ndim == 2 and K.shape[0] == K.shape[1]:
        return K
    raise ValueError(f"{name} must be [n, n] or [n, n, d_out, d_out] (got {tuple(K.shape)})")


def kernel_alignment(K: Tensor, y: Tensor) -> Tensor:
    """Kernel-target alignment ``<K, y y^T>_F / (||K||_F ||y y^T||_F)`` (uncentred cosine).

    Args:
        K: ``[n, n]`` Gram (e.g. trace mode) or ``[n, n, d_out, d_out]`` (full mode).
        y: targets ``[n]`` or ``[n, d_out]``; with an ``[n, n]`` kernel and ``[n, k]``
            targets the target Gram is ``Y Y^T``; with a full kernel, ``vec(y) vec(y)^T``.
    Returns:
        Scalar in [-1, 1] (in [0, 1] for PSD K), dimensionless.
    Raises:
        ValueError: if the shapes do not match, or K or y is all zero.
    References:
        Cristianini, Shawe-Taylor, Elisseeff & Kandola (2001), "On kernel-target alignment",
        NeurIPS, Definition 1.
    """
    G = _gram(K, "K")
    y = y.reshape(y.shape[0], -1)
    if K.ndim == 4:
        y = y.reshape(-1, 1)
    if y.shape[0] != G.shape[0]:
        raise ValueError(f"y must have {G.shape[0]} rows to match K (got {y.shape[0]})")
    T = y @ y.mT
    return _cosine(G, T)


def _cosine(A: Tensor, B: Tensor) -> Tensor:
    na, nb = torch.linalg.vector_norm(A), torch.linalg.vector_norm(B)
    if na == 0 or nb == 0:
        raise ValueError("kernels must not be all zero (alignment is a cosine)")
    return (A * B).sum() / (na * nb)


def centered_kernel_alignment(K1: Tensor, K2: Tensor) -> Tensor:
    """Centred kernel alignment ``<H K1 H, H K2 H>_F / (||H K1 H||_F ||H K2 H||_F)``.

    ``H = I - 11^T / n`` centres the features; pass ``K2 = y y^T`` for target alignment.

    Args:
        K1, K2: ``[n, n]`` or ``[n, n, d_out, d_out]`` Grams of the same shape.
    Returns:
        Scalar in [-1, 1] (in [0, 1] for PSD kernels), dimensionless.
    Raises:
        ValueError: if the shapes differ, or a centred kernel is zero (e.g. a constant kernel).
    References:
        Cortes, Mohri & Rostamizadeh (2012), "Algorithms for Learning Kernels Based on
        Centered Alignment", JMLR 13, Definition 1 and Lemma 1.
    """
    if K1.shape != K2.shape:
        raise ValueError(
            f"K1 and K2 must have the same shape (got {tuple(K1.shape)}, {tuple(K2.shape)})"
        )
    G1, G2 = _gram(K1, "K1"), _gram(K2, "K2")
    n = G1.shape[0]
    H = torch.eye(n, dtype=G1.dtype, device=G1.device) - 1.0 / n
    C1, C2 = H @ G1 @ H, H @ G2 @ H
    eps = n * torch.finfo(G1.dtype).eps  # centring a constant kernel leaves only round-off
    for name, C, G in (("K1", C1, G1), ("K2", C2, G2)):
        if torch.linalg.vector_norm(C) <= eps * torch.linalg.vector_norm(G):
            raise ValueError(f"{name} centred must not be all zero (a constant kernel has no CKA)")
    return _cosine(C1, C2)
