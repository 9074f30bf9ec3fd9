"""Which checkpoints a run directory keeps: the latest ones (for resume) and a log-spaced history.

A run writes a checkpoint every ``Loop.checkpoint_every`` steps and at its last step; the
latest ``Loop.keep_checkpoints`` of them are kept, and resume reads the last. With
``Loop.checkpoint_history="log"`` (the default) the engine also writes one at step 0 (the
initialisation) and at every power of two (1, 2, 4, 8, ...), and keeps those as the run's
history, so that the dynamics can be read back from the start (``dynascope inspect RUN``).
Every checkpoint holds the whole training state (model, optimizer, RNGs), so any of them can
be loaded or trained on from.

The history is bounded by ``Loop.checkpoint_budget_mb`` (MiB per run directory): history
checkpoints are kept in step order while their total size fits; the first one that does not
fit, and every later one, is removed once it is no longer among the latest. A run of ``T``
steps keeps at most ``floor(log2 T) + 2`` history checkpoints.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["MIB", "is_history_step", "kept_steps"]

MIB = 2**20
"""Bytes in a MiB (the unit of ``Loop.checkpoint_budget_mb``)."""


def is_history_step(step: int) -> bool:
    """Whether ``step`` is a history step: 0 or a power of two (1, 2, 4, ...).

    Raises:
        ValueError: if ``step`` is negative.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0 (got {step})")
    return step & (step - 1) == 0


def kept_steps(
    sizes: Sequence[tuple[int, int]],
    *,
    keep_last: int,
    history: bool,
    budget_bytes: float | None,
) -> set[int]:
    """The steps of the checkpoints to keep, out of ``sizes``.

    Args:
        sizes: ``(step, size in bytes)`` of every checkpoint in the run directory, any order.
        keep_last: the latest checkpoints (by step) always kept, ``>= 1``.
        history: keep history steps (:func:`is_history_step`) besides the latest.
        budget_bytes: the most bytes that history checkpoints outside the latest may take;
            ``None``: no limit. They are counted in step order and the count stops at the
            first one that does not fit, so the kept history is a prefix of the history
            (checkpoints of one run are about the same size) and never shrinks as the run
            goes on.
    Returns:
        The steps to keep; every other checkpoint is to be removed.
    Raises:
        ValueError: if ``keep_last < 1`` or a budget is negative.
    """
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1 (got {keep_last})")
    if budget_bytes is not None and budget_bytes < 0:
        raise ValueError(f"budget_bytes must be >= 0 or None (got {budget_bytes})")
    ordered = sorted(sizes)
    kept = {step for step, _ in ordered[-keep_last:]}
    if not history:
        return kept
    used = 0
    for step, size in ordered[:-keep_last]:
        if not is_history_step(step):
            continue
        if budget_bytes is not None and used + size > budget_bytes:
            break
        used += size
        kept.add(step)
    return kept
