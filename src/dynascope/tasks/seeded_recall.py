"""Associative recall with seed bits (von Oswald et al. 2025, Table 1): one-hot keys, bit values.

Glossary:
    N           ``n_keys``: tokens per input; every one of the N keys appears exactly once.
    b           ``n_value_bits`` (5): width of a value; answers are b-bit strings (2^b classes).
    k_i         one-hot key of token i, ``[N]``; the keys are a uniformly random order of the N
                one-hots.
    v_i         value of token i, b i.i.d. fair bits.
    j           query index, uniform over the N tokens (the query is always one of the keys).
    d_in        ``N + b``, token width before the seed encoding is appended.
    n_ctx       ``N + 1`` (N key-value tokens, then the query token).
    m           number of seeds; the model's output for a batch is ``[batch, m, n_ctx, b]``.

Encoding of one input (rows are tokens; the seed encoding ``r`` is appended to every token by
:class:`dynascope.nn.random_inputs.RandomInputs`, giving the paper's ``[k_i, r, v_i]`` up to the
order of the fields)::

    x[t] = [k_t, v_t]   for t = 0 .. N-1
    x[N] = [k_j, 0]     (the query: key of token j, value field zero)
    y    = v_j           [b] float bits

Loss of one (input, seed): the sum over the b bits of the binary cross-entropy (nats) of the
logits at the last position against ``y``. Success: all b bits of the argmax answer (logit > 0)
are right. This is not a :class:`~dynascope.tasks.base.Task`: its output carries a seed axis and
its loss is per (input, seed), to be pooled by :func:`dynascope.optim.lq.lq_loss`.

Sampling order per batch (fixed, so a generator state fixes the batch): key order via
``torch.rand([batch, N]).argsort(-1)``, values via ``torch.rand([batch, N, b]) < 0.5``, query
index via ``torch.randint(N, [batch])``.

References:
    von Oswald, Kobayashi, Akram, Steger (2025), "Learning Randomized Algorithms with
    Transformers", ICLR, arXiv 2408.10818, sec. 4.1 and Table 1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import _check_int

__all__ = ["SeededRecall"]


class SeededRecall:
    """Recall the b-bit value of the queried one-hot key among N key-value tokens.

    Args:
        n_keys: N, ``>= 1``.
        n_value_bits: b, ``>= 1``.
    Raises:
        ValueError: if an argument is not an int in range.
    References:
        von Oswald et al. (2025), arXiv 2408.10818, sec. 4.1.
    """

    def __init__(self, *, n_keys: int = 20, n_value_bits: int = 5) -> None:
        _check_int("n_keys", n_keys, 1)
        _check_int("n_value_bits", n_value_bits, 1)
        self.n_keys = n_keys
        self.n_value_bits = n_value_bits
        self.d_in = n_keys + n_value_bits
        self.n_ctx = n_keys + 1
        self.d_out = n_value_bits

    def batch(self, batch_size: int, generator: torch.Generator) -> dict[str, Tensor]:
        """Draw ``batch_size`` independent inputs.

        Returns:
            ``x`` ``[batch, n_ctx, d_in]`` floats; ``y`` ``[batch, b]`` float bits;
            ``query_index`` ``[batch]`` int64 (the token whose value is asked).
        Raises:
            ValueError: if ``batch_size`` is not an int >= 1.
        """
        _check_int("batch_size", batch_size, 1)
        device, N, b = generator.device, self.n_keys, self.n_value_bits
        dtype = torch.get_default_dtype()
        order = torch.rand(batch_size, N, generator=generator, device=device).argsort(dim=-1)
        values = (torch.rand(batch_size, N, b, generator=generator, device=device) < 0.5).to(dtype)
        query = torch.randint(N, (batch_size,), generator=generator, device=device)
        keys = F.one_hot(order, N).to(dtype)  # [batch, N, N]: token t has key order[t]
        rows = torch.arange(batch_size, device=device)
        query_token = torch.cat([keys[rows, query], torch.zeros(batch_size, b, device=device)], -1)
        x = torch.cat([torch.cat([keys, values], dim=-1), query_token[:, None]], dim=1)
        return {"x": x, "y": values[rows, query], "query_index": query}

    def _check(self, output: Tensor, batch: dict[str, Tensor]) -> None:
        n = batch["y"].shape[0]
        if output.ndim != 4 or output.shape[0] != n or output.shape[2:] != (self.n_ctx, self.d_out):
            raise ValueError(
                f"output must be [batch={n}, m, n_ctx={self.n_ctx}, d_out={self.d_out}] "
                f"(got {list(output.shape)})"
            )

    def per_seed_loss(self, output: Tensor, batch: dict[str, Tensor]) -> Tensor:
        """Sum over bits of the BCE (nats) at the last position, per (input, seed).

        Args:
            output: logits ``[batch, m, n_ctx, b]``.
        Returns:
            ``[batch, m]`` non-negative losses.
        Raises:
            ValueError: if ``output`` has the wrong shape.
        """
        self._check(output, batch)
        logits = output[:, :, -1]  # [batch, m, b]
        target = batch["y"][:, None].expand_as(logits)
        bce = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
        return bce.sum(dim=-1)

    def correct(self, output: Tensor, batch: dict[str, Tensor]) -> Tensor:
        """Bool ``[batch, m]``: all b argmax bits (logit > 0) equal ``y``.

        Raises:
            ValueError: if ``output`` has the wrong shape.
        """
        self._check(output, batch)
        bits = (output[:, :, -1] > 0).to(batch["y"].dtype)
        return (bits == batch["y"][:, None]).all(dim=-1)
