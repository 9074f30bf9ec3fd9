"""Child process for the kill-and-rerun test: run a three-run study into OUT, print JSON.

    python _resume_child.py OUT

Runs ``a`` (short), ``b`` (long, checkpoints every 10 steps) and ``c`` (short) in order with
the in-process executor, on the registry build, so a rerun after a SIGKILL resumes ``b`` from its
last checkpoint. Prints ``{"runs": [...], "invoked": [...]}`` when the study completes.
"""

from __future__ import annotations

import json
import sys

from dynascope.config import validate_config
from dynascope.studies.base import Analysis, RunSpec, Study, Verdict
from dynascope.train import build_registry


def _config(name: str, steps: int):
    return validate_config(
        {
            "name": name,
            "model": {"n_layers": 1, "d_model": 12, "n_heads": 3, "d_mlp": 0},
            "task": {"name": "associative_recall", "n_keys": 6, "n_values": 5, "n_pairs": 3},
            "train": {
                "steps": steps,
                "batch_size": 4,
                "log_every": 5,
                "eval_every": 100,
                "eval_batches": 1,
                "checkpoint_every": 10,
            },
        }
    )


def analyze(runs, figures_dir):
    n = sum(r.status == "finished" for r in runs.values())
    return Analysis([Verdict("all runs finished", "count", float(n), 3.0, n == 3)])


STUDY = Study(
    name="kill-and-rerun",
    claim="three runs finish",
    source="tests",
    presets={"smoke": lambda: _config("x", 1)},
    build_runs=lambda preset, seed: [
        RunSpec("a", _config("a", 10), build_registry),
        RunSpec("b", _config("b", 200), build_registry),
        RunSpec("c", _config("c", 10), build_registry),
    ],
    analyze=analyze,
)

if __name__ == "__main__":
    import torch

    torch.set_num_threads(1)
    outcome = STUDY.run(preset="smoke", out=sys.argv[1])
    calls = {"started": "start", "resumed": "resume"}
    invoked = [f"{r['name']}:{calls[r['this_call']]}" for r in outcome.runs if r["this_call"] in calls]
    print(json.dumps({"runs": outcome.runs, "invoked": invoked, "passed": outcome.passed}))
