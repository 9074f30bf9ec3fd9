"""The verdict contract (``studies/verdict.py``): interval statuses against independent oracles.

Oracles: published interval values (Wilson 0/10 and 10/10 from Brown, Cai & DasGupta 2001;
a Student-t interval with t_{0.975,4} = 2.7764451 from the table), the rules restated here
with a plain t-quantile from the table and a hand-written Wilson formula (``_expected``),
checked by hypothesis over seed values that include NaN, inf and values at the threshold;
plus hand-built cases for each rule.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynascope.studies.base import StudyOutcome, dump_json
from dynascope.studies.verdict import (
    Control,
    Precondition,
    Verdict,
    interval_status,
    judge,
    mean_interval,
    seed_passes,
    wilson_interval,
)

MET = Precondition("nothing beyond five seeds", met=True)
# t_{0.975, n-1} for n = 2..8 (printed tables, e.g. Abramowitz & Stegun Table 26.10)
T975 = {2: 12.7062047, 3: 4.3026527, 4: 3.1824463, 5: 2.7764451, 6: 2.5705818, 7: 2.4469119,
        8: 2.3646243}  # fmt: skip
FAILS = {100 + i: 100.0 + i for i in range(5)}  # fails "<= 1" with a tight interval


def _ablation(values=FAILS) -> Control:
    return Control("the cause removed", dict(values))


def _t_interval(values):
    finite = [v for v in values if math.isfinite(v)]
    n = len(finite)
    if n < 2:
        return (math.nan, math.nan)
    mean = sum(finite) / n
    s = math.sqrt(sum((v - mean) ** 2 for v in finite) / (n - 1))
    half = T975[n] * s / math.sqrt(n)
    return (mean - half, mean + half)


def _side(lo, hi, threshold, direction):
    if math.isnan(lo):
        return "inconclusive"
    if direction == "<=":
        return "held" if hi <= threshold else ("not held" if lo > threshold else "inconclusive")
    return "held" if lo >= threshold else ("not held" if hi < threshold else "inconclusive")


def _expected(values, control, threshold, direction, met):
    finite = [v for v in values if math.isfinite(v)]
    c_finite = [v for v in control if math.isfinite(v)]
    c_side = _side(*_t_interval(control), threshold, direction)
    c_status = "inconclusive" if len(c_finite) < 5 else c_side
    side = _side(*_t_interval(values), threshold, direction)
    if len(finite) < 5 or not met or side == "inconclusive" or c_status == "held":
        return "inconclusive", c_status
    if side == "held" and c_status == "inconclusive":
        return "inconclusive", c_status
    return side, c_status


def test_wilson_interval_matches_published_values():
    # Brown, Cai & DasGupta (2001): n = 10, k = 0 -> [0, 0.2775]; k = 10 -> [0.7225, 1]
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.27753), abs=1e-5)
    assert wilson_interval(10, 10) == pytest.approx((0.72247, 1.0), abs=1e-5)
    # k = 12, n = 15: p = 0.8, z = 1.959964: hand-evaluated formula
    z = 1.959964
    centre = (0.8 + z * z / 30) / (1 + z * z / 15)
    half = z * math.sqrt(0.8 * 0.2 / 15 + z * z / 900) / (1 + z * z / 15)
    assert wilson_interval(12, 15) == pytest.approx((centre - half, centre + half), abs=1e-6)
    assert all(math.isnan(x) for x in wilson_interval(0, 0))
    with pytest.raises(ValueError, match=r"k must be in \[0, n\] \(got k=6, n=5\)"):
        wilson_interval(6, 5)


def test_mean_interval_matches_the_t_table():
    lo, hi = mean_interval([1.0, 2.0, 3.0, 4.0, 5.0])  # mean 3, s = √2.5
    half = 2.7764451 * math.sqrt(2.5) / math.sqrt(5)
    assert (lo, hi) == pytest.approx((3 - half, 3 + half), abs=1e-6)
    assert mean_interval([2.0] * 5) == (2.0, 2.0)  # no spread: a point
    # NaN left out: [1, 3] has mean 2, s = √2, half = t_{0.975,1} · √2 / √2
    assert mean_interval([1.0, math.nan, 3.0]) == pytest.approx((2 - 12.7062047, 2 + 12.7062047))
    assert all(math.isnan(x) for x in mean_interval([1.0, math.nan]))
    assert mean_interval([1e308, -1e308, 1e308]) == (-math.inf, math.inf)  # overflowing spread


def test_interval_status_touching_counts_straddling_does_not():
    assert interval_status((0.2, 1.0), 1.0, "<=") == "held"
    assert interval_status((1.0, 3.0), 1.0, ">=") == "held"
    assert interval_status((1.0 + 1e-12, 2.0), 1.0, "<=") == "not held"
    assert interval_status((0.5, 1.5), 1.0, "<=") == "inconclusive"
    assert interval_status((math.nan, math.nan), 1.0, ">=") == "inconclusive"


values_st = st.lists(
    st.one_of(st.floats(-10, 10), st.sampled_from([1.0, math.nan, math.inf, -math.inf])),
    min_size=0,
    max_size=8,
)


@settings(max_examples=300, deadline=None)
@given(values=values_st, control=values_st, direction=st.sampled_from(["<=", ">="]),
       met=st.booleans())  # fmt: skip
def test_status_follows_the_documented_rules(values, control, direction, met):
    v = judge(
        claim="x: y", metric="m", per_seed=dict(enumerate(values)), threshold=1.0,
        direction=direction, precondition=Precondition("p", met=met),
        control=Control("c", {100 + i: c for i, c in enumerate(control)}),
    )  # fmt: skip
    status, c_status = _expected(values, control, 1.0, direction, met)
    if not _near_boundary(values, 1.0) and not _near_boundary(control, 1.0):
        assert v.control.status == c_status
        assert v.status == status
    assert v.passed == (v.status == "held")
    assert v.seeds == tuple(range(len(values)))
    assert v.status != "inconclusive" or v.reason
    finite = [x for x in values if math.isfinite(x)]
    assert v.n_seeds == len(finite)
    if finite:
        assert v.measured == pytest.approx(sum(finite) / len(finite))
    else:
        assert math.isnan(v.measured)


def _near_boundary(values, threshold) -> bool:
    """An interval end within rounding of the threshold: the oracle's 8-digit t may differ."""
    lo, hi = _t_interval(values)
    return any(math.isfinite(x) and abs(x - threshold) < 1e-6 for x in (lo, hi))


