"""The diagonal-attention teacher of study S10: regress a diagonal head onto a sparse teacher.

Glossary:
    n_seq:      number of sequences N (one fixed, full batch).
    n_ctx:      tokens per sequence n.
    d_model:    token width d.
    x:          ``[n_seq, n_ctx, d_model]`` tokens, i.i.d. N(0, 1), drawn from ``seed``.
    strengths:  the teacher's non-zero entries c_1 > c_2 > ... (default ``(2, 1, 0.5)``); the
                teacher is ``qk* = ov* = (c, 0, ..., 0)`` ``[d_model]``.
    y:          ``[n_seq, n_ctx, d_model]``, the teacher's output on ``x`` (noiseless).
    w:          ``[n_models, 4, d_model]`` the student's diagonals ``(w_Q, w_K, w_V, w_O)``, one
                row per independent copy (one per init scale α in S10).
    qk, ov:     ``w_Q ⊙ w_K`` and ``w_V ⊙ w_O`` ``[n_models, d_model]``.
    scale:      score multiplier of the head (1: the paper's head, no temperature).

Model and loss (see :mod:`dynascope.nn.diagonal_attention`)::

    pattern = softmax(scale · x diag(qk) xᵀ)              # [n_models, N, n, n]
    out     = (pattern @ x) ⊙ ov                           # [n_models, N, n, d]
    L(w)    = mean over (N, n, d) of (out − y)²             # per copy, [n_models]

Closed-form gradient (used for full-batch gradient descent; checked against autograd)::

    G        = 2 (out − y) / (N n d)
    ∂L/∂ov_k = Σ_{b,i} G_{bik} (pattern @ x)_{bik}
    dP_{bij} = Σ_k G_{bik} ov_k x_{bjk}                     # ∂L/∂pattern
    dS       = pattern ⊙ (dP − Σ_j dP_{bij} pattern_{bij})  # through the row softmax
    ∂L/∂qk_k = scale Σ_{b,i,j} dS_{bij} x_{bik} x_{bjk}
    ∂L/∂w_Q  = ∂L/∂qk ⊙ w_K,  ∂L/∂w_K = ∂L/∂qk ⊙ w_Q  (likewise w_V, w_O with ov)

Choices (S10's open details; each a constructor argument): θ0 i.i.d. N(0, 1); no softmax
temperature (``scale = 1``, the paper's head); loss the mean over ``N·n·d`` entries;
noiseless targets. This is not a :class:`~dynascope.tasks.Task` (there is no data stream):
like :class:`~dynascope.tasks.MatrixFactorization` it provides the exact loss, gradient and a
gradient-descent step on a fixed batch.

References:
    Abbe, Boix-Adserà, Littwin, Bengio & Susskind (2023), "Transformers learn through gradual
    rank increase", NeurIPS, arXiv 2306.07042 (Sec. 3 diagonal weights, Sec. 4 small init,
    Fig. 2 the diagonal head in rescaled time); dynascope SYSTEMS.md S10 (toy sizes, teacher).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from dynascope.nn.diagonal_attention import diagonal_attention

from .base import _check_float, _check_int

__all__ = ["DiagonalAttentionTeacher"]


class DiagonalAttentionTeacher:
    """A fixed batch ``x`` and the sparse diagonal teacher's outputs ``y`` (module docstring).

    Args:
        n_ctx: tokens per sequence, ``>= 1``.
        d_model: token width, ``>= len(strengths)``.
        n_seq: sequences in the batch, ``>= 1``.
        strengths: the teacher's non-zero entries of ``qk*`` and ``ov*`` (finite, non-empty).
        scale: score multiplier, finite and ``> 0``.
        seed: seed of the ``torch.Generator`` that draws ``x``.
        dtype: floating dtype of ``x`` and ``y`` (float64 for the study).
    Raises:
        ValueError: if a size is not an int ``>= 1``, ``strengths`` is empty, longer than
            ``d_model`` or not finite, or ``scale`` is not a finite number ``> 0``.
    """

    def __init__(
        self,
        *,
        n_ctx: int = 8,
        d_model: int = 8,
        n_seq: int = 256,
        strengths: Sequence[float] = (2.0, 1.0, 0.5),
        scale: float = 1.0,
        seed: int = 0,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        _check_int("n_ctx", n_ctx, 1)
        _check_int("d_model", d_model, 1)
        _check_int("n_seq", n_seq, 1)
        _check_float("scale", scale, positive=True)
        strengths = tuple(strengths)
        if not strengths or len(strengths) > d_model:
            raise ValueError(
                f"strengths must hold 1 .. d_model={d_model} entries (got {list(strengths)})"
            )
        if not all(isinstance(c, int | float) and math.isfinite(c) for c in strengths):
            raise ValueError(f"strengths must be finite numbers (got {list(strengths)})")
        self.n_ctx, self.d_model, self.n_seq = n_ctx, d_model, n_seq
        self.strengths = tuple(float(c) for c in strengths)
        self.scale = float(scale)
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n_seq, n_ctx, d_model, generator=generator, dtype=dtype)
        c = torch.zeros(d_model, dtype=dtype)
        c[: len(strengths)] = torch.tensor(self.strengths, dtype=dtype)
        self.teacher = c  # qk* = ov* = c
        self.y = diagonal_attention(self.x, c, c, scale=self.scale)[0]
        # x_{bik} x_{bjk} for every (b, i, j): scores = qk @ outer, [d_model, N n n]
        self._outer = (self.x[:, :, None, :] * self.x[:, None, :, :]).reshape(-1, d_model).T
        self._outer = self._outer.contiguous()
        self._x_copies: dict[int, tuple[Tensor, Tensor]] = {}

    @property
    def n_active(self) -> int:
        """Non-zero entries of the teacher's ``qk*`` (and ``ov*``): the final rank."""
        return sum(c != 0 for c in self.strengths)

    def init_weights(self, alphas: Tensor, generator: torch.Generator) -> Tensor:
        """Small init ``w = α θ0``: one ``θ0 [4, d_model]`` i.i.d. N(0, 1), shared by every α.

        Args:
            alphas: ``[n_models]`` init scales (finite, ``> 0``).
            generator: draws ``θ0`` (``w_Q, w_K, w_V, w_O`` in that order).
        Returns:
            ``[n_models, 4, d_model]`` in ``x``'s dtype.
        Raises:
            ValueError: if ``alphas`` is not 1-d and non-empty with finite entries ``> 0``.
        """
        alphas = torch.as_tensor(alphas, dtype=self.x.dtype)
        if alphas.ndim != 1 or alphas.numel() == 0:
            raise ValueError(f"alphas must be 1-d and non-empty (got shape {list(alphas.shape)})")
        if not bool(torch.isfinite(alphas).all() and (alphas > 0).all()):
            raise ValueError(f"alphas must be finite and > 0 (got {alphas.tolist()})")
        theta0 = torch.randn(4, self.d_model, generator=generator, dtype=self.x.dtype)
        return alphas[:, None, None] * theta0

    def _check_w(self, w: Tensor) -> None:
        if w.ndim != 3 or w.shape[1:] != (4, self.d_model):
            raise ValueError(
                f"w must be [n_models, 4, d_model={self.d_model}] (got shape {list(w.shape)})"
            )

    def _x_batched(self, n: int) -> tuple[Tensor, Tensor]:
        """``x`` and ``xᵀ`` repeated for ``n`` copies, ``[n N, n_ctx, d]`` and ``[n N, d, n_ctx]``
        contiguous for ``bmm``: built once per ``n`` (every step used to copy them again)."""
        if n not in self._x_copies:
            x = self.x.expand(n, -1, -1, -1)
            self._x_copies[n] = (
                x.reshape(n * self.n_seq, self.n_ctx, -1),
                x.mT.reshape(n * self.n_seq, -1, self.n_ctx),
            )
        return self._x_copies[n]

    def _forward(self, w: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        qk, ov = w[:, 0] * w[:, 1], w[:, 2] * w[:, 3]
        n, N, c = w.shape[0], self.n_seq, self.n_ctx
        scores = (self.scale * qk @ self._outer).view(n, N, c, c)
        e = (scores - scores.amax(dim=-1, keepdim=True)).exp_()
        pattern = e.div_(e.sum(dim=-1, keepdim=True))
        z = torch.bmm(pattern.view(n * N, c, c), self._x_batched(n)[0])
        z = z.view(n, N, c, -1)
        return pattern, z, z * ov[:, None, None, :], ov

    def loss(self, w: Tensor) -> Tensor:
        """Mean squared error per copy, ``[n_models]``.

        Raises:
            ValueError: if ``w`` is not ``[n_models, 4, d_model]``.
        """
        self._check_w(w)
        return (self._forward(w)[2] - self.y).square().mean(dim=(1, 2, 3))

    def loss_and_gradients(self, w: Tensor) -> tuple[Tensor, Tensor]:
        """Loss ``[n_models]`` and its closed-form gradient ``[n_models, 4, d_model]`` (module
        docstring).

        Raises:
            ValueError: if ``w`` is not ``[n_models, 4, d_model]``.
        """
        self._check_w(w)
        pattern, z, out, ov = self._forward(w)
        residual = out - self.y
        loss = residual.square().mean(dim=(1, 2, 3))
        G = residual.mul_(2.0 / residual[0].numel())
        g_ov = (G * z).sum(dim=(1, 2))  # [n_models, d]
        n, N, c = pattern.shape[:3]
        x_T = self._x_batched(n)[1]  # [n N, d, n_ctx]
        dP = torch.bmm((G * ov[:, None, None, :]).view(n * N, c, -1), x_T).view(n, N, c, c)
        dS = pattern * (dP - (dP * pattern).sum(dim=-1, keepdim=True))
        g_qk = self.scale * dS.view(n, -1) @ self._outer.T  # [n_models, d]
        grad = torch.stack([g_qk * w[:, 1], g_qk * w[:, 0], g_ov * w[:, 3], g_ov * w[:, 2]], 1)
        return loss, grad

    def gradient_step(self, w: Tensor, lr: float) -> tuple[Tensor, Tensor]:
        """One full-batch gradient-descent step.

        Args:
            w: ``[n_models, 4, d_model]``.
            lr: step size η (``> 0``).
        Returns:
            ``(w − η ∇L(w), L(w))``: the new weights and the loss *before* the step; ``w`` is
            not modified.
        Raises:
            ValueError: if ``w`` is not ``[n_models, 4, d_model]``.
        """
        loss, grad = self.loss_and_gradients(w)
        return w - lr * grad, loss
