"""Fixtures shared by the probe tests: the dense Hessian oracle."""

from __future__ import annotations

import pytest
import torch


def _dense_hessian(loss_fn, params):
    """``[P, P]`` Hessian of ``loss_fn`` over the flat vector of ``params`` (dict order, C order
    within each tensor), by ``torch.func.hessian``: the oracle of Lanczos-based probes."""
    names = list(params)
    shapes = [params[n].shape for n in names]
    sizes = [params[n].numel() for n in names]
    flat = torch.cat([params[n].detach().reshape(-1) for n in names])

    def flat_loss(theta):
        chunks = theta.split(sizes)
        return loss_fn({n: c.reshape(s) for n, c, s in zip(names, chunks, shapes)})

    return torch.func.hessian(flat_loss)(flat)


@pytest.fixture
def dense_hessian():
    """``dense_hessian(loss_fn, params) -> [P, P]`` (see :func:`_dense_hessian`)."""
    return _dense_hessian
