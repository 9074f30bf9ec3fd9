"""``dynascope.presets``: the preset tiers, the reproducing-preset clause and the cost reader."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dynascope import presets
from dynascope.presets import (
    PRESETS,
    REQUIRED_PRESETS,
    preset_costs,
    reproduces_clause,
    reproducing_preset,
)


def test_tiers_are_ordered_and_base_re_exports_them():
    from dynascope.studies import base

    assert PRESETS == ("smoke", "fast", "full", "paper")
    assert [p for p in PRESETS if p in REQUIRED_PRESETS] == list(REQUIRED_PRESETS)
    assert base.PRESETS is PRESETS and base.REQUIRED_PRESETS is REQUIRED_PRESETS


def test_the_module_does_not_import_torch():
    code = "import sys, dynascope.presets; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("reproduces", "clause", "preset"),
    [
        ("fast (all modes were learnt; ~160 s CPU)", "fast", "fast"),
        ("paper (GPU; never run); fast cannot fit", "paper", "paper"),
        ("none yet: at fast b1's runs are censored", "none yet", None),
        ("`fast` (seconds on 2 cores): two updates", "fast", "fast"),
        ("a1–a3 at `fast` (seconds); b needs every arm fit", "a1–a3 at fast", "fast"),
        ("fast for the MLP and the RNN; not yet for attention", "fast for the MLP and the RNN",
         "fast"),
        ("", "", None),
    ],
)  # fmt: skip
def test_reproduces_clause_and_its_preset(reproduces: str, clause: str, preset: str | None):
    assert reproduces_clause(reproduces) == clause
    assert reproducing_preset(clause) == preset


def test_reproducing_preset_matches_whole_words_only():
    assert reproducing_preset("breakfast") is None
    assert reproducing_preset("full, then paper") == "full"


def test_preset_costs_reads_the_file(tmp_path: Path, monkeypatch):
    costs = {"slingshot": {"fast": {"wall_s": 123.4, "cpu_s": 200.1, "measured": "2 cores"}}}
    path = tmp_path / "preset_costs.json"
    path.write_text(json.dumps(costs))
    monkeypatch.setattr(presets, "COSTS_FILE", path)
    assert preset_costs() == costs


def test_preset_costs_without_a_file_is_empty(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(presets, "COSTS_FILE", tmp_path / "missing.json")
    assert preset_costs() == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [("{nope", "not valid JSON"), ('{"slingshot": 3}', "must map study names")],
)
def test_preset_costs_refuses_a_malformed_file(tmp_path: Path, monkeypatch, text, message):
    path = tmp_path / "preset_costs.json"
    path.write_text(text)
    monkeypatch.setattr(presets, "COSTS_FILE", path)
    with pytest.raises(ValueError, match=rf"preset_costs\.json: {message}"):
        preset_costs()


def test_the_packaged_costs_file_is_valid():
    assert isinstance(preset_costs(), dict)  # the file the command reads; {} until measured


def test_cost_text_states_wall_and_cpu_seconds_and_how_they_were_measured():
    from dynascope.presets import cost_text

    entry = {"wall_s": 612.4, "cpu_s": 480.0, "measured": "2026-12-07, 2 cores"}
    assert cost_text(entry) == "612 s wall, 480 CPU s (2026-12-07, 2 cores)"
    assert cost_text({"wall_s": 59.6}) == "60 s wall"
    assert cost_text(None) == cost_text({}) == "not measured"
