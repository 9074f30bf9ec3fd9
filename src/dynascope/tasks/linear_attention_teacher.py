"""Teacher–student task: imitate a fixed, random causal linear self-attention layer.

Glossary:
    d_model:    token width.
    n_heads, d_head: the teacher's heads and head width.
    n_ctx:      tokens per sequence T.
    W_Q, W_K, W_V: ``[n_heads, d_model, d_head]``; W_O: ``[n_heads, d_head, d_model]``; every
                entry ~ N(0, 1/d_model), drawn once from ``torch.Generator().manual_seed(seed)``
                in the order W_Q, W_K, W_V, W_O (in ``torch.get_default_dtype()``).
    x:          ``[batch, n_ctx, d_model]`` tokens, i.i.d. N(0, 1), fresh every batch (online).
    y:          ``[batch, n_ctx, d_model]``, the teacher's output
                ``LSA(x)_t = Σ_h Σ_{s≤t} (q_t·k_s) v_s @ W_O[h]`` at every position (no residual).
    variance:   ``E[y²]`` averaged over positions and coordinates (``E[y] = 0`` by the symmetry
                x -> −x), estimated once from ``n_variance`` sequences drawn from
                ``torch.Generator().manual_seed(seed + 1)``; fixed for the task's lifetime.

Loss and metric ``nmse``: ``mean((output − y)²) / variance``, over batch, positions and
coordinates. Predicting 0 scores ≈ 1; the exact construction
(:func:`dynascope.nn.recurrent.gated_rnn_from_linear_attention`) scores 0.

References:
    Zucchet et al. (2023), "Gated recurrent neural networks discover attention",
    arXiv 2309.01775 (Sec. 4.1, teacher–student with a linear self-attention teacher);
    dynascope SYSTEMS.md S6 (sizes, normalisation).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from dynascope.nn.recurrent import causal_linear_attention

from .base import Split, Task, _check_int

__all__ = ["LinearAttentionTeacher"]


class LinearAttentionTeacher(Task):
    """Random linear-attention teacher; ``y`` is its output at every position (module doc).

    Args:
        d_model: token width, ``>= 1``.
        n_heads: teacher heads, ``>= 1``.
        d_head: teacher head width, ``>= 1``.
        n_ctx: tokens per sequence, ``>= 1``.
        seed: seed of the teacher's weights (and, plus one, of the variance estimate).
        n_variance: sequences used to estimate ``variance``, ``>= 1``.
    Raises:
        ValueError: if a size is not an int ``>= 1`` or ``seed < 0``.
    """

    input_kind = "vectors"
    d_vocab = None

    def __init__(
        self,
        *,
        d_model: int = 4,
        n_heads: int = 1,
        d_head: int = 4,
        n_ctx: int = 12,
        seed: int = 0,
        n_variance: int = 4096,
    ) -> None:
        for name, value in (
            ("d_model", d_model),
            ("n_heads", n_heads),
            ("d_head", d_head),
            ("n_ctx", n_ctx),
            ("n_variance", n_variance),
        ):
            _check_int(name, value, 1)
        _check_int("seed", seed, 0)
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_head
        self.n_ctx = n_ctx
        self.d_in = self.d_out = d_model
        generator = torch.Generator().manual_seed(seed)
        std = 1.0 / math.sqrt(d_model)
        dtype = torch.get_default_dtype()
        shape = (n_heads, d_model, d_head)
        self.W_Q, self.W_K, self.W_V = (
            torch.randn(shape, generator=generator, dtype=dtype) * std for _ in range(3)
        )
        self.W_O = torch.randn(n_heads, d_head, d_model, generator=generator, dtype=dtype) * std
        probe = torch.Generator().manual_seed(seed + 1)
        x = torch.randn(n_variance, n_ctx, d_model, generator=probe, dtype=dtype)
        self.variance = float(self.teacher(x).pow(2).mean())

    def teacher(self, x: Tensor) -> Tensor:
        """The teacher's output ``[batch, n_ctx, d_model]`` on ``x`` (moved to ``x``'s device).

        Raises:
            ValueError: if ``x`` is not ``[batch, pos, d_model]``.
        """
        W = [w.to(device=x.device, dtype=x.dtype) for w in (self.W_Q, self.W_K, self.W_V, self.W_O)]
        return causal_linear_attention(x, *W)

    def batch(self, split: Split, batch_size: int, generator: torch.Generator) -> dict[str, Tensor]:
        """Fresh tokens and the teacher's outputs (``split`` only validated).

        Returns:
            ``x``, ``y``: ``[batch, n_ctx, d_model]`` on ``generator.device``.
        Raises:
            ValueError: if ``split`` or ``batch_size`` is invalid.
        """
        self._check_batch_args(split, batch_size)
        x = torch.randn(
            batch_size,
            self.n_ctx,
            self.d_model,
            generator=generator,
            device=generator.device,
            dtype=torch.get_default_dtype(),
        )
        return {"x": x, "y": self.teacher(x)}

    def loss(self, output: Tensor, batch: dict[str, Tensor]) -> Tensor:
        """Normalised MSE ``mean((output − y)²) / variance``.

        Raises:
            ValueError: if ``output`` is not ``[batch, n_ctx, d_model]``.
        """
        self._check_output(output, batch)
        return (output - batch["y"]).pow(2).mean() / self.variance

    def metrics(self, output: Tensor, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """``{"nmse": ...}``, the loss of the detached output."""
        return {"nmse": self.loss(output.detach(), batch)}
