"""The ``dynascope`` command.

Exit codes: 0 success (a study whose claim did not hold still exits 0: a failed claim is a
scientific result); 1 unexpected error; 2 bad input (one line on stderr, nothing written), also
a run directory in use by another process; 3 a run diverged (its store is kept); 130 / 143 a
run stopped by SIGINT / SIGTERM after checkpointing (continue it with ``dynascope resume``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import sys
import warnings
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

console = Console()
err_console = Console(stderr=True)

EXIT_BAD_INPUT = 2
EXIT_DIVERGED = 3
EXIT_SIGNAL = {"SIGINT": 130, "SIGTERM": 143}  # 128 + signal number, as shells report it

# Click's base exception, found through a public subclass: typer vendors click from 0.2x on.
_ClickException = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


class _OneLineErrors(TyperGroup):
    """Usage errors (missing option, bad value, unknown command) as one line, exit code 2.

    Click prints a usage block and a boxed message over several lines; the rest of the CLI
    promises ``error: ...`` on one line, so its usage errors are folded the same way.
    """

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        warnings.showwarning = _warning_line
        args = _split_set_pairs(sys.argv[1:] if args is None else list(args))
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _ClickException as err:
            message = " ".join(err.format_message().split())
            err_console.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
            sys.exit(EXIT_BAD_INPUT if err.exit_code == 2 else err.exit_code)
        except typer.Abort:
            err_console.print("aborted", markup=False, highlight=False)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


def _split_set_pairs(args: list[str]) -> list[str]:
    """``--set a=1 b=2`` -> ``--set a=1 --set b=2``: every ``KEY=VALUE`` word after ``--set``
    (up to the next option or a word without ``=``) is one more override."""
    out: list[str] = []
    in_set = False
    for arg in args:
        if arg == "--":
            in_set = False
        elif arg == "--set" or arg.startswith("--set="):
            in_set = True
        elif in_set and out[-1] != "--set" and "=" in arg and not arg.startswith("-"):
            out.append("--set")
        elif out and out[-1] != "--set":
            in_set = False
        out.append(arg)
    return out


def _warning_line(message, category, filename, lineno, file=None, line=None) -> None:
    err_console.print(f"warning: {message}", markup=False, highlight=False, soft_wrap=True)


app = typer.Typer(
    cls=_OneLineErrors,
    name="dynascope",
    help="Instruments and re-runnable studies for the science of training dynamics.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
study_app = typer.Typer(help="List and run studies (published findings).", no_args_is_help=True)
config_app = typer.Typer(help="Check run configs.", no_args_is_help=True)
app.add_typer(study_app, name="study")
app.add_typer(config_app, name="config")


def _print_version(value: bool) -> None:
    if value:
        from dynascope import __version__

        console.print(f"dynascope {__version__}", markup=False, highlight=False)
        raise typer.Exit()


@app.callback()
def _main_options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", help="print the version and exit", callback=_print_version, is_eager=True
        ),
    ] = False,
) -> None:
    """Instruments and re-runnable studies for the science of training dynamics."""


SMOKE_NOTE = "smoke: plumbing check, not a scientific result"
"""Printed beside every smoke-preset verdict: smoke runs are seconds long, their numbers mean
nothing about the claim."""


def _smoke_note(preset: str) -> None:
    if preset == "smoke":
        console.print(SMOKE_NOTE, style="yellow", markup=False, highlight=False)


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    err_console.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _db_errors() -> tuple[type[BaseException], ...]:
    from pandas.errors import DatabaseError

    return (sqlite3.DatabaseError, DatabaseError)


def _refuse_unusable_dir(out: Path) -> None:
    """Fail (exit 2) if ``out`` exists as a file or cannot be created under its parents."""
    if str(out) in ("", "."):
        _fail(f"--out: give a directory for the run (got {str(out)!r})")
    if out.exists() and not out.is_dir():
        _fail(f"--out: {str(out)!r} exists and is not a directory")
    for parent in out.parents:
        if parent.exists() and not parent.is_dir():
            _fail(f"--out: {str(out)!r} cannot be created: {str(parent)!r} is not a directory")


def _refuse_existing_run(out: Path) -> None:
    _refuse_unusable_dir(out)
    if (out / "metrics.sqlite").exists():
        _fail(
            f"--out: {str(out)!r} already holds a run (continue it with `dynascope resume "
            f"{out}` or choose another directory)"
        )
    if out.exists() and not out.is_dir():
        _fail(f"--out: {str(out)!r} exists and is not a directory")


@app.command()
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
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="overrides: --set a.b=1 c=2 (or repeat --set)"),
    ] = None,
    device: Annotated[
        str | None, typer.Option(help="auto | cpu | cuda [default: the config's device]")
    ] = None,
    bf16: Annotated[bool, typer.Option(help="bf16 autocast for the forward pass (CUDA)")] = False,
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
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

    created = None
    try:
        device = resolve_device(device)
        build, cfg = load_run_config(config, list(set_ or []))
        name = cfg.name if isinstance(cfg, RunConfig) else config.resolve().parent.name
        if out is not None and os.environ.get("RANK", "0") == "0":  # torchrun: rank 0 creates
            _refuse_existing_run(out)
        else:
            _refuse_unusable_dir(Path("runs") / name)
        if out is None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            _fail("--out: give the run directory when training data-parallel (torchrun)")
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
        _fail(str(err))
    _report_result(result)


@app.command()
def resume(
    run_dir: Annotated[Path, typer.Argument(help="run directory to continue")],
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
) -> None:
    """Continue a run from its last checkpoint (rows logged after it are dropped)."""
    from dynascope.config import ConfigError
    from dynascope.train import resume_run

    if not (run_dir / "config.yaml").is_file():
        _fail(f"RUN_DIR: {str(run_dir)!r} is not a run directory (no config.yaml)")
    from dynascope.store import RunLockedError, UnsafeCheckpointError, load_run

    try:
        before = load_run(run_dir)
        finished_at = int(before.events["step"].iloc[-1]) if before.status == "finished" else None
    except (OSError, sqlite3.DatabaseError, IndexError):
        finished_at = None  # no store yet: resuming starts it
    try:
        result = resume_run(run_dir, progress=progress and sys.stderr.isatty())
    except (ConfigError, RunLockedError, UnsafeCheckpointError, sqlite3.DatabaseError) as err:
        _fail(str(err))
    if finished_at is not None and _resumed_from(run_dir) == finished_at:
        console.print(
            f"{run_dir} had already finished at step {finished_at}: nothing left to train "
            "(its last checkpoint was evaluated again)",
            markup=False,
            highlight=False,
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
    console.print(
        f"finished {result.step} steps in {result.run_dir}" + (f": {summary}" if summary else ""),
        markup=False,
        highlight=False,
    )


_FINAL_STATUSES = ("finished", "diverged", "interrupted", "failed")


@app.command()
def show(
    run_dir: Annotated[Path, typer.Argument(help="run directory")],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="keep the table live until the run ends")
    ] = False,
    interval: Annotated[float, typer.Option(help="seconds between reads, with --follow")] = 2.0,
    timeout: Annotated[
        float | None, typer.Option(help="stop following after this many seconds")
    ] = None,
) -> None:
    """Summary table of a run: status and the last value of every scalar.

    With --follow, the table is re-read every --interval seconds until the run's status is
    final (finished, diverged, interrupted), --timeout passes, or Ctrl-C.
    """
    import time

    from rich.live import Live

    if interval <= 0:
        _fail(f"--interval: must be > 0 (got {interval})")
    r = _read_run(run_dir)
    if not follow:
        console.print(_run_table(r))
        return
    deadline = None if timeout is None else time.monotonic() + timeout
    with contextlib.suppress(KeyboardInterrupt), Live(_run_table(r), console=console) as live:
        while r.status not in _FINAL_STATUSES:
            if deadline is not None and time.monotonic() + interval > deadline:
                break
            time.sleep(interval)
            r = _read_run(run_dir)
            live.update(_run_table(r))


def _read_run(run_dir: Path):
    from dynascope.store import load_run

    try:
        return load_run(run_dir)
    except FileNotFoundError as err:
        _fail(f"RUN_DIR: {err}")
    except _db_errors() as err:
        _fail(f"RUN_DIR: {str(run_dir)!r}: metrics.sqlite is not readable ({err})")


def _run_table(r) -> Table:
    last_step = "" if r.scalars.empty else f", step {int(r.scalars['step'].max())}"
    table = Table(title=f"{r.name}: {r.status or 'running'}{last_step}")
    table.add_column("key")
    table.add_column("step", justify="right")
    table.add_column("value", justify="right")
    if not r.scalars.empty:
        last = r.scalars.groupby("key").tail(1).sort_values("key")
        for key, step, value in zip(last["key"], last["step"], last["value"]):
            if key.startswith("L") and ".H" in key:  # per-head rows: see `dynascope report`
                continue
            table.add_row(key, str(step), f"{value:.6g}")
    return table


@app.command()
def report(directory: Annotated[Path, typer.Argument(help="run or study directory")]) -> None:
    """Draw figures and write report.html for a run directory, or re-analyze a study directory."""
    from dynascope.report.run import report_run

    if (directory / "verdict.json").is_file():
        _report_study(directory)
        return
    if not (directory / "metrics.sqlite").is_file():
        _fail(f"DIR: {str(directory)!r} is neither a run directory nor a study directory")
    try:
        path = report_run(directory)
    except _db_errors() as err:
        _fail(f"DIR: {str(directory)!r}: metrics.sqlite is not readable ({err})")
    console.print(f"wrote {path}", markup=False, highlight=False)


def _report_study(directory: Path) -> None:
    from dynascope import studies

    info = json.loads((directory / "verdict.json").read_text())
    try:
        study = studies.get(info["study"])
    except ValueError as err:
        _fail(f"DIR: {err}")
    outcome = study.reanalyze(directory, run_reports=True)
    _print_verdicts(outcome)
    _smoke_note(outcome.preset)


@study_app.command("list")
def study_list() -> None:
    """List the registered studies."""
    from dynascope._study_catalog import CATALOG, live_catalog

    # a fresh process reads the generated catalog (importing the studies means importing torch);
    # where the registry is loaded already (a notebook, a test), it reads the registry itself
    rows = live_catalog() if "dynascope.studies" in sys.modules else CATALOG
    table = Table()
    table.add_column("study", no_wrap=True)
    table.add_column("presets", no_wrap=True)
    table.add_column("claim")  # wraps: the table fits the terminal (100 columns when piped)
    for name, presets, claim in rows:
        table.add_row(name, ", ".join(presets), claim)
    _print_table(table, max_width=100)


def _print_table(table: Table, max_width: int | None = None) -> None:
    """Print ``table``; when stdout is not a terminal (a pipe, a file) and ``COLUMNS`` is not
    set, as wide as its content needs rather than 80 columns (at most ``max_width`` when given:
    columns that may wrap then wrap), so no name is ever cut."""
    if console.is_terminal or "COLUMNS" in os.environ:
        console.print(table)
        return
    wide = console.options.update_width(10_000)
    width = max(console.width, console.measure(table, options=wide).maximum)
    if max_width is not None:
        width = min(width, max(max_width, console.measure(table, options=wide).minimum))
    Console(width=width).print(table)


@study_app.command("run")
def study_run(
    name: Annotated[
        str | None, typer.Argument(help="study name (see `dynascope study list`); or --all")
    ] = None,
    all_: Annotated[
        bool, typer.Option("--all", help="run every registered study, then print the table")
    ] = False,
    preset: Annotated[str, typer.Option(help="smoke | fast | paper")] = "fast",
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
) -> None:
    """Run a study: its runs, the analysis, verdict.json, figures and report.html.

    Rerunning into the same directory resumes it: finished runs are kept, interrupted ones
    continue from their checkpoints, missing ones start (--fresh starts over).
    """
    from dynascope._study_catalog import check

    if all_ == (name is not None):
        given = "both were given" if all_ else "neither was given"
        _fail(f"NAME: give a study name or --all ({given}; `dynascope study list` names them)")
    if name is not None and "dynascope.studies" not in sys.modules:
        try:  # a fresh process refuses a typo at once, before importing torch
            check(name, preset)
        except ValueError as err:
            _fail(str(err))

    from dynascope import studies
    from dynascope.executors import make_executor
    from dynascope.studies.base import MAX_STUDY_SEED, resolve_device

    try:
        selected = studies.names() if all_ else [name]
        for study_name in selected:
            studies.get(study_name).preset(preset)
        resolve_device(device)
        runner = make_executor(executor, workers=workers, address=address)
    except ValueError as err:
        _fail(str(err))
    if not 0 <= seed < MAX_STUDY_SEED:
        _fail(f"--seed: must be in [0, 2**32) (got {seed})")
    if not all_:
        target = out or Path("runs") / f"{name}-{preset}"
        _run_one_study(name, preset, target, seed, runner, device, fresh, progress)
        return
    suite_dir = out or Path("runs")
    _refuse_unusable_dir(suite_dir)
    try:
        suite_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        _fail(f"--out: {str(suite_dir)!r} cannot be created ({err.strerror or err})")
    failed = []
    session = runner if hasattr(runner, "__enter__") else contextlib.nullcontext()
    with session:  # one Ray session for the whole suite
        for study_name in selected:
            target = suite_dir / f"{study_name}-{preset}"
            try:
                _run_one_study(study_name, preset, target, seed, runner, device, fresh, progress)
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
    _print_suite(suite_dir, selected, preset)
    if failed:
        _fail(f"studies that could not run: {', '.join(failed)}", code=1)


def _run_one_study(name, preset, out, seed, executor, device, fresh, progress) -> None:
    from dynascope import studies
    from dynascope.store import RunLockedError
    from dynascope.studies.base import AnalysisInterrupted, StudyInterrupted

    study = studies.get(name)
    _refuse_unusable_dir(out)
    if (out / "metrics.sqlite").exists():
        _fail(f"--out: {str(out)!r} is a run directory; choose a study directory")

    def on_start() -> None:  # only once the directory is checked: a refusal is the only output
        console.print(f"[bold]{name}[/] ({preset}, {executor.name}) -> {out}")

    def on_run(run_name: str, status: str, seconds: float, action: str) -> None:
        took = "" if math.isnan(seconds) else f" in {seconds:.1f} s"
        console.print(f"  run {run_name}: {status}{took} ({action})", markup=False, highlight=False)

    try:
        outcome = study.run(
            preset=preset,
            out=out,
            seed=seed,
            progress=progress and sys.stderr.isatty(),
            on_run=on_run,
            on_start=on_start,
            executor=executor,
            device=device,
            fresh=fresh,
            run_reports=True,
        )
    except (ValueError, RunLockedError) as err:
        message = str(err)
        _fail("--" + message if message.startswith("out: ") else message)  # the option's name
    except StudyInterrupted as err:
        err_console.print(
            f"study stopped: {err}; run the same command again to resume it",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(EXIT_SIGNAL.get(err.signal, 130)) from None
    except KeyboardInterrupt as err:  # between runs, or while analysing or writing reports
        after = isinstance(err, AnalysisInterrupted)
        where, again = (" after its runs", "analyze them") if after else ("", "go on")
        err_console.print(
            f"study stopped by SIGINT{where}; run the same command again to {again} "
            "(finished runs are kept)",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(EXIT_SIGNAL["SIGINT"]) from None
    _print_verdicts(outcome)
    _smoke_note(outcome.preset)
    console.print(
        f"wrote {out / 'verdict.json'}, {out / 'report.html'}, {out / 'figures'}/",
        markup=False,
        highlight=False,
    )


_STATUS_STYLE = {"held": "[green]held[/]", "not held": "[red]not held[/]"}


def _status_markup(status: str | None) -> str:
    if status is None:
        return "-"
    return _STATUS_STYLE.get(status, f"[yellow]{status}[/]")


_SUITE_WRAPPING = ("claim", "interval", "control")  # the suite table's free-text columns


def _print_suite(suite_dir: Path, names: list[str], preset: str) -> None:
    from dynascope.report.suite import suite_rows

    rows = suite_rows(suite_dir, names, preset)
    table = Table(title=f"suite ({preset}): {suite_dir}")
    columns = ("study", "claim", "status", "measured", "threshold", "interval", "control",
               "seconds")  # fmt: skip
    for column in columns:  # names and numbers never fold, even in a narrow terminal
        table.add_column(column, overflow="fold", no_wrap=column not in _SUITE_WRAPPING)
    for r in rows:
        measured, seconds = (
            "" if math.isnan(c) else f"{c:.4g}" for c in (r["measured"], r["seconds"])
        )
        threshold = "" if math.isnan(r["threshold"]) else f"{r['direction']} {r['threshold']:.4g}"
        table.add_row(
            r["study"], r["claim"], _status_markup(r["status"]), measured, threshold,
            r["interval"], r["control"], seconds,
        )  # fmt: skip
    _print_table(table)


@study_app.command("table")
def study_table(
    suite_dir: Annotated[
        Path, typer.Option("--dir", help="where `study run --all` wrote the studies")
    ] = Path("runs"),
    preset: Annotated[str, typer.Option(help="smoke | fast | paper")] = "fast",
    output: Annotated[
        Path | None,
        typer.Option(
            help="Markdown file to write [default: docs/studies.md, relative to the current "
            "directory]"
        ),
    ] = None,
) -> None:
    """Print the suite table from stored verdicts and write it as Markdown.

    The Markdown goes to --output (default docs/studies.md under the current directory).
    """
    import datetime

    from dynascope import studies
    from dynascope.report.suite import markdown_table, suite_rows

    if preset not in ("smoke", "fast", "paper"):
        _fail(f"--preset: must be one of smoke, fast, paper (got {preset!r})")
    if not suite_dir.is_dir():
        _fail(f"--dir: {str(suite_dir)!r} is not a directory")
    names = studies.names()
    if not any((suite_dir / f"{n}-{preset}" / "verdict.json").is_file() for n in names):
        kind = ""
        if (suite_dir / "metrics.sqlite").exists():
            kind = " (it is a run directory)"
        elif (suite_dir / "verdict.json").exists():
            kind = f" (it is a study directory; give its parent, e.g. {str(suite_dir.parent)!r})"
        _fail(
            f"--dir: {str(suite_dir)!r} holds no study verdicts for preset {preset}{kind}; "
            f"expected NAME-{preset}/verdict.json as written by "
            f"`dynascope study run --all --preset {preset} --out DIR`"
        )
    rows = suite_rows(suite_dir, names, preset)
    stamps = [
        (suite_dir / f"{n}-{preset}" / "verdict.json").stat().st_mtime
        for n in names
        if (suite_dir / f"{n}-{preset}" / "verdict.json").is_file()
    ]
    when = "no study run yet"
    if stamps:
        when = datetime.datetime.fromtimestamp(max(stamps), datetime.timezone.utc).strftime(
            "%Y-%m-%d"
        )
    output = output or Path("docs") / "studies.md"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(markdown_table(rows, preset=preset, when=when))
    _print_suite(suite_dir, names, preset)
    console.print(f"wrote {output}", markup=False, highlight=False)


@study_app.command("docs")
def study_docs(
    suite_dir: Annotated[
        Path | None,
        typer.Option(
            "--dir",
            help="where `study run --all` wrote the studies (their verdicts and figures go "
            "on the pages; without it the pages say that no verdict is stored)",
        ),
    ] = None,
    output: Annotated[Path, typer.Option(help="folder of the study pages")] = Path("docs/studies"),
    preset: Annotated[str, typer.Option(help="smoke | fast | paper")] = "fast",
) -> None:
    """Write one docs page per study, OUTPUT/NAME.md, generated from the study.

    Only the part between the generated:start and generated:end markers is rewritten.
    """
    from dynascope import studies
    from dynascope.report.study_page import check_page, write_study_page

    if preset not in ("smoke", "fast", "paper"):
        _fail(f"--preset: must be one of smoke, fast, paper (got {preset!r})")
    if suite_dir is not None and not suite_dir.is_dir():
        _fail(f"--dir: {str(suite_dir)!r} is not a directory")
    if output.exists() and not output.is_dir():
        _fail(f"--output: {str(output)!r} is not a directory")
    names = studies.names()
    try:
        for name in names:  # every page is checked before any is written
            check_page(output / f"{name}.md")
    except ValueError as err:
        _fail(str(err))
    measured = 0
    for name in names:
        write_study_page(studies.get(name), output, suite_dir=suite_dir, preset=preset)
        if suite_dir is not None and (suite_dir / f"{name}-{preset}" / "verdict.json").is_file():
            measured += 1
    console.print(
        f"wrote {len(names)} study pages to {output} ({measured} with {preset} verdicts)",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


@app.command()
def compare(
    dir_a: Annotated[Path, typer.Argument(help="run or study directory")],
    dir_b: Annotated[Path, typer.Argument(help="run or study directory of the same kind")],
) -> None:
    """Print two runs' (or two studies') metrics side by side, then their config differences."""
    from dynascope.report.compare import compare_dirs, config_differences

    try:
        kind, rows = compare_dirs(dir_a, dir_b)
    except ValueError as err:
        _fail(str(err))
    except _db_errors() as err:
        _fail(f"DIR: metrics.sqlite is not readable ({err})")
    table = Table(title=f"{kind} directories: A = {dir_a}, B = {dir_b}")
    for column in ("key", "A", "B", "B - A"):
        table.add_column(column, justify="left" if column == "key" else "right", overflow="fold")

    def cell(value) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return "" if math.isnan(value) else f"{value:.6g}"
        return str(value)

    for r in rows:
        table.add_row(r["key"], cell(r["a"]), cell(r["b"]), cell(r["delta"]))
    _print_table(table)
    differences = config_differences(dir_a, dir_b)
    if not differences:
        console.print("configs: identical", markup=False, highlight=False)
        return
    configs = Table(title="config differences")
    for column in ("field", "A", "B"):
        configs.add_column(column, overflow="fold")
    for r in differences:
        configs.add_row(r["key"], cell(r["a"]), cell(r["b"]))
    _print_table(configs)


@app.command()
def inspect(
    path: Annotated[
        Path,
        typer.Argument(
            help="Hugging Face checkpoint directory, .pt checkpoint, run directory, or a "
            "directory of checkpoints"
        ),
    ],
    text: Annotated[
        Path | None,
        typer.Option(help="text file, tokenized with the checkpoint's own tokenizer (offline)"),
    ] = None,
    tokens: Annotated[
        int | None, typer.Option(help="N random token ids (seed 0) as the input instead")
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="write inspect.csv, figures/ and inspect.html here")
    ] = None,
) -> None:
    """Analyse a model's attention heads: W_QK/W_OV ranks and norms, attention entropy."""
    from dynascope.inspection import inspect as inspect_model
    from dynascope.inspection import load_checkpoints

    if text is not None and tokens is not None:
        _fail("--text, --tokens: give one of them, not both")
    if tokens is not None and tokens < 1:
        _fail(f"--tokens: must be >= 1 (got {tokens})")
    if text is not None and not text.is_file():
        _fail(f"--text: no such file: {str(text)!r}")
    if out is not None:
        _refuse_unusable_dir(out)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # no "Loading weights" bars
    try:
        checkpoints = load_checkpoints(path)
        x = _inspect_inputs(path, checkpoints[-1][1], text, tokens)
        frames = []
        for step, model in checkpoints:
            frame = inspect_model(model, x)
            if step is not None:
                frame.insert(0, "step", step)
            frames.append(frame)
    except ValueError as err:
        _fail(str(err))
    import pandas as pd

    frame = pd.concat(frames, ignore_index=True)
    _print_inspect_summary(frame, path)
    if out is not None:
        from dynascope.report.inspect import write_inspect_report

        csv, page, figures = write_inspect_report(frame, out, f"dynascope inspect: {path}")
        console.print(f"wrote {csv}, {page}, {out / 'figures'}/", markup=False, highlight=False)


