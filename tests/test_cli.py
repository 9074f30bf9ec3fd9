"""The ``dynascope`` command: exit codes, one-line errors, nothing written on bad input.

Exit codes (``dynascope/cli/``): 0 success, 2 bad input (one line on stderr starting
``error:``, nothing written), 3 a run diverged (its store is kept).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from helpers import TINY, assert_one_line_error, invoke

from dynascope.store import load_run

# Small, pairwise-distinct sizes: 6 keys, 5 values, 3 pairs; d_model 12 over 3 heads (d_head 4).


@pytest.fixture
def tiny_config(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path


@pytest.fixture
def finished_run(tiny_config: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    result = invoke("run", tiny_config, "--out", out, "--no-progress")
    assert result.exit_code == 0, result.output
    return out


def test_run_show_report_and_refuse_rerun(finished_run: Path, tiny_config: Path):
    assert (finished_run / "metrics.sqlite").is_file()
    assert (finished_run / "config.yaml").is_file()

    shown = invoke("show", finished_run)
    assert shown.exit_code == 0, shown.output
    assert re.search(r"^\S+ val\.loss\s+\S+\s+6\s", shown.stdout, re.MULTILINE), shown.stdout

    reported = invoke("report", finished_run)
    assert reported.exit_code == 0, reported.output
    assert (finished_run / "report.html").is_file()
    assert (finished_run / "figures" / "loss.png").is_file()

    again = invoke("run", tiny_config, "--out", finished_run, "--no-progress")
    assert_one_line_error(again, r"^error: --out: '.*run' already holds a run \(continue it with")


def test_resume_finished_run_continues_from_last_checkpoint(finished_run: Path):
    result = invoke("resume", finished_run, "--no-progress")
    assert result.exit_code == 0, result.output
    assert re.search(r"finished 6 steps in ", result.stdout)
    assert "had already finished at step 6: nothing left to train" in result.stdout
    run = load_run(finished_run)
    assert run.status == "finished"
    resumed = run.events[run.events["kind"] == "resumed"]
    assert resumed["detail"].tolist() == ["from checkpoint step 6"]


def test_resume_after_lost_last_checkpoint_reproduces_the_run(finished_run: Path):
    """A crash after step 4's checkpoint (the history's; checkpoint_every is 3): resuming from
    it gives the same final metrics."""
    before = load_run(finished_run).scalars
    (finished_run / "checkpoints" / "step_6.pt").unlink()
    result = invoke("resume", finished_run, "--no-progress")
    assert result.exit_code == 0, result.output
    assert "already finished" not in result.stdout  # steps 5-6 were trained again
    run = load_run(finished_run)
    assert run.status == "finished"
    assert run.events[run.events["kind"] == "resumed"]["detail"].tolist() == [
        "from checkpoint step 4"
    ]
    # Same rows, same values: resume on CPU is exact (train.py docstring).
    pd.testing.assert_frame_equal(run.scalars, before)


def test_resume_non_run_directory(tmp_path: Path):
    result = invoke("resume", tmp_path)
    assert_one_line_error(
        result, r"^error: RUN_DIR: '.*' is not a run directory \(no config\.yaml\)"
    )


BAD_RUN = [
    ("unknown key", ["--set", "model.d_modle=3"], r"model\.d_modle: unknown field \(allowed: "),
    ("wrong type", ["--set", "train.steps=many"], r"train\.steps: .*integer.*\(got 'many'\)"),
    (
        "heads do not divide",
        ["--set", "model.n_heads=5"],
        r"n_heads must divide d_model \(got d_model=12, n_heads=5\)",
    ),
    (
        "set without =",
        ["--set", "model.n_heads"],
        r"--set expects KEY=VALUE .*\(got 'model\.n_heads'\)",
    ),
    (
        "unknown probe",
        ["--set", "monitor.probes=[qk_spectrum, entropy]"],
        r"monitor\.probes: unknown probe 'entropy' \(allowed: .*qk_spectrum",
    ),
    (
        "char_lm path missing",
        ["--set", "task={name: char_lm, path: /no/such/corpus}"],
        r"task\.path: no such file or directory: '/no/such/corpus'",
    ),
    (
        "negative lr",
        ["--set", "optimizer.lr=-0.1"],
        r"optimizer\.lr: .*greater than 0 \(got -0\.1\)",
    ),
]


@pytest.mark.parametrize(("args", "pattern"), [b[1:] for b in BAD_RUN], ids=[b[0] for b in BAD_RUN])
def test_bad_run_input_exits_2_and_writes_nothing(tiny_config, tmp_path, args, pattern):
    out = tmp_path / "out"
    result = invoke("run", tiny_config, "--out", out, "--no-progress", *args)
    assert_one_line_error(result, pattern)
    assert not out.exists()


def test_missing_config_file(tmp_path: Path):
    out = tmp_path / "out"
    result = invoke("run", tmp_path / "missing.yaml", "--out", out)
    assert_one_line_error(result, r"^error: config file: no such file: '.*missing\.yaml'$")
    assert not out.exists()


def test_invalid_yaml(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {d_model: 12\ntrain: [\n")
    out = tmp_path / "out"
    result = invoke("run", bad, "--out", out)
    assert_one_line_error(result, r"^error: config file '.*bad\.yaml': invalid YAML at line \d+$")
    assert not out.exists()


def test_divergence_exits_3_and_keeps_store(tiny_config: Path, tmp_path: Path):
    out = tmp_path / "out"
    result = invoke(
        "run", tiny_config, "--out", out, "--no-progress",
        "--set", "optimizer.lr=1e30", "--set", "optimizer.name=sgd", "--set", "monitor.probes=[]",
    )  # fmt: skip
    assert result.exit_code == 3, result.output
    assert re.search(r"run diverged at step \d+; store kept in ", result.stderr)
    assert (out / "metrics.sqlite").is_file()


def test_divergence_with_default_probes_exits_3(tiny_config: Path, tmp_path: Path):
    out = tmp_path / "out"
    result = invoke(
        "run", tiny_config, "--out", out, "--no-progress",
        "--set", "optimizer.lr=1e30", "--set", "optimizer.name=sgd",
    )  # fmt: skip
    assert result.exit_code == 3, result.output
    assert (out / "metrics.sqlite").is_file()


def test_config_validate(tiny_config: Path, tmp_path: Path):
    ok = invoke("config", "validate", tiny_config)
    assert ok.exit_code == 0, ok.output
    assert ok.stdout.rstrip().endswith("config is valid")
    assert "d_model: 12" in ok.stdout  # printed resolved, defaults filled in
    assert "lr: 0.001" in ok.stdout

    bad = invoke("config", "validate", tiny_config, "--set", "model.n_heads=5")
    assert_one_line_error(bad, r"n_heads must divide d_model \(got d_model=12, n_heads=5\)")


def test_study_list():
    from dynascope import studies
    from dynascope.presets import reproduces_clause

    result = invoke("study", "list")
    assert result.exit_code == 0, result.output
    assert re.search(r"study\s.*presets\s.*reproduces\s.*cost", result.stdout), result.stdout
    for name in studies.names():  # each study's own presets, and its reproducing preset
        study = studies.get(name)
        row = next(line for line in result.stdout.splitlines() if f" {name} " in line)
        assert "/".join(study.presets) in row, row
        clause = reproduces_clause(study.protocol.reproduces)
        assert row.split("│")[3].strip() in clause, (row, clause)  # the clause may wrap
    assert study.claim not in result.stdout  # claims only with --long
    long = invoke("study", "list", "--long")
    assert long.exit_code == 0, long.output
    assert f"\n{study.name}: {study.claim}\n" in long.stdout


def test_study_list_reads_the_cost_of_the_reproducing_preset(tmp_path: Path, monkeypatch):
    from dynascope import presets, studies
    from dynascope.presets import reproduces_clause, reproducing_preset

    name, preset = next(  # the first study with a reproducing preset
        (n, p)
        for n in studies.names()
        if (p := reproducing_preset(reproduces_clause(studies.get(n).protocol.reproduces)))
    )
    costs = tmp_path / "preset_costs.json"
    entry = {preset: {"wall_s": 150.0, "cpu_s": 240.0, "measured": "test"}, "smoke": {"wall_s": 3}}
    costs.write_text(json.dumps({name: entry}))
    monkeypatch.setattr(presets, "COSTS_FILE", costs)

    def row_of(name: str) -> str:
        result = invoke("study", "list")
        assert result.exit_code == 0, result.output
        return next(line for line in result.stdout.splitlines() if f" {name} " in line)

    assert row_of(name).rstrip(" │").endswith("2.5 min")
    other = next(n for n in studies.names() if n != name)
    assert row_of(other).rstrip(" │").endswith("—")  # no entry: no cost

    monkeypatch.setattr(presets, "COSTS_FILE", tmp_path / "missing.json")
    assert row_of(name).rstrip(" │").endswith("—")
    costs.write_text("{not json")
    monkeypatch.setattr(presets, "COSTS_FILE", costs)
    assert_one_line_error(invoke("study", "list"), r"preset_costs\.json: not valid JSON")


def test_study_run_bad_input_exits_2_and_writes_nothing(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default --out is runs/NAME-PRESET under the cwd
    unknown = invoke("study", "run", "nope")
    assert_one_line_error(
        unknown, r"^error: unknown study 'nope' \(allowed: (\S+, )*weight-decay-low-rank\)$"
    )
    preset = invoke("study", "run", "weight-decay-low-rank", "--preset", "huge")
    assert_one_line_error(preset, r"preset must be one of smoke, fast, paper \(got 'huge'\)$")
    assert list(tmp_path.iterdir()) == []


def test_module_entry_point_help():
    proc = subprocess.run(
        [sys.executable, "-m", "dynascope.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    for command in ("run", "resume", "show", "report", "study", "config"):
        assert re.search(rf"\b{command}\b", proc.stdout), proc.stdout


def test_study_into_a_run_directory_is_refused(finished_run: Path):
    result = invoke(
        "study", "run", "weight-decay-low-rank", "--preset", "smoke", "--out", finished_run
    )
    assert result.exit_code == 2
    assert re.search(r"^error: --out: .* is a run directory", result.stderr)
    assert not (finished_run / "verdict.json").exists()


def test_cuda_without_cuda_is_bad_input(tiny_config: Path, tmp_path: Path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the run would be valid")
    out = tmp_path / "out"
    result = invoke("run", tiny_config, "--out", out, "--no-progress", "--set", "device=cuda")
    assert result.exit_code == 2
    assert re.search(r"^error: device: cuda is not available here", result.stderr)
    assert not out.exists()


# -- issue 21: start-up, --version, python -m, --set pairs, widths, show --follow, smoke label --
def _python(*args: str, **env: str) -> subprocess.CompletedProcess:
    import os

    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **env},
    )


def test_the_cli_module_and_the_package_do_not_import_torch():
    # --help and `study list` must start without torch (timed in benchmarks/cli_startup.py)
    code = (
        "import sys, dynascope, dynascope.cli\n"
        "from typer.testing import CliRunner\n"
        "r = CliRunner().invoke(dynascope.cli.app, ['study', 'list'])\n"
        "assert r.exit_code == 0, r.output\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    proc = _python("-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nope"], "unknown study 'nope' (allowed: autoencoder-greedy-rank"),
        (["slingshot", "--preset", "quick"], "preset must be one of smoke, fast, full, paper"),
    ],
)
def test_study_run_refuses_a_bad_name_or_preset_before_importing_torch(tmp_path, args, message):
    code = (
        "import sys, dynascope.cli\n"
        "from typer.testing import CliRunner\n"
        f"r = CliRunner().invoke(dynascope.cli.app, ['study', 'run', *{args!r}])\n"
        "print(r.exit_code, r.output.strip())\n"
        "print(sorted(m for m in sys.modules if m == 'torch'))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    status, imported = proc.stdout.strip().rsplit("\n", 1)
    assert status.startswith("2 ") and message in status, status
    assert imported == "[]"
    assert list(tmp_path.iterdir()) == []  # wrote nothing


def test_version_and_python_dash_m_dynascope():
    from dynascope import __version__

    assert invoke("--version").stdout == f"dynascope {__version__}\n"
    proc = _python("-m", "dynascope", "--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"dynascope {__version__}\n"
    helped = _python("-m", "dynascope", "--help")
    assert helped.returncode == 0 and re.search(r"\binspect\b", helped.stdout), helped.stdout


def test_study_list_fits_100_columns_when_piped():
    proc = _python("-m", "dynascope", "study", "list", COLUMNS="")
    assert proc.returncode == 0, proc.stderr
    widths = [len(line) for line in proc.stdout.splitlines()]
    assert max(widths) <= 100, max(widths)
    assert "weight-decay-low-rank" in proc.stdout


@pytest.mark.parametrize(
    "words",
    [
        ["--set", "train.steps=4", "model.n_heads=2"],
        ["--set", "train.steps=4", "--set", "model.n_heads=2"],
        ["--set=train.steps=4", "model.n_heads=2"],
    ],
)
def test_set_takes_several_pairs(tiny_config: Path, words: list[str]):
    result = invoke("config", "validate", tiny_config, *words)
    assert result.exit_code == 0, result.output
    assert "  steps: 4\n" in result.stdout and "  n_heads: 2\n" in result.stdout


def test_set_pairs_stop_at_the_next_option_or_a_plain_word():
    from dynascope.cli import split_set_pairs

    assert split_set_pairs(["run", "--set", "a=1", "b=2", "cfg.yaml", "--out", "x=y"]) == [
        "run", "--set", "a=1", "--set", "b=2", "cfg.yaml", "--out", "x=y"
    ]  # fmt: skip


def test_show_follow_stops_at_a_final_status_or_the_timeout(finished_run: Path, tmp_path: Path):
    from dynascope.store import RunStore

    followed = invoke("show", finished_run, "--follow", "--interval", "0.05")
    assert followed.exit_code == 0, followed.output
    assert "run: finished, step 6" in followed.stdout
    assert re.search(r"^\S+ val\.loss\s+\S+\s+6\s", followed.stdout, re.MULTILINE)

    live = tmp_path / "live"
    with RunStore(live) as store:  # a run still going: no status yet
        store.log(3, {"train.loss": 1.25})
        store.flush()
        result = invoke("show", live, "--follow", "--interval", "0.05", "--timeout", "0.3")
    assert result.exit_code == 0, result.output
    assert "live: running, step 3" in result.stdout
    assert "1.25" in result.stdout


def test_report_leaves_no_wal_files(finished_run: Path):
    assert invoke("report", finished_run).exit_code == 0
    assert invoke("show", finished_run).exit_code == 0
    leftovers = sorted(p.name for p in finished_run.iterdir() if p.name.endswith(("-wal", "-shm")))
    assert leftovers == []


def test_compare_shows_config_differences(tiny_config: Path, tmp_path: Path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert invoke("run", tiny_config, "--out", a, "--no-progress").exit_code == 0
    made = invoke("run", tiny_config, "--out", b, "--no-progress", "--set", "train.batch_size=5")
    assert made.exit_code == 0, made.output
    result = invoke("compare", a, b)
    assert result.exit_code == 0, result.output
    assert "config differences" in result.stdout
    row = next(line for line in result.stdout.splitlines() if "train.batch_size" in line)
    assert re.search(r"train\.batch_size\s*│\s*4\s*│\s*5", row), row
    same = invoke("compare", a, a)
    assert "configs: identical" in same.stdout


def test_progress_bar_shows_no_nan_before_the_first_loss():
    from rich.console import Console

    from dynascope.train._runtime import progress_bar

    progress, task_id = progress_bar(True, "tiny", 10, 0)
    try:
        console = Console(width=120, record=True, file=open("/dev/null", "w"))
        console.print(progress.make_tasks_table(progress.tasks))
        before = console.export_text()
        progress.update(task_id, completed=5, loss=f"{1.5:.4f}")
        console.print(progress.make_tasks_table(progress.tasks))
        after = console.export_text()
    finally:
        progress.stop()
        console.file.close()
    assert "loss -" in before and "nan" not in before
    assert "loss 1.5000" in after
