"""Child process for test_resume_every_study: run a study's smoke preset, counting store writes
(``count OUT FILE``) or killing itself with SIGKILL at the N-th write (``kill OUT N``)."""

import os
import signal
import sys

import torch

import dynascope.store as store_module
from dynascope import studies


def main() -> None:
    name, mode, out, arg = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    torch.set_num_threads(1)  # as the test session (tests/conftest.py)
    calls = {"n": 0}
    log = store_module.RunStore.log

    def counting_log(self, step, values):
        calls["n"] += 1
        if mode == "kill" and calls["n"] == int(arg):
            os.kill(os.getpid(), signal.SIGKILL)
        return log(self, step, values)

    store_module.RunStore.log = counting_log
    studies.get(name).run(preset="smoke", out=out)
    if mode == "count":
        with open(arg, "w") as f:
            f.write(str(calls["n"]))


if __name__ == "__main__":
    main()
