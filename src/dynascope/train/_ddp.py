"""Data-parallel training under ``torchrun``: who writes, what is reduced, what is gathered.

Glossary:
    world_size:  number of processes training one run (``WORLD_SIZE`` set by ``torchrun``).
    rank:        this process's index, 0 .. world_size - 1 (``RANK``); rank 0 is the writer.
    local_rank:  index on this machine (``LOCAL_RANK``): the CUDA device a rank uses.

The Trainer keeps the plain model (probes, evaluation and checkpoints see it, unwrapped) and
trains through a ``DistributedDataParallel`` wrapper of it. Only rank 0 opens the
:class:`~dynascope.store.RunStore`; other ranks get a :class:`ReadOnlyStore` that reads the
run directory's checkpoints and drops every write. Checkpoints are written by rank 0 and
loaded by every rank; each rank's data generator and torch RNG state travel in the
checkpoint (``state["ranks"]``) so a resumed DDP run draws the same batches it would have.
Backends: ``gloo`` on CPU, ``nccl`` on CUDA.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["DistContext", "ReadOnlyStore"]


@dataclass
class DistContext:
    """This process's place in a data-parallel run (``world_size == 1``: not distributed)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owns_group: bool = False

    @classmethod
    def from_env(cls, device: str) -> DistContext:
        """Join the process group ``torchrun`` describes in the environment, if any.

        Raises:
            ValueError: if ``WORLD_SIZE``/``RANK`` are set but not integers.
        """
        try:
            world_size = int(os.environ.get("WORLD_SIZE", "1"))
            rank = int(os.environ.get("RANK", "0"))
            local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        except ValueError:
            raise ValueError(
                "WORLD_SIZE/RANK/LOCAL_RANK must be integers (as torchrun sets them; got "
                f"{os.environ.get('WORLD_SIZE')!r}/{os.environ.get('RANK')!r})"
            ) from None
        if world_size <= 1:
            return cls()
        if device == "cuda":
            torch.cuda.set_device(local_rank)  # one GPU per rank; nccl uses the current one
        owns = not dist.is_initialized()
        if owns:
            dist.init_process_group(backend="nccl" if device == "cuda" else "gloo")
        return cls(rank, world_size, local_rank, owns)

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_writer(self) -> bool:
        return self.rank == 0

    def all_sum(self, values: list[float]) -> list[float]:
        """Sum of ``values`` over ranks (float64; the identity when not distributed)."""
        if not self.enabled:
            return values
        t = torch.tensor(values, dtype=torch.float64)
        if dist.get_backend() == "nccl":
            t = t.cuda()
        dist.all_reduce(t)
        return t.cpu().tolist()

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank (a signal seen by one rank stops all)."""
        return self.all_sum([float(flag)])[0] > 0 if self.enabled else flag

    def gather(self, obj: Any) -> list[Any]:
        """``obj`` from every rank, in rank order (``[obj]`` when not distributed)."""
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def close(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()


class ReadOnlyStore:
    """What a rank other than 0 sees of the run directory: checkpoints to read, no writes."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def checkpoints(self) -> list[tuple[int, Path]]:
        from dynascope.store import RunStore

        return RunStore.checkpoints(self)  # type: ignore[arg-type]

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / "checkpoints"

    def load_checkpoint(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        from dynascope.store import RunStore

        return RunStore.load_checkpoint(self, path)  # type: ignore[arg-type]

    def log(self, step: int, values: dict[str, Any]) -> None: ...
    def event(self, step: int, kind: str, detail: str = "") -> None: ...
    def set_status(self, step: int, status: str) -> None: ...
    def truncate_after(self, step: int) -> None: ...
    def write_config(self, config: dict[str, Any]) -> None: ...
    def save_checkpoint(self, step: int, state: dict[str, Any]) -> None: ...
    def flush(self) -> None: ...

    def __enter__(self) -> ReadOnlyStore:
        return self

    def __exit__(self, *exc: object) -> None: ...
