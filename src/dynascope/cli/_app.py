"""The ``dynascope`` Typer app: every command, registered in the order ``--help`` lists them.

The commands live one group per module (``run``, ``inspect``, ``compare``, ``study``,
``study_docs``, ``config``) as plain functions; this module assembles them, folds Click's usage
errors into the one-line ``error: ...`` every command promises, and turns ``--set a=1 b=2``
into repeated ``--set`` options.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from inspect import cleandoc
from typing import Annotated

import typer
from typer.core import TyperGroup

from . import compare, config, inspect, run, study, study_docs
from ._common import EXIT_BAD_INPUT, err_console, print_line

# Click's base exception, found through a public subclass: typer vendors click from 0.2x on.
_ClickException = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


class OneLineErrors(TyperGroup):
    """Usage errors (missing option, bad value, unknown command) as one line, exit code 2.

    Click prints a usage block and a boxed message over several lines; the rest of the CLI
    promises ``error: ...`` on one line, so its usage errors are folded the same way.
    """

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        warnings.showwarning = _warning_line
        args = split_set_pairs(sys.argv[1:] if args is None else list(args))
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
        except ValueError as err:  # a file of a run or study that does not parse
            from dynascope.store import CorruptFileError

            if not isinstance(err, CorruptFileError):
                raise
            err_console.print(f"error: {err}", markup=False, highlight=False, soft_wrap=True)
            sys.exit(EXIT_BAD_INPUT)
        sys.exit(code if isinstance(code, int) else 0)


def split_set_pairs(args: list[str]) -> list[str]:
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


def _print_version(value: bool) -> None:
    if value:
        from dynascope import __version__

        print_line(f"dynascope {__version__}")
        raise typer.Exit()


app = typer.Typer(
    cls=OneLineErrors,
    name="dynascope",
    help="Instruments and re-runnable studies for the science of training dynamics.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


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


def _help(command: Callable[..., None]) -> str:
    """The command's docstring with each prose paragraph on one line.

    Typer's rich help keeps a docstring's line breaks after its first paragraph, so a
    paragraph wrapped at 100 columns in the source would break mid-sentence at 80. A
    paragraph holding a list item or an indented line is kept as it is.
    """
    paragraphs = cleandoc(command.__doc__ or "").split("\n\n")
    return "\n\n".join(
        text
        if any(line.startswith((" ", "-", "*")) for line in text.splitlines())
        else " ".join(text.split("\n"))
        for text in paragraphs
    )


def _add(group: typer.Typer, command: Callable[..., None], name: str | None = None, **kw) -> None:
    group.command(name, help=_help(command), **kw)(command)


for _command in (
    run.run,
    run.resume,
    inspect.show,
    inspect.report,
    compare.compare,
    inspect.inspect,
):
    _add(app, _command)

study_app = typer.Typer(help="List and run studies (published findings).", no_args_is_help=True)
_add(study_app, study.study_list, "list")
_add(study_app, study.study_run, "run")
_add(study_app, study_docs.study_table, "table")
_add(study_app, study_docs.study_docs, "docs")
_add(study_app, study.study_catalog, "catalog", hidden=True)
app.add_typer(study_app, name="study")

config_app = typer.Typer(help="Check run configs.", no_args_is_help=True)
_add(config_app, config.config_validate, "validate")
app.add_typer(config_app, name="config")


def main() -> None:
    """Entry point of the ``dynascope`` script."""
    from dynascope.executors import quiet_interrupts_in_callbacks

    quiet_interrupts_in_callbacks()
    app()
