"""``dynascope run`` and ``dynascope resume``: train one run into a run directory, continue it."""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path
from typing import Annotated

import typer

from ._common import (
    EXIT_DIVERGED,
    EXIT_SIGNAL,
    Overrides,
    err_console,
    fail,
    print_line,
    refuse_unusable_dir,
)
from ._log_to import LogTo, log_run_dir, log_targets


def run(
    config: Annotated[
        Path, typer.Argument(help="run config (YAML), or a run directory's config.yaml")
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", help="run directory to create [default: a new runs/NAME, runs/NAME-2, ...]"
        ),
    ] = None,
    set_: Overrides = None,
    device: Annotated[
        str | None, typer.Option(help="auto | cpu | cuda [default: the config's device]")
    ] = None,
    bf16: Annotated[bool, typer.Option(help="bf16 autocast for the forward pass (CUDA)")] = False,
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
    log_to: LogTo = None,
) -> None:
    """Train one run from a YAML config into a new run directory.

    The config is a registry run config, or any run directory's ``config.yaml`` (a study's run
    too: ``runner.json`` beside it names what trains it), which trains that run again.
    Under `torchrun --nproc_per_node N` the run trains data-parallel (only rank 0 writes).
    """
    from dynascope.config import ConfigError, RunConfig
    from dynascope.store import RunLockedError, create_run_dir
    from dynascope.studies.base import resolve_device
    from dynascope.train import load_run_config, run_members

    targets = log_targets(log_to)
    created = None
    try:
        device = resolve_device(device)
        build, cfg = load_run_config(config, list(set_ or []))
        name = cfg.name if isinstance(cfg, RunConfig) else config.resolve().parent.name
        if out is not None and os.environ.get("RANK", "0") == "0":  # torchrun: rank 0 creates
            _refuse_existing_run(out)
        else:
            refuse_unusable_dir(Path("runs") / name)
        if out is None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            fail("--out: give the run directory when training data-parallel (torchrun)")
        if out is None:  # a fresh directory, atomically; removed below if the run is refused
            created = out = create_run_dir("runs", name)
        result = run_members(
            build,
            cfg,
            out,
            device=device,
            progress=progress and sys.stderr.isatty(),
            bf16=bf16,
        )
    except (ConfigError, RunLockedError, sqlite3.DatabaseError, ValueError) as err:
        if created is not None and not any(created.iterdir()):
            created.rmdir()
        fail(str(err))
    if os.environ.get("RANK", "0") == "0":  # torchrun: rank 0 holds the store
        log_run_dir(targets, result.run_dir)
    _report_result(result)


def _refuse_existing_run(out: Path) -> None:
    from dynascope.store import METRICS_FILE

    refuse_unusable_dir(out)
    if (out / METRICS_FILE).exists():
        fail(
            f"--out: {str(out)!r} already holds a run (continue it with `dynascope resume "
            f"{out}` or choose another directory)"
        )


def resume(
    run_dir: Annotated[Path, typer.Argument(help="run directory to continue")],
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
) -> None:
    """Continue a run from its last checkpoint (rows logged after it are dropped)."""
    from dynascope.config import ConfigError
    from dynascope.store import (
        CONFIG_FILE,
        METRICS_FILE,
        RunLockedError,
        UnsafeCheckpointError,
        load_run,
    )
    from dynascope.train import resume_run

    if not (run_dir / CONFIG_FILE).is_file():
        fail(f"RUN_DIR: {str(run_dir)!r} is not a run directory (no {CONFIG_FILE})")
    if not (run_dir / METRICS_FILE).is_file() and any(run_dir.glob("checkpoints/step_*.pt")):
        fail(
            f"RUN_DIR: {str(run_dir)!r} has checkpoints but no {METRICS_FILE}: its metrics are "
            "lost, so resuming would keep only what follows the checkpoint; train it again"
        )
    try:
        before = load_run(run_dir)
        finished_at = int(before.events["step"].iloc[-1]) if before.status == "finished" else None
    except (OSError, sqlite3.DatabaseError, IndexError):
        finished_at = None  # no store yet: resuming starts it
    try:
        result = resume_run(run_dir, progress=progress and sys.stderr.isatty())
    except (ConfigError, RunLockedError, UnsafeCheckpointError, sqlite3.DatabaseError) as err:
        fail(str(err))
    if finished_at is not None and _resumed_from(run_dir) == finished_at:
        print_line(
            f"{run_dir} had already finished at step {finished_at}: nothing left to train "
            "(its last checkpoint was evaluated again)",
            soft_wrap=True,
        )
    _report_result(result)


def _resumed_from(run_dir: Path) -> int | None:
    """The checkpoint step the run's latest resume started from."""
    from dynascope.store import load_run

    events = load_run(run_dir).events
    resumed = events[events["kind"] == "resumed"]
    return int(resumed["step"].iloc[-1]) if len(resumed) else None


def _report_result(result) -> None:
    """The run's last line, and its exit code: 3 diverged, 130 / 143 interrupted."""
    if result.status == "diverged":
        err_console.print(
            f"run diverged at step {result.step}; store kept in {result.run_dir}", markup=False
        )
        raise typer.Exit(EXIT_DIVERGED)
    if result.status == "interrupted":
        err_console.print(
            f"run interrupted by {result.signal} at step {result.step}; checkpoint written; "
            f"continue with `dynascope resume {result.run_dir}`",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(EXIT_SIGNAL.get(result.signal, 130))
    summary = ", ".join(f"{k} {v:.4g}" for k, v in result.final.items())
    print_line(
        f"finished {result.step} steps in {result.run_dir}" + (f": {summary}" if summary else "")
    )
