"""The suite and scale-out commands: ``study run --all``, ``study table``, ``compare``,
``--executor``/``--workers``/``--device`` input checks.

``--all`` runs against a registry of two stub studies (tests/executors/_stub_study.py), so the
test does not depend on the real studies' runtimes.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from dynascope import studies
from dynascope.cli import app

HERE = Path(__file__).parent / "executors"
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def assert_one_line_error(result, pattern: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert re.search(pattern, lines[0]), lines[0]


@pytest.fixture
def stub_registry(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))
    # output as piped to a file (as wide as its content), whatever the test runner's COLUMNS
    monkeypatch.delenv("COLUMNS", raising=False)
    stub = importlib.import_module("_stub_study")
    registry = {
        "stub-a": stub.make_study(("ok", "ok"), name="stub-a"),
        "stub-b": stub.make_study(("ok", "raise"), name="stub-b"),
    }
    monkeypatch.setattr(studies, "_registry", lambda: registry)
    return registry


def _broken_runs(preset, seed):
    raise RuntimeError("broken build_runs")


def test_study_run_all_prints_the_suite_table_and_study_table_writes_markdown(
    stub_registry, tmp_path
):
    stub = importlib.import_module("_stub_study")
    broken = dataclasses.replace(stub.make_study(name="stub-0broken"), build_runs=_broken_runs)
    stub_registry["stub-0broken"] = broken  # sorted first: the suite goes on after it
    result = invoke(
        "study", "run", "--all", "--preset", "smoke", "--out", tmp_path, "--no-progress"
    )
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines() == [
        "error: study stub-0broken failed: RuntimeError: broken build_runs",
        "error: studies that could not run: stub-0broken",
    ]
    assert "stub-0broken" in result.stdout and "(not run)" in result.stdout
    del stub_registry["stub-0broken"]
    for name in stub_registry:
        assert (tmp_path / f"{name}-smoke" / "verdict.json").is_file()
        assert (tmp_path / f"{name}-smoke" / "runs" / "r0_ok" / "report.html").is_file()
    assert "suite (smoke)" in result.stdout
    table_lines = [line for line in result.stdout.splitlines() if "stub-" in line and "s1" in line]
    assert len(table_lines) == 2

    docs = tmp_path / "studies.md"
    result = invoke("study", "table", "--dir", tmp_path, "--preset", "smoke", "--output", docs)
    assert result.exit_code == 0, result.output
    text = docs.read_text()
    assert "`dynascope study run --all --preset smoke`" in text
    row = (
        r"^\| stub-a \| s1 \| (held|not held) \| -?[0-9.e+-]+ \| unknown 0 \| no interval \| "
        r"no control \| [0-9.]+ \| sum of last x \|$"
    )  # the stub's verdicts are legacy: no seeds, no control, no direction in their detail
    assert re.search(row, text, re.M)
    # one of two finished
    assert (
        "| stub-b | s2 | held | 1 | unknown 1 | no interval | no control |  | finished runs |"
        in text
    )
    assert "0 of them identity checks; 0 amended" in text  # legacy stubs: no protocol

    del stub_registry["stub-b"]
    stub_registry["stub-c"] = stub_registry["stub-a"]  # registered, never run here
    result = invoke("study", "table", "--dir", tmp_path, "--preset", "smoke", "--output", docs)
    assert "| stub-c | (not run) |" in docs.read_text()


def test_study_run_needs_a_name_or_all_and_checks_executor_options(stub_registry, tmp_path):
    out = tmp_path / "never"
    assert_one_line_error(invoke("study", "run", "--out", out), "give a study name or --all")
    assert_one_line_error(
        invoke("study", "run", "stub-a", "--all", "--out", out), "give a study name or --all"
    )
    assert_one_line_error(
        invoke("study", "run", "stub-a", "--executor", "dask", "--out", out),
        r"executor must be one of local, process, ray \(got 'dask'\)",
    )
    assert_one_line_error(
        invoke("study", "run", "stub-a", "--workers", "2", "--out", out),
        "workers: only the process executor takes it",
    )
    assert_one_line_error(
        invoke("study", "run", "stub-a", "--device", "tpu", "--out", out),
        r"device must be one of auto, cpu, cuda \(got 'tpu'\)",
    )
    if not torch.cuda.is_available():
        assert_one_line_error(
            invoke("study", "run", "stub-a", "--device", "cuda", "--out", out),
            "device: cuda is not available here",
        )
    assert not out.exists()


def test_run_device_and_bf16_without_cuda_are_one_line_errors(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(
        "task: {name: associative_recall, n_keys: 6, n_values: 5, n_pairs: 3}\n"
        "model: {d_model: 12, n_heads: 3, d_mlp: 0}\ntrain: {steps: 2, batch_size: 4}\n"
    )
    out = tmp_path / "run"
    if not torch.cuda.is_available():
        assert_one_line_error(
            invoke("run", config, "--out", out, "--device", "cuda"),
            "device: cuda is not available here",
        )
    assert_one_line_error(
        invoke("run", config, "--out", out, "--bf16"), r"bf16: autocast needs device=cuda"
    )
    assert not out.exists()
    result = invoke("run", config, "--out", out, "--device", "auto", "--no-progress")
    assert result.exit_code == 0, result.output


def test_compare_prints_two_runs_and_two_studies_side_by_side(stub_registry, tmp_path):
    for seed in (0, 1):
        out = tmp_path / f"s{seed}"
        result = invoke("study", "run", "stub-a", "--preset", "smoke", "--seed", seed, "--out", out)
        assert result.exit_code == 0, result.output
    runs = invoke("compare", tmp_path / "s0" / "runs" / "r0_ok", tmp_path / "s1" / "runs" / "r0_ok")
    assert runs.exit_code == 0, runs.output
    x_line = next(line for line in runs.stdout.splitlines() if line.strip("│ ").startswith("x "))
    numbers = [float(v) for v in re.findall(r"-?\d+\.?\d*(?:e[-+]\d+)?", x_line)]
    assert len(numbers) == 3 and numbers[2] == pytest.approx(numbers[1] - numbers[0], abs=1e-5)
    studies_ = invoke("compare", tmp_path / "s0", tmp_path / "s1")
    assert studies_.exit_code == 0 and "s1 measured" in studies_.stdout
    assert_one_line_error(
        invoke("compare", tmp_path / "s0", tmp_path / "s1" / "runs" / "r0_ok"),
        "cannot compare a study directory with a run directory",
    )
    assert_one_line_error(invoke("compare", tmp_path, tmp_path / "s1"), "is neither a run")


def test_study_run_refusals_are_the_only_output_and_name_the_option(stub_registry, tmp_path):
    result = invoke("study", "run", "stub-a", "--preset", "smoke", "--out", "/proc/nope/x")
    assert_one_line_error(result, r"^error: --out: '/proc/nope/x' cannot be created")
    assert result.stdout == ""
    out = tmp_path / "s"
    assert invoke("study", "run", "stub-a", "--preset", "smoke", "--out", out).exit_code == 0
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    refused = invoke("study", "run", "stub-a", "--preset", "smoke", "--seed", 1, "--out", out)
    assert_one_line_error(refused, "holds runs made with other configs")
    assert refused.stdout == ""  # validated before the header line
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


def test_study_table_refuses_a_directory_without_verdicts(stub_registry, tmp_path):
    docs = tmp_path / "docs" / "studies.md"
    empty = tmp_path / "empty"
    empty.mkdir()
    result = invoke("study", "table", "--dir", empty, "--preset", "smoke", "--output", docs)
    assert_one_line_error(result, r"--dir: '.*empty' holds no study verdicts for preset smoke")
    assert result.stdout == "" and not docs.parent.exists()
    run_dir = tmp_path / "s" / "runs" / "r0_ok"
    made = invoke("study", "run", "stub-a", "--preset", "smoke", "--out", run_dir.parents[1])
    assert made.exit_code == 0, made.output
    for wrong, why in ((run_dir, "a run directory"), (run_dir.parents[1], "a study directory")):
        result = invoke("study", "table", "--dir", wrong, "--preset", "smoke", "--output", docs)
        assert_one_line_error(result, f"holds no study verdicts.*it is {why}")
    assert not docs.parent.exists()
    help_words = " ".join(
        re.sub("[│╭╮╰╯─]", " ", invoke("study", "table", "--help").stdout).split()
    )
    assert "docs/studies.md under the current directory" in help_words


def test_names_are_never_cut_when_stdout_is_not_a_terminal(stub_registry, monkeypatch, tmp_path):
    monkeypatch.delenv("COLUMNS", raising=False)
    long = "stub-with-a-name-long-enough-to-be-cut-at-eighty-columns"
    stub_registry[long] = dataclasses.replace(
        stub_registry["stub-a"], name=long, claim="a claim " * 30
    )
    listed = invoke("study", "list")
    assert listed.exit_code == 0 and long in listed.stdout and "…" not in listed.stdout
    suite = invoke("study", "run", "--all", "--preset", "smoke", "--out", tmp_path)
    assert suite.exit_code == 0, suite.output
    docs = tmp_path / "studies.md"
    table = invoke("study", "table", "--dir", tmp_path, "--preset", "smoke", "--output", docs)
    for output in (suite.stdout, table.stdout):
        assert long in output and "…" not in output


def _judged_analyze(runs, figures_dir):
    from dynascope.studies.base import Analysis
    from dynascope.studies.verdict import Control, Precondition, judge

    x = {i: run.last("x") for i, run in enumerate(runs.values())}  # two runs: two seeds
    verdict = judge(
        claim="j1: x is finite",
        metric="last x",
        per_seed=x,
        threshold=-100.0,
        direction=">=",
        precondition=Precondition("the runs finished", met=True),
        control=Control("x minus 1000", per_seed={s: v - 1000 for s, v in x.items()}),
    )
    return Analysis([verdict])


def test_study_run_prints_status_spread_control_and_why_inconclusive(stub_registry, tmp_path):
    stub_registry["stub-a"] = dataclasses.replace(stub_registry["stub-a"], analyze=_judged_analyze)
    out = tmp_path / "j"
    result = invoke("study", "run", "stub-a", "--preset", "smoke", "--seed", 7, "--out", out)
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "stub-a (smoke, seed 7): inconclusive" in text
    assert "j1 │ inconclusive" in text and ">= -100" in text and "(-999" in text
    assert "j1: inconclusive: only 2 of 2 seeds finite (need 5)" in text
    data = json.loads((out / "verdict.json").read_text())
    assert data["seed"] == 7 and data["status"] == "inconclusive"
    assert data["claims"][0]["control"]["status"] == "inconclusive"  # two seeds: not judged


def test_smoke_verdicts_are_labelled_plumbing_checks(stub_registry, tmp_path):
    out = tmp_path / "s"
    result = invoke("study", "run", "stub-a", "--preset", "smoke", "--out", out)
    assert result.exit_code == 0, result.output
    assert "smoke: plumbing check, not a scientific result" in result.stdout
    assert "smoke: plumbing check, not a scientific result" in (out / "report.html").read_text()
    again = invoke("report", out)
    assert "smoke: plumbing check, not a scientific result" in again.stdout


def test_compare_two_studies_lists_their_runs_config_differences(stub_registry, tmp_path):
    for seed in (0, 1):
        out = tmp_path / f"s{seed}"
        result = invoke("study", "run", "stub-a", "--preset", "smoke", "--seed", seed, "--out", out)
        assert result.exit_code == 0, result.output
    result = invoke("compare", tmp_path / "s0", tmp_path / "s1")
    assert result.exit_code == 0, result.output
    assert "config differences" in result.stdout
    assert re.search(r"r0_ok/seed\s*│\s*\d+\s*│\s*\d+", result.stdout), result.stdout


def test_ctrl_c_during_the_analysis_says_so_and_a_rerun_keeps_the_runs(stub_registry, tmp_path):
    study = stub_registry["stub-a"]

    def interrupted(runs, figures):
        raise KeyboardInterrupt

    stub_registry["stub-a"] = dataclasses.replace(study, analyze=interrupted)
    result = invoke("study", "run", "stub-a", "--preset", "smoke", "--out", tmp_path)
    assert result.exit_code == 130, result.output
    assert result.stderr.splitlines() == [
        "study stopped by SIGINT after its runs; run the same command again to analyze them "
        "(finished runs are kept)"
    ]
    stub_registry["stub-a"] = study
    result = invoke("study", "run", "stub-a", "--preset", "smoke", "--out", tmp_path)
    assert result.exit_code == 0, result.output
    assert result.stdout.count("(kept)") == 2, result.stdout
