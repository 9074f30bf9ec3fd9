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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dynascope.presets import cost_text, preset_costs

from .suite import claim_cell, control_cell, interval_cell, spread_cell

if TYPE_CHECKING:
    from dynascope.studies.base import Study

StoredVerdict = tuple[dict[str, Any], str | None]
"""A stored ``verdict.json`` (parsed) and the date it was written (``YYYY-MM-DD`` or ``None``)."""

__all__ = [
    "END",
    "START",
    "StoredVerdict",
    "check_page",
    "merge_page",
    "study_section",
    "write_study_page",
]

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


def _verdict_lines(
    preset: str, run: str, stored: StoredVerdict | None, sha256: str | None = None
) -> list[str]:
    """The ``## Measured verdicts (PRESET)`` part: the status line and the claim table, or
    how to get a verdict when none is stored; a verdict written under another protocol than
    the study's (``sha256``, the current one's hash) says so."""
    lines = ["", f"## Measured verdicts (`{preset}`)", ""]
    if stored is None:
        return lines + [
            f"No stored verdict for `{preset}` yet: run `{run}` (or the whole suite with "
            f"`dynascope study run --all --preset {preset} --out runs`), then "
            "`dynascope study docs --dir runs`."
        ]
    verdict, measured_on = stored
    how = f"`{preset}`"
    if verdict.get("seed") is not None:
        how += f", base seed {verdict['seed']}"
    if measured_on:
        how += f", measured {measured_on}"
    if verdict.get("seconds") is not None:
        how += f", {float(verdict['seconds']):.0f} s wall time"
    n_held = sum((c.get("status") or "") == "held" for c in verdict["claims"])
    return lines + [
        f"Status: **{verdict.get('status', 'unknown')}** ({n_held} of "
        f"{len(verdict['claims'])} claims held; {how}). A claim that did not hold is a "
        "measured result at this preset's scale ([how verdicts are judged](../verdicts.md))."
        + _protocol_note(verdict, sha256),
        "",
        *_verdict_table(verdict),
        "",
        "† the protocol logs an amendment to this claim (below).",
    ]


def _protocol_note(verdict: dict[str, Any], sha256: str | None) -> str:
    """`` Measured under an earlier protocol ...`` when the verdict's protocol hash is not
    ``sha256``; ``""`` when it is, or when either is unknown."""
    measured = (verdict.get("protocol") or {}).get("sha256")
    if not measured or not sha256 or measured == sha256:
        return ""
    return (
        f" Measured under an earlier version of the protocol (sha256 `{measured[:16]}…`); "
        "its amendment log below says what changed since."
    )


def study_section(
    study: Study,
    *,
    preset: str = "fast",
    verdict: dict[str, Any] | None = None,
    measured_on: str | None = None,
    figures: list[str] | None = None,
    has_notes: bool = False,
    verdicts: dict[str, StoredVerdict | None] | None = None,
) -> str:
    """The generated section of a study's page, markers included.

    Args:
        study: the registered study.
        preset: the preset of the page's run command and figures, and whose verdict
            ``verdict`` is (when ``verdicts`` is not given).
        verdict: that preset's ``verdict.json``, parsed; ``None``: no stored verdict.
        measured_on: the date the verdict was written (``YYYY-MM-DD``), shown with the table.
        figures: figure paths relative to the page, shown as images.
        has_notes: hand-written notes follow the section (they get a ``## Notes`` heading
            unless they start with a heading of their own).
        verdicts: preset -> ``(verdict, measured_on)`` or ``None`` (not stored), one table
            each in this order; default ``{preset: (verdict, measured_on)}``.
    Returns:
        Markdown from :data:`START` to :data:`END`, ending with a newline.
    """
    if verdicts is None:
        verdicts = {preset: None if verdict is None else (verdict, measured_on)}
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
    protocol = getattr(study, "protocol", None)
    sha256 = None if protocol is None else protocol.sha256
    for shown, stored in verdicts.items():
        command = run.replace(f"--preset {preset}", f"--preset {shown}").replace(
            f"{study.name}-{preset}", f"{study.name}-{shown}"
        )
        lines += _verdict_lines(shown, command, stored, sha256)
    if protocol is not None:
        lines += ["", protocol.markdown().rstrip()]
    lines += ["", f"## Figures (`{preset}`)" if len(verdicts) > 1 else "## Figures", ""]
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


def _stored(study_dir: Path) -> StoredVerdict | None:
    """``study_dir``'s parsed ``verdict.json`` and the date it was written; ``None``: none."""
    path = study_dir / "verdict.json"
    if not path.is_file():
        return None
    when = datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.timezone.utc)
    return json.loads(path.read_text()), when.strftime("%Y-%m-%d")


def _copy_figures(study_dir: Path, output_dir: Path, name: str) -> list[str]:
    """Copy ``study_dir/figures/*.png`` to ``output_dir/figures/NAME/`` (dropping figures of
    an earlier run that this one lacks); their paths relative to the page."""
    pngs = sorted((study_dir / "figures").glob("*.png"))
    if not pngs:
        return []
    target = output_dir / "figures" / name
    target.mkdir(parents=True, exist_ok=True)
    for old in target.glob("*.png"):
        old.unlink()
    for png in pngs:
        shutil.copyfile(png, target / png.name)
    return [f"figures/{name}/{png.name}" for png in pngs]


def write_study_page(
    study: Study,
    output_dir: str | Path,
    *,
    suite_dir: str | Path | None = None,
    preset: str | Sequence[str] = "fast",
) -> Path:
    """Write (or regenerate) ``output_dir/NAME.md``; copy the study's stored figures beside it.

    Args:
        study: the study.
        output_dir: the folder of the study pages (``docs/studies``).
        suite_dir: where ``dynascope study run --all`` wrote ``NAME-PRESET/``; ``None``: no
            measured verdicts (the table says how to get them).
        preset: the preset, or presets in order, whose ``verdict.json`` each get a table; a
            preset the study does not have is skipped (the first is always shown). The
            figures come from the last preset with a stored verdict.
    Returns:
        The page's path.
    Raises:
        ValueError: if the existing page has unbalanced or misordered markers (it is left
            untouched).
    """
    output_dir = Path(output_dir)
    page = output_dir / f"{study.name}.md"
    presets = [preset] if isinstance(preset, str) else list(preset)
    presets = [p for i, p in enumerate(presets) if i == 0 or p in study.presets]
    verdicts: dict[str, StoredVerdict | None] = {p: None for p in presets}
    shown = presets[0]
    if suite_dir is not None:
        for name in presets:
            verdicts[name] = _stored(Path(suite_dir) / f"{study.name}-{name}")
            shown = name if verdicts[name] is not None else shown
    figures = []
    if verdicts[shown] is not None:
        figures = _copy_figures(Path(suite_dir) / f"{study.name}-{shown}", output_dir, study.name)
    existing = page.read_text() if page.is_file() else None

    def make_section(has_notes: bool) -> str:
        return study_section(
            study, preset=shown, figures=figures, has_notes=has_notes, verdicts=verdicts
        )

    text = merge_page(existing, study.name, make_section, str(page))
    output_dir.mkdir(parents=True, exist_ok=True)
    page.write_text(text)
    return page
