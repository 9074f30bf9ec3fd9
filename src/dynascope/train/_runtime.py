"""What a run needs around its loop: RNG state as plain data, signals, a progress bar, threads,
the heap policy."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import random
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

__all__ = [
    "StopSignals",
    "global_rng_state",
    "keep_freed_heap",
    "progress_bar",
    "set_global_rng_state",
    "torch_threads",
]


class StopSignals:
    """Within ``with``: the first SIGINT/SIGTERM only sets :attr:`signal`; a second one
    interrupts at once (``KeyboardInterrupt``). Outside the main thread it does nothing."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: object) -> None:
        if self.signal is not None:
            raise KeyboardInterrupt
        self.signal = signal.Signals(signum).name

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run torch on ``n`` intra-op threads inside the block (``None``: leave it), then restore.

    The engine's thread policy: one thread by default. The models of the studies are small
    (matrices of a few hundred rows); a second thread only adds hand-offs (steps measured
    10-18x slower with two threads on a busy 2-core machine), and one thread makes CPU runs
    bitwise reproducible whichever executor runs them.
    """
    previous = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


# glibc's mallopt parameters (malloc.h) and the values the engine sets.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD = 32 * 2**20  # glibc's largest allowed value on 64-bit systems
_TRIM_THRESHOLD = 128 * 2**20


@functools.cache
def keep_freed_heap() -> bool:
    """Let glibc keep freed memory for reuse instead of returning it to the kernel (once per
    process); returns whether the policy was set.

    By default glibc serves a block over 128 KiB with a fresh ``mmap`` and gives it back on
    free, and trims the heap's free top above a dynamic threshold, so a loop that allocates
    the same few hundred-KiB tensors every step pays page faults for each of them again. With
    ``M_MMAP_THRESHOLD`` = 32 MiB and ``M_TRIM_THRESHOLD`` = 128 MiB those blocks are reused.
    Measured on gradual-rank's toy step (tensors of 512 KiB, float64, one thread): 2.7 s of
    system time and 937,570 minor page faults per 1,000 steps without it, 0.03 s and 3,591 with
    it; user time fell too (4.6 -> 3.9 s). The values computed do not change (allocation only).

    Does nothing (returns False) off glibc, or when the user set ``MALLOC_MMAP_THRESHOLD_`` or
    ``MALLOC_TRIM_THRESHOLD_`` in the environment (their choice wins).
    """
    if any(k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return False
    if not hasattr(libc, "gnu_get_libc_version"):  # not glibc (musl, macOS): leave it alone
        return False
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # Setting either parameter turns glibc's dynamic thresholds off, so both are set.
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
    )


def global_rng_state() -> dict:
    """The global torch, Python and numpy RNG states as plain data (``weights_only`` loads)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
        "numpy_rng": {
            "name": name,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
    }


def set_global_rng_state(state: dict) -> None:
    """Restore what :func:`global_rng_state` returned (from a checkpoint)."""
    torch.set_rng_state(state["torch_rng"])
    random.setstate(_as_tuples(state["python_rng"]))
    numpy = state["numpy_rng"]
    keys = numpy["keys"].numpy().astype(np.uint32)
    np.random.set_state(
        (numpy["name"], keys, numpy["pos"], numpy["has_gauss"], numpy["cached_gaussian"])
    )


def _as_tuples(value):
    """``random.setstate`` wants tuples; a checkpoint may hand back lists."""
    if isinstance(value, list | tuple):
        return tuple(_as_tuples(v) for v in value)
    return value


def progress_bar(enabled: bool, name: str, total: int, start: int):
    """A rich progress bar ``(progress, task_id)``, or ``None`` when not ``enabled``.

    The loss column reads "loss -" until the first logged loss (no "nan" at step 0).
    """
    if not enabled:
        return None
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("loss {task.fields[loss]}"),
        TimeRemainingColumn(),
        transient=True,
    )
    task_id = progress.add_task(name, total=total, completed=start, loss="-")
    progress.start()
    return progress, task_id