def _inspect_inputs(path: Path, model, text: Path | None, tokens: int | None):
    """Token ids ``[1, pos]`` for ``dynascope inspect``, or ``None`` without --text/--tokens."""
    import torch

    from dynascope.inspection import model_limits

    if text is None and tokens is None:
        return None
    d_vocab, n_ctx = model_limits(model)
    if tokens is not None:
        if d_vocab is None:
            _fail("--tokens: the model's vocabulary size cannot be read; use the Python API")
        if n_ctx is not None and tokens > n_ctx:
            _fail(f"--tokens: must be <= the model's context length {n_ctx} (got {tokens})")
        generator = torch.Generator().manual_seed(0)
        return torch.randint(0, d_vocab, (1, tokens), generator=generator)
    folder = path if path.is_dir() else path.parent
    candidates = [folder, *sorted(p for p in folder.iterdir() if p.is_dir())]
    try:
        from transformers import AutoTokenizer
    except ImportError:
        _fail("--text: needs transformers (pip install 'dynascope[hf]') and a saved tokenizer")
    for candidate in candidates:
        try:
            tokenizer = AutoTokenizer.from_pretrained(candidate, local_files_only=True)
            break
        except (OSError, ValueError, TypeError):
            continue
    else:
        _fail(f"--text: no tokenizer saved in {str(folder)!r}; use --tokens N")
    ids = tokenizer(text.read_text(encoding="utf-8"), return_tensors="pt")["input_ids"]
    if ids.shape[1] == 0:
        _fail(f"--text: {str(text)!r} holds no tokens")
    return ids[:, :n_ctx] if n_ctx is not None else ids


