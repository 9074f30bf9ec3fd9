"""The engine's heap policy: glibc keeps freed blocks (the values computed do not change)."""

from __future__ import annotations

import ctypes.util
import platform

import torch

from dynascope.train import _runtime
from dynascope.train._runtime import keep_freed_heap


def test_heap_policy_is_set_on_glibc_and_left_to_the_user_when_they_chose():
    is_glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert keep_freed_heap() is (is_glibc and ctypes.util.find_library("c") is not None)
    assert keep_freed_heap() is keep_freed_heap()  # once per process (cached)


def test_a_users_malloc_setting_wins(monkeypatch):
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert _runtime.keep_freed_heap.__wrapped__() is False


def test_no_libc_found_leaves_the_allocator_alone(monkeypatch):
    monkeypatch.setattr(_runtime.ctypes.util, "find_library", lambda name: None)
    assert _runtime.keep_freed_heap.__wrapped__() is False


def test_tensors_allocated_after_the_policy_hold_what_is_written():
    """Allocation only: a block reused after a free holds exactly the new values."""
    keep_freed_heap()
    for n in (1, 70_000, 1_000_000):  # under, at and over glibc's default 128 KiB threshold
        a = torch.arange(n, dtype=torch.float64)
        del a
        b = torch.full((n,), 3.0, dtype=torch.float64)
        torch.testing.assert_close(b, torch.full((n,), 3.0, dtype=torch.float64), rtol=0, atol=0)
