"""A run or study whose files were damaged by hand: every command says which file, in one line,
exits 2 and writes nothing (found by a new user's try: tracebacks, and a resume that silently
started over without its metrics)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import TINY, assert_one_line_error, invoke

from dynascope.store import CorruptFileError, read_json, read_yaml


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corrupt")
    (root / "tiny.yaml").write_text(TINY)
    result = invoke("run", root / "tiny.yaml", "--out", root / "run", "--no-progress")
    assert result.exit_code == 0, result.output
    return root / "run"


def _files(path: Path) -> dict[str, int]:
    return {str(p.relative_to(path)): p.stat().st_mtime_ns for p in path.rglob("*") if p.is_file()}


@pytest.mark.parametrize("command", ["show", "resume", "report", "compare"])
def test_a_run_whose_config_does_not_parse_is_one_line(tmp_path, run_dir, command):
    broken = tmp_path / "run"
    shutil.copytree(run_dir, broken)
    (broken / "config.yaml").write_text("model: {d_model: 12\ntask: [")
    before = _files(broken)
    args = [broken, run_dir] if command == "compare" else [broken]
    assert_one_line_error(invoke(command, *args), r"config\.yaml' is not valid YAML at line \d")
    assert _files(broken) == before


def test_resume_refuses_a_run_whose_metrics_were_deleted(tmp_path, run_dir):
    broken = tmp_path / "run"
    shutil.copytree(run_dir, broken)
    (broken / "metrics.sqlite").unlink()
    before = _files(broken)
    assert_one_line_error(invoke("resume", broken), r"has checkpoints but no metrics\.sqlite")
    assert _files(broken) == before


def test_readers_name_the_file_line_and_problem(tmp_path):
    (tmp_path / "a.yaml").write_text("a: 1\nb: [\n")
    (tmp_path / "b.json").write_text('{"runs": {bad')
    with pytest.raises(CorruptFileError, match=r"a\.yaml' is not valid YAML at line 3"):
        read_yaml(tmp_path / "a.yaml")
    with pytest.raises(CorruptFileError, match=r"b\.json' is not valid JSON at line 1"):
        read_json(tmp_path / "b.json")
    (tmp_path / "c.json").write_text(json.dumps({"runs": {}}))
    assert read_json(tmp_path / "c.json") == {"runs": {}}
