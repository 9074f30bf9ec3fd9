"""``dynascope study list`` and ``dynascope study run``: the registered studies, and running
one of them (or all, then the suite table)."""

from __future__ import annotations

import contextlib
import math
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from dynascope.presets import preset_costs, reproducing_preset

from ._common import (
    EXIT_SIGNAL,
    PRESET_HELP,
    console,
    err_console,
    fail,
    print_line,
    print_table,
    print_verdicts,
    refuse_unusable_dir,
    smoke_note,
)
from ._log_to import LogTo, StudyLogging, log_targets
from ._study_view import study_progress_bar
from .study_docs import print_suite


def study_list(
    long: Annotated[bool, typer.Option("--long", help="add each study's claim")] = False,
) -> None:
    """List the registered studies: their presets, which one reproduces the finding, its cost.

    The cost is the measured wall time of that preset (— where none is recorded).
    """
    from dynascope.catalog import read_catalog

    # a fresh process reads the catalog file (importing the studies means importing torch);
    # where the registry is loaded already (a notebook, a test), it reads the registry itself
    try:
        if "dynascope.studies" in sys.modules:
            rows = sys.modules["dynascope.studies"].catalog_entries()
        else:
            rows = read_catalog()
        costs = preset_costs()
    except ValueError as err:
        fail(str(err))
    table = Table()
    table.add_column("study", no_wrap=True)
    table.add_column("presets", no_wrap=True)
    # wraps (never below its header): the table fits the terminal (100 columns when piped)
    table.add_column("reproduces", min_width=len("reproduces"))
    table.add_column("cost", justify="right", no_wrap=True)
    for name, presets, _, reproduces in rows:
        cost = costs.get(name, {}).get(reproducing_preset(reproduces) or "", {}).get("wall_s")
        table.add_row(name, "/".join(presets), reproduces or "—", _duration(cost))
    print_table(table, max_width=100)
    if long:  # a paragraph each: prose reads badly in a narrow column
        for name, _, claim, _ in rows:
            print_line(f"\n{name}: {claim}", soft_wrap=True)


def study_catalog(
    write: Annotated[
        bool, typer.Option("--write", help="write the file (default: print what it would hold)")
    ] = False,
) -> None:
    """The study catalog (studies/catalog.json) from the study packages: each study's presets,
    claim and reproducing preset, which `study list` and `--help` read without importing torch.

    Run with --write after adding a study or changing a claim, a preset or a protocol's
    `reproduces`; a test fails while the file is stale.
    """
    from dynascope import studies
    from dynascope.catalog import CATALOG_FILE, catalog_text

    text = catalog_text(studies.catalog_entries())
    if not write:
        sys.stdout.write(text)
        return
    CATALOG_FILE.write_text(text, encoding="utf-8")
    print_line(f"wrote {CATALOG_FILE}")


def _duration(seconds: float | None) -> str:
    """``45 s``, ``2.5 min``, ``1.2 h``; ``—`` for no measurement."""
    if seconds is None:
        return "—"
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 3600 else f"{seconds / 3600:.1f} h"


