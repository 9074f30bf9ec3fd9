"""Start-up time of the ``dynascope`` command against ``python -c "import torch"``.

Run by hand (not part of the test suite)::

    python benchmarks/cli_startup.py [--repeats R]

Each command is a fresh ``python`` process (the same interpreter as this script), run ``R``
times, interleaved (torch, --help, study list, import dynascope, torch, ...) so slow drifts of a
shared machine hit every command alike; the median wall time of each is printed, with its ratio
to ``import torch``. Goal (issue 21): ``--help`` and ``study list`` in under half the time of
``import torch``. Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "python -c 'import torch'": ["-c", "import torch"],
    "dynascope --help": ["-m", "dynascope", "--help"],
    "dynascope study list": ["-m", "dynascope", "study", "list"],
    "python -c 'import dynascope'": ["-c", "import dynascope"],
    "python -c 'pass' (interpreter)": ["-c", "pass"],
}


def _seconds(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    repeats = parser.parse_args().repeats
    for args in COMMANDS.values():  # warm the file cache once
        _seconds(args)
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(repeats):
        for name, args in COMMANDS.items():
            times[name].append(_seconds(args))
    torch_s = statistics.median(times["python -c 'import torch'"])
    print(f"median of {repeats} runs each ({sys.executable})")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:34s} {median:6.3f} s  ({median / torch_s:4.2f} x import torch)")


if __name__ == "__main__":
    main()