def _judge(values, *, direction="<=", met=True, control=None, **kwargs):
    return judge(
        claim="c1: a claim",
        metric="m",
        per_seed=dict(enumerate(values)),
        threshold=1.0,
        direction=direction,
        precondition=Precondition("p", met=met, measured=0.5),
        control=_ablation() if control is None else control,
        **kwargs,
    )


def test_interval_on_the_claimed_side_holds_and_straddling_is_inconclusive():
    assert _judge([0.1, 0.2, 0.3, 0.2, 0.1]).status == "held"
    v = _judge([0.1, 0.2, 0.3, 0.2, 2.5])  # mean 0.66, but s = 1.04: the interval reaches 1.96
    assert v.status == "inconclusive" and "straddles the threshold 1" in v.reason
    assert _judge([3.0, 2.5, 2.0, 2.2, 2.9]).status == "not held"
    assert _judge([1.0] * 5).status == "held"  # a point interval at the threshold: equality
    up = _judge([3.0, 2.5, 2.0, 2.2, 2.9], direction=">=", control=_ablation({i: -5.0 + i * 0.1 for i in range(5)}))  # fmt: skip
    assert up.status == "held" and up.control.status == "not held"


def test_a_control_that_holds_makes_the_claim_inconclusive():
    v = _judge([0.1, 0.2, 0.3, 0.2, 0.1], control=_ablation({i: 0.5 for i in range(5)}))
    assert v.control.status == "held" and v.status == "inconclusive" and not v.passed
    assert "control also holds" in v.reason
    assert v.control.measured == pytest.approx(0.5) and v.control.interval == (0.5, 0.5)
    assert v.control.kind == "ablation" and v.control.n_seeds == 5


