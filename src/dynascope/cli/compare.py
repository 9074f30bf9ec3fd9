"""``dynascope compare``: two runs' (or two studies') metrics side by side, and their configs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ._common import db_errors, fail, print_line, print_table


def compare(
    dir_a: Annotated[Path, typer.Argument(help="run or study directory")],
    dir_b: Annotated[Path, typer.Argument(help="run or study directory of the same kind")],
) -> None:
    """Print two runs' (or two studies') metrics side by side, then their config differences."""
    from dynascope.report.compare import compare_dirs, config_differences
    from dynascope.store import METRICS_FILE

    try:
        kind, rows = compare_dirs(dir_a, dir_b)
    except ValueError as err:
        fail(str(err))
    except db_errors() as err:
        fail(f"DIR: {METRICS_FILE} is not readable ({err})")
    table = Table(title=f"{kind} directories: A = {dir_a}, B = {dir_b}")
    for column in ("key", "A", "B", "B - A"):
        table.add_column(column, justify="left" if column == "key" else "right", overflow="fold")
    for r in rows:
        table.add_row(r["key"], _cell(r["a"]), _cell(r["b"]), _cell(r["delta"]))
    print_table(table)
    differences = config_differences(dir_a, dir_b)
    if not differences:
        print_line("configs: identical")
        return
    configs = Table(title="config differences")
    for column in ("field", "A", "B"):
        configs.add_column(column, overflow="fold")
    for r in differences:
        configs.add_row(r["key"], _cell(r["a"]), _cell(r["b"]))
    print_table(configs)


def _cell(value) -> str:
    """A table cell: ``-`` for a missing value, blank for NaN, floats to 6 digits."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return str(value)
