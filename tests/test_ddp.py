"""Data-parallel training under torchrun: 2 CPU processes (gloo), one writer.

The run must hold exactly the rows a single-process run of the same config holds (same
``(step, key)`` pairs, one ``running`` and one ``finished`` status), probes must have read the
model (the unwrapped one: their keys are those of a plain run), the checkpoint must carry both
ranks' data-generator states, and a single process must be able to load it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from dynascope.config import validate_config
from dynascope.store import RunStore, load_run
from dynascope.train import Trainer

CONFIG = {
    "name": "ddp",
    "model": {"n_layers": 2, "d_model": 12, "n_heads": 3, "d_mlp": 8},
    "task": {"name": "associative_recall", "n_keys": 6, "n_values": 5, "n_pairs": 3},
    "train": {
        "steps": 12,
        "batch_size": 4,
        "log_every": 3,
        "eval_every": 6,
        "eval_batches": 1,
        "checkpoint_every": 6,
    },
    "monitor": {"probes": ["qk_spectrum", "parameter_norms"], "schedule": "every", "every": 4},
}


def _pairs(run) -> list[tuple[int, str]]:
    return sorted(zip(run.scalars["step"].tolist(), run.scalars["key"].tolist()))


@pytest.mark.slow
def test_two_process_ddp_writes_one_copy_of_each_row(tmp_path):
    config_file = tmp_path / "ddp.json"
    config_file.write_text(json.dumps(CONFIG))
    out = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    command = ["-m", "dynascope.cli", "run", str(config_file), "--out", str(out), "--no-progress"]
    result = subprocess.run(launch + command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]

    Trainer(validate_config(CONFIG), tmp_path / "single").run()
    ddp, single = load_run(out), load_run(tmp_path / "single")
    assert not ddp.scalars.duplicated(["step", "key"]).any()
    assert _pairs(ddp) == _pairs(single)
    assert any(key.startswith("qk.") for key in ddp.scalars["key"])
    statuses = ddp.events[ddp.events["kind"] == "status"]["detail"].tolist()
    assert statuses == ["running", "finished"]

    with RunStore(out) as store:
        step, path = store.checkpoints()[-1]
        state = store.load_checkpoint(path)
    assert step == 12 and len(state["ranks"]) == 2
    rank0, rank1 = (r["generator"] for r in state["ranks"])
    assert not torch.equal(rank0, rank1)  # each rank drew its own batches
    assert torch.equal(state["generator"], rank0)  # the single-process view is rank 0's
    assert not any(k.startswith("module.") for k in state["model"])  # the unwrapped model

    resumed = Trainer(validate_config(CONFIG), out).run(resume=True)  # one process, same files
    assert resumed.status == "finished" and resumed.step == 12
