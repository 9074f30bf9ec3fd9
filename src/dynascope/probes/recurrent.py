"""Instruments for gated linear RNNs: λ statistics, pruning, and agreement with attention / GD.

Glossary:
    d_hidden:   recurrent neurons of a :class:`~dynascope.nn.recurrent.GatedLinearRNN`.
    λ:          ``[d_hidden]`` decays (real or complex; statistics use |λ|).
    δ:          ``delta``, the half-width of "near 0" (|λ| < δ) and "near 1" (|λ| > 1 − δ);
                neurons with δ ≤ |λ| ≤ 1 − δ are "mid-range".
    d_x, N:     in-context regression input width and context length; tokens ``[x_i; y_i]``
                (i < N) then the query ``[x_q; 0]``
                (:class:`~dynascope.tasks.InContextLinearRegression`).
    ŷ:          a model's prediction at the query ``[batch]``.
    ŷ_GD:       one gradient-descent step from w = 0 on ``L(w) = (1/2N) Σ_i (y_i − w·x_i)²`` with
                step η: ``ŷ_GD = η·(1/N) Σ_i y_i (x_i·x_q)``; η* minimises the squared error of
                ``ŷ_GD`` on a set of sequences (least squares in one variable).

All functions are pure (tensors in, tensors out, no ``.item()``), batched over leading dims where
noted; :func:`pruned_copy` returns a modified copy and leaves its argument untouched.

References:
    Zucchet et al. (2023), "Gated recurrent neural networks discover attention",
    arXiv 2309.01775 (Sec. 4: λ histograms, pruning, comparison with linear attention and GD;
    Table 2: linear probes of the hidden state).
    von Oswald et al. (2023), "Transformers learn in-context by gradient descent", ICML,
    arXiv 2212.07677 (Sec. 2–3: one GD step, prediction and gradient agreement).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from dynascope.nn.recurrent import GatedLinearRNN

__all__ = [
    "gradient_cosine",
    "lambda_histogram",
    "lambda_mass",
    "linear_probe_r2",
    "mid_lambda_mask",
    "normalized_prediction_gap",
    "one_step_gd_prediction",
    "optimal_gd_learning_rate",
    "pruned_copy",
    "query_gradient",
]


def _check_delta(delta: float) -> None:
    if not 0.0 < delta < 0.5:
        raise ValueError(f"delta must be in (0, 0.5) (got delta={delta!r})")


def _modulus(lam: Tensor) -> Tensor:
    if lam.ndim != 1:
        raise ValueError(f"lam must have shape [d_hidden] (got {list(lam.shape)})")
    if torch.isnan(lam.abs()).any():
        raise ValueError("lam must not contain NaN")
    return lam.abs()


def lambda_histogram(lam: Tensor, bins: int = 20) -> Tensor:
    """Counts of |λ| in ``bins`` equal bins of [0, 1] (|λ| = 1 falls in the last bin).

    Args:
        lam: ``[d_hidden]`` real or complex decays.
        bins: number of bins, ``>= 1``.
    Returns:
        ``[bins]`` float counts, summing to ``d_hidden`` for |λ| in [0, 1] (|λ| > 1, an
        unstable neuron, is not counted).
    Raises:
        ValueError: if ``lam`` is not 1-D or holds NaN, or ``bins < 1``.
    """
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ValueError(f"bins must be an int >= 1 (got bins={bins!r})")
    r = _modulus(lam).detach().double().cpu()
    # numpy's edges (i / bins rounded as np.linspace does) and right-open bins, the last one
    # closed: torch.histc's (r - min) * bins / (max - min) put 0.3 in bin 3 of 10, not bin 2.
    edges = torch.from_numpy(np.linspace(0.0, 1.0, bins + 1))
    r = r[(r >= 0.0) & (r <= 1.0)]
    index = (torch.searchsorted(edges, r, right=True) - 1).clamp(max=bins - 1)
    return torch.bincount(index, minlength=bins).double()


def mid_lambda_mask(lam: Tensor, delta: float = 0.05) -> Tensor:
    """Bool ``[d_hidden]``, True where ``δ <= |λ| <= 1 − δ`` (neither forgetting nor integrating).

    Raises:
        ValueError: if ``lam`` is not 1-D or holds NaN, or ``delta`` is not in (0, 0.5).
    """
    _check_delta(delta)
    r = _modulus(lam)
    return (r >= delta) & (r <= 1.0 - delta)


def lambda_mass(lam: Tensor, delta: float = 0.05) -> dict[str, Tensor]:
    """Fractions of neurons with |λ| < δ (``near_0``), > 1 − δ (``near_1``) and the rest (``mid``).

    Returns:
        ``{"near_0", "near_1", "mid"}`` -> 0-d float tensors summing to 1.
    Raises:
        ValueError: as :func:`mid_lambda_mask`.
    """
    mid = mid_lambda_mask(lam, delta)
    r = lam.abs()
    return {
        "near_0": (r < delta).double().mean(),
        "near_1": (r > 1.0 - delta).double().mean(),
        "mid": mid.double().mean(),
    }


def pruned_copy(rnn: GatedLinearRNN, mask: Tensor) -> GatedLinearRNN:
    """A deep copy of ``rnn`` with the neurons in ``mask`` removed from its output.

    Pruning neuron n zeroes row n of ``W_out_h`` (and ``W_out_h_im``) and column n of
    ``W_in_x``, so ``h_n`` is 0 and nothing reads it; the other neurons are unchanged.

    Args:
        rnn: the layer (left untouched).
        mask: bool ``[d_hidden]``, True = prune.
    Returns:
        The pruned copy.
    Raises:
        ValueError: if ``mask`` is not a bool tensor of shape ``[d_hidden]``.
    """
    if mask.dtype != torch.bool or mask.shape != (rnn.d_hidden,):
        raise ValueError(
            f"mask must be a bool tensor of shape [d_hidden={rnn.d_hidden}] "
            f"(got {mask.dtype}, {list(mask.shape)})"
        )
    out = copy.deepcopy(rnn)
    keep = (~mask).to(out.W_out_h.dtype).to(out.W_out_h.device)
    with torch.no_grad():
        out.W_out_h.mul_(keep[:, None])
        if out.W_out_h_im is not None:
            out.W_out_h_im.mul_(keep[:, None])
        out.W_in_x.mul_(keep[None, :])
    return out


def _split_tokens(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    if x.ndim != 3 or x.shape[1] < 2 or x.shape[2] < 2:
        raise ValueError(
            f"x must have shape [batch, N + 1, d_x + 1] with N, d_x >= 1 (got {list(x.shape)})"
        )
    return x[:, :-1, :-1], x[:, :-1, -1], x[:, -1, :-1]  # x_i, y_i, x_q


def one_step_gd_prediction(x: Tensor, eta: float | Tensor = 1.0) -> Tensor:
    """``ŷ_GD = η·(1/N) Σ_i y_i (x_i·x_q)``: one GD step from w = 0, evaluated at the query.

    Args:
        x: tokens ``[batch, N + 1, d_x + 1]`` in the in-context regression encoding.
        eta: step η (float or 0-d tensor).
    Returns:
        ``[batch]`` predictions.
    Raises:
        ValueError: if ``x`` is not ``[batch, N + 1, d_x + 1]`` with N, d_x >= 1.
    References:
        von Oswald et al. (2023), arXiv 2212.07677, Sec. 2 (Prop. 1: one LSA layer = one GD step).
    """
    xs, ys, xq = _split_tokens(x)
    return eta * torch.einsum("bi,bid,bd->b", ys, xs, xq) / xs.shape[1]


def optimal_gd_learning_rate(x: Tensor, y: Tensor) -> Tensor:
    """η* = argmin_η Σ_b (η·s_b − y_b)² = Σ s·y / Σ s², s = :func:`one_step_gd_prediction` at η = 1.

    Args:
        x: tokens ``[batch, N + 1, d_x + 1]``; y: query labels ``[batch]``.
    Returns:
        0-d tensor η* (NaN if every s_b is 0).
    Raises:
        ValueError: if the shapes disagree.
    """
    s = one_step_gd_prediction(x, 1.0)
    if y.shape != s.shape:
        raise ValueError(f"y must have shape [batch={s.shape[0]}] (got {list(y.shape)})")
    return (s * y).sum() / (s * s).sum()


def normalized_prediction_gap(pred: Tensor, ref: Tensor) -> Tensor:
    """``mean((pred − ref)²) / mean(ref²)``: 0 for equal predictions, 1 for ``pred = 0``.

    Raises:
        ValueError: if the shapes differ.
    """
    if pred.shape != ref.shape:
        raise ValueError(
            f"pred and ref must have the same shape (got {list(pred.shape)}, {list(ref.shape)})"
        )
    return (pred - ref).pow(2).mean() / ref.pow(2).mean()


def query_gradient(predict: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """∂ŷ_b/∂x_q of a predictor at each sequence's query input, ``[batch, d_x]``.

    Args:
        predict: maps tokens ``[batch, N + 1, d_x + 1]`` to ``[batch]`` predictions; sequences
            must not interact (true of every per-sequence model), so the gradient of the sum is
            the per-sequence gradient.
        x: tokens ``[batch, N + 1, d_x + 1]`` (not modified).
    Returns:
        ``[batch, d_x]`` detached gradients.
    Raises:
        ValueError: if ``x`` has the wrong shape.
    """
    _split_tokens(x)
    with torch.enable_grad():
        x = x.detach().clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(predict(x).sum(), x)
    return grad[:, -1, :-1].detach()


def gradient_cosine(a: Tensor, b: Tensor, eps: float = 1e-12) -> Tensor:
    """Row-wise cosine similarity ``[batch]`` of two ``[batch, d]`` gradient sets (0: a zero row).

    Raises:
        ValueError: if the shapes differ or are not 2-D.
    """
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(
            f"a and b must be equal [batch, d] shapes (got {list(a.shape)}, {list(b.shape)})"
        )
    return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1)).clamp_min(eps)


def linear_probe_r2(features: Tensor, targets: Tensor) -> Tensor:
    """R² per target of the least-squares linear map (with intercept) from features to targets.

    ``R²_j = 1 − Σ (t_j − t̂_j)² / Σ (t_j − mean t_j)²``, fitted and scored on the same rows
    (use many more rows than features). Complex features are split into real and imaginary parts.

    Args:
        features: ``[n, d_features]``; targets: ``[n, d_targets]``.
    Returns:
        ``[d_targets]`` R² (1 = linearly decodable; NaN for a constant target).
    Raises:
        ValueError: if the shapes are not 2-D with the same n.
    References:
        Zucchet et al. (2023), arXiv 2309.01775, Table 2 (probing Σ x_i y_i from the state).
    """
    if features.ndim != 2 or targets.ndim != 2 or features.shape[0] != targets.shape[0]:
        raise ValueError(
            f"features [n, d_features] and targets [n, d_targets] need the same n "
            f"(got {list(features.shape)}, {list(targets.shape)})"
        )
    if features.is_complex():
        features = torch.cat([features.real, features.imag], dim=-1)
    f = features.double()
    t = targets.double()
    design = torch.cat([f, torch.ones(f.shape[0], 1, dtype=f.dtype, device=f.device)], dim=-1)
    coef = torch.linalg.lstsq(
        design, t, driver="gelsd" if f.device.type == "cpu" else None
    ).solution
    residual = (t - design @ coef).pow(2).sum(0)
    total = (t - t.mean(0)).pow(2).sum(0)
    return torch.where(total > 0, 1 - residual / total, torch.full_like(total, float("nan")))
