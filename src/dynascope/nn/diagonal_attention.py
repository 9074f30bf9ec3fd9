"""The diagonal attention head of Abbe et al. (2023): the solvable model of gradual rank increase.

Glossary (dimensions and symbols, TransformerLens names where they exist):
    batch:      number of sequences.
    n_ctx:      tokens per sequence; ``query_pos`` and ``key_pos`` index them (no mask).
    d_model:    token width; every weight matrix is ``d_model x d_model`` and diagonal.
    n_models:   independent copies of the head trained side by side (one per init scale ``α``
                in the gradual-rank study); the leading axis of every parameter.
    w_Q, w_K, w_V, w_O: ``[n_models, d_model]``, the diagonals of ``W_Q, W_K, W_V, W_O``
                (as TransformerLens weights of one head with ``d_head = d_model``:
                ``W_Q[0] = diag(w_Q)`` etc.).
    qk:         ``w_Q ⊙ w_K`` ``[..., d_model]``, the diagonal of ``W_QK = W_Q W_K^T``.
    ov:         ``w_V ⊙ w_O`` ``[..., d_model]``, the diagonal of ``W_OV = W_V W_O``.
    scale:      score multiplier (the paper's head has none: ``scale = 1``; ``1/sqrt(d_model)``
                gives the scaled dot product of :class:`~dynascope.nn.MultiHeadAttention`).
    α:          init scale; the weights start at ``α θ0`` (so ``qk, ov`` start at ``α² θ0 θ0``).

Forward (right-multiplying, as everywhere in dynascope)::

    scores  = scale * x diag(qk) x^T          # [*, batch, query_pos, key_pos]
    pattern = softmax over key_pos of scores
    out     = pattern @ x diag(ov)            # [*, batch, n_ctx, d_model]

The paper writes ``smax(X W_K W_Q^T X^T) X W_V W_O^T`` (left-multiplying): for diagonal weights
the products are the same diagonals. The rank of ``W_QK`` (of ``W_OV``) is the number of
non-zero entries of ``qk`` (of ``ov``), so "rank grows by one" reads "one more entry switches
on". Trained by gradient flow from ``α θ0`` with ``α → 0`` and time measured in units of
``log(1/α)``, the entries switch on one at a time, each at a sharp loss drop (Sec. 4 of the
reference, under its nondegeneracy Assumptions 4.4 and 4.5; Fig. 2).

References:
    Abbe, Boix-Adserà, Littwin, Bengio & Susskind (2023), "Transformers learn through gradual
    rank increase", NeurIPS, arXiv 2306.07042 (Sec. 3, networks with diagonal weights; Sec. 4,
    incremental learning from small init, Assumptions 4.4 and 4.5; Fig. 2, the diagonal head in
    rescaled time).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["DiagonalAttention", "diagonal_attention"]


def _check_pair(x: Tensor, qk: Tensor, ov: Tensor) -> None:
    if x.ndim != 3:
        raise ValueError(f"x must be [batch, n_ctx, d_model] (got shape {tuple(x.shape)})")
    d_model = x.shape[-1]
    if qk.ndim < 1 or qk.shape[-1] != d_model or ov.shape != qk.shape:
        raise ValueError(
            f"qk and ov must both be [..., d_model={d_model}] (got qk {tuple(qk.shape)}, "
            f"ov {tuple(ov.shape)})"
        )


def diagonal_attention(
    x: Tensor, qk: Tensor, ov: Tensor, *, scale: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Output and pattern of the diagonal head, ``smax(scale · x diag(qk) xᵀ) x diag(ov)``.

    Args:
        x: ``[batch, n_ctx, d_model]`` tokens.
        qk: ``[..., d_model]`` diagonal of ``W_QK`` (leading dims: independent heads).
        ov: ``[..., d_model]`` diagonal of ``W_OV``, same shape as ``qk``.
        scale: score multiplier (dimensionless).
    Returns:
        ``(out [..., batch, n_ctx, d_model], pattern [..., batch, query_pos, key_pos])``; rows
        of ``pattern`` sum to 1.
    Raises:
        ValueError: if ``x`` is not 3-d or ``qk``, ``ov`` are not both ``[..., d_model]``.
    References:
        Abbe et al. (2023), arXiv 2306.07042, Sec. 3 (the diagonal head).
    """
    _check_pair(x, qk, ov)
    lead = qk.shape[:-1]
    q = qk.reshape(*lead, 1, 1, -1)  # broadcast over batch and query_pos
    scores = scale * (x * q) @ x.mT  # [..., batch, query_pos, key_pos]
    pattern = torch.softmax(scores, dim=-1)
    out = (pattern @ x) * ov.reshape(*lead, 1, 1, -1)
    return out, pattern


