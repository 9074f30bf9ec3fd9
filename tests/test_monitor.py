"""Monitor and schedules."""

from __future__ import annotations

import pytest
import torch

from dynascope.monitor import EveryN, LogSchedule, Monitor
from dynascope.probes import Probe, ProbeContext


class _Counter(Probe):
    name = "counter"

    def __init__(self):
        self.steps = []

    def measure(self, model, ctx: ProbeContext):
        self.steps.append(ctx.step)
        return {"count": float(len(self.steps))}


class _ListSink:
    def __init__(self):
        self.rows = []

    def log(self, step, values):
        self.rows.append((step, dict(values)))


def test_every_n_schedule():
    s = EveryN(5)
    assert [t for t in range(21) if s.due(t)] == [0, 5, 10, 15, 20]
    with pytest.raises(ValueError, match="every must be >= 1"):
        EveryN(0)


def test_log_schedule_is_log_spaced_deduplicated_and_includes_ends():
    s = LogSchedule(1000, 10)
    due = sorted(s.steps)
    assert due[0] == 0 and due[1] == 1 and due[-1] == 1000
    ratios = [b / a for a, b in zip(due[1:], due[2:])]
    assert max(ratios) / min(ratios) < 1.5  # geometric spacing up to rounding
    assert len(LogSchedule(3, 50).steps) == 4  # 0, 1, 2, 3 after deduplication
    with pytest.raises(ValueError, match="start <= stop"):
        LogSchedule(0, 5)


def test_monitor_runs_probes_only_when_due():
    probe, sink = _Counter(), _ListSink()
    monitor = Monitor(torch.nn.Linear(2, 2), [probe], EveryN(3), sink)
    ran = [monitor.step(t) for t in range(7)]
    assert ran == [True, False, False, True, False, False, True]
    assert probe.steps == [0, 3, 6]
    assert sink.rows == [(0, {"count": 1.0}), (3, {"count": 2.0}), (6, {"count": 3.0})]


def test_monitor_hands_its_loss_to_the_probes():
    seen = []

    class _LossReader(Probe):
        name = "loss_reader"

        def measure(self, model, ctx: ProbeContext):
            seen.append(ctx.loss)
            return {}

    def loss(output, batch):
        return output.sum()

    model = torch.nn.Linear(2, 1)
    Monitor(model, [_LossReader()], EveryN(1), _ListSink(), loss=loss).step(0)
    Monitor(model, [_LossReader()], EveryN(1), _ListSink()).step(0)
    assert seen == [loss, None]


def test_colliding_probe_keys_are_an_error_naming_both_probes():
    """Issue 20: two QK spectra with different abs_tol both emit ``qk.mean.rank_abs``; the
    second silently overwrote the first (6.0 logged where the first measured 8.0)."""
    from dynascope.nn import Transformer
    from dynascope.probes import QKSpectrum

    torch.manual_seed(0)
    model = Transformer(n_layers=1, d_model=8, n_heads=2, d_vocab=11, d_out=3, n_ctx=5)
    sink = _ListSink()
    probes = [QKSpectrum(abs_tol=1e-6, per_head=False), QKSpectrum(abs_tol=1.0, per_head=False)]
    monitor = Monitor(model, probes, EveryN(1), sink)
    with pytest.raises(
        ValueError,
        match=r"probes\[0\] QKSpectrum\(name='qk_spectrum'\) and probes\[1\] QKSpectrum\(name="
        r"'qk_spectrum'\) both emit key 'qk\.mean\.rank_1e-2' at step 0",
    ):
        monitor.step(0)
    assert sink.rows == []  # nothing half-written
    # Distinct keys pass through unchanged.
    Monitor(model, [QKSpectrum(per_head=False), _Counter()], EveryN(1), sink).step(1)
    assert sink.rows[0][1]["count"] == 1.0 and "qk.mean.rank_abs" in sink.rows[0][1]


def test_ntk_drift_stepped_without_inputs_raises_like_attention_entropy():
    """Issue 20: the HF callback calls ``monitor.step(t)`` with no batch; NTKDrift logged empty
    records with no warning while AttentionEntropy raised."""
    from dynascope.probes import AttentionEntropy, NTKDrift

    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    for probe, name in ((NTKDrift(), "ntk_drift"), (AttentionEntropy(), "attention_entropy")):
        sink = _ListSink()
        with pytest.raises(ValueError, match=rf"{name} needs inputs: pass x= .*\(got no batch\)"):
            Monitor(model, [probe], EveryN(1), sink).step(0)
        assert sink.rows == []
