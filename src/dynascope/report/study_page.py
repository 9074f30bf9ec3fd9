"""One docs page per study, ``docs/studies/NAME.md``, generated from the study object.

Glossary:
    section:    the generated part of a page, between :data:`START` and :data:`END`: the claim,
                the source, where the code lives, the command that runs it, the presets (one
                line each, from the preset function's docstring), the measured verdict table
                (from a stored ``verdict.json``) and the figures. Regenerating replaces it.
    notes:      everything outside the markers, written by hand (the study's lab notes). It is
                kept as it is: a page without markers gets the section after its title block
                (the ``# ...`` line and the lines up to the first blank one), or, without a
                title, a ``# NAME`` title and the section at the top.
    suite dir:  where ``dynascope study run --all --preset PRESET --out DIR`` wrote one study
                directory per study, ``DIR/NAME-PRESET/`` with ``verdict.json`` and
                ``figures/*.png``; a study's figures are copied next to its page, under
                ``figures/NAME/``, so the docs site can show them.

``dynascope study docs [--dir runs] [--output docs/studies]`` writes every registered study's
page; the verdict table says what was measured, or that the study has no stored verdict.
"""

from __future__ import annotations

import datetime
import inspect
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dynascope.presets import cost_text, preset_costs

from .suite import claim_cell, control_cell, interval_cell, spread_cell

if TYPE_CHECKING:
    from dynascope.studies.base import Study

__all__ = ["END", "START", "check_page", "merge_page", "study_section", "write_study_page"]

START = "<!-- generated:start -->"
END = "<!-- generated:end -->"


def _first_paragraph(obj: Any) -> str:
    """The first paragraph of ``obj``'s docstring on one line (``""`` when it has none)."""
    doc = inspect.getdoc(obj) or ""
    return " ".join(doc.split("\n\n")[0].split())


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _number(value: Any) -> str:
    return "" if value is None else f"{float(value):.4g}"


