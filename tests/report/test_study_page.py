"""``dynascope study docs``: one page per study, generated between markers, notes kept.

Runs against stub studies (tests/executors/_stub_study.py) with documented presets, so the
pages' content is known exactly and a stored verdict takes a second to make.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dynascope import studies
from dynascope.cli import app
from dynascope.report.study_page import END, START, merge_page, study_section

EXECUTORS = Path(__file__).parents[1] / "executors"
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def smoke_preset():
    """Plumbing only: two runs of 4 steps.

    Not shown: only the first paragraph is.
    """
    return importlib.import_module("_stub_study").StubPreset(steps=4)


def fast_preset():
    """Two runs of 6 steps | a pipe to escape."""
    return importlib.import_module("_stub_study").StubPreset(steps=6)


@pytest.fixture
def stub_registry(monkeypatch):
    monkeypatch.syspath_prepend(str(EXECUTORS))
    stub = importlib.import_module("_stub_study")
    presets = {"smoke": smoke_preset, "fast": fast_preset}
    registry = {
        name: dataclasses.replace(stub.make_study(name=name), presets=presets, source=f"src {name}")
        for name in ("stub-a", "stub-b")
    }
    monkeypatch.setattr(studies, "_registry", lambda: registry)
    return registry


def section_of(text: str) -> str:
    return text[text.index(START) : text.index(END) + len(END)]


def outside_of(text: str) -> str:
    return text.replace(section_of(text), "")


def test_study_docs_writes_one_page_per_study_from_the_study(stub_registry, tmp_path):
    out = tmp_path / "studies"
    result = invoke("study", "docs", "--output", out)
    assert result.exit_code == 0, result.output
    assert "wrote 2 study pages" in result.stdout and "(0 with fast verdicts)" in result.stdout
    assert sorted(p.name for p in out.iterdir()) == ["stub-a.md", "stub-b.md"]
    text = (out / "stub-a.md").read_text()
    assert text.startswith(f"# stub-a\n\n{START}\n") and text.endswith(f"{END}\n")
    assert "**Claim.** a stub claim for the executor tests" in text
    assert "**Source.** src stub-a" in text
    assert "**Code.** `_stub_study`" in text
    assert "`dynascope study run stub-a --preset fast --out runs/stub-a-fast`" in text
    # presets: the first paragraph of each preset function's docstring, pipes escaped
    assert "| `smoke` | Plumbing only: two runs of 4 steps. | not measured |\n" in text
    assert "| `fast` | Two runs of 6 steps \\| a pipe to escape. | not measured |\n" in text
    assert "Not shown" not in text
    assert "No stored verdict for `fast` yet" in text
    assert "No stored figures for `fast`" in text
    assert "## Notes" not in text


def test_hand_written_text_outside_the_markers_survives_regeneration(stub_registry, tmp_path):
    out = tmp_path / "studies"
    out.mkdir()
    before = "# stub-a (S0): notes\n\nIntro kept above.\n\n"
    after = "\n\nNotes below, with | pipes and <!-- comments -->.\n\n## Calibration\n\nkept.\n"
    (out / "stub-a.md").write_text(f"{before}{START}\nstale generated text\n{END}{after}")
    # a notes page written before the markers existed: the section goes after its title block
    (out / "stub-b.md").write_text(
        "# stub-b (S1): a title\nwhose second line belongs to the title block\n\n"
        "Source: the hand-written notes.\n\n## Redesign\n\ntext\n"
    )
    assert invoke("study", "docs", "--output", out).exit_code == 0
    a = (out / "stub-a.md").read_text()
    assert a.startswith(before + START) and a.endswith(END + after)
    assert "stale generated text" not in a and "**Claim.** a stub claim" in a
    assert "## Notes\n" in section_of(a)  # the notes do not open with a heading of their own
    b = (out / "stub-b.md").read_text()
    assert b.startswith(
        f"# stub-b (S1): a title\nwhose second line belongs to the title block\n\n{START}\n"
    )
    assert b.endswith(f"{END}\n\nSource: the hand-written notes.\n\n## Redesign\n\ntext\n")

    # regeneration: a changed study changes only the section; unchanged, the page is identical
    pages = {p: p.read_text() for p in out.glob("*.md")}
    stub_registry["stub-a"] = dataclasses.replace(stub_registry["stub-a"], claim="a new claim")
    assert invoke("study", "docs", "--output", out).exit_code == 0
    a2 = (out / "stub-a.md").read_text()
    assert outside_of(a2) == outside_of(a) and "**Claim.** a new claim" in a2
    assert (out / "stub-b.md").read_text() == pages[out / "stub-b.md"]
    assert invoke("study", "docs", "--output", out).exit_code == 0
    assert (out / "stub-a.md").read_text() == a2


def test_stored_verdicts_and_figures_go_on_the_page(stub_registry, tmp_path):
    suite = tmp_path / "runs"
    result = invoke(
        "study",
        "run",
        "stub-a",
        "--preset",
        "fast",
        "--out",
        suite / "stub-a-fast",
        "--no-progress",
    )
    assert result.exit_code == 0, result.output
    info = json.loads((suite / "stub-a-fast" / "verdict.json").read_text())
    out = tmp_path / "docs" / "studies"
    result = invoke("study", "docs", "--dir", suite, "--output", out)
    assert result.exit_code == 0, result.output
    assert "(1 with fast verdicts)" in result.stdout
    text = (out / "stub-a.md").read_text()
    claims = {c["claim"].split(":")[0]: c for c in info["claims"]}
    for claim_id, claim in claims.items():
        row = re.search(rf"^\| {claim_id} \| (held|not held) \| ([^|]*) \| ([^|]*) \|", text, re.M)
        assert row is not None, text
        assert row.group(1) == claim["status"]
        assert float(row.group(2)) == pytest.approx(claim["measured"], rel=1e-3)  # 4 digits
        assert row.group(3).strip().endswith(f"{claim['threshold']:.4g}")
    n_held = sum(c["status"] == "held" for c in info["claims"])
    assert f"Status: **{info['status']}** ({n_held} of 2 claims held; `fast`, base seed 0" in text
    assert (out / "figures" / "stub-a" / "x.png").read_bytes() == (
        suite / "stub-a-fast" / "figures" / "x.png"
    ).read_bytes()
    assert "![x](figures/stub-a/x.png)" in text
    # stub-b has no stored run: its page says so
    assert "No stored verdict for `fast` yet" in (out / "stub-b.md").read_text()


def test_bad_markers_and_bad_options_are_one_line_errors_and_write_nothing(stub_registry, tmp_path):
    out = tmp_path / "studies"
    out.mkdir()
    broken = f"# stub-b\n\n{END}\nnotes\n{START}\n"
    (out / "stub-b.md").write_text(broken)
    for args, pattern in [
        (("--output", out), r"stub-b\.md: expected one .* followed by one .*got 1 start and 1 end"),
        (("--dir", tmp_path / "missing", "--output", out), r"--dir: '.*missing' is not a dir"),
        (
            ("--preset", "huge", "--output", out),
            r"--preset: must be one of smoke, fast, full, paper",
        ),
    ]:
        result = invoke("study", "docs", *args)
        assert result.exit_code == 2, result.output
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and re.search(pattern, lines[0]), result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["stub-b.md"]  # stub-a was not written
    assert (out / "stub-b.md").read_text() == broken


_text = st.text(st.characters(codec="utf-8", exclude_characters="\r\x00"), max_size=60).filter(
    lambda s: "<!--" not in s and "-->" not in s
)


@settings(max_examples=60, deadline=None)
@given(before=_text, after=_text)
def test_merge_keeps_any_text_outside_the_markers(before, after):
    page = f"{before}{START}\nold\n{END}{after}"
    merged = merge_page(page, "x", lambda has_notes: f"{START}\nnew {has_notes}\n{END}\n")
    assert (
        merged
        == f"{before}{START}\nnew {bool(after.strip()) and not after.strip().startswith('## ')}\n{END}{after}"
    )
    assert merge_page(merged, "x", lambda has_notes: f"{START}\nnew {has_notes}\n{END}\n") == merged


@settings(max_examples=60, deadline=None)
@given(notes=_text)
def test_merge_into_a_page_without_markers_keeps_every_line(notes):
    merged = merge_page(notes, "x", lambda has_notes: f"{START}\nnew\n{END}\n")
    if not notes.strip():
        assert merged == f"# x\n\n{START}\nnew\n{END}\n"
        return
    outside = merged.replace(f"{START}\nnew\n{END}", "")
    assert [line for line in outside.splitlines() if line.strip()] == [
        line
        for line in ([] if notes.lstrip("\n").startswith("# ") else ["# x"]) + notes.splitlines()
        if line.strip()
    ]


def test_repeated_preset_gives_one_table_each_and_the_last_measured_presets_figures(
    stub_registry, tmp_path, monkeypatch
):
    def full_preset():
        """Two runs of 8 steps."""
        return importlib.import_module("_stub_study").StubPreset(steps=8)

    study = stub_registry["stub-a"]
    stub_registry["stub-a"] = dataclasses.replace(
        study, presets={**study.presets, "full": full_preset}
    )
    suite = tmp_path / "runs"
    for preset in ("fast", "full"):
        out = suite / f"stub-a-{preset}"
        result = invoke("study", "run", "stub-a", "--preset", preset, "--out", out, "--no-progress")
        assert result.exit_code == 0, result.output
    (suite / "stub-a-full" / "figures" / "x.png").write_bytes(b"full's figure")
    out = tmp_path / "docs"
    args = ("study", "docs", "--dir", suite, "--output", out, "--preset", "fast")
    result = invoke(*args, "--preset", "full")
    assert result.exit_code == 0, result.output
    assert "(1 with fast verdicts, 1 with full verdicts)" in result.stdout
    text = (out / "stub-a.md").read_text()
    fast_at, full_at = text.index("## Measured verdicts (`fast`)"), text.index("`full`)")
    assert fast_at < full_at < text.index("## Figures (`full`)")
    assert "`full`, base seed 0" in text and "`fast`, base seed 0" in text
    assert "--preset full --out runs/stub-a-full" in text  # the run command of the figures
    assert (out / "figures" / "stub-a" / "x.png").read_bytes() == b"full's figure"
    # stub-b has no full preset: one fast table, no full one
    text_b = (out / "stub-b.md").read_text()
    assert "No stored verdict for `fast` yet" in text_b and "`full`" not in text_b


def test_a_verdict_written_under_another_protocol_says_so():
    study = studies.get("ntk-lazy-validity")
    current = {
        "status": "held",
        "seed": 0,
        "claims": [],
        "protocol": {"sha256": study.protocol.sha256},
    }
    earlier = current | {"protocol": {"sha256": "ab" * 32}}
    text = study_section(
        study, preset="full", verdicts={"fast": (earlier, None), "full": (current, None)}
    )
    note = "Measured under an earlier version of the protocol (sha256 `abababababababab…`)"
    assert text.count(note) == 1
    assert text.index("(`fast`)") < text.index(note) < text.index("(`full`)")
    no_hash = current | {"protocol": {}}
    assert "earlier version" not in study_section(study, verdict=no_hash)
