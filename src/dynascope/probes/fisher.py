"""Neural Fisher Kernel (NFK): Fisher scores, diagonal Fisher, exact Gram and a matrix-free
low-rank embedding by randomized SVD (SYSTEMS.md S14).

Glossary:
    params:   ``dict[str, Tensor]`` of the model's parameters theta; P = total entries.
    x:        N inputs, a Tensor ``[N, ...]`` or a tuple of Tensors with leading N (e.g.
              ``(images, labels)`` for the conditional score).
    score_fn: ``score_fn(params, x) -> [N]``, the per-example score ``s_theta(x)``:
              ``log p_theta(x)`` up to a theta-dependent constant, i.e. ``-E_theta(x)`` for an
              energy-based model ``p_theta ∝ exp(-E_theta)``.
    J:        ``[N, P]``, ``J[i] = grad_theta s(x_i)``.
    g_bar:    ``[P]``, the mean score gradient that centres the scores (below).
    U_x:      ``[P]``, Fisher score ``J[x] - g_bar``; stacked ``U`` ``[N, P]``.
    D:        ``[P]``, diagonal Fisher ``I_jj = mean_i U_ij^2 + delta``.
    Phi:      ``[N, P]``, ``Phi = U D^{-1/2}`` (rows ``phi(x)``); the NFK is ``K = Phi Phi^T``
              ``[N, N]``.
    k, p, q:  embedding rank, oversampling, power iterations; ``l = k + p`` sketch columns.

Score forms (S14 "Definitions"; which form the paper uses is unverified):

- **Energy-based (unsupervised)**: ``U_x = -grad E(x) + E_{x'~p_theta} grad E(x')``. With
  ``score_fn = -E`` and ``g_bar = mean of grad s over model samples x'`` (pass the samples to
  :func:`mean_score_gradient`), ``U_x = grad s(x) - g_bar`` is exactly this, the expectation
  estimated by the sample mean.
- **Supervised, JEM reading** (default for classifiers): the classifier's logits ``f(x)``
  define ``s(x) = logsumexp_y f(x)_y`` (:func:`jem_score`), and ``g_bar`` is the mean of
  ``grad s`` over the scored set itself, standing in for the model expectation. This is the
  default of every function here (``mean_grad=None``): centring by the scored set's mean,
  i.e. ``Phi = C J D^{-1/2}`` with ``C = I_N - 1 1^T / N``.
- **Conditional**: ``s(x, y) = log softmax(f(x))_y`` (:func:`conditional_score`) with ``y`` the
  label or sampled from ``p_theta(. | x)``; its expectation over ``y ~ p_theta(.|x)`` is 0, so
  use ``center=False``.

Fisher information: the full ``I = E[U U^T]`` is replaced by its diagonal (an unverified
approximation, S14), damped by ``delta = damping * mean_j I_jj`` (default ``damping=1e-8``).
``fisher_diag=None`` means ``D = I`` (no whitening); with ``D = I`` and ``center=False`` the
NFK is the empirical NTK of the scalar model ``s``.

Low-rank embedding (S14 "Low-rank embedding", our construction): the truncated SVD
``Phi ≈ U_k Sigma_k V_k^T``; the scored points embed as ``e(x_i) = (U_k Sigma_k)_i`` and new
points as ``e(x) = V_k^T phi(x) = J_x (D^{-1/2} V_k) - g_bar^T D^{-1/2} V_k`` (k JVPs). The
randomized SVD (Halko et al. 2011, Alg. 4.4 with re-orthonormalisation) touches ``Phi`` only
through ``Phi W = C (J (D^{-1/2} W))`` (forward-mode JVPs, vmapped over the l columns) and
``Phi^T Q = D^{-1/2} (J^T (C Q))`` (one reverse pass, vmapped over columns): the ``N x P``
Jacobian is never formed. Cost: ``2 + 2q`` sweeps over the N examples with l columns each.

Every function is pure (no ``.item()``, logging or device moves); work in float64 for tests.
Attention models: dynascope's own attention takes its explicit softmax under the JVPs by itself;
a ``score_fn`` over a Hugging Face model (SDPA has no forward-AD rule on CPU) is run inside
``with dynascope.adapters.explicit_attention(model):`` (eager attention, restored on exit).

References:
    Zhang, Zhai, Littwin & Susskind (2022), "Learning Representation from Neural Fisher Kernel
    with Low-rank Approximation", ICLR, arXiv 2202.01944 (the NFK of energy-based models and
    classifiers, and its low-rank embedding; section and equation numbers not checked here).
    Jaakkola & Haussler (1998), "Exploiting generative models in discriminative classifiers",
    NeurIPS (the Fisher kernel ``U_x^T I^{-1} U_z``).
    Grathwohl et al. (2020), "Your classifier is secretly an energy based model", ICLR,
    arXiv 1912.03263 (JEM: ``-E(x) = logsumexp_y f(x)_y``).
    Halko, Martinsson & Tropp (2011), "Finding structure with randomness", SIAM Review,
    arXiv 0909.4061 (Alg. 4.3/4.4, randomized range finder with power iterations; Sec. 5.1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dynascope.probes import _fisher_ops as ops

from ._fisher_scores import _centre, _check_chunk, _params
from ._fisher_scores import conditional_score as conditional_score
from ._fisher_scores import jem_score as jem_score
from ._fisher_scores import mean_score_gradient as mean_score_gradient

__all__ = [
    "NFKEmbedding",
    "conditional_score",
    "diagonal_fisher",
    "fisher_scores",
    "jem_score",
    "mean_score_gradient",
    "nfk_embedding",
    "nfk_features",
    "nfk_gram",
    "nfk_transform",
    "principal_angle_cosines",
]


def fisher_scores(
    score_fn: ops.ScoreFn,
    params: dict[str, Tensor],
    x: Any,
    *,
    center: bool = True,
    mean_grad: Tensor | None = None,
    chunk_size: int | None = None,
) -> Tensor:
    """Fisher scores ``U = J - 1 g_bar^T`` ``[N, P]`` (exact path: per-example gradients).

    Args:
        score_fn: ``score_fn(params, x) -> [N]`` (``-E`` for an energy, :func:`jem_score` of a
            classifier's logits, or :func:`conditional_score`).
        params: parameters (detached inside).
        x: ``[N, ...]`` inputs (or a tuple of them).
        center: subtract ``g_bar``; ``False`` gives the raw gradients ``J``.
        mean_grad: ``g_bar`` ``[P]``; ``None`` uses the mean over ``x`` (JEM stand-in). Pass
            :func:`mean_score_gradient` of model samples for the energy-based form.
        chunk_size: examples per ``vmap(grad)`` call.
    Returns:
        ``[N, P]``, rows flattened in ``params`` order (units of ``s`` per parameter unit).
    Raises:
        ValueError: for empty ``params``, inconsistent ``x``, a ``mean_grad`` not ``[P]`` or a
            bad ``chunk_size``.
    References:
        Zhang et al. (2022), arXiv 2202.01944 (Fisher score of an EBM).
    """
    params = _params(params)
    _check_chunk(chunk_size)
    if center and mean_grad is not None:
        _centre(score_fn, params, x, center, mean_grad, chunk_size)  # shape check
    J = ops.score_jacobian(score_fn, params, x, chunk_size)
    if not center:
        return J
    return J - (J.mean(dim=0) if mean_grad is None else mean_grad)


def diagonal_fisher(
    score_fn: ops.ScoreFn,
    params: dict[str, Tensor],
    x: Any,
    *,
    center: bool = True,
    mean_grad: Tensor | None = None,
    damping: float = 1e-8,
    chunk_size: int | None = None,
) -> Tensor:
    """Damped diagonal Fisher ``D_j = mean_i U_ij^2 + delta``, ``delta = damping * mean_j``.

    Accumulated chunk by chunk (P floats of state): ``U`` is never held whole. ``x`` are the
    points the expectation ``E_{x~p_theta}`` is taken over (model samples, or the scored set
    as its stand-in).

    Args:
        score_fn, params, x, center, mean_grad, chunk_size: as :func:`fisher_scores`.
        damping: relative damping (>= 0); ``delta = damping * mean_j mean_i U_ij^2``.
    Returns:
        ``[P]``, > 0 unless every score gradient is zero and ``damping = 0``.
    Raises:
        ValueError: for a negative or non-finite ``damping``, or as :func:`fisher_scores`.
    """
    if not (damping >= 0 and damping < float("inf")):
        raise ValueError(f"damping must be finite and >= 0 (got {damping!r})")
    params = _params(params)
    _check_chunk(chunk_size)
    g_bar = _centre(score_fn, params, x, center, mean_grad, chunk_size)
    ref = next(iter(params.values()))
    if g_bar is None:
        g_bar = torch.zeros(ops.n_params(params), dtype=ref.dtype, device=ref.device)
    second = ops.squared_centred_grads(score_fn, params, x, g_bar, chunk_size)
    second = second / ops.n_examples(x)
    return second + damping * second.mean()


def _inverse_sqrt(fisher_diag: Tensor | None, n_params: int) -> Tensor | None:
    if fisher_diag is None:
        return None
    if fisher_diag.shape != (n_params,):
        raise ValueError(
            f"fisher_diag must be [P] with P={n_params} (got {tuple(fisher_diag.shape)})"
        )
    if not bool((fisher_diag > 0).all()) or not bool(fisher_diag.isfinite().all()):
        raise ValueError("fisher_diag must be finite and > 0 everywhere (raise damping)")
    return fisher_diag.rsqrt()


def nfk_features(
    score_fn: ops.ScoreFn,
    params: dict[str, Tensor],
    x: Any,
    *,
    fisher_diag: Tensor | None = None,
    center: bool = True,
    mean_grad: Tensor | None = None,
    chunk_size: int | None = None,
) -> Tensor:
    """Exact NFK feature rows ``Phi = U D^{-1/2}`` ``[N, P]`` (the oracle of the embedding).

    Args:
        fisher_diag: ``D`` ``[P]`` (:func:`diagonal_fisher`); ``None``: ``D = I``.
        score_fn, params, x, center, mean_grad, chunk_size: as :func:`fisher_scores`.
    Returns:
        ``[N, P]``.
    Raises:
        ValueError: for a ``fisher_diag`` that is not ``[P]``, finite and positive, or as
            :func:`fisher_scores`.
    """
    U = fisher_scores(
        score_fn, params, x, center=center, mean_grad=mean_grad, chunk_size=chunk_size
    )
    scale = _inverse_sqrt(fisher_diag, U.shape[1])
    return U if scale is None else U * scale


def nfk_gram(
    score_fn: ops.ScoreFn,
    params: dict[str, Tensor],
    x1: Any,
    x2: Any | None = None,
    *,
    fisher_diag: Tensor | None = None,
    center: bool = True,
    mean_grad: Tensor | None = None,
    chunk_size: int | None = None,
) -> Tensor:
    """Exact NFK Gram ``K(x, z) = U_x^T D^{-1} U_z`` ``[N1, N2]``.

    With ``center=True`` and ``mean_grad=None`` both sides are centred by the mean gradient of
    ``x1`` (the scored set), so ``nfk_gram(f, p, x1)`` is ``C J D^{-1} J^T C``.

    Args:
        x1: ``[N1, ...]`` scored inputs; ``x2``: ``[N2, ...]`` (``None``: ``x1``).
        fisher_diag, score_fn, params, center, mean_grad, chunk_size: as :func:`nfk_features`.
    Returns:
        ``[N1, N2]``; symmetric PSD when ``x2`` is ``None``.
    Raises:
        ValueError: as :func:`nfk_features`.
    References:
        Zhang et al. (2022), arXiv 2202.01944 (the NFK); Jaakkola & Haussler (1998).
    """
    params = _params(params)
    g_bar = _centre(score_fn, params, x1, center, mean_grad, chunk_size)
    kw = dict(fisher_diag=fisher_diag, center=center, mean_grad=g_bar, chunk_size=chunk_size)
    phi1 = nfk_features(score_fn, params, x1, **kw)
    if x2 is None:
        return phi1 @ phi1.mT
    return phi1 @ nfk_features(score_fn, params, x2, **kw).mT


@dataclass(frozen=True)
class NFKEmbedding:
    """A rank-k NFK embedding ``Phi ≈ U_k Sigma_k V_k^T`` of N scored points.

    Attributes:
        embedding: ``[N, k]``, ``e(x_i) = (U_k Sigma_k)_i``.
        singular_values: ``[k]`` descending; ``Sigma_k^2`` are the top eigenvalues of K.
        left: ``U_k`` ``[N, k]``, orthonormal columns.
        right: ``V_k`` ``[P, k]``, orthonormal columns.
        scaled_right: ``D^{-1/2} V_k`` ``[P, k]`` (the JVP directions for new points).
        offset: ``g_bar^T D^{-1/2} V_k`` ``[k]`` (zero without centring).
    """

    embedding: Tensor
    singular_values: Tensor
    left: Tensor
    right: Tensor
    scaled_right: Tensor
    offset: Tensor


def nfk_embedding(
    score_fn: ops.ScoreFn,
    params: dict[str, Tensor],
    x: Any,
    k: int = 32,
    *,
    oversampling: int = 10,
    power_iters: int = 2,
    fisher_diag: Tensor | None = None,
    center: bool = True,
    mean_grad: Tensor | None = None,
    chunk_size: int | None = None,
    generator: torch.Generator | None = None,
) -> NFKEmbedding:
    """Matrix-free rank-k NFK embedding of ``x`` by randomized SVD (JVPs/VJPs only).

    ``Omega ~ N(0, 1)^{P x l}``; ``Q = qr(Phi Omega)``; ``power_iters`` times
    ``Q = qr(Phi qr(Phi^T Q))``; ``B = (Phi^T Q)^T``; ``B = U~ Sigma V^T``; keep the top k of
    ``Q U~``, ``Sigma``, ``V``. ``l = min(k + oversampling, N, P)``. When ``l >= rank(Phi)`` the
    result is the exact truncated SVD up to rounding.

    Args:
        score_fn, params, x, fisher_diag, center, mean_grad, chunk_size: as
            :func:`nfk_features`.
        k: embedding rank, ``1 <= k <= min(N, P)``.
        oversampling: extra sketch columns p (>= 0).
        power_iters: power iterations q (>= 0).
        generator: for ``Omega`` (on the parameters' device).
    Returns:
        :class:`NFKEmbedding`.
    Raises:
        ValueError: for ``k`` out of range, negative ``oversampling`` or ``power_iters``, or as
            :func:`nfk_features`.
    References:
        Halko, Martinsson & Tropp (2011), arXiv 0909.4061, Alg. 4.4 and Sec. 5.1.
        Zhang et al. (2022), arXiv 2202.01944 (low-rank NFK embedding).
    """
    params = _params(params)
    _check_chunk(chunk_size)
    n, P = ops.n_examples(x), ops.n_params(params)
    if isinstance(k, bool) or not 1 <= k <= min(n, P):
        raise ValueError(f"k must lie in [1, min(N, P)] = [1, {min(n, P)}] (got {k!r})")
    for name, value in (("oversampling", oversampling), ("power_iters", power_iters)):
        if isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0 (got {value!r})")
    scale = _inverse_sqrt(fisher_diag, P)
    g_bar = _centre(score_fn, params, x, center, mean_grad, chunk_size)
    ref = next(iter(params.values()))

    def phi_times(W: Tensor) -> Tensor:  # Phi W, W [P, m] -> [N, m]
        W = W if scale is None else W * scale[:, None]
        out = ops.jvp_columns(score_fn, params, x, W, chunk_size)
        return out if g_bar is None else out - g_bar @ W

    def phi_t_times(Q: Tensor) -> Tensor:  # Phi^T Q, Q [N, m] -> [P, m]
        out = ops.vjp_columns(score_fn, params, x, Q, chunk_size)
        if g_bar is not None:
            out = out - torch.outer(g_bar, Q.sum(dim=0))
        return out if scale is None else out * scale[:, None]

    sketch = min(k + oversampling, n, P)
    omega = torch.randn(P, sketch, generator=generator, dtype=ref.dtype, device=ref.device)
    Q = torch.linalg.qr(phi_times(omega)).Q
    for _ in range(power_iters):
        Z = torch.linalg.qr(phi_t_times(Q)).Q
        Q = torch.linalg.qr(phi_times(Z)).Q
    Bt = phi_t_times(Q)  # [P, l] = B^T
    V, S, Uh_t = torch.linalg.svd(Bt, full_matrices=False)  # B = Uh S V^T
    left = Q @ Uh_t.mT[:, :k]
    right = V[:, :k]
    scaled = right if scale is None else right * scale[:, None]
    offset = torch.zeros(k, dtype=ref.dtype, device=ref.device) if g_bar is None else g_bar @ scaled
    return NFKEmbedding(
        embedding=left * S[:k],
        singular_values=S[:k],
        left=left,
        right=right,
        scaled_right=scaled,
        offset=offset,
    )


def nfk_transform(
    embedding: NFKEmbedding,
    score_fn: ops.ScoreFn,
    params: dict[str, Tensor],
    x: Any,
    *,
    chunk_size: int | None = None,
) -> Tensor:
    """Embed new points: ``e(x) = J_x (D^{-1/2} V_k) - g_bar^T D^{-1/2} V_k`` ``[M, k]``.

    Uses k forward-mode JVPs per chunk; on the scored points it reproduces
    ``embedding.embedding`` when the SVD is exact (Nyström-consistent).

    Args:
        embedding: from :func:`nfk_embedding` with the same ``score_fn`` and ``params``.
        x: ``[M, ...]`` inputs.
        chunk_size: examples per JVP sweep.
    Returns:
        ``[M, k]``.
    Raises:
        ValueError: if ``params`` do not have the embedding's P entries, or a bad
            ``chunk_size``.
    """
    params = _params(params)
    _check_chunk(chunk_size)
    if embedding.scaled_right.shape[0] != ops.n_params(params):
        raise ValueError(
            f"params hold P={ops.n_params(params)} entries but the embedding was built for "
            f"P={embedding.scaled_right.shape[0]}"
        )
    out = ops.jvp_columns(score_fn, params, x, embedding.scaled_right, chunk_size)
    return out - embedding.offset


def principal_angle_cosines(A: Tensor, B: Tensor) -> Tensor:
    """Cosines of the principal angles between ``span(A)`` and ``span(B)``, descending.

    ``cos theta_i = sigma_i(Q_A^T Q_B)`` with ``Q`` orthonormal bases (reduced QR).

    Args:
        A: ``[..., n, a]``, B: ``[..., n, b]``, full column rank.
    Returns:
        ``[..., min(a, b)]`` in [0, 1] (up to rounding).
    Raises:
        ValueError: if A and B differ in their row count ``n``.
    References:
        Björck & Golub (1973), "Numerical methods for computing angles between linear
        subspaces", Math. Comp. 27.
    """
    if A.shape[-2] != B.shape[-2]:
        raise ValueError(
            f"A and B must share their row count (got A {tuple(A.shape)}, B {tuple(B.shape)})"
        )
    return torch.linalg.svdvals(torch.linalg.qr(A).Q.mT @ torch.linalg.qr(B).Q)