def study_run(
    name: Annotated[
        str | None, typer.Argument(help="study name (see `dynascope study list`); or --all")
    ] = None,
    all_: Annotated[
        bool, typer.Option("--all", help="run every registered study, then print the table")
    ] = False,
    preset: Annotated[str, typer.Option(help=PRESET_HELP)] = "fast",
    out: Annotated[
        Path | None,
        typer.Option(help="study directory [default: runs/NAME-PRESET; with --all: runs/]"),
    ] = None,
    seed: Annotated[int, typer.Option(help="added to every run's seed (>= 0)")] = 0,
    executor: Annotated[str, typer.Option(help="local | process | ray")] = "local",
    workers: Annotated[int, typer.Option(help="runs at once, for --executor process")] = 1,
    address: Annotated[
        str | None,
        typer.Option(help="Ray cluster address, for --executor ray [default: start Ray here]"),
    ] = None,
    device: Annotated[
        str | None, typer.Option(help="auto | cpu | cuda [default: each run's own]")
    ] = None,
    fresh: Annotated[bool, typer.Option(help="delete the directory's runs, start over")] = False,
    progress: Annotated[bool, typer.Option(help="show progress bars")] = True,
    log_to: LogTo = None,
) -> None:
    """Run a study: its runs, the analysis, verdict.json, figures and report.html.

    Rerunning into the same directory resumes it: finished runs are kept, interrupted ones
    continue from their checkpoints, missing ones start (--fresh starts over).
    """
    from dynascope.catalog import check

    if all_ == (name is not None):
        given = "both were given" if all_ else "neither was given"
        fail(f"NAME: give a study name or --all ({given}; `dynascope study list` names them)")
    if name is not None and "dynascope.studies" not in sys.modules:
        try:  # a fresh process refuses a typo at once, before importing torch
            check(name, preset)
        except ValueError as err:
            fail(str(err))
    targets = log_targets(log_to)

    from dynascope import studies
    from dynascope.executors import make_executor
    from dynascope.studies.base import MAX_STUDY_SEED, resolve_device

    try:
        selected = studies.names() if all_ else [name]
        for study_name in selected:
            studies.get(study_name).preset(preset)  # each study's own presets
        resolve_device(device)
        runner = make_executor(executor, workers=workers, address=address)
    except ValueError as err:
        fail(str(err))
    if not 0 <= seed < MAX_STUDY_SEED:
        fail(f"--seed: must be in [0, 2**32) (got {seed})")
    if not all_:
        target = out or Path("runs") / f"{name}-{preset}"
        _run_one_study(name, preset, target, seed, runner, device, fresh, progress, targets)
        return
    suite_dir = out or Path("runs")
    refuse_unusable_dir(suite_dir)
    try:
        suite_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        fail(f"--out: {str(suite_dir)!r} cannot be created ({err.strerror or err})")
    failed = []
    session = runner if hasattr(runner, "__enter__") else contextlib.nullcontext()
    with session:  # one Ray session for the whole suite
        for study_name in selected:
            target = suite_dir / f"{study_name}-{preset}"
            try:
                _run_one_study(
                    study_name, preset, target, seed, runner, device, fresh, progress, targets
                )
            except typer.Exit as stop:
                if stop.exit_code in EXIT_SIGNAL.values():
                    raise
                failed.append(study_name)  # its error line is printed; the suite goes on
            except Exception as err:  # a broken study must not cost the others their runs
                err_console.print(
                    f"error: study {study_name} failed: {type(err).__name__}: {err}",
                    markup=False,
                    highlight=False,
                    soft_wrap=True,
                )
                failed.append(study_name)
    print_suite(suite_dir, selected, preset)
    if failed:
        fail(f"studies that could not run: {', '.join(failed)}", code=1)


def _run_one_study(name, preset, out, seed, executor, device, fresh, progress, log_to) -> None:
    from dynascope import studies
    from dynascope.store import (
        FIGURES_DIR,
        METRICS_FILE,
        REPORT_FILE,
        VERDICT_FILE,
        RunLockedError,
    )
    from dynascope.studies.base import AnalysisInterrupted, StudyInterrupted

    study = studies.get(name)
    refuse_unusable_dir(out)
    if (out / METRICS_FILE).exists():
        fail(f"--out: {str(out)!r} is a run directory; choose a study directory")

    # on a terminal, one bar for the study (with a bar per running run) instead of the runs' own
    overall_bar = progress and console.is_terminal
    bars = contextlib.ExitStack()

    logs = StudyLogging(log_to, study, preset, seed, out)  # --log-to (cli/_log_to.py)

    def on_start() -> None:  # only once the directory is checked: a refusal is the only output
        console.print(f"[bold]{name}[/] ({preset}, {executor.name}) -> {out}")
        logs.start()
        if overall_bar:
            bars.enter_context(study_progress_bar(out))

    def on_run(run_name: str, status: str, seconds: float, action: str) -> None:
        took = "" if math.isnan(seconds) else f" in {seconds:.1f} s"
        print_line(f"  run {run_name}: {status}{took} ({action})")
        logs.run(run_name)

    try:
        with bars:
            outcome = study.run(
                preset=preset,
                out=out,
                seed=seed,
                progress=progress and not overall_bar and sys.stderr.isatty(),
                on_run=on_run,
                on_start=on_start,
                executor=executor,
                device=device,
                fresh=fresh,
                run_reports=True,
            )
        logs.finish(outcome)
    except (ValueError, RunLockedError) as err:
        message = str(err)
        fail("--" + message if message.startswith("out: ") else message)  # the option's name
    except StudyInterrupted as err:
        _stopped(f"study stopped: {err}; run the same command again to resume it")
        raise typer.Exit(EXIT_SIGNAL.get(err.signal, 130)) from None
    except KeyboardInterrupt as err:  # between runs, or while analysing or writing reports
        after = isinstance(err, AnalysisInterrupted)
        where, again = (" after its runs", "analyze them") if after else ("", "go on")
        _stopped(
            f"study stopped by SIGINT{where}; run the same command again to {again} "
            "(finished runs are kept)"
        )
        raise typer.Exit(EXIT_SIGNAL["SIGINT"]) from None
    finally:
        logs.close()  # a study that did not finish: its MLflow parent run ends as KILLED
    print_verdicts(outcome)
    smoke_note(outcome.preset)
    print_line(f"wrote {out / VERDICT_FILE}, {out / REPORT_FILE}, {out / FIGURES_DIR}/")


def _stopped(message: str) -> None:
    err_console.print(message, markup=False, highlight=False, soft_wrap=True)
