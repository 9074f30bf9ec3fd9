"""The verdict contract (``studies/verdict.py``): every rule of ``judge`` against a hand count.

Oracle: the rules restated independently here (``_expected_status``: a plain count of passing
seeds and the mean of the finite ones), checked by hypothesis over seed values that include NaN,
inf, values equal to the threshold and both directions; plus hand-built cases for each rule.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynascope.studies.base import StudyOutcome, dump_json
from dynascope.studies.verdict import Control, Precondition, Verdict, judge, seed_passes

MET = Precondition("nothing beyond three seeds", met=True)
FAILS = Control("a control far on the failing side", measured=100.0)  # fails "<= 1"


def _value(v: float, threshold: float, direction: str) -> bool:
    if not math.isfinite(v):
        return False
    return v <= threshold if direction == "<=" else v >= threshold


def _expected_status(values, threshold, direction, met, control_status):
    finite = [v for v in values if math.isfinite(v)]
    n_pass = sum(_value(v, threshold, direction) for v in values)
    mean = sum(finite) / len(finite) if finite else math.nan
    holds = _value(mean, threshold, direction) and 3 * n_pass >= 2 * len(values)
    if len(finite) < 3 or not met or control_status == "held":
        return "inconclusive"
    if holds and control_status == "inconclusive":
        return "inconclusive"
    return "held" if holds else "not held"


values_st = st.lists(
    st.one_of(
        st.floats(-10, 10),
        st.sampled_from([1.0, math.nan, math.inf, -math.inf]),
    ),
    min_size=0,
    max_size=7,
)


@settings(max_examples=300, deadline=None)
@given(
    values=values_st,
    control=values_st,
    direction=st.sampled_from(["<=", ">="]),
    met=st.booleans(),
)
def test_status_follows_the_documented_rules(values, control, direction, met):
    threshold = 1.0  # values of exactly 1.0 are drawn often: equality is exercised
    v = judge(
        claim="x: y",
        metric="m",
        per_seed=dict(enumerate(values)),
        threshold=threshold,
        direction=direction,
        precondition=Precondition("p", met=met),
        control=Control("c", per_seed={100 + i: c for i, c in enumerate(control)}),
    )
    finite_c = [c for c in control if math.isfinite(c)]
    c_pass = sum(_value(c, threshold, direction) for c in control)
    c_mean = sum(finite_c) / len(finite_c) if finite_c else math.nan
    if len(finite_c) < 3:
        c_status = "inconclusive"
    elif _value(c_mean, threshold, direction) and 3 * c_pass >= 2 * len(control):
        c_status = "held"
    else:
        c_status = "not held"
    assert v.control.status == c_status
    assert v.status == _expected_status(values, threshold, direction, met, c_status)
    assert v.passed == (v.status == "held")
    assert v.seeds == tuple(range(len(values)))
    if v.status == "inconclusive":
        assert v.reason
    finite = [x for x in values if math.isfinite(x)]
    if finite:
        assert v.measured == pytest.approx(sum(finite) / len(finite))
        assert v.spread["min"] == min(finite) and v.spread["max"] == max(finite)
    else:
        assert math.isnan(v.measured)
    assert v.spread["n_finite"] == len(finite)


def _judge(values, *, direction="<=", met=True, control=FAILS, rule="mean_and_2of3"):
    return judge(
        claim="c1: a claim",
        metric="m",
        per_seed=dict(enumerate(values)),
        threshold=1.0,
        direction=direction,
        precondition=Precondition("p", met=met, measured=0.5),
        control=control,
        rule=rule,
    )


def test_equality_passes_in_both_directions():
    assert seed_passes(1.0, 1.0, "<=") and seed_passes(1.0, 1.0, ">=")
    assert _judge([1.0, 1.0, 1.0]).status == "held"
    assert _judge([1.0, 1.0, 1.0], direction=">=", control=Control("c", measured=-5.0)).passed


def test_direction_is_respected():
    assert _judge([0.5, 0.6, 0.7]).status == "held"
    assert _judge([0.5, 0.6, 0.7], direction=">=", control=Control("c", measured=-5)).status == (
        "not held"
    )


def test_a_control_that_holds_makes_the_claim_inconclusive():
    v = _judge([0.1, 0.2, 0.3], control=Control("no mechanism", per_seed={7: 0.5, 8: 0.5, 9: 2}))
    assert v.control.status == "held" and v.status == "inconclusive" and not v.passed
    assert "control also holds" in v.reason
    assert v.control.measured == pytest.approx(1.0)


def test_fewer_than_three_finite_seeds_is_inconclusive_never_held():
    for values in ([0.1, 0.2], [0.1, 0.2, math.nan], [], [0.1, math.inf, -math.inf]):
        v = _judge(values)
        assert v.status == "inconclusive" and "seeds finite" in v.reason, values


def test_a_failed_precondition_is_inconclusive():
    v = _judge([0.1, 0.2, 0.3], met=False)
    assert v.status == "inconclusive" and v.reason == "precondition not met: p [measured 0.5]"
    measured = judge(
        claim="c", metric="m", per_seed={0: 0.1, 1: 0.2, 2: 0.3}, threshold=0.5, direction="<=",
        precondition=Precondition("train R² >= 0.9", met=False, measured=0.52731), control=FAILS,
    )  # fmt: skip
    assert measured.reason == "precondition not met: train R² >= 0.9 [measured 0.5273]"


def test_nan_seeds_count_as_failing():
    assert _judge([0.1, 0.2, 5.0]).status == "not held"  # 2 of 3 pass; the mean 1.77 fails
    assert _judge([0.1, 0.2, 1.5]).status == "held"  # 2 of 3 pass; the mean 0.6 passes
    assert _judge([0.1, 0.2, 0.3, math.nan]).status == "held"  # 3 of 4 >= 2/3
    assert _judge([0.1, 0.2, 0.3, math.nan, math.nan]).status == "not held"  # 3 of 5 < 2/3
    assert _judge([0.1, 0.2, 0.3, math.nan], rule="all_seeds").status == "not held"


def test_two_of_three_and_the_mean_are_both_needed():
    assert _judge([0.0, 0.0, 2.5]).status == "held"  # mean 0.83, 2 of 3
    assert _judge([-3.0, 2.0, 2.0]).status == "not held"  # mean passes, 1 of 3
    assert _judge([0.9, 0.9, 1.3]).status == "not held"  # 2 of 3 pass; the mean 1.033 fails
    assert _judge([0.9, 0.9, 1.3]).measured == pytest.approx(31 / 30)


def test_inconclusive_control_blocks_held_but_not_not_held():
    unjudgeable = Control("two seeds", per_seed={0: 5.0, 1: 5.0})
    assert _judge([0.1, 0.2, 0.3], control=unjudgeable).status == "inconclusive"
    assert _judge([3.0, 2.0, 2.0], control=unjudgeable).status == "not held"


def test_bad_input_is_a_one_line_error():
    with pytest.raises(ValueError, match="direction must be one of"):
        _judge([0.1, 0.2, 0.3], direction="<")
    with pytest.raises(ValueError, match="rule must be one of"):
        _judge([0.1, 0.2, 0.3], rule="median")
    with pytest.raises(ValueError, match="give per_seed or a measured value"):
        _judge([0.1, 0.2, 0.3], control=Control("nothing"))
    with pytest.raises(ValueError, match="per_seed: must map seed"):
        judge(claim="c", metric="m", per_seed=[0.1], threshold=1.0, direction="<=",
              precondition=MET, control=FAILS)  # fmt: skip
    with pytest.raises(ValueError, match="threshold must be finite"):
        judge(claim="c", metric="m", per_seed={0: 0.1}, threshold=math.nan, direction="<=",
              precondition=MET, control=FAILS)  # fmt: skip
    with pytest.raises(ValueError, match="contradicts status"):
        Verdict("c", "m", 0.1, 1.0, True, status="not held", direction="<=")
    with pytest.raises(ValueError, match="status must be one of"):
        Verdict("c", "m", 0.1, 1.0, status="passed", direction="<=")
    with pytest.raises(ValueError, match="needs status or passed"):
        Verdict("c", "m", 0.1, 1.0)


def test_legacy_constructor_still_works_and_is_marked():
    v = Verdict("c2: flat", "spread", 1.2, 1.5, True, "measured <= threshold; worst at W1")
    assert v.legacy and v.status == "held" and v.passed and v.direction == "<="
    assert v.seeds == () and v.control is None and v.precondition is None
    assert Verdict("c", "m", 3.0, 1.0, False, "measured > threshold").direction == ">"
    assert Verdict("c", "m", 3.0, 1.0, False).direction == "unknown"
    assert not _judge([0.1, 0.2, 0.3]).legacy


def test_verdict_json_records_every_field_and_is_strict():
    v = _judge([0.1, math.nan, 0.3, 0.2])
    outcome = StudyOutcome("s", "fast", [v], [], 1.0, out=None, seed=1000)  # type: ignore[arg-type]
    data = json.loads(dump_json(outcome.to_json()), parse_constant=pytest.fail)
    assert data["seed"] == 1000 and data["status"] == "held"
    claim = data["claims"][0]
    assert claim["status"] == "held" and claim["passed"] is True and claim["direction"] == "<="
    assert claim["seeds"] == [0, 1, 2, 3] and claim["per_seed"][1] is None
    assert claim["spread"]["n_finite"] == 3
    assert claim["spread"]["std"] == pytest.approx(0.1)
    assert claim["spread"]["min"] == 0.1 and claim["spread"]["max"] == 0.3
    assert claim["precondition"] == {"text": "p", "met": True, "measured": 0.5}
    assert claim["control"]["status"] == "not held" and claim["control"]["measured"] == 100.0
    assert claim["aggregation"].startswith("the mean over seeds passes")
    assert claim["legacy"] is False
    legacy = Verdict("c", "m", math.nan, 1.0, False, "measured >= threshold").to_json()
    assert legacy["legacy"] is True and legacy["control"] is None and legacy["seeds"] == []


def test_outcome_status_is_held_only_when_every_claim_held():
    held, bad = _judge([0.1, 0.2, 0.3]), _judge([3.0, 2.0, 2.0])
    unsure = _judge([0.1, 0.2])
    make = lambda claims: StudyOutcome("s", "fast", claims, [], 0.0, out=None)  # noqa: E731
    assert make([held]).status == "held"
    assert make([held, unsure]).status == "inconclusive"
    assert make([held, unsure, bad]).status == "not held"
