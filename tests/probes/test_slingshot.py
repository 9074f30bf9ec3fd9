"""Tests for dynascope.probes.slingshot: the S13 slingshot detector on synthetic traces with
planted cycles (oracle: the planted steps), traces without cycles, input validation and the
invariances the relative criteria promise."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dynascope.probes import (
    SlingshotCycle,
    detect_slingshots,
    grok_step,
    onset_distance,
)

FAST = settings(max_examples=40, deadline=None)

# Planted trace: log N is flat, then rises at RATE per step for GROWTH steps, then flat (the
# plateau); the loss spikes by SPIKE x for SPIKE_LEN steps right where the growth ends.
ONSETS = (1000, 3000, 5000)  # planted growth onsets
GROWTH, RATE, SPIKE, SPIKE_LEN, W = 300, 5e-3, 50.0, 5, 100
# The detector dates growth onset at the first step whose trailing w-step rate exceeds tau: for a
# bend from flat to rate r that lags the bend by w * tau / r = 100 * 1e-3 / 5e-3 = 20 steps; the
# noise (sd 1e-3 in log N per step, so about 1.4e-5 per step in the windowed rate, against a
# ramp of r / w = 5e-5 per step) moves that by a step or so. Tolerance: 20 +- 5 steps.
ONSET_LAG, ONSET_TOL = 20, 5


def planted(onsets=ONSETS, n=7000, seed=0, spike_len=SPIKE_LEN, noise=1e-3):
    """Steps 0..n-1, norm, loss, and the planted spike steps (growth end)."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    log_norm = noise * rng.standard_normal(n)
    for t0 in onsets:
        log_norm += np.clip(t - t0, 0, GROWTH) * RATE
    loss = 1e-2 * np.exp(-t / 3000) * (1 + 0.1 * rng.uniform(-1, 1, n))
    for t0 in onsets:
        loss[t0 + GROWTH : t0 + GROWTH + spike_len] *= SPIKE
    return t, np.exp(log_norm), loss


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_three_planted_cycles_are_found_at_their_steps(seed):
    t, norm, loss = planted(seed=seed)
    cycles = detect_slingshots(t, norm, loss)
    assert len(cycles) == 3
    for cycle, t0 in zip(cycles, ONSETS):
        spike = t0 + GROWTH
        assert abs(cycle.start_step - (t0 + ONSET_LAG)) <= ONSET_TOL
        assert cycle.spike_step == spike  # a 50x spike is unambiguous: exact
        assert cycle.spike_end_step == spike + SPIKE_LEN - 1
        # the plateau is dated when the first whole window after the last spike step is level
        assert cycle.end_step == cycle.spike_end_step + W
        assert cycle.spike_events == 1
        # growth from the (lagged) onset to the spike: rate * (GROWTH - lag), noise 2e-3 in log
        expected = math.exp(RATE * (spike - cycle.start_step))
        assert cycle.growth_factor == pytest.approx(expected, rel=5e-3)
        assert cycle.norm_ratio == pytest.approx(cycle.growth_factor, rel=5e-3)  # flat plateau
        assert 10 < cycle.spike_magnitude < SPIKE * 1.1 / 0.9 * 1.05  # noise +-10%, decay
        assert cycle.length == cycle.end_step - cycle.start_step


def test_inputs_may_be_lists_arrays_or_tensors():
    t, norm, loss = planted()
    expected = detect_slingshots(t, norm, loss)
    assert detect_slingshots(t.tolist(), norm.tolist(), loss.tolist()) == expected
    as_tensors = [torch.from_numpy(x) for x in (t, norm, loss)]
    assert detect_slingshots(*as_tensors) == expected
    assert isinstance(expected[0], SlingshotCycle)


def test_irregular_logging_every_other_step():
    t, norm, loss = planted()
    keep = (t % 2 == 0) | np.isin(t, [t0 + GROWTH + i for t0 in ONSETS for i in range(5)])
    cycles = detect_slingshots(t[keep], norm[keep], loss[keep])
    assert [c.spike_step for c in cycles] == [t0 + GROWTH for t0 in ONSETS]
    for cycle, t0 in zip(cycles, ONSETS):
        assert abs(cycle.start_step - (t0 + ONSET_LAG)) <= ONSET_TOL + 1


def test_flat_trace_has_no_cycle():
    rng = np.random.default_rng(0)
    t = np.arange(5000)
    norm = 3.0 * np.exp(1e-3 * rng.standard_normal(t.size))
    loss = 1e-3 * (1 + 0.1 * rng.uniform(-1, 1, t.size))
    assert detect_slingshots(t, norm, loss) == []


