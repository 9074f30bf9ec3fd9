"""Latent codes inside a model and how well known task factors decode from them.

Glossary:
    pattern:    ``[batch, n_heads, query_pos, key_pos]`` normalised attention scores of a layer.
    latent code: per (query, key) pair, the head vector ``a[:, :, q, k]`` ``[batch, n_heads]``
                (attention read as a hypernetwork); by default the query on itself, ``a_{h,q,q}``.
    features:   ``[n, d]`` any representation (latent codes, residual stream), one row per
                sequence; ``targets`` ``[n, t]`` known task factors (K-hot terms, teacher z).
    R²:         per target column ``1 - sum (y - y_hat)^2 / sum (y - mean y)^2`` on held-out rows
                (mean over evaluation rows of that column); columns constant on the evaluation
                rows are NaN and skipped in the mean.
    F1:         per binary label, ``2 TP / (2 TP + FP + FN)`` of a logistic probe's 0.5 threshold.

All functions are pure: float64 internally, no ``.item()``, no device moves.

References:
    Schug et al. (2025), "Attention as a Hypernetwork", arXiv 2406.05816, sec. 4.3 (logistic
        probes of head-score latent codes, F1); reference ``callbacks.py`` (ridge R²,
        ``r2_attn_latent``).
    Kobayashi et al. (2024), arXiv 2407.12275, App. C.2 (ridge, alpha = 1, residual stream to z).
    Schug et al. (2024), "Discovering modular solutions that generalize compositionally",
        arXiv 2312.15001, sec. 3 (module alignment after a linear map of codes).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "attention_latent_code",
    "logistic_f1",
    "ridge_fit",
    "ridge_r2",
]


def attention_latent_code(pattern: Tensor, query: int = -1, key: int | None = None) -> Tensor:
    """Head-score latent code of one (query, key) pair: ``pattern[:, :, query, key]``.

    Args:
        pattern: ``[batch, n_heads, query_pos, key_pos]``.
        query: query position (negative counts from the end; default the last token).
        key: key position; ``None`` means the query itself (``a_{h,q,q}``, the paper's code).
    Returns:
        ``[batch, n_heads]``.
    Raises:
        ValueError: if ``pattern`` is not 4-D or a position is out of range.
    """
    if pattern.ndim != 4:
        raise ValueError(
            "pattern must be [batch, n_heads, query_pos, key_pos] "
            f"(got shape {tuple(pattern.shape)})"
        )
    n_q, n_k = pattern.shape[-2:]
    if not -n_q <= query < n_q:
        raise ValueError(f"query must be in [-{n_q}, {n_q}) (got query={query})")
    q = query % n_q
    k = q if key is None else key
    if not -n_k <= k < n_k:
        raise ValueError(f"key must be in [-{n_k}, {n_k}) (got key={key})")
    return pattern[:, :, q, k % n_k]


def _check_xy(features: Tensor, targets: Tensor, name: str) -> None:
    if features.ndim != 2 or targets.ndim != 2 or features.shape[0] != targets.shape[0]:
        raise ValueError(
            f"{name}: features must be [n, d] and targets [n, t] with the same n "
            f"(got {tuple(features.shape)} and {tuple(targets.shape)})"
        )
    if not (features.isfinite().all() and targets.isfinite().all()):
        raise ValueError(f"{name}: features and targets must be finite")


def ridge_fit(features: Tensor, targets: Tensor, alpha: float = 1.0) -> tuple[Tensor, Tensor]:
    """Ridge regression with an unpenalised intercept: ``min ||X W + b - Y||^2 + alpha ||W||^2``.

    Args:
        features: ``[n, d]``; targets: ``[n, t]``; alpha: ``>= 0`` (0 = least squares via lstsq).
    Returns:
        ``(W [d, t], b [t])`` in float64.
    Raises:
        ValueError: for bad shapes, non-finite values or ``alpha < 0``.
    """
    _check_xy(features, targets, "ridge_fit")
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0 (got alpha={alpha})")
    X, Y = features.double(), targets.double()
    x_mean, y_mean = X.mean(0), Y.mean(0)
    Xc, Yc = X - x_mean, Y - y_mean
    if alpha == 0:
        W = torch.linalg.lstsq(Xc, Yc, driver="gelsd").solution
    else:
        gram = Xc.T @ Xc + alpha * torch.eye(X.shape[1], dtype=X.dtype, device=X.device)
        W = torch.linalg.solve(gram, Xc.T @ Yc)
    return W, y_mean - x_mean @ W


def _r2_columns(y: Tensor, y_hat: Tensor) -> Tensor:
    ss_res = (y - y_hat).square().sum(0)
    ss_tot = (y - y.mean(0)).square().sum(0)
    r2 = 1.0 - ss_res / ss_tot
    return torch.where(ss_tot > 1e-12 * y.shape[0], r2, torch.full_like(r2, float("nan")))


def ridge_r2(
    train_features: Tensor,
    train_targets: Tensor,
    test_features: Tensor,
    test_targets: Tensor,
    alpha: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """Fit ridge on train rows, return held-out R² per target column and its mean.

    Args:
        train_features, test_features: ``[n, d]``, ``[m, d]``.
        train_targets, test_targets: ``[n, t]``, ``[m, t]``.
        alpha: ridge penalty (S3: 1).
    Returns:
        ``(r2 [t], mean_r2 [])``; a column constant on the test rows is NaN and skipped
        (NaN mean if every column is).
    Raises:
        ValueError: as :func:`ridge_fit`; if the feature widths differ.
    References:
        Kobayashi et al. (2024), arXiv 2407.12275, App. C.2.
    """
    _check_xy(test_features, test_targets, "ridge_r2")
    if test_features.shape[1] != train_features.shape[1]:
        raise ValueError(
            f"test_features width {test_features.shape[1]} != train width {train_features.shape[1]}"
        )
    W, b = ridge_fit(train_features, train_targets, alpha)
    r2 = _r2_columns(test_targets.double(), test_features.double() @ W + b)
    return r2, r2.nanmean()


def logistic_f1(
    train_features: Tensor,
    train_labels: Tensor,
    test_features: Tensor,
    test_labels: Tensor,
    l2: float = 1e-3,
    steps: int = 100,
) -> tuple[Tensor, Tensor]:
    """One logistic probe per binary label (full-batch L-BFGS, L2 on the weights); test F1.

    Features are standardised with the train rows' mean and std first.

    Args:
        train_features, test_features: ``[n, d]``, ``[m, d]``.
        train_labels, test_labels: ``[n, t]``, ``[m, t]`` in {0, 1}.
        l2: penalty ``l2 * ||w||^2`` per label (mean loss over rows), ``>= 0``.
        steps: L-BFGS iterations, ``>= 1``.
    Returns:
        ``(f1 [t], mean_f1 [])``; a label with no positive in test and none predicted is NaN
        and skipped.
    Raises:
        ValueError: for bad shapes, non-finite values, labels outside {0, 1}, ``l2 < 0`` or
            ``steps < 1``.
    References:
        Schug et al. (2025), arXiv 2406.05816, sec. 4.3 (logistic probes, F1).
    """
    _check_xy(train_features, train_labels, "logistic_f1")
    _check_xy(test_features, test_labels, "logistic_f1")
    for labels in (train_labels, test_labels):
        if not ((labels == 0) | (labels == 1)).all():
            raise ValueError("logistic_f1: labels must be 0 or 1")
    if l2 < 0 or steps < 1:
        raise ValueError(f"l2 must be >= 0 and steps >= 1 (got l2={l2}, steps={steps})")
    X, Y = train_features.double(), train_labels.double()
    mean, std = X.mean(0), X.std(0).clamp_min(1e-12)
    X = (X - mean) / std
    Xt = (test_features.double() - mean) / std
    with torch.enable_grad():
        W = torch.zeros(X.shape[1], Y.shape[1], dtype=X.dtype, device=X.device, requires_grad=True)
        b = torch.zeros(Y.shape[1], dtype=X.dtype, device=X.device, requires_grad=True)
        opt = torch.optim.LBFGS([W, b], max_iter=steps, line_search_fn="strong_wolfe")

        def closure() -> Tensor:
            opt.zero_grad()
            logits = X @ W + b
            loss = (
                torch.nn.functional.binary_cross_entropy_with_logits(logits, Y, reduction="sum")
                / X.shape[0]
                + l2 * W.square().sum()
            )
            loss.backward()
            return loss

        opt.step(closure)
    pred = ((Xt @ W.detach() + b.detach()) > 0).double()
    truth = test_labels.double()
    tp = (pred * truth).sum(0)
    denom = 2 * tp + (pred * (1 - truth)).sum(0) + ((1 - pred) * truth).sum(0)
    f1 = torch.where(denom > 0, 2 * tp / denom.clamp_min(1), torch.full_like(tp, float("nan")))
    return f1, f1.nanmean()