def _print_inspect_summary(frame, path: Path) -> None:
    keys = [c for c in ("step", "layer") if c in frame.columns]
    columns = [
        c
        for c in ("qk_effective_rank", "ov_effective_rank", "qk_spectral_norm", "attention_entropy")
        if c in frame.columns
    ]
    means = frame.groupby(keys)[columns].mean().reset_index()
    table = Table(title=f"{path}: mean over heads ({frame['head'].nunique()} per layer)")
    for column in keys + columns:
        table.add_column(column, justify="right")
    for row in means.itertuples(index=False):
        table.add_row(
            *(str(int(v)) if k in keys else f"{v:.4g}" for k, v in zip(keys + columns, row))
        )
    _print_table(table)


def _print_verdicts(outcome) -> None:
    from dynascope.report.suite import claim_cell, control_cell, interval_cell

    seed = "" if outcome.seed is None else f", seed {outcome.seed}"
    table = Table(
        title=f"{outcome.study} ({outcome.preset}{seed}): {outcome.status} "
        f"in {outcome.seconds:.0f} s"
    )
    for column in ("claim", "status", "measured", "threshold", "interval (95 %)", "control"):
        table.add_column(column)
    for v in outcome.claims:
        measured = "nan" if math.isnan(v.measured) else f"{v.measured:.4g}"
        data = v.to_json()
        table.add_row(
            claim_cell(data),
            _status_markup(v.status),
            measured,
            f"{v.direction} {v.threshold:g}",
            interval_cell(data),
            control_cell(data),
        )
    console.print(table)
    for v in outcome.claims:
        if v.reason:
            console.print(f"  {v.claim.split(':')[0]}: inconclusive: {v.reason}", markup=False)


@config_app.command("validate")
def config_validate(
    file: Annotated[Path, typer.Argument(help="run config (YAML)")],
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="overrides: --set a.b=1 c=2 (or repeat --set)"),
    ] = None,
) -> None:
    """Validate a run config (with overrides); print it resolved, with defaults filled in."""
    import yaml

    from dynascope.config import ConfigError, load_config

    try:
        cfg = load_config(file, set_ or [])
    except ConfigError as err:
        _fail(str(err))
    console.print(
        yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False),
        markup=False,
        highlight=False,
        end="",
    )
    console.print("config is valid", style="green")


def main() -> None:
    """Entry point of the ``dynascope`` script."""
    from dynascope.executors._task import quiet_interrupts_in_callbacks

    quiet_interrupts_in_callbacks()
    app()


if __name__ == "__main__":
    main()
