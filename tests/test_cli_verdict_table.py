"""The terminal verdict table (``study run``, ``study show``): piped, each claim stays on one
line however long its cells; a one-line legend explains ``†`` when a claim is amended."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from dynascope.cli._common import AMENDED_LEGEND, print_verdicts
from dynascope.studies.verdict import Control, Precondition, judge

CONTROL = "the same model and budget with the claimed cause removed, read the same way"


def _outcome(amended: bool) -> SimpleNamespace:
    claims = [
        judge(
            claim=f"{name}: a claim",
            metric="a metric",
            per_seed={seed: 2.0 + seed / 10 for seed in range(5)},
            threshold=1.0,
            direction=">=",
            precondition=Precondition("every arm trained", True),
            control=Control(CONTROL, {seed: 0.1 * seed for seed in range(5)}),
        )
        for name in ("a1", "a2")
    ]
    claims[0] = dataclasses.replace(claims[0], amended=amended)
    return SimpleNamespace(study="s", preset="fast", seed=None, status="held", seconds=1.0,
                           claims=claims)  # fmt: skip


@pytest.mark.parametrize("amended", [True, False])
def test_piped_verdict_rows_do_not_wrap_and_dagger_has_a_legend(amended, capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    print_verdicts(_outcome(amended))
    lines = capsys.readouterr().out.splitlines()
    rows = [line for line in lines if line.lstrip("│ ").startswith(("a1", "a2"))]
    assert len(rows) == 2, lines  # one line per claim: no cell folded onto a second line
    assert all("held" in row and "[" in row for row in rows)  # status and interval on it
    assert ("a1 †" in rows[0]) is amended
    assert lines.count(AMENDED_LEGEND) == int(amended)
