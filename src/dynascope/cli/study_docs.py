"""``dynascope study table`` and ``dynascope study docs``: the suite table and the study pages,
written from the verdicts that ``study run`` stored."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from dynascope.presets import PRESETS

from ._common import AMENDED_LEGEND, PRESET_HELP, fail, print_line, print_table, status_markup

_SUITE_WRAPPING = ("claim", "interval", "control")  # the suite table's free-text columns


def print_suite(suite_dir: Path, names: list[str], preset: str) -> None:
    """The suite table: one row per study of ``names`` from ``suite_dir/NAME-PRESET``."""
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
            r["study"], r["claim"], status_markup(r["status"]), measured, threshold,
            r["interval"], r["control"], seconds,
        )  # fmt: skip
    print_table(table)
    if any("†" in r["claim"] for r in rows):
        print_line(AMENDED_LEGEND, soft_wrap=True)


def _check_preset(preset: str) -> None:
    if preset not in PRESETS:
        fail(f"--preset: must be one of {', '.join(PRESETS)} (got {preset!r})")


def study_table(
    suite_dir: Annotated[
        Path, typer.Option("--dir", help="where `study run --all` wrote the studies")
    ] = Path("runs"),
    preset: Annotated[str, typer.Option(help=PRESET_HELP)] = "fast",
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
    from dynascope.store import METRICS_FILE, VERDICT_FILE

    _check_preset(preset)
    if not suite_dir.is_dir():
        fail(f"--dir: {str(suite_dir)!r} is not a directory")
    names = studies.names()
    verdicts = [suite_dir / f"{n}-{preset}" / VERDICT_FILE for n in names]
    stamps = [path.stat().st_mtime for path in verdicts if path.is_file()]
    if not stamps:
        kind = ""
        if (suite_dir / METRICS_FILE).exists():
            kind = " (it is a run directory)"
        elif (suite_dir / VERDICT_FILE).exists():
            kind = f" (it is a study directory; give its parent, e.g. {str(suite_dir.parent)!r})"
        fail(
            f"--dir: {str(suite_dir)!r} holds no study verdicts for preset {preset}{kind}; "
            f"expected NAME-{preset}/{VERDICT_FILE} as written by "
            f"`dynascope study run --all --preset {preset} --out DIR`"
        )
    rows = suite_rows(suite_dir, names, preset)
    when = datetime.datetime.fromtimestamp(max(stamps), datetime.timezone.utc).strftime("%Y-%m-%d")
    output = output or Path("docs") / "studies.md"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(markdown_table(rows, preset=preset, when=when))
    print_suite(suite_dir, names, preset)
    print_line(f"wrote {output}")


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
    preset: Annotated[
        list[str] | None,
        typer.Option(
            help=f"{PRESET_HELP}; repeat for one verdict table each (--preset fast --preset "
            "full; a study without that preset skips it) [default: fast]"
        ),
    ] = None,
) -> None:
    """Write one docs page per study, OUTPUT/NAME.md, generated from the study.

    Only the part between the generated:start and generated:end markers is rewritten.
    """
    presets = preset or ["fast"]
    from dynascope import studies
    from dynascope.report.study_page import check_page, write_study_page
    from dynascope.store import VERDICT_FILE

    for name in presets:
        _check_preset(name)
    if suite_dir is not None and not suite_dir.is_dir():
        fail(f"--dir: {str(suite_dir)!r} is not a directory")
    if output.exists() and not output.is_dir():
        fail(f"--output: {str(output)!r} is not a directory")
    names = studies.names()
    try:
        for name in names:  # every page is checked before any is written
            check_page(output / f"{name}.md")
    except ValueError as err:
        fail(str(err))
    measured = dict.fromkeys(presets, 0)
    for name in names:
        write_study_page(studies.get(name), output, suite_dir=suite_dir, preset=presets)
        for shown in presets:
            verdict = None if suite_dir is None else suite_dir / f"{name}-{shown}" / VERDICT_FILE
            measured[shown] += verdict is not None and verdict.is_file()
    counts = ", ".join(f"{n} with {shown} verdicts" for shown, n in measured.items())
    print_line(f"wrote {len(names)} study pages to {output} ({counts})", soft_wrap=True)
