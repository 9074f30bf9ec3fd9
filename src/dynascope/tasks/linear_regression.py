"""In-context linear regression: infer w from N examples, predict the query's label.

Glossary:
    d_x         input dimension of the regression.
    N           ``n_points``, in-context examples per sequence.
    w           ``[d_x]`` task vector, fresh per sequence, ``w ~ N(0, w_std^2 I)``.
    x_i         ``[d_x]`` inputs, ``x_i ~ N(0, I)``, i = 1..N, and the query ``x_q``.
    y_i         labels, ``y_i = w^T x_i + eps_i``, ``eps_i ~ N(0, noise_std^2)``; same for y_q.
    d_in        ``= d_x + 1`` (one token holds an input and its label).
    n_ctx       ``= N + 1``.
    d_out       ``= 1``.

Encoding (one sequence, positions ``0 .. N``)::

    x[i] = [x_i ; y_i]   for i < N          # [d_x + 1]
    x[N] = [x_q ; 0]                         # the query: label slot zeroed
    y    = y_q                               # scalar target, noise included

All values are in ``torch.get_default_dtype()``. Sampling order per batch (fixed, so a seed
fixes the batch): ``w`` ``[batch, d_x]``, then all inputs ``[batch, N+1, d_x]`` (query last),
then the noise ``[batch, N+1]`` (always drawn, scaled by ``noise_std``, so changing
``noise_std`` does not change ``w`` or the inputs).

Loss: mean squared error of ``output[:, -1, 0]`` against ``y`` (the query position only).
Metric ``mse``: the same number. For reference, predicting 0 gives expected mse
``d_x * w_std^2 + noise_std^2``; one step of gradient descent from w = 0 on the in-context
least-squares loss (what a linear self-attention layer can implement) does much better for
large N.

References:
    von Oswald, Niklasson, Randazzo, Sacramento, Mordvintsev, Zhmoginov & Vladymyrov (2023),
    "Transformers learn in-context by gradient descent", ICML, arXiv 2212.07677 (Section 2,
    the token construction ``e_i = (x_i, y_i)`` with the query's label slot set to 0).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import Split, Task, _check_float, _check_int


class InContextLinearRegression(Task):
    """Sequences of ``[x_i; y_i]`` tokens from a per-sequence linear map, then a query.

    Args:
        d_x: input dimension, ``>= 1``.
        n_points: in-context examples N, ``>= 1``.
        noise_std: label noise standard deviation, finite, ``>= 0``.
        w_std: standard deviation of each entry of ``w``, finite, ``> 0``.
    Raises:
        ValueError: if an argument is out of range (message names the field and value).
    """

    input_kind = "vectors"
    d_vocab = None
    d_out = 1

    def __init__(
        self, *, d_x: int = 4, n_points: int = 16, noise_std: float = 0.0, w_std: float = 1.0
    ) -> None:
        _check_int("d_x", d_x, 1)
        _check_int("n_points", n_points, 1)
        _check_float("noise_std", noise_std, positive=False)
        _check_float("w_std", w_std, positive=True)
        self.d_x = d_x
        self.n_points = n_points
        self.noise_std = float(noise_std)
        self.w_std = float(w_std)
        self.d_in = d_x + 1
        self.n_ctx = n_points + 1

    def batch(self, split: Split, batch_size: int, generator: torch.Generator) -> dict[str, Tensor]:
        """Draw ``batch_size`` independent regression problems (``split`` only validated).

        Returns:
            ``x``: ``[batch, n_ctx, d_in]`` float; ``y``: ``[batch]`` float, the query label.
        """
        self._check_batch_args(split, batch_size)
        kw = {
            "generator": generator,
            "device": generator.device,
            "dtype": torch.get_default_dtype(),
        }
        w = torch.randn(batch_size, self.d_x, **kw) * self.w_std  # [batch, d_x]
        inputs = torch.randn(batch_size, self.n_ctx, self.d_x, **kw)  # [batch, n_ctx, d_x]
        noise = torch.randn(batch_size, self.n_ctx, **kw) * self.noise_std  # [batch, n_ctx]
        labels = torch.einsum("bpd,bd->bp", inputs, w) + noise  # [batch, n_ctx]
        y = labels[:, -1].clone()  # [batch]
        labels[:, -1] = 0.0
        x = torch.cat([inputs, labels.unsqueeze(-1)], dim=-1)  # [batch, n_ctx, d_in]
        return {"x": x, "y": y}

    def loss(self, output: Tensor, batch: dict[str, Tensor]) -> Tensor:
        """Mean squared error of ``output[:, -1, 0]`` against ``y``.

        Raises:
            ValueError: if ``output`` is not ``[batch, n_ctx, 1]``.
        """
        self._check_output(output, batch)
        return F.mse_loss(output[:, -1, 0], batch["y"])

    def metrics(self, output: Tensor, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """``{"mse": ...}``: mean squared error at the query position."""
        self._check_output(output, batch)
        return {"mse": F.mse_loss(output[:, -1, 0].detach(), batch["y"])}