def test_fewer_than_five_finite_seeds_is_inconclusive_never_held():
    for values in ([0.1, 0.2, 0.1, 0.2], [0.1, 0.2, 0.1, 0.2, math.nan], [], [0.1, math.inf]):
        v = _judge(values)
        assert v.status == "inconclusive" and "seeds finite (need 5)" in v.reason, values


def test_a_failed_precondition_is_inconclusive():
    v = _judge([0.1, 0.2, 0.3, 0.2, 0.1], met=False)
    assert v.status == "inconclusive" and v.reason == "precondition not met: p [measured 0.5]"


def test_inconclusive_control_blocks_held_but_not_not_held():
    unjudgeable = _ablation({0: 5.0, 1: 5.0})  # two seeds: cannot be judged
    assert _judge([0.1, 0.2, 0.3, 0.2, 0.1], control=unjudgeable).status == "inconclusive"
    assert _judge([3.0, 2.0, 2.0, 2.5, 2.2], control=unjudgeable).status == "not held"


def test_a_rate_claim_reads_the_wilson_interval_of_passing_seeds():
    cycles = {s: c for s, c in enumerate([2, 2, 1, 2, 2, 2, 2, 2, 2, 2])}  # 9 of 10 pass
    fewer = {100 + s: c for s, c in enumerate([1, 1, 0, 1, 2, 1, 1, 1, 0, 1])}  # 1 of 10
    v = judge(
        claim="s1: two cycles", metric="cycles", per_seed=cycles, threshold=0.5, direction=">=",
        precondition=MET, control=Control("float64", fewer), statistic="rate",
        seed_threshold=2, seed_direction=">=",
    )  # fmt: skip
    assert v.measured == pytest.approx(0.9) and v.n_seeds == 10
    assert v.interval == pytest.approx(wilson_interval(9, 10))
    assert v.interval[0] == pytest.approx(0.59585, abs=1e-4)  # published: 9/10 -> [0.596, 0.982]
    assert v.status == "held" and v.control.status == "not held"
    assert v.control.measured == pytest.approx(0.1)
    assert v.to_json()["seed_threshold"] == 2 and v.to_json()["statistic"] == "rate"
    nan_fails = judge(
        claim="s1: x", metric="m", per_seed={i: math.nan for i in range(5)}, threshold=0.5,
        direction=">=", precondition=MET, control=Control("c", fewer), statistic="rate",
        seed_threshold=2, seed_direction=">=",
    )  # fmt: skip
    assert nan_fails.measured == 0.0 and nan_fails.status == "inconclusive"


def test_an_identity_check_needs_no_control_and_a_finding_does():
    v = judge(claim="g1: rnn = attention", metric="max |Δ|", per_seed={i: 1e-15 for i in range(5)},
              threshold=1e-10, direction="<=", precondition=MET, control=None, kind="identity")  # fmt: skip
    assert v.status == "held" and v.kind == "identity" and v.control is None
    assert v.to_json()["kind"] == "identity" and v.to_json()["control"] is None
    with pytest.raises(ValueError, match="a finding needs an ablation control"):
        judge(claim="a: x", metric="m", per_seed={0: 1.0}, threshold=1.0, direction="<=",
              precondition=MET, control=None)  # fmt: skip


