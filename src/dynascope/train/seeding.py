"""Named seed streams: every random source of a run is drawn from its own, named stream.

A run has one integer ``seed``. Each consumer asks for the stream it uses by name instead of
adding an ad-hoc offset to the seed:

    ======== ==========================================================================
    ``init``  the global torch/Python/numpy RNG while the model is built (weights)
    ``data``  the training-batch generator (a ``torch.Generator``)
    ``val``   the fixed evaluation batches (re-created from the same seed each time)
    other     any name a study needs (``"noise"``, ``"probe"``, ``"teacher"``, ...)
    ======== ==========================================================================

``init`` and ``data`` are the run seed itself (so a run's weights and batches do not change
when streams are added); every other name maps to a 64-bit seed by hashing ``"{seed}/{name}"``
(BLAKE2b), which is deterministic across processes, platforms and Python versions (unlike
``hash``), and makes streams of one run, and the same stream of two seeds, unrelated.
"""

from __future__ import annotations

import hashlib
import random

import numpy as np
import torch

__all__ = ["SeedStreams", "seed_everything", "stream_seed"]

_ROOT_STREAMS = ("init", "data")


def stream_seed(seed: int, name: str) -> int:
    """The seed of stream ``name`` of a run seeded ``seed`` (module docstring).

    Args:
        seed: the run seed, ``0 <= seed < 2**64``.
        name: the stream's name (non-empty).
    Returns:
        A seed in ``[0, 2**63)``: ``seed`` itself for ``init`` and ``data``.
    Raises:
        ValueError: if ``seed`` is outside ``[0, 2**64)`` or ``name`` is empty.
    """
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed must lie in [0, 2**64) (got {seed})")
    if not name:
        raise ValueError("stream name must be non-empty")
    if name in _ROOT_STREAMS:
        return seed
    digest = hashlib.blake2b(f"{seed}/{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def seed_everything(seed: int) -> None:
    """Seed the global torch, Python ``random`` and numpy RNGs (numpy takes 32 bits)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class SeedStreams:
    """The named streams of one run seed.

    Args:
        seed: the run seed, ``0 <= seed < 2**64``.
    Raises:
        ValueError: if ``seed`` is out of range.
    """

    def __init__(self, seed: int) -> None:
        stream_seed(seed, "init")  # validates
        self.seed = seed

    def __call__(self, name: str) -> int:
        """The seed of stream ``name`` (:func:`stream_seed`)."""
        return stream_seed(self.seed, name)

    def generator(self, name: str, device: str | torch.device = "cpu") -> torch.Generator:
        """A fresh ``torch.Generator`` on ``device`` seeded from stream ``name``."""
        return torch.Generator(device=device).manual_seed(self(name))
