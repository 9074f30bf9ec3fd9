"""Reading one value from a stored run for analysis tables (NaN where the run lacks it).

Glossary: a run's scalar ``key`` is a series indexed by step (:meth:`dynascope.store.Run.scalar`);
its "last" value is the one at the last logged step.
"""

from __future__ import annotations

from dynascope.store import Run

__all__ = ["last_or_nan"]


def last_or_nan(run: Run, key: str) -> float:
    """The value of scalar ``key`` at its last logged step, or NaN if ``run`` never logged it.

    Analysis tables use NaN for a metric a run did not produce (a diverged or unfinished run,
    or a key only some presets log), so one missing key does not stop a study's analysis.
    """
    try:
        return run.last(key)
    except KeyError:
        return float("nan")
