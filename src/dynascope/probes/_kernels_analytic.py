"""Infinite-width ReLU kernels (arc-cosine recursions) and the kernel-GD twin (private).

Glossary:
    n1, n2, d_in:  examples in ``x1``, ``x2`` and their width.
    L (depth):     hidden ReLU layers of the MLP ``d_in -> n (x L) -> 1``.
    Sigma^l:       NNGP covariance of the l-th preactivation; ``Sigma^{L+1}`` is the readout's.
    Theta^l:       NTK of the l-th preactivation; ``Theta^{L+1}`` is the net's NTK.
    N, M, d_out:   training examples, test examples, outputs per example (kernel GD).

Public wrappers re-exported (with these docstrings) from :mod:`dynascope.probes.kernels`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

# NTK4A's utils.py clamps the correlation to [-1 + eps, 1 - eps] (eps 1e-10 / 1e-6), which keeps
# arccos's derivative finite; no gradient is taken here, and that eps moves the diagonal by
# ~2e-6 relative (theta = sqrt(2 eps)), so we clamp to [-1, 1] only (round-off past +-1).


def _check_inputs(x1: Tensor, x2: Tensor | None, depth: int, W_std: float, b_std: float):
    if x1.ndim != 2:
        raise ValueError(f"x1 must be [n1, d_in] (got shape {tuple(x1.shape)})")
    x2 = x1 if x2 is None else x2
    if x2.ndim != 2 or x2.shape[1] != x1.shape[1]:
        raise ValueError(
            f"x2 must be [n2, d_in={x1.shape[1]}] like x1 (got shape {tuple(x2.shape)})"
        )
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth must be an integer >= 1 (got {depth!r})")
    if not (math.isfinite(W_std) and W_std > 0):
        raise ValueError(f"W_std must be a finite number > 0 (got {W_std!r})")
    if not (math.isfinite(b_std) and b_std >= 0):
        raise ValueError(f"b_std must be a finite number >= 0 (got {b_std!r})")
    return x2


def _arccos_terms(s12: Tensor, s11: Tensor, s22: Tensor) -> tuple[Tensor, Tensor]:
    """``(V_ReLU(Sigma)_12, V_Step(Sigma)_12)`` for cross covariance s12 and variances s11, s22."""
    norm = torch.sqrt(s11[:, None] * s22[None, :])
    c = torch.where(norm > 0, s12 / torch.where(norm > 0, norm, 1), torch.zeros_like(s12))
    c = c.clamp(-1.0, 1.0)
    theta = torch.arccos(c)
    v_relu = norm / (2 * math.pi) * (torch.sin(theta) + (math.pi - theta) * c)
    v_step = (math.pi - theta) / (2 * math.pi)
    return v_relu, v_step


def relu_kernels(
    x1: Tensor, x2: Tensor | None, depth: int, W_std: float, b_std: float
) -> tuple[Tensor, Tensor]:
    """``(Sigma^{L+1}, Theta^{L+1})`` ``[n1, n2]`` each, by the recursion in the module docs."""
    x2 = _check_inputs(x1, x2, depth, W_std, b_std)
    d_in = x1.shape[1]
    w2, b2 = W_std**2, b_std**2
    s12 = w2 * (x1 @ x2.mT) / d_in + b2  # Sigma^1 cross
    s11 = w2 * (x1 * x1).sum(-1) / d_in + b2  # Sigma^1 diagonal at x1
    s22 = w2 * (x2 * x2).sum(-1) / d_in + b2
    theta = s12
    for _ in range(depth):
        v_relu, v_step = _arccos_terms(s12, s11, s22)
        theta = w2 * v_relu + b2 + w2 * v_step * theta
        s12 = w2 * v_relu + b2
        # V_ReLU on the diagonal (c = 1, theta = 0): s / 2
        s11 = w2 * s11 / 2 + b2
        s22 = w2 * s22 / 2 + b2
    return s12, theta


def kernel_gd(
    K_test_train: Tensor | None,
    K_train: Tensor,
    y: Tensor,
    lr: float,
    steps: int,
    f0_train: Tensor | None,
    f0_test: Tensor | None,
    loss: str,
) -> tuple[Tensor, Tensor | None]:
    """Kernel gradient descent (see :func:`dynascope.probes.kernels.kernel_gd_predictions`)."""
    if y.ndim == 1:
        y = y[:, None]
    if y.ndim != 2:
        raise ValueError(f"y must be [N] or [N, d_out] (got shape {tuple(y.shape)})")
    N, d_out = y.shape
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be an integer >= 0 (got {steps!r})")
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a finite number > 0 (got {lr!r})")
    if loss not in ("mean", "sum"):
        raise ValueError(f"loss must be 'mean' or 'sum' (got {loss!r})")

    def flat(K: Tensor, rows: int, name: str) -> Tensor:
        if K.shape == (rows, N):
            return torch.kron(K, torch.eye(d_out, dtype=K.dtype, device=K.device))
        if K.shape == (rows, N, d_out, d_out):
            return K.permute(0, 2, 1, 3).reshape(rows * d_out, N * d_out)
        raise ValueError(
            f"{name} must be [{rows}, {N}] or [{rows}, {N}, {d_out}, {d_out}] "
            f"(got shape {tuple(K.shape)})"
        )

    A = flat(K_train, N, "K_train")  # [N d_out, N d_out]
    scale = lr / N if loss == "mean" else lr
    f = torch.zeros_like(y) if f0_train is None else f0_train.reshape(N, d_out).to(y.dtype)
    train = [f]
    test = None
    if K_test_train is not None:
        M = K_test_train.shape[0]
        B = flat(K_test_train, M, "K_test_train")
        g = torch.zeros(M, d_out, dtype=y.dtype, device=y.device)
        if f0_test is not None:
            g = f0_test.reshape(M, d_out).to(y.dtype)
        test = [g]
    for _ in range(steps):
        r = (f - y).reshape(-1)  # [N d_out], the loss derivative times N (mean) or 1 (sum)
        f = f - scale * (A @ r).view(N, d_out)
        train.append(f)
        if test is not None:
            g = g - scale * (B @ r).view(-1, d_out)
            test.append(g)
    return torch.stack(train), None if test is None else torch.stack(test)
