"""Random inputs: append a seed encoding to every token, the same m seeds across a batch.

Glossary:
    batch     number of inputs x_i in a batch.
    m         number of seeds r_1..r_m (``m_seeds``); the same m seeds for every input.
    pos       tokens per input.
    d_in      width of one input token.
    d_seed    width of the seed encoding r_j (``d_r``): 10 random bits for associative recall,
              one U[0, 1] number for cycle colouring, Gaussian for the grid world.
    d_out     width of the wrapped model's output per position.

Encoding: token t of input i under seed j is ``[x_i[t], r_j]`` (seed concatenated to every
token), or ``[x_i[t], r_j[t]]`` with per-token seeds ``[m, pos, d_seed]`` (each vertex of a
graph draws its own randomness). The wrapped model sees ``batch * m`` sequences of width
``d_in + d_seed``, ordered input-major (sequence ``i * m + j`` is input i with seed j), and its
output is reshaped to ``[batch, m, ...]``. Sharing the m seeds across the batch (as the
reference code does) makes per-seed losses comparable across inputs.

References:
    von Oswald, Kobayashi, Akram, Steger (2025), "Learning Randomized Algorithms with
    Transformers", ICLR, arXiv 2408.10818, sec. 3 ("the seed is encoded and concatenated to
    every token") and Table 1.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

__all__ = ["RandomInputs", "append_seeds", "draw_seeds"]

SeedKind = Literal["bits", "uniform", "gaussian"]
_KINDS = ("bits", "uniform", "gaussian")


def draw_seeds(
    m: int,
    d_seed: int,
    *,
    kind: SeedKind = "bits",
    generator: torch.Generator | None = None,
    pos: int | None = None,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """Draw ``m`` seed encodings.

    Args:
        m: number of seeds, ``>= 1``.
        d_seed: width of one encoding, ``>= 1``.
        kind: ``"bits"`` (i.i.d. fair {0, 1}), ``"uniform"`` (U[0, 1)) or ``"gaussian"`` (N(0, 1)).
        generator: source of randomness; the seeds live on its device.
        pos: if given, per-token seeds ``[m, pos, d_seed]``; else ``[m, d_seed]``.
        dtype: float dtype (default: torch's default dtype).
    Returns:
        ``[m, d_seed]`` or ``[m, pos, d_seed]`` floats.
    Raises:
        ValueError: if ``m``, ``d_seed`` or ``pos`` is not a positive int, or ``kind`` is unknown.
    """
    for name, value in (("m", m), ("d_seed", d_seed), ("pos", 1 if pos is None else pos)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1 (got {name}={value!r})")
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {_KINDS} (got kind={kind!r})")
    shape = (m, d_seed) if pos is None else (m, pos, d_seed)
    device = generator.device if generator is not None else None
    dtype = dtype or torch.get_default_dtype()
    if kind == "gaussian":
        return torch.randn(shape, generator=generator, device=device, dtype=dtype)
    u = torch.rand(shape, generator=generator, device=device, dtype=dtype)
    return (u < 0.5).to(dtype) if kind == "bits" else u


def append_seeds(x: Tensor, seeds: Tensor) -> Tensor:
    """Concatenate every seed to every token of every input.

    Args:
        x: ``[batch, pos, d_in]`` inputs.
        seeds: ``[m, d_seed]`` (one seed for all tokens) or ``[m, pos, d_seed]`` (per token).
    Returns:
        ``[batch * m, pos, d_in + d_seed]``, input-major (row ``i * m + j``: input i, seed j).
    Raises:
        ValueError: if ``x`` is not 3-D, or ``seeds`` is not ``[m, d_seed]`` or
            ``[m, pos, d_seed]`` with the input's ``pos``.
    """
    if x.ndim != 3:
        raise ValueError(f"x must be [batch, pos, d_in] (got shape {list(x.shape)})")
    batch, pos, d_in = x.shape
    if seeds.ndim == 2:
        seeds = seeds[:, None, :].expand(-1, pos, -1)
    elif seeds.ndim != 3 or seeds.shape[1] != pos:
        raise ValueError(
            f"seeds must be [m, d_seed] or [m, pos={pos}, d_seed] (got shape {list(seeds.shape)})"
        )
    m, _, d_seed = seeds.shape
    tokens = x[:, None].expand(batch, m, pos, d_in)
    seeded = torch.cat([tokens, seeds[None].expand(batch, -1, -1, -1).to(x.dtype)], dim=-1)
    return seeded.reshape(batch * m, pos, d_in + d_seed)


class RandomInputs(nn.Module):
    """Run ``model`` on every (input, seed) pair; seeds are appended to every token.

    Args:
        model: any module taking ``[sequences, pos, d_in + d_seed]`` (plus optional keyword
            tensors with a leading sequence axis) and returning ``[sequences, ...]``.
        d_seed: width of the seed encoding, ``>= 1``.
    Raises:
        ValueError: if ``d_seed`` is not a positive int.
    References:
        von Oswald et al. (2025), arXiv 2408.10818, sec. 3.
    """

    def __init__(self, model: nn.Module, d_seed: int) -> None:
        super().__init__()
        if isinstance(d_seed, bool) or not isinstance(d_seed, int) or d_seed < 1:
            raise ValueError(f"d_seed must be an int >= 1 (got d_seed={d_seed!r})")
        self.model = model
        self.d_seed = d_seed

    def forward(self, x: Tensor, seeds: Tensor, **batch_kwargs: Tensor) -> Tensor:
        """Evaluate all ``batch x m`` pairs in one call of the wrapped model.

        Args:
            x: ``[batch, pos, d_in]``.
            seeds: ``[m, d_seed]`` or ``[m, pos, d_seed]``; the same m seeds for every input.
            **batch_kwargs: tensors ``[batch, ...]`` (e.g. attention masks), repeated per seed.
        Returns:
            ``[batch, m, ...]``: the model's output for input i and seed j at ``[i, j]``.
        Raises:
            ValueError: if ``seeds``' last axis is not ``d_seed``; as :func:`append_seeds`.
        """
        if seeds.shape[-1] != self.d_seed:
            raise ValueError(
                f"seeds must end in d_seed={self.d_seed} (got shape {list(seeds.shape)})"
            )
        batch, m = x.shape[0], seeds.shape[0]
        repeated = {k: v.repeat_interleave(m, dim=0) for k, v in batch_kwargs.items()}
        out = self.model(append_seeds(x, seeds), **repeated)  # [batch * m, ...]
        return out.reshape(batch, m, *out.shape[1:])
