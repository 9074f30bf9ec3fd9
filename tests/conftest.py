"""Test-session settings and the fixtures every test folder shares (helpers: ``tests/helpers.py``).

Tests run torch with one intra-op thread: the models here are tiny (one thread is as fast), and
on a busy 2-core CI machine a second thread can be starved. Bitwise determinism of CPU training
is also only promised for a fixed thread count (see ``dynascope.train``); with more than one
thread some CPU kernels were measured to differ run to run (docs/benchmarks.md).
"""

import importlib
import os
import sys
from pathlib import Path

import pytest
import torch
from helpers import SmokeRuns

torch.set_num_threads(1)

EXECUTORS = Path(__file__).parent / "executors"


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """``smoke_run(name) -> Path``: the study directory of ``name``'s smoke preset, run once per
    session for all xdist workers (:class:`helpers.SmokeRuns`; also ``smoke_run.outcome(name)``,
    ``.writes(name)``, ``.copy(name, to)``). Read-only: copy it before writing into it."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker has its own basetemp below one root
        base = base.parent
    root = base / "smoke_runs"
    root.mkdir(exist_ok=True)
    runs = SmokeRuns(root)
    yield runs
    runs.check_untouched()


@pytest.fixture(scope="session")
def stub_study():
    """The stub study module ``tests/executors/_stub_study.py``, imported by name with its folder
    on ``sys.path`` for the session (executors in other processes unpickle its builds by
    reference)."""
    sys.path.insert(0, str(EXECUTORS))
    try:
        yield importlib.import_module("_stub_study")
    finally:
        if str(EXECUTORS) in sys.path:
            sys.path.remove(str(EXECUTORS))
