"""Child process for the stop tests: ``dynascope study run stub ...`` with a stub registry.

    python _stop_child.py STEPS SLEEP_S [CLI OPTIONS...]

Registers one study, ``stub``, whose runs are ``r0_ok`` and ``r1_slow`` (custom runners without
signal handling or resume, tests/executors/_stub_study.py; each logs STEPS+1 rows, one
every SLEEP_S seconds, so a signal can reach it mid-way), then runs the real CLI.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import _stub_study  # noqa: E402

from dynascope import studies  # noqa: E402
from dynascope.cli import main  # noqa: E402

if __name__ == "__main__":  # the process executor's children import this file as __main__
    steps, sleep_s = int(sys.argv[1]), float(sys.argv[2])
    STUDY = _stub_study.make_study(("ok", "slow"), steps=steps, sleep_s=sleep_s)
    studies._registry = lambda: {"stub": STUDY}
    sys.argv = ["dynascope", "study", "run", "stub", *sys.argv[3:]]
    main()
