"""Every script in examples/ runs as a user would run it, with tiny arguments, and prints (or
writes) what its docstring promises.

Each script runs as ``__main__`` in its own process, with its folder first on ``sys.path``
and warnings ignored (as ``PYTHONWARNINGS=ignore python examples/NAME.py ARGS``); the process
is forked from the test's, so it does not import torch and transformers again.
"""

from __future__ import annotations

import csv
import math
import re
import runpy
import sys
import warnings
from pathlib import Path

import pytest
from helpers import run_forked

ROOT = Path(__file__).resolve().parents[1]


def _as_script(path: Path, *args: str) -> None:
    """The forked child: ``python PATH ARGS`` with warnings ignored."""
    warnings.resetwarnings()
    warnings.simplefilter("ignore")
    sys.argv = [str(path), *args]
    sys.path.insert(0, str(path.parent))
    runpy.run_path(str(path), run_name="__main__")


def _run(name: str, out: Path, *args: str) -> str:
    script = ROOT / "examples" / name
    result = run_forked(_as_script, script, "--out", str(out), *args, cwd=out.parent, timeout_s=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_own_loop(tmp_path):
    stdout = _run("own_loop.py", tmp_path / "run", "--steps", "10")
    loss = float(re.search(r"final loss ([0-9.]+)", stdout).group(1))
    assert 0 < loss < 10
    erank = float(re.search(r"^0 +([0-9.]+)$", stdout, re.MULTILINE).group(1))
    assert 0 < erank <= 8  # effective rank of a d_head = 8 product, at step 0
    assert (tmp_path / "run" / "metrics.sqlite").exists()


def test_gpt2_analysis(tmp_path):
    stdout = _run("gpt2_analysis.py", tmp_path / "out", "--tokens", "8")
    rows = _csv(tmp_path / "out" / "inspect.csv")
    assert len(rows) == 2 * 4  # n_layer x n_head
    assert all(0 < float(r["qk_effective_rank"]) <= 8 for r in rows)  # d_head = 8
    assert "8 rows written" in stdout


def test_hf_trainer(tmp_path):
    pytest.importorskip("transformers")
    stdout = _run("hf_trainer.py", tmp_path / "out", "--steps", "5")
    assert "status: finished" in stdout
    match = re.search(r"step 0 ([0-9.]+), step 5 ([0-9.]+)", stdout)
    assert match and 0 < float(match.group(1)) <= 4  # d_head = 4


def test_coord_check(tmp_path):
    stdout = _run("coord_check.py", tmp_path / "out", "--widths", "32", "128", "--seeds", "1")
    ratios = dict(
        re.findall(r"(standard|mup): logits mean \|activation\| grows ([0-9.]+)x", stdout)
    )
    assert float(ratios["standard"]) > float(ratios["mup"])  # SP's logits grow faster with width
    assert (tmp_path / "out" / "coord_check_mup.png").exists()


def test_entk(tmp_path):
    stdout = _run("entk.py", tmp_path / "out", "--n", "4")
    rows = _csv(tmp_path / "out" / "entk.csv")
    assert [(r["model"], r["strategy"]) for r in rows] == [
        (m, s) for m in ("mlp", "transformer") for s in ("structured", "jacobian", "jvp_vjp")
    ]
    for r in rows:  # every strategy computes the same kernel, up to float32 rounding
        assert float(r["max_diff"]) <= 1e-5 * float(r["kernel_max"]), r
        assert int(r["est_bytes"]) > 0
    assert "kernel (4, 4, 3, 3)" in stdout


def test_one_step_axis(tmp_path):
    args = ["--steps", "6", "--points", "3", "--held", "32", "--llc-draws", "4", "--calibrate"]
    stdout = _run("one_step_axis.py", tmp_path / "out", *args)
    rows = _csv(tmp_path / "out" / "steps.csv")
    assert [int(r["step"]) for r in rows] == [0, 1, 2, 6]  # step 0 + LogSchedule(6, 3)
    heads = [f"L{layer}.H{head}.dqk.stable_rank" for layer in (0, 1) for head in (0, 1)]
    for r in rows:
        assert math.isfinite(float(r["llc.mean"])), r
        assert float(r["sharpness.two_over_lr"]) == pytest.approx(2 / 1e-3)  # 2/η, η = 1e-3
        for key in heads:  # ΔW_QK = 0 at step 0 (srank(0) := 0); rank <= 2 d_head = 32 after
            assert (float(r[key]) == 0) if r["step"] == "0" else (0 < float(r[key]) <= 32), r
    # Adam's edge (2 + 2β₁)/((1 − β₁)η) = 38/η once Adam has a second moment (not at step 0)
    assert rows[0]["sharpness.preconditioned_threshold"] == ""
    edges = [float(r["sharpness.preconditioned_threshold"]) for r in rows[1:]]
    assert edges == pytest.approx([38e3] * len(edges))
    assert (tmp_path / "out" / "one_step_axis.png").exists()
    assert "figure written to" in stdout
    assert "llc_calibrate at step 6: " in stdout  # its choice, or why nothing passed
