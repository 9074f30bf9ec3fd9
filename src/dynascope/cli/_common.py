"""What every command shares: the consoles, exit codes, the one-line error, directory checks,
table printing and the verdict table.

Nothing here imports torch at module level: ``dynascope --help`` imports this module.
"""

from __future__ import annotations

import math
import os
import sqlite3
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from dynascope.presets import PRESETS

console = Console()
err_console = Console(stderr=True)

EXIT_BAD_INPUT = 2
EXIT_DIVERGED = 3
EXIT_SIGNAL = {"SIGINT": 130, "SIGTERM": 143}  # 128 + signal number, as shells report it

PRESET_HELP = " | ".join(PRESETS)

Overrides = Annotated[
    list[str] | None,
    typer.Option("--set", help="overrides: --set a.b=1 c=2 (or repeat --set)"),
]
"""``--set KEY=VALUE`` options, as ``run`` and ``config validate`` take them."""

SMOKE_NOTE = "smoke: plumbing check, not a scientific result"
"""Printed beside every smoke-preset verdict: smoke runs are seconds long, their numbers mean
nothing about the claim."""


def print_line(text: str, **options) -> None:
    """``text`` on stdout as it is: no markup, no highlighting."""
    console.print(text, markup=False, highlight=False, **options)


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """One line ``error: MESSAGE`` on stderr, then exit ``code`` (2: bad input)."""
    err_console.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def smoke_note(preset: str) -> None:
    if preset == "smoke":
        console.print(SMOKE_NOTE, style="yellow", markup=False, highlight=False)


def db_errors() -> tuple[type[BaseException], ...]:
    """The errors an unreadable ``metrics.sqlite`` raises, through sqlite3 or pandas."""
    from pandas.errors import DatabaseError

    return (sqlite3.DatabaseError, DatabaseError)


def refuse_unusable_dir(out: Path) -> None:
    """Fail (exit 2) if ``out`` exists as a file or cannot be created under its parents."""
    if str(out) in ("", "."):
        fail(f"--out: give a directory for the run (got {str(out)!r})")
    if out.exists() and not out.is_dir():
        fail(f"--out: {str(out)!r} exists and is not a directory")
    for parent in out.parents:
        if parent.exists() and not parent.is_dir():
            fail(f"--out: {str(out)!r} cannot be created: {str(parent)!r} is not a directory")


def print_table(table: Table, max_width: int | None = None) -> None:
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


_STATUS_STYLE = {"held": "[green]held[/]", "not held": "[red]not held[/]"}

AMENDED_LEGEND = (
    "† amended: the study's protocol logs a change to this claim (the Amendments section of "
    "its docs page)"
)


def status_markup(status: str | None) -> str:
    """A verdict status as Rich markup: held green, not held red, anything else yellow."""
    if status is None:
        return "-"
    return _STATUS_STYLE.get(status, f"[yellow]{status}[/]")


def print_verdicts(outcome) -> None:
    """A study outcome's verdicts as a table, then each inconclusive claim's reason."""
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
            status_markup(v.status),
            measured,
            f"{v.direction} {v.threshold:g}",
            interval_cell(data),
            control_cell(data),
        )
    print_table(table)
    if any(v.amended for v in outcome.claims):
        print_line(AMENDED_LEGEND, soft_wrap=True)
    for v in outcome.claims:
        if v.reason:
            console.print(f"  {v.claim.split(':')[0]}: inconclusive: {v.reason}", markup=False)