def test_monotone_trace_has_no_cycle():
    """Norm growing fast all the way (rate 5x tau), loss falling: growth without a spike."""
    t = np.arange(5000)
    assert detect_slingshots(t, np.exp(5e-3 * t), 2.0 * np.exp(-t / 500)) == []


@pytest.mark.parametrize("seed", range(5))
def test_noise_with_loss_spikes_but_no_growth_has_no_cycle(seed):
    """log N ~ N(0, 0.01^2) i.i.d. (windowed rate ~1.4e-4 per step, far below tau = 1e-3);
    log l ~ N(0, 1) i.i.d., whose excursions do pass the 10x spike test."""
    rng = np.random.default_rng(seed)
    t = np.arange(5000)
    norm = np.exp(0.01 * rng.standard_normal(t.size))
    loss = 1e-3 * np.exp(rng.standard_normal(t.size))
    previous_min = np.minimum.accumulate(loss)[:-1]
    assert (loss[1:] > 10 * previous_min).any()  # spikes are there; growth is not
    assert detect_slingshots(t, norm, loss) == []


def test_spike_without_growth_and_growth_without_spike():
    t, norm, loss = planted()
    assert detect_slingshots(t, np.ones_like(norm), loss) == []  # spikes, flat norm
    _, _, calm = planted(spike_len=0)
    assert detect_slingshots(t, norm, calm) == []  # growth, no spike


def test_armed_by_training_accuracy():
    t, norm, loss = planted()
    accuracy = np.where(t >= 2000, 1.0, 0.5)
    cycles = detect_slingshots(t, norm, loss, accuracy=accuracy)
    assert [c.spike_step for c in cycles] == [3300, 5300]  # the spike at 1300 came before arming
    assert detect_slingshots(t, norm, loss, accuracy=np.full(t.size, 0.98)) == []
    armed_late = detect_slingshots(t, norm, loss, accuracy=accuracy, arm_accuracy=0.4)
    assert len(armed_late) == 3


def test_unfinished_cycle_is_not_reported():
    t, norm, loss = planted()
    end = ONSETS[-1] + GROWTH + SPIKE_LEN + W // 2  # the trace stops inside the last window
    cycles = detect_slingshots(t[:end], norm[:end], loss[:end])
    assert [c.spike_step for c in cycles] == [1300, 3300]


def test_spike_events_before_the_plateau_belong_to_one_cycle():
    t, norm, loss = planted(onsets=(1000,), n=3000)
    loss[1330:1333] *= SPIKE  # a second event 30 steps after the first
    (cycle,) = detect_slingshots(t, norm, loss)
    assert (cycle.spike_step, cycle.spike_end_step, cycle.spike_events) == (1300, 1332, 2)
    assert cycle.end_step == 1332 + W


def test_zero_baseline_makes_any_positive_loss_a_spike():
    t = np.arange(400)
    norm = np.exp(np.clip(t - 100, 0, 100) * RATE)
    loss = np.zeros(t.size)
    loss[200] = 1e-12
    (cycle,) = detect_slingshots(t, norm, loss)
    assert cycle.spike_step == 200 and cycle.spike_magnitude == math.inf


# -- invariance ----------------------------------------------------------------------------------
TRACE = planted()
TRACE_CYCLES = detect_slingshots(*TRACE)


@FAST
@given(
    norm_scale=st.floats(1e-6, 1e6),
    loss_scale=st.floats(1e-6, 1e6),
    shift=st.integers(-(10**6), 10**6),
)
def test_cycles_invariant_to_norm_and_loss_scale_and_step_shift(norm_scale, loss_scale, shift):
    t, norm, loss = TRACE
    cycles = detect_slingshots(t + shift, norm * norm_scale, loss * loss_scale)
    assert len(cycles) == len(TRACE_CYCLES) == 3
    for got, ref in zip(cycles, TRACE_CYCLES):
        for field in ("start_step", "spike_step", "spike_end_step", "end_step"):
            assert getattr(got, field) == getattr(ref, field) + shift
        assert got.spike_events == ref.spike_events
        for field in ("norm_start", "norm_spike", "norm_end"):
            assert getattr(got, field) == pytest.approx(getattr(ref, field) * norm_scale, rel=1e-12)
        for field in ("loss_baseline", "loss_peak"):
            assert getattr(got, field) == pytest.approx(getattr(ref, field) * loss_scale, rel=1e-12)
        assert got.growth_factor == pytest.approx(ref.growth_factor, rel=1e-12)
        assert got.spike_magnitude == pytest.approx(ref.spike_magnitude, rel=1e-12)


