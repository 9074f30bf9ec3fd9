"""Every registered study against the verdict contract (``studies/verdict.py``).

- Which studies still build legacy verdicts (``Verdict(claim, metric, measured, threshold,
  passed, detail)``: no seeds, no control) is read from their source: a ``Verdict(...)`` call
  without ``status=`` in the study's module or in the private ``dynascope.studies`` modules it
  imports. That set must equal :data:`LEGACY_STUDIES`, an allow-list that only shrinks: a
  study ported to :func:`~dynascope.studies.verdict.judge` must be removed from it (the test
  fails until it is), and no new study may join it.
- ``study run --seed N`` shifts every run: at seed 1000 no run's config equals any run's config
  at seed 0, in every preset of every study (so a verdict at ``--seed 1000`` is judged on seeds
  nobody tuned on).
"""

from __future__ import annotations

import ast
import importlib
import inspect
from importlib.util import resolve_name
from pathlib import Path

import pytest

from dynascope import studies

# Studies whose analysis still builds legacy verdicts: none since every study was ported to
# judge() (issue 18, part B); never add to it.
LEGACY_STUDIES: set[str] = set()
_SHARED = {"dynascope.studies.base", "dynascope.studies.verdict"}


def _study_modules(module_name: str, seen: set[str] | None = None) -> set[str]:
    """``module_name`` and the ``dynascope.studies`` modules it imports, transitively."""
    seen = set() if seen is None else seen
    if module_name in seen or module_name in _SHARED:
        return seen
    seen.add(module_name)
    module = importlib.import_module(module_name)
    tree = ast.parse(inspect.getsource(module))
    package = module.__package__ or module_name.rpartition(".")[0]  # a study package's own
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                target = resolve_name("." * node.level + target, package)
            if target.startswith("dynascope.studies."):
                _study_modules(target, seen)
    return seen


def _legacy_calls(module_name: str) -> list[int]:
    """Line numbers of ``Verdict(...)`` calls without ``status=`` in ``module_name``."""
    tree = ast.parse(inspect.getsource(importlib.import_module(module_name)))
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Verdict":
            if not any(k.arg == "status" for k in node.keywords):
                lines.append(node.lineno)
    return lines


def _legacy_studies() -> dict[str, list[str]]:
    found = {}
    for name in studies.names():
        modules = _study_modules(studies.get(name).analyze.__module__)
        calls = [f"{m}:{line}" for m in sorted(modules) for line in _legacy_calls(m)]
        if calls:
            found[name] = calls
    return found


def test_the_set_of_studies_with_legacy_verdicts_is_the_shrinking_allow_list():
    found = _legacy_studies()
    ported = LEGACY_STUDIES - set(found)
    assert not ported, f"ported to judge(): remove {sorted(ported)} from LEGACY_STUDIES"
    new = set(found) - LEGACY_STUDIES
    assert not new, (
        f"legacy Verdict(...) calls in studies not on the list: { {n: found[n] for n in new} }"
    )


def test_the_detector_finds_legacy_calls_and_ignores_judged_ones(monkeypatch):
    legacy = _legacy_studies()
    for name in LEGACY_STUDIES:  # each is found at a located Verdict(...) call of its own
        assert legacy[name] and all("dynascope.studies." in where for where in legacy[name])
    assert "mup-coordinate-check" not in legacy and "ntk-universality" not in legacy
    # the executor tests' stub study still builds two legacy verdicts: the detector sees them
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "executors"))
    assert len(_legacy_calls("_stub_study")) == 2


@pytest.mark.parametrize("name", studies.names())
def test_seed_shifts_every_run_of_every_preset(name):
    study = studies.get(name)
    for preset in study.presets:
        config = study.preset(preset)
        base = [s.config.model_dump_json() for s in study.build_runs(config, 0)]
        shifted = [s.config.model_dump_json() for s in study.build_runs(config, 1000)]
        assert len(shifted) == len(base)
        assert not set(base) & set(shifted), f"{name}/{preset}: a run ignores --seed"


# Every study is judged by a protocol fixed before its evaluation seeds run (issue 27).
# Studies still to be put on a protocol: none once every family has one; never add to it.
UNREGISTERED: set[str] = set()


@pytest.mark.parametrize("name", studies.names())
def test_every_study_has_a_protocol_that_names_its_claims(name):
    from dynascope.studies.protocol import Protocol

    study = studies.get(name)
    if name in UNREGISTERED:
        assert study.protocol is None, f"{name} has a protocol: remove it from UNREGISTERED"
        return
    protocol = study.protocol
    assert isinstance(protocol, Protocol) and protocol.study == name
    assert len(protocol.sha256) == 64 and protocol.sha256 == Protocol(**vars(protocol)).sha256
    for spec in protocol.claims:  # what decides a verdict is written down, in words
        assert spec.statement and spec.citation and spec.metric and spec.threshold_source
        assert spec.kind == "identity" or (spec.control and spec.preconditions), spec.id
    assert protocol.registered[:10].count("-") == 2  # an ISO date first
    for preset in ("fast", "full"):
        if preset in study.presets:
            assert protocol.seeds.get(preset, 0) >= 5, f"{name}/{preset}: fewer than 5 seeds"


def test_a_verdict_outside_its_protocol_is_refused():
    from dynascope.studies.protocol import Amendment, ClaimSpec, Protocol
    from dynascope.studies.verdict import Precondition

    spec = ClaimSpec(id="a", claim="x", statement="s", citation="c", metric="m", threshold=1.0,
                     direction="<=", threshold_source="theory", preconditions=("fit",),
                     control="λ = 0")  # fmt: skip
    protocol = Protocol(study="s", claims=(spec,), seeds={"fast": 5}, calibration_seeds=(),
                        presets={}, reproduces="fast", registered="2026-12-07: test",
                        amendments=(Amendment("2026-12-07", ("a",), "x", "y", "z"),))  # fmt: skip
    seeds = {i: 0.5 for i in range(5)}
    verdict = spec.judge(seeds, precondition=Precondition("fit", True), control={i: 2.0 for i in range(5)})  # fmt: skip
    (checked,) = protocol.check([verdict])
    assert checked.amended and checked.status == "held"
    other = ClaimSpec(**{**vars(spec), "threshold": 0.6}).judge(
        seeds, precondition=Precondition("fit", True), control={i: 2.0 for i in range(5)}
    )
    with pytest.raises(ValueError, match=r"the protocol says \(1.0, '<=', 'mean', 'finding'\)"):
        protocol.check([other])
    stranger = ClaimSpec(**{**vars(spec), "id": "zz"}).judge(
        seeds, precondition=Precondition("fit", True), control={i: 2.0 for i in range(5)}
    )
    with pytest.raises(ValueError, match="verdict 'zz' is not in the protocol"):
        protocol.check([stranger])
    with pytest.raises(ValueError, match="calibration seeds must be >= 10000"):
        Protocol(**{**vars(protocol), "calibration_seeds": (42,)})
    with pytest.raises(ValueError, match=r"seeds\['fast'\] must be >= 5"):
        Protocol(**{**vars(protocol), "seeds": {"fast": 3}})
    with pytest.raises(ValueError, match="names unknown claims"):
        Protocol(**{**vars(protocol), "amendments": (Amendment("2026-12-07", ("q",), "", "", ""),)})
    with pytest.raises(ValueError, match="amendment date must be YYYY-MM-DD"):
        Amendment("7 Dec", ("a",), "", "", "")
    markdown = protocol.markdown()
    assert "## Protocol" in markdown and "## Amendments" in markdown and "2026-12-07" in markdown
