"""The README's monitoring snippet runs as written (with a tiny model and 20 steps)."""

from __future__ import annotations

import re
from pathlib import Path

import torch

import dynascope as ds

README = Path(__file__).resolve().parents[1] / "README.md"


def _block_after(heading: str) -> str:
    text = README.read_text()
    section = text[text.index(heading) :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_instruments_snippet_runs_and_commits_every_due_step(tmp_path, monkeypatch):
    code = _block_after("## Instruments in your own loop")
    code = code.replace("10_000", "20").replace("10_001", "21")
    step_code = "loss = model(x).square().mean(); opt.zero_grad(); loss.backward(); opt.step()"
    code = code.replace("...", step_code, 1)
    assert code.count("...") == 0
    model = ds.nn.Transformer(n_layers=2, d_model=12, n_heads=3, d_vocab=11, d_out=11, n_ctx=7)
    namespace = {
        "model": model,
        "x": ds.tasks.AssociativeRecall(n_keys=6, n_values=5, n_pairs=3).batch(
            "train", 4, torch.Generator().manual_seed(0)
        )["x"],
        "opt": torch.optim.SGD(model.parameters(), lr=0.01),
    }
    monkeypatch.chdir(tmp_path)
    exec(compile(code, str(README), "exec"), namespace)
    run = ds.load_run(tmp_path / "runs" / "mine")
    logged = sorted(run.scalar("qk.mean.effective_rank").index)
    assert logged == sorted(ds.LogSchedule(20, 30).steps)
    assert logged[0] == 0 and logged[-1] == 20
