"""Study and run reports are single self-contained HTML files.

Checked with the standard library's ``html.parser``: tags nest and close (void elements
excepted), the page has one html/head/title/body, no element fetches anything (no ``script``,
``link``, ``iframe``; no ``src``/``href`` outside ``data:`` URIs and relative links to run
reports; no ``url(``/``@import`` in the style), and every figure in ``figures/`` appears as an
``<img>`` whose base64 payload is byte-for-byte the PNG file.
"""

from __future__ import annotations

import base64
import json
from html.parser import HTMLParser
from pathlib import Path

import pytest

from dynascope.config import validate_config
from dynascope.report.run import report_run
from dynascope.train import Trainer

VOID = {"meta", "img", "br", "hr", "input", "link", "source", "wbr", "col", "area", "base"}


class _Checker(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.counts: dict[str, int] = {}
        self.images: list[str] = []
        self.links: list[str] = []
        self.text: list[str] = []
        self.style = ""
        self.errors: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        self.counts[tag] = self.counts.get(tag, 0) + 1
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs.get("src", ""))
        if "href" in attrs:
            self.links.append(attrs["href"])
        for name in ("src", "href", "action", "srcset", "poster"):
            value = attrs.get(name)
            if value is not None and not value.startswith("data:") and tag != "a":
                self.errors.append(f"<{tag} {name}={value[:40]!r}> loads something")
        self._in_style = tag == "style"
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()
        self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.style += data
        else:
            self.text.append(data)


def check_self_contained(path: Path) -> _Checker:
    """Parse ``path`` and assert the properties in the module docstring (except figures)."""
    text = path.read_text(encoding="utf-8")
    assert text.lower().startswith("<!doctype html>")
    checker = _Checker()
    checker.feed(text)
    checker.close()
    assert checker.errors == [] and checker.stack == []
    for tag in ("html", "head", "title", "body"):
        assert checker.counts.get(tag) == 1, tag
    for tag in ("script", "link", "iframe", "object", "embed"):
        assert tag not in checker.counts, tag
    assert "url(" not in checker.style and "@import" not in checker.style
    for href in checker.links:  # only relative links to run reports beside this file
        assert "://" not in href and not href.startswith("//"), href
        assert (path.parent / href).is_file(), href
    return checker


def assert_inlines_every_figure(checker: _Checker, figures_dir: Path) -> None:
    payloads = sorted(
        base64.b64decode(src.removeprefix("data:image/png;base64,")) for src in checker.images
    )
    assert all(src.startswith("data:image/png;base64,") for src in checker.images)
    files = sorted(p.read_bytes() for p in figures_dir.glob("*.png"))
    assert files and payloads == files


def test_study_report_is_self_contained_with_claims_runs_statuses_and_configs(stub_study, tmp_path):
    study = stub_study.make_study(("ok", "raise", "ok"))
    outcome = study.run(preset="smoke", out=tmp_path, run_reports=True)
    checker = check_self_contained(tmp_path / "report.html")
    assert_inlines_every_figure(checker, tmp_path / "figures")
    text = " ".join(checker.text)
    for claim in outcome.claims:
        assert claim.claim in text
    for row in outcome.runs:  # the runs table: each run with its status, linked to its report
        assert row["name"] in text
    assert [r["status"] for r in outcome.runs] == ["finished", "failed", "finished"]
    assert "3 runs (1 failed, 2 finished)" in text
    assert sorted(checker.links) == [f"runs/{r['name']}/report.html" for r in outcome.runs]
    configs = json.loads((tmp_path / "study.json").read_text())["runs"]
    assert "behaviour: raise" in text and len(configs) == 3
    for row in outcome.runs:
        check_self_contained(tmp_path / "runs" / row["name"] / "report.html")


def test_run_report_has_loss_and_probe_curves_inlined(tmp_path):
    config = validate_config(
        {
            "name": "report",
            "model": {"n_layers": 1, "d_model": 12, "n_heads": 3, "d_mlp": 0},
            "task": {"name": "associative_recall", "n_keys": 6, "n_values": 5, "n_pairs": 3},
            "train": {"steps": 8, "batch_size": 4, "log_every": 2, "eval_every": 4},
            "monitor": {"probes": ["qk_spectrum"], "schedule": "every", "every": 2},
        }
    )
    Trainer(config, tmp_path).run()
    path = report_run(tmp_path)
    checker = check_self_contained(path)
    assert sorted(p.name for p in (tmp_path / "figures").glob("*.png")) == [
        "loss.png",
        "probes.png",
    ]
    assert_inlines_every_figure(checker, tmp_path / "figures")
    assert "associative_recall" in " ".join(checker.text)  # the config is shown


class _CrashingExecutor:
    """Dies as soon as the runs are to execute (a crash or kill of the study's process)."""

    name = "local"

    def map(self, tasks):
        raise RuntimeError("the study's process died")
        yield  # pragma: no cover


def test_every_run_link_resolves_after_a_fresh_rerun_that_stops(stub_study, tmp_path):
    study = stub_study.make_study(("ok", "ok"))
    study.run(preset="smoke", out=tmp_path, run_reports=True)
    assert len(check_self_contained(tmp_path / "report.html").links) == 2
    with pytest.raises(RuntimeError, match="process died"):  # --fresh deleted the runs
        study.run(preset="smoke", out=tmp_path, fresh=True, executor=_CrashingExecutor())
    if (tmp_path / "report.html").exists():
        for link in check_self_contained(tmp_path / "report.html").links:
            assert (tmp_path / link).is_file(), link
    study.run(preset="smoke", out=tmp_path, fresh=True)  # no run reports: no links
    assert check_self_contained(tmp_path / "report.html").links == []


def test_wide_tables_scroll_in_their_own_box_and_names_may_break(tmp_path):
    """A 20-column table (as ``dynascope inspect`` writes, or a study's 14-column verdict table)
    sits in a box that scrolls sideways (``overflow-x:auto``) instead of running off the page;
    header names break after ``_``; a cell over 60 characters gets a paragraph's width."""
    from dynascope.report.html import write_table_report

    row = {f"qk_metric_{i}": 0.5 + i for i in range(19)} | {"detail": "word " * 20}
    path = write_table_report(tmp_path / "t.html", "wide", [], [("Per head", [row, row])])
    checker = check_self_contained(path)
    page = path.read_text()
    assert ".table{overflow-x:auto;" in page
    assert page.count("<div class=table><table>") == page.count("<table>") == 1
    assert "<th>qk_<wbr>metric_<wbr>0</th>" in page
    assert page.count("<td class='long'>") == 2 and page.count("<td>") == 2 * 19
    assert "18.5" in checker.text  # the last numeric column, 0.5 + 18
