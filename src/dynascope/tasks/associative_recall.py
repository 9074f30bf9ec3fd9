"""Associative recall: read P key-value pairs, then return the value of a queried key.

Glossary:
    n_keys      number of key tokens; keys are token ids ``0 .. n_keys-1``.
    n_values    number of value tokens; values are ids ``n_keys .. n_keys+n_values-1``.
    P           ``n_pairs``, key-value pairs per sequence, ``1 <= P <= n_keys``.
    k_i, v_i    the i-th key and its value (``i = 1..P``).
    q           the query, one of ``k_1..k_P``.
    d_vocab     ``= d_out = n_keys + n_values`` (the model predicts over the whole vocabulary).
    n_ctx       ``= 2P + 1``.

Encoding (one sequence, positions ``0 .. 2P``)::

    x = k_1 v_1 k_2 v_2 ... k_P v_P q        # [n_ctx] int64
    y = v_j where k_j == q                    # scalar int64, a value token id

The P keys are distinct (drawn without replacement from the ``n_keys`` keys, in random order);
each value is uniform over the ``n_values`` values, with replacement (two keys may share a
value); the query index j is uniform over ``1..P``. All sequences of a batch are independent.
Example with ``n_keys = n_values = 4, P = 2``: ``x = [3, 5, 0, 5, 0]`` (keys 3 and 0, both
with value 5, query 0) and ``y = 5``.

Sampling order per batch (fixed, so a seed fixes the batch): keys via
``torch.rand([batch, n_keys]).argsort(-1)[:, :P]``, then values via ``torch.randint``
``[batch, P]``, then the query index via ``torch.randint`` ``[batch]``.

Loss: cross-entropy (nats) of the logits at the last position, ``output[:, -1]``, against
``y``; other positions are not scored. Metric ``accuracy``: fraction of sequences whose
last-position argmax equals ``y``; chance is ``1/n_values`` for a model that has learned to
answer with a value token.

References:
    Kobayashi, Akram & von Oswald (2024), "Weight decay induces low-rank attention layers",
    NeurIPS, arXiv 2410.23819 (task (b) of study S01; the paper's exact task is unverified,
    this generator is ours).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import Split, Task, _check_int


class AssociativeRecall(Task):
    """Key-value recall sequences ``k1 v1 ... kP vP q`` with target the value of ``q``.

    Args:
        n_keys: number of key tokens, ``>= 1``.
        n_values: number of value tokens, ``>= 1``.
        n_pairs: pairs per sequence, in ``[1, n_keys]``.
    Raises:
        ValueError: if an argument is out of range (message names the field and value).
    """

    input_kind = "tokens"
    d_in = None

    def __init__(self, *, n_keys: int = 16, n_values: int = 16, n_pairs: int = 8) -> None:
        _check_int("n_keys", n_keys, 1)
        _check_int("n_values", n_values, 1)
        if isinstance(n_pairs, bool) or not isinstance(n_pairs, int) or not 1 <= n_pairs <= n_keys:
            raise ValueError(
                f"n_pairs must be in [1, n_keys] (got n_pairs={n_pairs!r}, n_keys={n_keys})"
            )
        self.n_keys = n_keys
        self.n_values = n_values
        self.n_pairs = n_pairs
        self.d_vocab = n_keys + n_values
        self.d_out = self.d_vocab
        self.n_ctx = 2 * n_pairs + 1

    def batch(self, split: Split, batch_size: int, generator: torch.Generator) -> dict[str, Tensor]:
        """Draw ``batch_size`` independent sequences (``split`` only validated: online task).

        Returns:
            ``x``: ``[batch, n_ctx]`` int64 tokens; ``y``: ``[batch]`` int64 value token ids.
        """
        self._check_batch_args(split, batch_size)
        device = generator.device
        P = self.n_pairs
        keys = torch.rand(batch_size, self.n_keys, generator=generator, device=device)
        keys = keys.argsort(dim=-1)[:, :P]  # [batch, P] distinct keys
        values = torch.randint(
            self.n_keys, self.d_vocab, (batch_size, P), generator=generator, device=device
        )  # [batch, P]
        query_index = torch.randint(0, P, (batch_size, 1), generator=generator, device=device)
        query = keys.gather(1, query_index)  # [batch, 1]
        pairs = torch.stack([keys, values], dim=-1).reshape(batch_size, 2 * P)
        x = torch.cat([pairs, query], dim=1)  # [batch, n_ctx]
        y = values.gather(1, query_index).squeeze(1)  # [batch]
        return {"x": x, "y": y}

    def loss(self, output: Tensor, batch: dict[str, Tensor]) -> Tensor:
        """Cross-entropy (nats, batch mean) of ``output[:, -1]`` ``[batch, d_out]`` vs ``y``.

        Raises:
            ValueError: if ``output`` is not ``[batch, n_ctx, d_out]``.
        """
        self._check_output(output, batch)
        return F.cross_entropy(output[:, -1], batch["y"])

    def metrics(self, output: Tensor, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """``{"accuracy": ...}``: fraction of last-position argmax equal to ``y``."""
        self._check_output(output, batch)
        hit = output[:, -1].detach().argmax(dim=-1) == batch["y"]
        return {"accuracy": hit.float().mean()}