class DiagonalAttention(nn.Module):
    """``n_models`` diagonal attention heads side by side (see the module docstring).

    Initialisation (Abbe et al.'s small init): ``w_Q, w_K, w_V, w_O = α θ0`` with ``θ0`` the
    rows of ``theta0`` (shared by every copy) and one ``α`` per copy.

    Args:
        theta0: ``[4, d_model]``, the unscaled initial ``(w_Q, w_K, w_V, w_O)``.
        alphas: ``[n_models]`` init scales, each finite and ``> 0``.
        scale: score multiplier (finite).
    Raises:
        ValueError: if ``theta0`` is not ``[4, d_model]``, ``alphas`` is empty or has an entry
            that is not finite and positive, or ``scale`` is not finite.
    References:
        Abbe et al. (2023), arXiv 2306.07042, Sec. 4 (small init ``α θ0``).
    """

    def __init__(self, theta0: Tensor, alphas: Tensor, *, scale: float = 1.0) -> None:
        super().__init__()
        if theta0.ndim != 2 or theta0.shape[0] != 4:
            raise ValueError(f"theta0 must be [4, d_model] (got shape {tuple(theta0.shape)})")
        alphas = torch.as_tensor(alphas, dtype=theta0.dtype, device=theta0.device).reshape(-1)
        if alphas.numel() == 0 or not bool(torch.isfinite(alphas).all() and (alphas > 0).all()):
            raise ValueError(f"alphas must be finite and > 0 (got {alphas.tolist()})")
        if not math.isfinite(scale):
            raise ValueError(f"scale must be finite (got scale={scale})")
        self.scale = float(scale)
        w = alphas[:, None, None] * theta0[None]  # [n_models, 4, d_model]
        self.w_Q = nn.Parameter(w[:, 0].clone())
        self.w_K = nn.Parameter(w[:, 1].clone())
        self.w_V = nn.Parameter(w[:, 2].clone())
        self.w_O = nn.Parameter(w[:, 3].clone())

    @property
    def qk(self) -> Tensor:
        """``w_Q ⊙ w_K`` ``[n_models, d_model]``: the diagonal of ``W_QK``."""
        return self.w_Q * self.w_K

    @property
    def ov(self) -> Tensor:
        """``w_V ⊙ w_O`` ``[n_models, d_model]``: the diagonal of ``W_OV``."""
        return self.w_V * self.w_O

    def dense_weights(self, index: int) -> dict[str, Tensor]:
        """Copy ``index``'s weights as one TransformerLens head (``d_head = d_model``).

        Returns:
            ``W_Q, W_K, W_V: [1, d_model, d_model]``, ``W_O: [1, d_model, d_model]``, diagonal
            (detached copies), for loading into :class:`~dynascope.nn.MultiHeadAttention`.
        Raises:
            IndexError: if ``index`` is out of range.
        """
        n = self.w_Q.shape[0]
        if not -n <= index < n:
            raise IndexError(f"index must lie in [{-n}, {n}) (got {index})")
        return {
            name: torch.diag(getattr(self, f"w_{name[-1]}")[index].detach())[None].clone()
            for name in ("W_Q", "W_K", "W_V", "W_O")
        }

    def forward(self, x: Tensor) -> Tensor:
        """Every copy's output.

        Args:
            x: ``[batch, n_ctx, d_model]``.
        Returns:
            ``[n_models, batch, n_ctx, d_model]``.
        Raises:
            ValueError: as :func:`diagonal_attention`.
        """
        return diagonal_attention(x, self.qk, self.ov, scale=self.scale)[0]