def _verdict_table(info: dict[str, Any]) -> list[str]:
    """The claims of one ``verdict.json`` as a Markdown table, with how they were measured."""
    lines = [
        "| claim | status | measured | threshold | interval (95 %) | spread over seeds | control "
        "| the claim |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for claim in info["claims"]:
        _, _, text = claim["claim"].partition(":")
        status = claim.get("status") or ("held" if claim.get("passed") else "not held")
        if claim.get("reason"):
            text = f"{text.strip()} (inconclusive: {claim['reason']})"
        threshold = f"{claim.get('direction') or ''} {_number(claim.get('threshold'))}".strip()
        cells = [claim_cell(claim), status, _number(claim.get("measured")), threshold]
        cells += [interval_cell(claim), spread_cell(claim), control_cell(claim)]
        cells.append(text.strip() or claim["claim"])
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def study_section(
    study: Study,
    *,
    preset: str = "fast",
    verdict: dict[str, Any] | None = None,
    measured_on: str | None = None,
    figures: list[str] | None = None,
    has_notes: bool = False,
) -> str:
    """The generated section of a study's page, markers included.

    Args:
        study: the registered study.
        preset: the preset whose verdicts the table shows.
        verdict: that preset's ``verdict.json``, parsed; ``None``: no stored verdict.
        measured_on: the date the verdict was written (``YYYY-MM-DD``), shown with the table.
        figures: figure paths relative to the page, shown as images.
        has_notes: hand-written notes follow the section (they get a ``## Notes`` heading
            unless they start with a heading of their own).
    Returns:
        Markdown from :data:`START` to :data:`END`, ending with a newline.
    """
    run = f"dynascope study run {study.name} --preset {preset} --out runs/{study.name}-{preset}"
    lines = [
        START,
        "<!-- Written by `dynascope study docs` from the study and its stored verdicts: edit "
        "the study, not this section. Text outside the markers is hand-written and kept. -->",
        "",
        f"**Claim.** {study.claim}",
        "",
        f"**Source.** {study.source}",
        "",
        f"**Code.** `{study.build_runs.__module__}`. **Run it:** `{run}`",
        "",
        "## Presets",
        "",
        "| preset | what it runs | measured cost |",
        "|---|---|---|",
    ]
    costs = preset_costs().get(study.name, {})
    lines += [
        f"| `{name}` | {_cell(_first_paragraph(fn))} | {_cell(cost_text(costs.get(name)))} |"
        for name, fn in study.presets.items()
    ]
    lines += ["", f"## Measured verdicts (`{preset}`)", ""]
    if verdict is None:
        lines.append(
            f"No stored verdict for `{preset}` yet: run `{run}` (or the whole suite with "
            f"`dynascope study run --all --preset {preset} --out runs`), then "
            "`dynascope study docs --dir runs`."
        )
    else:
        how = f"`{preset}`"
        if verdict.get("seed") is not None:
            how += f", base seed {verdict['seed']}"
        if measured_on:
            how += f", measured {measured_on}"
        if verdict.get("seconds") is not None:
            how += f", {float(verdict['seconds']):.0f} s wall time"
        n_held = sum((c.get("status") or "") == "held" for c in verdict["claims"])
        lines += [
            f"Status: **{verdict.get('status', 'unknown')}** ({n_held} of "
            f"{len(verdict['claims'])} claims held; {how}). A claim that did not hold is a "
            "measured result at this preset's scale ([how verdicts are judged](../verdicts.md)).",
            "",
            *_verdict_table(verdict),
            "",
            "† the protocol logs an amendment to this claim (below).",
        ]
    protocol = getattr(study, "protocol", None)
    if protocol is not None:
        lines += ["", protocol.markdown().rstrip()]
    lines += ["", "## Figures", ""]
    for figure in figures or []:
        lines += [f"![{Path(figure).stem}]({figure})", ""]
    if not figures:
        lines += [f"No stored figures for `{preset}` (the study run draws them).", ""]
    if has_notes:
        lines += ["## Notes", ""]
    lines.append(END)
    return "\n".join(lines) + "\n"


def _split(text: str, path: str) -> tuple[str, str] | None:
    """``(before, after)`` the marked section of ``text``; ``None`` when it has no markers.

    Raises:
        ValueError: if the markers are not exactly one :data:`START` followed by one
            :data:`END` (the page is not rewritten: its hand-written text would be at risk).
    """
    n_start, n_end = text.count(START), text.count(END)
    if n_start == n_end == 0:
        return None
    if n_start != 1 or n_end != 1 or text.index(START) > text.index(END):
        raise ValueError(
            f"{path}: expected one {START} line followed by one {END} line "
            f"(got {n_start} start and {n_end} end markers); fix the page by hand"
        )
    before, _, rest = text.partition(START)
    _, _, after = rest.partition(END)
    return before, after


def check_page(path: str | Path) -> None:
    """Check that an existing page's markers can be regenerated (a missing page passes).

    Raises:
        ValueError: if the page has unbalanced or misordered markers.
    """
    path = Path(path)
    if path.is_file():
        _split(path.read_text(), str(path))


def _title_block(text: str) -> tuple[str, str]:
    """``(title, rest)``: the leading ``# ...`` line and the lines up to the first blank one."""
    stripped = text.lstrip("\n")
    if not stripped.startswith("# "):
        return "", text
    title, sep, rest = stripped.partition("\n\n")
    return title + "\n", rest if sep else ""


def _has_notes(after: str) -> bool:
    """Notes follow the section and do not open with a heading of their own."""
    after = after.strip()
    return bool(after) and not after.startswith("## ")


def merge_page(
    existing: str | None, name: str, make_section: Callable[[bool], str], path: str = "page"
) -> str:
    """The page with its generated section (re)placed and everything else kept as it was.

    Args:
        existing: the page's current text, or ``None`` for a new page.
        name: the study's name (the title of a page that has none).
        make_section: ``make_section(has_notes) -> str``, the section, markers included.
        path: the page's path, for the error message.
    Returns:
        The new page text.
    Raises:
        ValueError: if ``existing`` has unbalanced or misordered markers.
    """

    def section(has_notes: bool) -> str:  # ends at the END marker: what follows is kept
        return make_section(has_notes).rstrip("\n")

    if existing is None or not existing.strip():
        return f"# {name}\n\n{section(False)}\n"
    parts = _split(existing, path)
    if parts is not None:
        before, after = parts
        return before + section(_has_notes(after)) + after
    title, rest = _title_block(existing)
    if not title:
        title = f"# {name}\n"
    rest = rest.lstrip("\n")
    return f"{title}\n{section(_has_notes(rest))}\n\n{rest}"


def write_study_page(
    study: Study,
    output_dir: str | Path,
    *,
    suite_dir: str | Path | None = None,
    preset: str = "fast",
) -> Path:
    """Write (or regenerate) ``output_dir/NAME.md``; copy the study's stored figures beside it.

    Args:
        study: the study.
        output_dir: the folder of the study pages (``docs/studies``).
        suite_dir: where ``dynascope study run --all`` wrote ``NAME-PRESET/``; ``None``: no
            measured verdicts (the table says how to get them).
        preset: the preset whose ``verdict.json`` and figures are shown.
    Returns:
        The page's path.
    Raises:
        ValueError: if the existing page has unbalanced or misordered markers (it is left
            untouched).
    """
    output_dir = Path(output_dir)
    page = output_dir / f"{study.name}.md"
    verdict, measured_on, figures = None, None, []
    study_dir = Path(suite_dir) / f"{study.name}-{preset}" if suite_dir is not None else None
    if study_dir is not None and (study_dir / "verdict.json").is_file():
        verdict_path = study_dir / "verdict.json"
        verdict = json.loads(verdict_path.read_text())
        measured_on = datetime.datetime.fromtimestamp(
            verdict_path.stat().st_mtime, datetime.timezone.utc
        ).strftime("%Y-%m-%d")
        pngs = sorted((study_dir / "figures").glob("*.png"))
        if pngs:
            target = output_dir / "figures" / study.name
            target.mkdir(parents=True, exist_ok=True)
            for old in target.glob("*.png"):  # figures of an earlier run that this one lacks
                old.unlink()
            for png in pngs:
                shutil.copyfile(png, target / png.name)
                figures.append(f"figures/{study.name}/{png.name}")
    existing = page.read_text() if page.is_file() else None

    def make_section(has_notes: bool) -> str:
        return study_section(
            study,
            preset=preset,
            verdict=verdict,
            measured_on=measured_on,
            figures=figures,
            has_notes=has_notes,
        )

    text = merge_page(existing, study.name, make_section, str(page))
    output_dir.mkdir(parents=True, exist_ok=True)
    page.write_text(text)
    return page
