"""coord_check (on the engine), CoordProbe, coord_summary and the plot against hand-computed cases.

Oracle: a bias-free linear model y = x @ W with plain SGD on (1/2)·mean‖y − t‖²: the gradient
is xᵀ(y − t)/n, so every record is a closed form from the W the factory drew (float32,
tolerance 1e-6 relative; the two seeds are one ensemble, batched matmuls round differently).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from dynascope.probes.base import ProbeContext
from dynascope.probes.coordcheck import CoordProbe, CoordRecord, coord_summary, plot_coord_check
from dynascope.train import coord_check


class _Linear(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.W = nn.Parameter(torch.randn(3, width))

    def forward(self, x):
        return x @ self.W


def _loss(out, target):
    return 0.5 * ((out - target) ** 2).sum(-1).mean()


def test_records_match_the_hand_computed_linear_model():
    x, target = torch.randn(4, 3), torch.randn(4, 5)
    drawn = []

    def factory(width):
        model = _Linear(width)
        drawn.append(model.W.detach().clone())
        return model

    records = coord_check(
        factory,
        [5],
        (x, target.clone()),
        loss_fn=_loss,
        make_optimizer=lambda m, w: torch.optim.SGD(m.parameters(), lr=0.1),
        nsteps=3,
        nseeds=2,
    )
    assert len(records) == 2 * 3  # 2 seeds × 3 steps × one module ("output")
    assert len(drawn) == 2 and not torch.equal(drawn[0], drawn[1])  # one W per seed
    for seed, W in zip((0, 1), drawn):
        y0 = x @ W
        for t in (1, 2, 3):
            y = x @ W
            rec = next(r for r in records if r.seed == seed and r.t == t)
            assert rec.module == "output" and rec.width == 5
            assert rec.l1 == pytest.approx(float(y.abs().mean()), rel=1e-6)
            assert rec.rel_change == pytest.approx(float((y - y0).norm() / y0.norm()), abs=1e-6)
            W = W - 0.1 * x.T @ (y - target) / 4


def test_hooks_record_every_named_submodule_and_seeds_are_reproducible():
    def factory(width):
        return nn.Sequential(nn.Linear(3, width), nn.ReLU(), nn.Linear(width, 2))

    kw = dict(
        loss_fn=nn.functional.cross_entropy,
        make_optimizer=lambda m, w: torch.optim.Adam(m.parameters(), lr=1e-2),
        nsteps=2,
        nseeds=1,
    )
    batch = (torch.randn(6, 3), torch.randint(2, (6,)))
    first = coord_check(factory, [4, 8], batch, **kw)
    assert {r.module for r in first} == {"0", "1", "2", "output"}
    assert first == coord_check(factory, [4, 8], batch, **kw)
    shifted = coord_check(factory, [4, 8], batch, seed_offset=5, **kw)
    assert {r.seed for r in shifted} == {5}
    assert shifted != first  # another seed, another initialisation
    once = coord_check(factory, [4], batch, **{**kw, "nsteps": 1})
    assert {r.t for r in once} == {1} and len(once) == 4
    assert all(r.rel_change == 0.0 for r in once)


def test_probe_keeps_its_reference_through_a_state_dict():
    model = nn.Linear(3, 2, bias=False)
    x = torch.randn(5, 3)
    probe = CoordProbe()
    first = probe(model, ProbeContext(0, {"x": x}))
    assert first["rel.output"] == 0.0
    with torch.no_grad():
        model.weight.mul_(2.0)
    restored = CoordProbe()
    restored.load_state_dict(probe.state_dict())
    second = restored(model, ProbeContext(1, {"x": x}))
    assert second["l1.output"] == pytest.approx(2 * first["l1.output"], rel=1e-6)
    assert second["rel.output"] == pytest.approx(1.0, rel=1e-6)  # ||2y - y|| / ||y||
    with pytest.raises(ValueError, match="ctx.batch"):
        CoordProbe()(model, ProbeContext(0, None))


def test_summary_recovers_a_power_law_and_flags_zeros():
    widths = [16, 64, 256]
    records = [
        CoordRecord(w, s, "h", 1, 2.0 * w**0.5 * (1 + 0.1 * s), 0.0)
        for w in widths
        for s in range(2)
    ]
    records += [CoordRecord(w, 0, "zero", 1, 0.0, math.nan) for w in widths]
    rows = {r["module"]: r for r in coord_summary(records)}
    assert rows["h"]["slope"] == pytest.approx(0.5, abs=1e-12)
    assert rows["h"]["width_ratio"] == pytest.approx(4.0)
    assert rows["h"]["spread"] == pytest.approx(4.0)
    assert math.isnan(rows["zero"]["slope"]) and math.isnan(rows["zero"]["spread"])


def test_bad_arguments_are_refused():
    kw = dict(loss_fn=_loss, make_optimizer=lambda m, w: torch.optim.SGD(m.parameters(), lr=0.1))
    batch = (torch.randn(2, 3), torch.randn(2, 4))
    with pytest.raises(ValueError, match="widths must be a non-empty list of positive ints"):
        coord_check(_Linear, [], batch, **kw)
    with pytest.raises(ValueError, match="widths must be"):
        coord_check(_Linear, [0, 4], batch, **kw)
    with pytest.raises(ValueError, match="nsteps must be >= 1"):
        coord_check(_Linear, [4], batch, nsteps=0, **kw)
    with pytest.raises(ValueError, match="nseeds must be >= 1"):
        coord_check(_Linear, [4], batch, nseeds=0, **kw)
    with pytest.raises(ValueError, match="stat must be 'l1' or 'rel_change'"):
        coord_summary([], stat="l2")


def test_plot_has_one_log_log_panel_per_step():
    import matplotlib.pyplot as plt

    records = [CoordRecord(w, 0, "h", t, float(w * t), 0.0) for w in (8, 16) for t in (1, 2, 3)]
    fig = plot_coord_check(records, title="x")
    axes = fig.axes
    assert [ax.get_title() for ax in axes] == ["t = 1", "t = 2", "t = 3"]
    assert all(ax.get_xscale() == "log" and ax.get_yscale() == "log" for ax in axes)
    np.testing.assert_allclose(axes[1].lines[0].get_ydata(), [16.0, 32.0])
    plt.close(fig)
    with pytest.raises(ValueError, match="axes must hold one panel per step"):
        plot_coord_check(records, axes=axes[:1])
