"""Heavy-tailed spectra of weight matrices: the ESD of every layer and a power-law fit of its tail.

Glossary (one weight matrix, any layer):

    W: [N, M] after reshaping, N >= M (the transpose when W has more columns; same spectrum)
    X = W^T W / N                        [M, M], the layer's correlation matrix
    lambda_i = sigma_i(W)^2 / N          the M eigenvalues of X (the ESD), sigma_i = singular values
    p(lambda) ~ lambda^(-alpha)          for lambda >= x_min: the power-law tail, alpha > 1
    D = sup_x |S(x) - P(x)|              Kolmogorov-Smirnov distance between the tail's empirical
                                         CDF S and the fitted power law's CDF P

Which matrices (:func:`esd_matrices`): each attention layer that :mod:`dynascope.adapters`
reads gives four, its W_Q, W_K, W_V ``[d_model, n_heads d_head]`` (heads side by side; grouped
K/V heads once each) and W_O ``[n_heads d_head, d_model]``, named ``<module>.W_Q`` ...; every
other parameter with two or more dimensions is one matrix under its parameter name (MLP and
embedding matrices as stored; a convolution kernel ``[out, in, k_h, k_w]`` as ``[out, in k_h
k_w]``, i.e. any ``[d_0, d_1, ...]`` as ``[d_0, d_1 d_2 ...]``). Vectors (biases, norms) are
skipped. A tied weight (GPT-2's ``lm_head`` and ``wte``) appears once.

The fit (:func:`fit_power_law`) is Clauset, Shalizi & Newman's: for each candidate ``x_min``
(every distinct eigenvalue with at least ``min_tail`` eigenvalues at or above it), the
continuous maximum-likelihood exponent of the tail, then the ``x_min`` whose fit has the
smallest KS distance. WeightWatcher reads ``alpha`` as a quality metric: roughly 2 to 6 for
well-trained layers, larger for layers close to random, below 2 for very heavy tails.

References:
    Martin & Mahoney (2021), "Implicit self-regularization in deep neural networks: evidence
    from random matrix theory and implications for learning", JMLR 22(165), arXiv 1810.01075
    (X = W^T W / N, the ESD and its power-law fit; heavy-tailed universality classes).
    Clauset, Shalizi & Newman (2009), "Power-law distributions in empirical data", SIAM Review
    51(4), 661-703, arXiv 0706.1062 (eq. 3.1 the MLE, eq. 3.2 its standard error, Sec. 3.3 the
    KS choice of x_min).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from dynascope.adapters import AttentionView, attention_views

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "ESD_COLUMNS",
    "MIN_TAIL",
    "PowerLawFit",
    "esd_eigenvalues",
    "esd_matrices",
    "fit_power_law",
    "weight_esd",
]

MIN_TAIL = 10
"""Default fewest eigenvalues in a fitted tail. Clauset et al. warn that fits on fewer than
about 50 points are weak: read ``alpha_stderr`` beside ``alpha``."""

ESD_COLUMNS = (
    "name",
    "shape",
    "n_eigenvalues",
    "rank",
    "lambda_max",
    "alpha",
    "alpha_stderr",
    "x_min",
    "ks_distance",
    "n_tail",
    "reason",
)
"""Columns of :func:`weight_esd`, in order."""


class PowerLawFit(NamedTuple):
    """A power-law fit of a sample's tail (:func:`fit_power_law`); NaN fields when not fitted.

    Attributes:
        alpha: exponent of the density ``p(x) ~ x^(-alpha)`` above ``x_min``, dimensionless.
        alpha_stderr: ``(alpha - 1) / sqrt(n_tail)``, its asymptotic standard error.
        x_min: the tail's lower end, in the sample's unit.
        ks_distance: KS distance ``D`` between the tail and the fitted law, in [0, 1].
        n_tail: number of sample points ``>= x_min`` (0 when not fitted).
        reason: why no fit was made; ``""`` when fitted.
    """

    alpha: float
    alpha_stderr: float
    x_min: float
    ks_distance: float
    n_tail: int
    reason: str = ""


def _no_fit(reason: str) -> PowerLawFit:
    return PowerLawFit(math.nan, math.nan, math.nan, math.nan, 0, reason)


def _tail_fits(
    logs: np.ndarray, log_mins: np.ndarray, starts: np.ndarray, below: np.ndarray, at: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(alpha, D)`` per candidate tail ``x[starts[k]:]`` with lower end ``exp(log_mins[k])``.

    ``logs``: ``ln x`` of the sorted sample; ``below``/``at``: how many points are ``<`` /
    ``<=`` each point (ties jump the empirical CDF together). Candidates are processed in
    blocks, ``[block, m]`` at a time, with the points before each start masked out.
    """
    m = len(logs)
    middle, half_step = (below + at) / 2, (at - below) / 2  # the empirical CDF's step at x_j, x n
    alphas, distances = np.empty(len(starts)), np.empty(len(starts))
    block = max(1, 2**19 // m)
    for lo in range(0, len(starts), block):
        i = starts[lo : lo + block, None]  # [k, 1]
        first = starts[lo]  # the block's points: from its first start on (starts ascend)
        n = m - i
        in_tail = np.arange(first, m) >= i  # [k, m - first]
        log_ratio = np.where(in_tail, logs[first:] - log_mins[lo : lo + block, None], 0.0)
        alpha = 1.0 + n / log_ratio.sum(axis=1, keepdims=True)  # Clauset et al. eq. (3.1)
        fitted = -np.expm1((1.0 - alpha) * log_ratio)  # P(x_j) = 1 - (x_j / x_min)^(1 - alpha)
        # n |P - S| at its worst beside x_j: |n P - (middle of the step)| + half the step
        gap = np.abs(fitted * n - (middle[first:] - i)) + half_step[first:]
        alphas[lo : lo + block] = alpha[:, 0]
        distances[lo : lo + block] = np.where(in_tail, gap, 0.0).max(axis=1) / n[:, 0]
    return alphas, distances


def fit_power_law(
    x: Tensor | np.ndarray | Iterable[float],
    *,
    min_tail: int = MIN_TAIL,
    x_min: float | None = None,
) -> PowerLawFit:
    """Fit a continuous power law to the tail of a sample: Clauset, Shalizi & Newman (2009).

    For a tail ``x_1 ... x_n >= x_min`` the maximum-likelihood exponent of the density
    ``p(x) = (alpha - 1) / x_min * (x / x_min)^(-alpha)`` is (eq. 3.1)::

        alpha = 1 + n / sum_i ln(x_i / x_min),   standard error (alpha - 1) / sqrt(n)  (eq. 3.2)

    Without ``x_min``, every distinct sample value with at least ``min_tail`` points at or above
    it is tried, and the one whose fit minimises the KS distance ``D = max_x |S(x) - P(x)|``
    between the tail's empirical CDF ``S`` and ``P(x) = 1 - (x / x_min)^(1 - alpha)`` is kept
    (Sec. 3.3). ``D`` is the supremum over all ``x`` (both sides of each step of ``S``). Cost
    O(m^2) for m positive points.

    Args:
        x: sample, any shape (flattened), real; values ``<= 0`` are dropped (no power law
            reaches them: the null space of a rank-deficient matrix).
        min_tail: fewest points in a tail, ``>= 2``.
        x_min: a fixed lower end of the tail instead of the KS search, ``> 0``.
    Returns:
        :class:`PowerLawFit`. Not fitted (NaN, ``reason`` set) when fewer than ``min_tail``
        positive points lie at or above every candidate ``x_min``, or when all of them are equal.
    Raises:
        ValueError: if ``x`` holds NaN or inf, ``min_tail < 2`` or ``x_min <= 0``.
    References:
        Clauset, Shalizi & Newman (2009), "Power-law distributions in empirical data", SIAM
        Review 51(4), 661-703, arXiv 0706.1062.
    """
    if isinstance(min_tail, bool) or not isinstance(min_tail, int) or min_tail < 2:
        raise ValueError(f"min_tail must be an integer >= 2 (got {min_tail!r})")
    if x_min is not None and not x_min > 0:
        raise ValueError(f"x_min must be > 0 or None (got {x_min})")
    if isinstance(x, Tensor):
        x = x.detach().cpu().double().numpy()
    x = np.asarray(x, dtype=np.float64).ravel()
    if not np.isfinite(x).all():
        raise ValueError("x must be finite (got NaN or inf)")
    x = np.sort(x[x > 0])
    if x_min is not None:
        x = x[x >= x_min]
    if len(x) < min_tail:
        return _no_fit(f"too few positive values ({len(x)} < min_tail={min_tail})")
    logs = np.log(x)
    below, at = np.searchsorted(x, x, "left"), np.searchsorted(x, x, "right")
    if x_min is None:  # each distinct value that leaves >= min_tail points at or above it
        starts = np.flatnonzero(below == np.arange(len(x)))
        starts = starts[len(x) - starts >= min_tail]
        log_mins = logs[starts]
    else:
        starts, log_mins = np.zeros(1, dtype=int), np.full(1, math.log(x_min))
    flat = logs[-1] <= log_mins  # every point at x_min: no exponent
    starts, log_mins = starts[~flat], log_mins[~flat]
    if len(starts) == 0:
        return _no_fit("all values equal: no tail to fit")
    alphas, distances = _tail_fits(logs, log_mins, starts, below, at)
    best = int(np.argmin(distances))  # the smallest D; ties: the lowest x_min
    alpha, distance, i = float(alphas[best]), float(distances[best]), int(starts[best])
    n_tail = len(x) - i
    return PowerLawFit(
        alpha,
        (alpha - 1.0) / math.sqrt(n_tail),
        float(x[i]) if x_min is None else float(x_min),
        distance,
        int(n_tail),
    )


def esd_eigenvalues(W: Tensor | np.ndarray) -> np.ndarray:
    """The ESD of one matrix: eigenvalues of ``X = W^T W / N``, ``N = max(W.shape)``.

    ``lambda_i = sigma_i(W)^2 / N`` from the singular values (float64 SVD; ``X`` is never
    formed, so small eigenvalues keep their accuracy). Singular values at or below ``sigma_max
    * max(N, M) * eps`` (the threshold of ``numpy.linalg.matrix_rank``, ``eps`` of ``W``'s
    dtype) are rounding noise of a rank-deficient ``W`` and are returned as exactly 0.

    Args:
        W: ``[N, M]`` or ``[M, N]``, real, finite.
    Returns:
        ``[min(N, M)]`` float64 eigenvalues, ascending, in (units of W)^2. ``inf`` where
        ``sigma^2 / N`` overflows float64 (entries beyond about 1e150).
    Raises:
        ValueError: if ``W`` is not 2-D, is empty, or holds NaN or inf.
    References:
        Martin & Mahoney (2021), JMLR 22(165), Sec. 2 (X = W^T W / N).
    """
    if isinstance(W, Tensor):
        eps = torch.finfo(W.dtype).eps if W.is_floating_point() else torch.finfo(torch.float64).eps
        W = W.detach().to("cpu", torch.float64)
    else:
        W = np.asarray(W)
        eps = np.finfo(W.dtype if W.dtype.kind == "f" else np.float64).eps
        W = torch.from_numpy(W.astype(np.float64))
    if W.ndim != 2 or W.numel() == 0:
        raise ValueError(f"W must be a non-empty 2-D matrix (got shape {tuple(W.shape)})")
    if not torch.isfinite(W).all():
        raise ValueError("W must be finite (got NaN or inf)")
    peak = float(W.abs().max())
    if peak == 0:
        return np.zeros(min(W.shape))
    scale = 2.0 ** math.frexp(peak)[1]  # a power of two: exact, and the SVD cannot overflow
    tall = W if W.shape[0] >= W.shape[1] else W.T  # LAPACK was measured 3.5x slower on wide
    s = torch.linalg.svdvals(tall / scale).numpy()  # torch: its thread count, not OpenBLAS's
    s[s <= s.max() * max(W.shape) * eps] = 0.0
    with np.errstate(over="ignore"):
        return np.sort((s * scale) ** 2 / max(W.shape))


def _heads_matrix(view: AttentionView, field: str) -> Tensor:
    """One attention weight of all heads as a 2-D matrix; grouped K/V heads once each."""
    W = getattr(view, field).detach()  # [n_heads, d_in, d_head] or W_O [n_heads, d_head, d_model]
    if field in ("W_K", "W_V") and view.n_key_value_heads not in (None, view.n_heads):
        W = W[:: view.n_heads // view.n_key_value_heads]  # repeat_interleave'd copies
    if field == "W_O":
        return W.reshape(-1, W.shape[-1])  # [n_heads d_head, d_model]
    return W.permute(1, 0, 2).reshape(W.shape[1], -1)  # [d_in, n_heads d_head]


def esd_matrices(model: nn.Module) -> dict[str, Tensor]:
    """Every weight matrix of ``model`` that :func:`weight_esd` analyses, 2-D, by name.

    Attention layers that :mod:`dynascope.adapters` reads give ``<module>.W_Q``, ``.W_K``,
    ``.W_V`` (``[d_model, n_heads d_head]``, heads side by side; each grouped K/V head once)
    and ``.W_O`` (``[n_heads d_head, d_model]``), in place of the module's own parameters
    (GPT-2's fused ``c_attn``, Llama's ``q_proj`` ...). Every other parameter with ``ndim >=
    2`` is reshaped ``[d_0, d_1, ...] -> [d_0, d_1 d_2 ...]`` (a convolution kernel ``[out, in,
    k_h, k_w]`` becomes ``[out, in k_h k_w]``). Parameters with fewer dimensions are skipped.

    Args:
        model: any module (frozen parameters included).
    Returns:
        name -> detached ``[rows, cols]`` tensor (views or copies of the weights), in the order
        of ``model.named_parameters()``; a layer's attention matrices where its first
        parameter is.
    """
    try:
        views = attention_views(model)
    except ValueError:  # no attention layer: every matrix is a plain parameter
        views = []
    owner: dict[int, AttentionView] = {}
    for view in views:
        owned = view.module.parameters() if view.module is not None else ()
        fields = [getattr(view, f) for f in ("W_Q", "W_K", "W_V", "W_O")]
        owner.update({id(t): view for t in (*owned, *fields)})
    matrices: dict[str, Tensor] = {}

    def add_attention(view: AttentionView) -> None:  # once per layer, at its first parameter
        if f"{view.name}.W_Q".lstrip(".") not in matrices:
            for field in ("W_Q", "W_K", "W_V", "W_O"):
                matrices[f"{view.name}.{field}".lstrip(".")] = _heads_matrix(view, field)

    for name, param in model.named_parameters():
        if id(param) in owner:
            add_attention(owner[id(param)])
        elif param.ndim >= 2:
            matrices[name] = param.detach().reshape(param.shape[0], -1)
    for view in views:  # a view that owns no parameter (a custom adapter without ``module``)
        add_attention(view)
    return matrices


def _esd_row(name: str, W: Tensor | np.ndarray, min_tail: int) -> dict[str, object]:
    W = W if isinstance(W, Tensor) else np.asarray(W)
    if W.ndim < 2:
        raise ValueError(f"{name}: a weight matrix needs 2 or more dims (got shape {W.shape})")
    W = W.reshape(W.shape[0], -1)
    try:
        eigenvalues = esd_eigenvalues(W)
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None
    rank = int((eigenvalues > 0).sum())
    if rank == 0:
        fit = _no_fit("zero matrix")
    elif not np.isfinite(eigenvalues).all():
        fit = _no_fit("eigenvalues overflow float64")
    else:
        fit = fit_power_law(eigenvalues, min_tail=min_tail)
    return {
        "name": name,
        "shape": tuple(int(d) for d in W.shape),
        "n_eigenvalues": len(eigenvalues),
        "rank": rank,
        "lambda_max": float(eigenvalues[-1]),
        **fit._asdict(),
    }


def weight_esd(
    model_or_matrices: nn.Module | Mapping[str, Tensor | np.ndarray],
    *,
    min_tail: int = MIN_TAIL,
) -> pd.DataFrame:
    """ESD and power-law tail of every weight matrix: one row per matrix (WeightWatcher-style).

    Per matrix ``W`` (``[N, M]`` with ``N >= M`` after a transpose, which leaves the spectrum
    unchanged): the ``M`` eigenvalues ``lambda_i = sigma_i(W)^2 / N`` of ``X = W^T W / N``
    (:func:`esd_eigenvalues`) and Clauset et al.'s fit of ``p(lambda) ~ lambda^(-alpha)`` above
    the KS-chosen ``x_min`` (:func:`fit_power_law`). ``alpha`` and ``ks_distance`` do not change
    when ``W`` is scaled; ``x_min`` and ``lambda_max`` scale with its square.

    Example::

        df = ds.probes.weight_esd(model)
        df[["name", "alpha", "ks_distance", "n_tail"]]

    Args:
        model_or_matrices: a module (its matrices by :func:`esd_matrices`: attention W_Q, W_K,
            W_V, W_O per layer, every other parameter with two or more dims), or name ->
            matrix (a tensor or array with ``ndim >= 2``, reshaped ``[d_0, d_1 d_2 ...]``).
        min_tail: fewest eigenvalues in a fitted tail, ``>= 2``.
    Returns:
        ``pandas.DataFrame``, columns :data:`ESD_COLUMNS`: ``name``; ``shape`` (the 2-D matrix
        analysed, as stored); ``n_eigenvalues`` ``= min(shape)``; ``rank`` (eigenvalues above
        rounding noise); ``lambda_max``; ``alpha``, ``alpha_stderr``, ``x_min``,
        ``ks_distance``, ``n_tail`` of the fit; ``reason``, ``""`` when fitted, else why
        ``alpha`` is NaN: ``"zero matrix"``, ``"too few positive values (k < min_tail=10)"``
        (tiny or low-rank matrices), ``"all values equal: no tail to fit"`` (an orthogonal
        matrix), ``"eigenvalues overflow float64"``.
    Raises:
        ValueError: if a matrix holds NaN or inf, or has fewer than 2 dims (the message names
            it), or ``min_tail < 2``.
    References:
        Martin & Mahoney (2021), "Implicit self-regularization in deep neural networks", JMLR
        22(165), arXiv 1810.01075. Clauset, Shalizi & Newman (2009), SIAM Review 51(4).
    """
    import pandas as pd

    if isinstance(min_tail, bool) or not isinstance(min_tail, int) or min_tail < 2:
        raise ValueError(f"min_tail must be an integer >= 2 (got {min_tail!r})")
    if isinstance(model_or_matrices, nn.Module):
        matrices: Mapping[str, Tensor | np.ndarray] = esd_matrices(model_or_matrices)
    else:
        matrices = model_or_matrices
    rows = [_esd_row(name, W, min_tail) for name, W in matrices.items()]
    return pd.DataFrame(rows, columns=list(ESD_COLUMNS))
