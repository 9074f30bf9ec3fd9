"""What a user reads names no internal tracker numbers ("issue 27", "#27"): the README, every
docs page (the generated study sections included), every CLI help text, and the package's
source (protocols, docstrings, messages). A reference is written out in words instead
(docs/verdicts.md, History of the rules)."""

from __future__ import annotations

import re
from pathlib import Path

import click
import typer

from dynascope.cli._app import app

ROOT = Path(__file__).resolve().parents[1]
TRACKER = re.compile(r"\bissues?\s*#?\d+|(?<![\w&/#])#\d+\b", re.IGNORECASE)


def _hits(text: str) -> list[str]:
    return [text[max(0, m.start() - 30) : m.end() + 10] for m in TRACKER.finditer(text)]


def test_pattern_finds_issue_numbers_and_hash_references_only():
    text = "see issue 27; Issues 17/18; #12 here; colour #a0b0c0; a.md#3x; issue-free; step #"
    assert [m.group() for m in TRACKER.finditer(text)] == ["issue 27", "Issues 17", "#12"]


def test_readme_and_docs_pages_name_no_issue_numbers():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = {str(p.relative_to(ROOT)): _hits(p.read_text()) for p in pages}
    assert {page: hits for page, hits in found.items() if hits} == {}


def test_package_source_names_no_issue_numbers():
    """The strings that generate the study pages (protocols, preset docstrings), the CLI's
    messages and every docstring live in the package's source."""
    sources = sorted((ROOT / "src" / "dynascope").rglob("*.py"))
    issue = re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE)  # "#222" is a colour in CSS
    found = {str(p.relative_to(ROOT)): issue.findall(p.read_text()) for p in sources}
    assert len(sources) > 100
    assert {path: hits for path, hits in found.items() if hits} == {}


def _help_texts(command: click.Command, path: tuple[str, ...]) -> dict[str, str]:
    with click.Context(command, info_name=" ".join(path)) as ctx:
        texts = {" ".join(path): command.get_help(ctx)}
    for name, sub in getattr(command, "commands", {}).items():
        texts |= _help_texts(sub, (*path, name))
    return texts


def test_cli_help_names_no_issue_numbers():
    texts = _help_texts(typer.main.get_command(app), ("dynascope",))
    assert len(texts) >= 10  # every command and group was reached
    found = {command: _hits(text) for command, text in texts.items()}
    assert {command: hits for command, hits in found.items() if hits} == {}
