"""Child process for test_resume_every_study: run a study's smoke preset into OUT and SIGKILL
itself at the N-th store write (``RunStore.log`` call), before that write: ``NAME OUT N``."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/: the shared helpers
from helpers import counting_store_writes  # noqa: E402

from dynascope import studies  # noqa: E402


def main() -> None:
    name, out, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(1)  # as the test session (tests/conftest.py)
    with counting_store_writes(kill_at=kill_at):
        studies.get(name).run(preset="smoke", out=out)


if __name__ == "__main__":
    main()
