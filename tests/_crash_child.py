"""Child process for tests/test_crash_resume.py: a run that is killed or signalled on purpose.

Usage: ``python tests/_crash_child.py CONFIG.json RUN_DIR MODE STEP``

MODE:
  ``sigkill-step``    SIGKILL itself when the batch of train step STEP is drawn
                      (steps < STEP are done, their rows partly committed);
  ``sigkill-commit``  SIGKILL itself inside the first store transaction that holds a row of
                      step >= STEP, after the INSERTs and before the COMMIT;
  ``sigterm-step`` / ``sigint-step``  send itself SIGTERM / SIGINT at step STEP and exit
                      with the CLI's code (the run should checkpoint and stop).

The store commits every 50 rows here (not 2000), so rows after the last checkpoint are on
disk when the kill comes and resume must drop them.
"""

from __future__ import annotations

import os
import signal
import sys

import torch

from dynascope import store as store_module
from dynascope.tasks import AssociativeRecall

torch.set_num_threads(1)  # bitwise reproducible on CPU (see dynascope/train.py)


class _SmallBatchStore(store_module.RunStore):
    def __init__(self, path, **kwargs):
        super().__init__(path, **{**kwargs, "flush_every": 50})


class _KillBeforeCommit:
    """A connection proxy whose ``with`` block is SIGKILLed before it commits."""

    def __init__(self, db, from_step: int, owner) -> None:
        self._db, self._from_step, self._owner = db, from_step, owner

    def __getattr__(self, name):
        return getattr(self._db, name)

    def __enter__(self):
        self._armed = any(r[0] >= self._from_step for r in self._owner._scalars)
        return self._db.__enter__()

    def __exit__(self, *exc):
        if self._armed and exc[0] is None:
            assert self._db.in_transaction  # the INSERTs ran; nothing is committed yet
            os.kill(os.getpid(), signal.SIGKILL)
        return self._db.__exit__(*exc)


def main() -> None:
    config_path, run_dir, mode, step = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    store_module.RunStore = _SmallBatchStore
    import dynascope.train.engine as train_module

    train_module.RunStore = _SmallBatchStore

    if mode == "sigkill-commit":
        init = _SmallBatchStore.__init__

        def init_with_proxy(self, path, **kwargs):
            init(self, path, **kwargs)
            self._db = _KillBeforeCommit(self._db, step, self)

        _SmallBatchStore.__init__ = init_with_proxy
    else:
        sig = {
            "sigkill-step": signal.SIGKILL,
            "sigterm-step": signal.SIGTERM,
            "sigint-step": signal.SIGINT,
        }[mode]
        batch = AssociativeRecall.batch
        calls = {"train": 0}

        def batch_with_signal(self, split, *args, **kwargs):
            if split == "train":
                calls["train"] += 1
                if calls["train"] == step:
                    os.kill(os.getpid(), sig)
            return batch(self, split, *args, **kwargs)

        AssociativeRecall.batch = batch_with_signal

    from dynascope.cli import main as cli_main

    sys.argv = ["dynascope", "run", config_path, "--out", run_dir, "--no-progress"]
    cli_main()


if __name__ == "__main__":
    main()
