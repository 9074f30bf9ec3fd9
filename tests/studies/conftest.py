"""Fixtures of the study tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynascope.studies.base import StudyOutcome


@pytest.fixture
def smoke_out(request, smoke_run) -> tuple[StudyOutcome, Path]:
    """``(outcome, study directory)`` of the test module's ``STUDY`` at its smoke preset: the
    session's shared run (``smoke_run`` in tests/conftest.py), read-only."""
    name = request.module.STUDY.name
    return smoke_run.outcome(name), smoke_run(name)
