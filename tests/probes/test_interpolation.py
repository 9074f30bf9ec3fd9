"""Interpolation and evaluation run the networks in eval mode and restore the caller's mode.

Regression for issue 20: ``evaluate``/``interpolate`` ran the model in whatever mode it was in;
a chain with ``nn.Dropout`` gave endpoint losses 0.008 nats off the eval losses, and two
identical calls differed by 0.010 nats. Oracle: the NLL of each end network computed by hand
in eval mode (``F.cross_entropy`` of its logits), float64; equal to 1e-12 (same arithmetic),
and two identical calls bitwise equal.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

from dynascope.probes.permutation import evaluate, interpolate

F64 = torch.float64
TOL = dict(rtol=0, atol=1e-12)


def _chain(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(5, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 16), nn.ReLU(),
        nn.Dropout(0.5), nn.Linear(16, 3),
    ).to(F64)  # fmt: skip


def _data():
    g = torch.Generator().manual_seed(7)
    return torch.randn(64, 5, generator=g, dtype=F64), torch.randint(0, 3, (64,), generator=g)


def _eval_nll(model, x, y):
    was = model.training
    model.eval()
    with torch.no_grad():
        loss = F.cross_entropy(model(x), y)
    model.train(was)
    return loss


def test_evaluate_uses_eval_mode_and_restores_train_mode():
    model, (x, y) = _chain(0).train(), _data()
    model[2].eval()  # a mixed-mode caller: each submodule gets its own flag back
    first, second = evaluate(model, x, y), evaluate(model, x, y)
    assert [m.training for m in model.modules()] == [m is not model[2] for m in model.modules()]
    assert_close(first["loss"], _eval_nll(model, x, y), **TOL)
    assert torch.equal(first["loss"], second["loss"])


def test_interpolate_endpoints_equal_eval_losses_and_calls_repeat_exactly():
    a, b, (x, y) = _chain(0).train(), _chain(1).train(), _data()
    path = interpolate(a, b, x, y)
    again = interpolate(a, b, x, y)
    assert_close(path.loss[-1], _eval_nll(a, x, y), **TOL)  # alpha = 1 is net a
    assert_close(path.loss[0], _eval_nll(b, x, y), **TOL)
    assert torch.equal(path.loss, again.loss) and torch.equal(path.accuracy, again.accuracy)
    assert a.training and b.training and all(m.training for m in (*a, *b))