def test_bad_input_is_a_one_line_error():
    with pytest.raises(ValueError, match="direction must be one of"):
        _judge([0.1] * 5, direction="<")
    with pytest.raises(ValueError, match="statistic must be one of mean, rate"):
        _judge([0.1] * 5, statistic="median")
    with pytest.raises(ValueError, match="statistic 'rate' needs seed_threshold"):
        _judge([0.1] * 5, statistic="rate")
    with pytest.raises(ValueError, match=r"threshold of a rate must be in \[0, 1\]"):
        judge(claim="c", metric="m", per_seed={0: 1}, threshold=2.0, direction=">=",
              precondition=MET, control=_ablation(), statistic="rate", seed_threshold=1,
              seed_direction=">=")  # fmt: skip
    with pytest.raises(ValueError, match="kind must be one of finding, identity"):
        _judge([0.1] * 5, kind="check")
    with pytest.raises(ValueError, match="give per_seed"):
        _judge([0.1] * 5, control=Control("nothing"))
    with pytest.raises(ValueError, match="control kind must be ablation"):
        Control("untrained twin", {0: 1.0}, kind="untrained")
    with pytest.raises(ValueError, match="per_seed: must map seed"):
        judge(claim="c", metric="m", per_seed=[0.1], threshold=1.0, direction="<=",
              precondition=MET, control=_ablation())  # fmt: skip
    with pytest.raises(ValueError, match="threshold must be finite"):
        judge(claim="c", metric="m", per_seed={0: 0.1}, threshold=math.nan, direction="<=",
              precondition=MET, control=_ablation())  # fmt: skip
    with pytest.raises(ValueError, match="contradicts status"):
        Verdict("c", "m", 0.1, 1.0, True, status="not held", direction="<=")
    with pytest.raises(ValueError, match="status must be one of"):
        Verdict("c", "m", 0.1, 1.0, status="passed", direction="<=")
    with pytest.raises(ValueError, match="needs status or passed"):
        Verdict("c", "m", 0.1, 1.0)


def test_seed_passes_equality_and_nan():
    assert seed_passes(1.0, 1.0, "<=") and seed_passes(1.0, 1.0, ">=")
    assert not seed_passes(math.nan, 1.0, "<=")


def test_legacy_constructor_still_reads_old_verdicts():
    v = Verdict("c2: flat", "spread", 1.2, 1.5, True, "measured <= threshold; worst at W1")
    assert v.legacy and v.status == "held" and v.passed and v.direction == "<="
    assert v.seeds == () and v.control is None and v.precondition is None
    assert not _judge([0.1] * 5).legacy


def test_verdict_json_records_every_field_and_is_strict():
    v = _judge([0.1, math.nan, 0.3, 0.2, 0.2, 0.2])
    outcome = StudyOutcome("s", "fast", [v], [], 1.0, out=None, seed=1000)  # type: ignore[arg-type]
    data = json.loads(dump_json(outcome.to_json()), parse_constant=pytest.fail)
    assert data["seed"] == 1000 and data["status"] == "held" and data["protocol"] is None
    claim = data["claims"][0]
    assert claim["status"] == "held" and claim["passed"] is True and claim["direction"] == "<="
    assert claim["kind"] == "finding" and claim["amended"] is False
    assert claim["n_seeds"] == 5 and claim["interval"] == pytest.approx(_t_interval([0.1, 0.3, 0.2, 0.2, 0.2]))  # fmt: skip
    assert claim["seeds"] == [0, 1, 2, 3, 4, 5] and claim["per_seed"][1] is None
    assert claim["spread"]["n_finite"] == 5
    assert claim["precondition"] == {"text": "p", "met": True, "measured": 0.5}
    control = claim["control"]
    assert control["status"] == "not held" and control["kind"] == "ablation"
    assert control["measured"] == 102.0 and control["n_seeds"] == 5
    assert control["interval"] == pytest.approx(_t_interval(list(FAILS.values())))
    assert claim["statistic"] == "mean" and claim["aggregation"].startswith("mean over seeds")


def test_outcome_status_is_held_only_when_every_claim_held():
    held, bad = _judge([0.1, 0.2, 0.3, 0.2, 0.1]), _judge([3.0, 2.0, 2.0, 2.5, 2.2])
    unsure = _judge([0.1, 0.2])
    make = lambda claims: StudyOutcome("s", "fast", claims, [], 0.0, out=None)  # noqa: E731
    assert make([held]).status == "held"
    assert make([held, unsure]).status == "inconclusive"
    assert make([held, unsure, bad]).status == "not held"
