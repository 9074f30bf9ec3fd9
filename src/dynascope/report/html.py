"""Self-contained HTML reports: verdicts, runs and figures (PNG embedded as base64) in one file."""

from __future__ import annotations

import base64
import html
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["render_page", "write_run_report", "write_study_report", "write_table_report"]

# A table box may reach past the text column into the page's right margin (50% + 50vw is the
# distance from the column's left edge to the window's right edge) and scrolls sideways beyond.
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em}
.table{overflow-x:auto;width:max-content;max-width:calc(50% + 50vw - 2em);margin:.5em 0}
table{border-collapse:collapse;font-size:.9em}
td,th{border:1px solid #ddd;padding:.3em .6em;text-align:left;vertical-align:top;min-width:3em}
td.long{min-width:16em}
th{background:#f5f5f5}.pass{color:#1a7f37;font-weight:600}.fail{color:#cf222e;font-weight:600}
figure{display:inline-block;margin:.5em;text-align:center;max-width:100%}figure img{max-width:100%}
figcaption{font-size:.8em;color:#555}.muted{color:#666;font-size:.9em}
.warn{color:#9a6700;font-weight:600}
pre{background:#f6f8fa;padding:.5em;font-size:.8em;overflow-x:auto}
summary{cursor:pointer}
"""


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.4g}"
    return html.escape(str(value))


_LONG_CELL = 60  # characters: a cell this long gets a paragraph's width, not a word's


def _th(name: str) -> str:
    """A header cell whose name may break after ``_`` or ``.`` (``qk_effective_rank``), so a
    table of many numeric columns is as wide as its numbers, not its names."""
    text = html.escape(name).replace("_", "_<wbr>").replace(".", ".<wbr>")
    return f"<th>{text}</th>"


def _td(text: str, cls: str = "") -> str:
    """A data cell (``text`` already escaped); long text gets the ``long`` class."""
    classes = " ".join(c for c in (cls, "long" if len(text) > _LONG_CELL else "") if c)
    return f"<td class='{classes}'>{text}</td>" if classes else f"<td>{text}</td>"


def _wrap(head: str, body: list[str]) -> str:
    """A table in a box that scrolls sideways when the table is wider than the page."""
    return f"<div class=table><table><tr>{head}</tr>{''.join(body)}</table></div>"


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "<p class=muted>(none)</p>"
    columns = list(rows[0])
    head = "".join(_th(c) for c in columns)
    body = []
    for row in rows:
        cells = []
        for c in columns:
            v = row.get(c, "")
            if c == "passed":
                cells.append(_td("yes" if v else "no", "pass" if v else "fail"))
            elif c == "status":
                cls = {"held": "pass", "not held": "fail"}.get(str(v), "warn")
                cells.append(_td(html.escape(str(v)), cls))
            else:
                cells.append(_td(_fmt(v)))
        body.append("<tr>" + "".join(cells) + "</tr>")
    return _wrap(head, body)


def _figures(paths: Iterable[Path]) -> str:
    parts = []
    for path in paths:
        data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
        name = html.escape(Path(path).stem)
        parts.append(
            f"<figure><img alt='{name}' src='data:image/png;base64,{data}'>"
            f"<figcaption>{name}</figcaption></figure>"
        )
    return "".join(parts)


def render_page(title: str, sections: list[tuple[str, str]]) -> str:
    """A complete HTML page: ``sections`` are ``(heading, inner_html)`` pairs."""
    body = "".join(f"<h2>{html.escape(h)}</h2>{inner}" for h, inner in sections)
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head>"
        f"<body><h1>{html.escape(title)}</h1>{body}</body></html>"
    )


def _write(path: Path, text: str) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def _status_cell(status: Any) -> str:
    cls = {"finished": "pass", "diverged": "fail", "failed": "fail"}.get(str(status), "warn")
    return f"<td class={cls}>{html.escape(str(status))}</td>"


def _runs_table(runs: list[dict[str, Any]], out: Path) -> str:
    """Runs with their status; a run's name links to its own report when it has one."""
    if not runs:
        return "<p class=muted>(none)</p>"
    columns = [c for c in runs[0] if c not in ("name", "status")]
    head = "<th>run</th><th>status</th>" + "".join(_th(c) for c in columns)
    body = []
    for row in runs:
        name = html.escape(str(row["name"]))
        if (out / "runs" / str(row["name"]) / "report.html").is_file():
            name = f"<a href='runs/{name}/report.html'>{name}</a>"
        cells = "".join(_td(_fmt(row.get(c, ""))) for c in columns)
        body.append(f"<tr><td>{name}</td>{_status_cell(row['status'])}{cells}</tr>")
    return _wrap(head, body)


def _configs(configs: dict[str, Any]) -> str:
    """Each run's config as YAML, folded (``<details>``)."""
    import yaml

    parts = []
    for name, config in configs.items():
        text = yaml.safe_dump(config, sort_keys=False)
        parts.append(
            f"<details><summary>{html.escape(name)}</summary><pre>{html.escape(text)}</pre>"
            "</details>"
        )
    return "".join(parts) or "<p class=muted>(none)</p>"


def _claim_row(v: Any) -> dict[str, Any]:
    """One :class:`~dynascope.studies.Verdict` as a row of the report's verdict table."""
    from dynascope.report.suite import control_cell, interval_cell, spread_cell

    data = v.to_json()
    control = control_cell(data) if v.control is None else f"{v.control.text}: {control_cell(data)}"
    pre = v.precondition
    precondition = "none stated (legacy verdict)"
    if pre is not None:
        precondition = f"{pre.text}: {'met' if pre.met else 'NOT met'}"
        if not math.isnan(pre.measured):
            precondition += f" (measured {_fmt(pre.measured)})"
    per_seed = ", ".join(f"{s}: {_fmt(x)}" for s, x in zip(v.seeds, v.per_seed))
    return {
        "claim": v.claim,
        "status": v.status,
        "measured": v.measured,
        "threshold": f"{v.direction} {v.threshold:.4g}",
        "kind": v.kind + (" (amended: see the protocol's log)" if v.amended else ""),
        "interval (95 %)": interval_cell(data),
        "per seed": per_seed or "no seeds",
        "spread": spread_cell(data),
        "control": control,
        "precondition": precondition,
        "metric": v.metric,
        "aggregation": v.aggregation or "single value (legacy verdict)",
        "why inconclusive": v.reason,
        "detail": v.detail,
    }


def write_study_report(
    study: Any,
    outcome: Any,
    figures: list[Path],
    path: Path,
    configs: dict[str, Any] | None = None,
) -> Path:
    """Write a study's ``report.html``: claims, verdicts, figures, tables, runs, configs.

    Self-contained: figures are inlined as base64 PNG, the style is inline, nothing is fetched
    from the network. Run names link (relative) to the runs' own ``report.html`` when present.

    Args:
        study: the :class:`~dynascope.studies.Study`.
        outcome: its :class:`~dynascope.studies.StudyOutcome`.
        figures: PNG files to inline.
        path: where to write.
        configs: run name -> config (JSON data) for the configs section.
    """
    cls = {"held": "pass", "not held": "fail"}.get(outcome.status, "warn")
    verdict = f"<span class={cls}>{html.escape(outcome.status)}</span>"
    claims = [_claim_row(v) for v in outcome.claims]
    counts = {}
    for row in outcome.runs:
        counts[str(row["status"])] = counts.get(str(row["status"]), 0) + 1
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    seed = "" if outcome.seed is None else f", seed {outcome.seed}"
    sections = [
        (
            "Claim",
            f"<p>{html.escape(study.claim)}</p><p class=muted>Source: {html.escape(study.source)}"
            f"</p><p>Preset <b>{html.escape(outcome.preset)}</b>{seed}, {outcome.seconds:.1f} s, "
            f"{len(outcome.runs)} runs ({html.escape(summary)}). Overall: {verdict}.</p>"
            + (
                "<p class=warn>smoke: plumbing check, not a scientific result</p>"
                if outcome.preset == "smoke"
                else ""
            ),
        ),
        ("Verdicts", _table(claims)),
        ("Figures", _figures(figures)),
    ]
    for name, rows in outcome.tables.items():
        sections.append((name, _table(rows)))
    sections.append(("Runs", _runs_table(outcome.runs, Path(path).parent)))
    sections.append(("Configs", _configs(configs or {})))
    return _write(path, render_page(f"dynascope study: {study.name}", sections))


def write_run_report(run: Any, figures: list[Path], path: Path, summary: list[dict]) -> Path:
    """Write a run's ``report.html``: status, events, last values, figures, config."""
    events = [
        {"step": int(step), "kind": kind, "detail": detail}
        for step, kind, detail in zip(run.events["step"], run.events["kind"], run.events["detail"])
        if kind != "status"
    ]
    sections = [
        ("Status", f"<p>{html.escape(str(run.status))} — {html.escape(str(run.path))}</p>"),
        ("Figures", _figures(figures)),
        ("Last values", _table(summary)),
        ("Events", _table(events)),
        ("Config", _configs({run.name: run.config})),
    ]
    return _write(path, render_page(f"dynascope run: {run.name}", sections))


def write_table_report(
    path: Path, title: str, figures: list[Path], tables: list[tuple[str, list[dict[str, Any]]]]
) -> Path:
    """Write a self-contained page: the figures (inlined), then one table per ``(heading, rows)``.

    Used by ``dynascope inspect --out``.
    """
    sections = [("Figures", _figures(figures))]
    sections += [(heading, _table(rows)) for heading, rows in tables]
    return _write(Path(path), render_page(title, sections))
