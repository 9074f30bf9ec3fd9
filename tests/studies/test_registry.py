"""Every registered study: three presets that validate, runs with unique safe names, a claim.

The README lists the studies; the CLI's `study list` prints the registry.
"""

from __future__ import annotations

import pytest

from dynascope import studies
from dynascope.studies.base import PRESETS, REQUIRED_PRESETS, RunSpec


@pytest.mark.parametrize("name", studies.names())
def test_study_presets_build_runs_with_unique_safe_names(name):
    study = studies.get(name)
    assert study.name == name
    assert study.claim and study.source
    assert set(REQUIRED_PRESETS) <= set(study.presets)
    assert list(study.presets) == [p for p in PRESETS if p in study.presets]  # tier order
    for preset in study.presets:
        config = study.preset(preset)
        specs = study.build_runs(config, 0)
        assert specs and all(isinstance(s, RunSpec) for s in specs)
        assert len({s.name for s in specs}) == len(specs), f"{name}/{preset}: duplicate runs"
        shifted = study.build_runs(config, 1)
        assert [s.name for s in shifted] == [s.name for s in specs]  # the seed moves values only


def test_every_study_is_in_the_readme():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for name in studies.names():
        assert f"dynascope study run {name}" in readme or f"`{name}`" in readme, name
