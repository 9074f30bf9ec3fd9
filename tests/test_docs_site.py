"""The docs site's sources agree with the code: a generated page and a nav entry per study, and
an API reference section per public probes module. (CI builds the site with
``mkdocs build --strict``; this test needs no mkdocs.)
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from dynascope import studies
from dynascope.report.study_page import END, START

ROOT = Path(__file__).parents[1]


def _nav_pages(nav) -> list[str]:
    pages: list[str] = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_every_study_has_a_generated_page_in_the_nav():
    nav = _nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    for name in studies.names():
        page = ROOT / "docs" / "studies" / f"{name}.md"
        assert page.is_file(), f"run `dynascope study docs` to write {page}"
        text = page.read_text()
        assert text.count(START) == 1 and text.count(END) == 1, (
            f"{page}: no generated section; run `dynascope study docs`"
        )
        assert f"studies/{name}.md" in nav, f"add studies/{name}.md to the nav in mkdocs.yml"
    assert all((ROOT / "docs" / p).is_file() for p in nav), "the nav names a missing page"


def test_every_public_probes_module_is_in_the_api_reference():
    reference = (ROOT / "docs" / "api" / "probes.md").read_text()
    modules = [p.stem for p in (ROOT / "src" / "dynascope" / "probes").glob("*.py")]
    missing = [
        m
        for m in modules
        if not m.startswith("_") and f"::: dynascope.probes.{m}\n" not in reference
    ]
    assert missing == [], f"add these modules to docs/api/probes.md: {missing}"


_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def _relative_links(text: str) -> list[str]:
    """The targets of the inline Markdown links and images in ``text`` that are relative paths
    (no scheme, not a bare ``#anchor``), outside code spans and fenced blocks."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    targets = [m.group(1) for m in _LINK.finditer(text)]
    return [t for t in targets if not re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:|#", t)]


def test_link_finder_reads_links_and_images_but_not_code():
    text = "[a](x.md#s) ![f](fig/a.png) [w](https://e.org) [t](#top) `[c](code.md)`\n```\n[d](d.md)\n```"
    assert _relative_links(text) == ["x.md#s", "fig/a.png"]


def test_every_relative_link_in_docs_targets_a_file_in_docs():
    """A link to a directory (``studies/``) or outside docs/ builds under one mkdocs version
    and fails ``mkdocs build --strict`` under another; a link to a file builds under all."""
    docs = (ROOT / "docs").resolve()
    bad = []
    for page in sorted(docs.rglob("*.md")):
        for target in _relative_links(page.read_text()):
            path = (page.parent / target.split("#")[0]).resolve()
            if not (path.is_file() and path.is_relative_to(docs)):
                bad.append(f"{page.relative_to(docs)}: {target}")
    assert bad == [], f"link to an existing .md page or asset inside docs/: {bad}"


def _first_bash_block(text: str, heading: str) -> str:
    return re.findall(r"```bash\n(.*?)```", text[text.index(heading) :], re.S)[0]


def test_home_page_quick_start_is_the_readmes():
    readme = (ROOT / "README.md").read_text()
    home = (ROOT / "docs" / "index.md").read_text()
    commands = _first_bash_block(readme, "## Set up and run")
    assert commands.count("\n") == 2 and "dynascope study run" in commands
    assert _first_bash_block(home, "## Quick start") == commands
    assert re.search(r"!\[[^\]]+\]\([^)]+\.png\)", home), "the home page shows a figure"


def test_readme_and_home_page_name_every_extra():
    import tomllib

    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"])  # fmt: skip
    for page in (ROOT / "README.md", ROOT / "docs" / "index.md"):
        named = {e for group in re.findall(r'-e "\.\[([^\]]+)\]"', page.read_text())
                 for e in group.split(",")}  # fmt: skip
        assert named == extras, f"{page.name}: name every extra of pyproject.toml ({named})"
