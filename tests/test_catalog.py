"""The study catalog (studies/catalog.json) against the registry (the study packages)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dynascope import catalog, studies
from dynascope.cli import app


def test_the_catalog_file_is_what_the_command_writes():
    # on failure: rewrite it with `dynascope study catalog --write`
    written = catalog.catalog_text(studies.catalog_entries())
    assert catalog.CATALOG_FILE.read_text(encoding="utf-8") == written


def test_the_registry_is_the_study_packages():
    folders = sorted(
        p.name.replace("_", "-")
        for p in Path(studies.__file__).parent.iterdir()
        if (p / "__init__.py").exists() and not p.name.startswith("_")
    )
    assert studies.names() == folders
    assert len(folders) == 17
    for name in folders:
        assert studies.get(name).name == name  # each package's STUDY carries its folder's name


def test_the_command_prints_the_catalog_without_writing(monkeypatch, tmp_path):
    target = tmp_path / "catalog.json"
    monkeypatch.setattr(catalog, "CATALOG_FILE", target)
    printed = CliRunner().invoke(app, ["study", "catalog"])
    assert printed.exit_code == 0, printed.output
    assert not target.exists()
    rows = json.loads(printed.stdout)
    assert [row["name"] for row in rows] == studies.names()
    written = CliRunner().invoke(app, ["study", "catalog", "--write"])
    assert written.exit_code == 0, written.output
    assert target.read_text(encoding="utf-8") == printed.stdout
    assert catalog.read_catalog(target) == studies.catalog_entries()


def test_check_refuses_an_unknown_name_or_preset():
    catalog.check("slingshot", "smoke")
    with pytest.raises(ValueError, match=r"unknown study 'nope' \(allowed: autoencoder"):
        catalog.check("nope")
    with pytest.raises(
        ValueError, match=r"preset must be one of smoke, fast, full, paper \(got 'x'\)"
    ):
        catalog.check("slingshot", "x")
    with pytest.raises(ValueError, match=r"unknown study 'nope' \(allowed: autoencoder"):
        studies.get("nope")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "the study catalog is missing"),
        ("{", "not a study catalog"),
        ('[{"name": "a"}]', "not a study catalog"),
    ],
)
def test_a_missing_or_broken_catalog_is_one_line_naming_the_file(tmp_path, text, message):
    path = tmp_path / "catalog.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ValueError, match=rf"catalog.json: {message} .*study catalog --write"):
        catalog.read_catalog(path)