# -- validation ----------------------------------------------------------------------------------
finite = st.floats(0.1, 10.0)


@FAST
@given(n=st.integers(2, 30), extra=st.integers(1, 5), which=st.sampled_from(["norm", "loss"]))
def test_rejects_mismatched_lengths(n, extra, which):
    series = {"steps": np.arange(n), "norm": np.ones(n), "loss": np.ones(n)}
    series[which] = np.ones(n + extra)
    with pytest.raises(
        ValueError,
        match=rf"^{which} must have the same length as steps \(got {n + extra}, not {n}\)$",
    ):
        detect_slingshots(**series)


@FAST
@given(
    values=st.lists(finite, min_size=2, max_size=30),
    data=st.data(),
    bad=st.sampled_from([math.nan, math.inf, -math.inf]),
    which=st.sampled_from(["steps", "norm", "loss", "accuracy"]),
)
def test_rejects_nan_and_inf_naming_the_argument_and_index(values, data, bad, which):
    n = len(values)
    i = data.draw(st.integers(0, n - 1))
    series = {
        "steps": np.arange(n, dtype=float),
        "norm": np.array(values),
        "loss": np.array(values),
        "accuracy": np.zeros(n),
    }
    series[which][i] = bad
    with pytest.raises(ValueError, match=rf"^{which} must be finite \(got {bad} at index {i}\)$"):
        detect_slingshots(**series)


@FAST
@given(steps=st.lists(st.integers(-1000, 1000), min_size=2, max_size=30))
def test_rejects_steps_that_do_not_strictly_increase(steps):
    steps_array = np.array(steps)
    back = np.flatnonzero(np.diff(steps_array) <= 0)
    n = len(steps)
    if back.size == 0:
        assert detect_slingshots(steps, np.ones(n), np.ones(n)) == []
        return
    i = back[0] + 1
    with pytest.raises(
        ValueError,
        match=rf"^steps must be strictly increasing \(got steps\[{i}\]={steps[i]} after "
        rf"steps\[{i - 1}\]={steps[i - 1]}\)$",
    ):
        detect_slingshots(steps, np.ones(n), np.ones(n))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"steps": [0, 1.5, 2]}, r"^steps must be integers \(got 1\.5 at index 1\)$"),
        ({"norm": [1.0, 0.0, 1.0]}, r"^norm must be > 0 \(got 0\.0 at index 1\)$"),
        ({"loss": [1.0, 1.0, -1.0]}, r"^loss must be >= 0 \(got -1\.0 at index 2\)$"),
        ({"norm": np.ones((3, 1))}, r"^norm must be 1-D \(got shape \(3, 1\)\)$"),
        ({"loss": ["a", "b", "c"]}, r"^loss must be a 1-D sequence of numbers"),
        ({"accuracy": [1.0, 1.0]}, r"^accuracy must have the same length as steps"),
        ({"spike_factor": 1.0}, r"^spike_factor must be > 1 \(got 1\.0\)$"),
        ({"growth_rate": 0.0}, r"^growth_rate must be > 0 \(got 0\.0\)$"),
        ({"plateau_rate": -1e-3}, r"^plateau_rate must be > 0 \(got -0\.001\)$"),
        ({"window": 0}, r"^window must be >= 1 \(got 0\)$"),
    ],
)
def test_rejects_bad_input_in_one_line(kwargs, message):
    args = {"steps": [0, 1, 2], "norm": [1.0, 1.0, 1.0], "loss": [1.0, 1.0, 1.0], **kwargs}
    with pytest.raises(ValueError, match=message):
        detect_slingshots(**args)


def test_short_inputs():
    assert detect_slingshots([], [], []) == []
    assert detect_slingshots([3], [1.0], [1.0]) == []


# -- grok step -----------------------------------------------------------------------------------
def test_grok_step_and_onset_distance():
    steps = [0, 10, 20, 30]
    assert grok_step(steps, [0.1, 0.94, 0.95, 1.0]) == 20
    assert grok_step(steps, [0.1, 0.5, 0.5, 0.9]) is None
    assert grok_step(steps, [0.1, 0.5, 0.5, 0.9], threshold=0.5) == 10
    with pytest.raises(ValueError, match=r"^val_accuracy must have the same length as steps"):
        grok_step(steps, [1.0])
    cycles = detect_slingshots(*planted())
    assert onset_distance(3100, cycles) == abs(3100 - cycles[1].start_step)
    assert onset_distance(0, []) is None
