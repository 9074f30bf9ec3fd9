"""Every registered probe keeps the probe contract (DESIGN.md, "Probe").

A probe reads the model and returns ``dict[str, Tensor | float]``; it leaves the parameters,
their ``.grad`` (values and None-ness), every module's training flag and the global RNG state
exactly as they were. Checked by exact equality on a tiny dynascope Transformer after one
backward pass, with one submodule switched to eval so a blanket ``model.train()`` would show.
"""

from __future__ import annotations

import pytest
import torch

import dynascope as ds
from dynascope.probes import PROBES, ProbeContext, make_probe


def _model_after_backward():
    torch.manual_seed(0)
    model = ds.nn.Transformer(
        n_layers=2, d_model=12, n_heads=3, d_mlp=20, d_vocab=11, d_out=11, n_ctx=7
    )
    task = ds.tasks.AssociativeRecall(n_keys=6, n_values=5, n_pairs=3)
    batch = task.batch("train", 4, torch.Generator().manual_seed(1))
    task.loss(model(batch["x"]), batch).backward()
    model.blocks[0].train(False)  # mixed modes: the probe must restore each flag
    model.W_U.grad = None  # a parameter without a gradient stays without one
    return model, batch


@pytest.mark.parametrize("name", sorted(PROBES))
def test_probe_leaves_model_grads_modes_and_rng_untouched(name):
    model, batch = _model_after_backward()
    params = {k: p.detach().clone() for k, p in model.named_parameters()}
    grads = {k: None if p.grad is None else p.grad.clone() for k, p in model.named_parameters()}
    modes = {k: m.training for k, m in model.named_modules()}
    probe = make_probe(name)
    rng = torch.get_rng_state()

    for step in (0, 1):  # stateful probes (snapshots) take their first and a later reading
        out = probe(model, ProbeContext(step=step, batch=batch))
        assert isinstance(out, dict)
        assert out or step == 0, f"{name} returned nothing at its second reading"
        for key, value in out.items():
            assert isinstance(key, str) and key
            assert isinstance(value, float | int | torch.Tensor), (key, type(value))
            if isinstance(value, torch.Tensor):
                assert value.device.type == "cpu" and not value.requires_grad, key

    assert torch.equal(torch.get_rng_state(), rng)
    assert {k: m.training for k, m in model.named_modules()} == modes
    for k, p in model.named_parameters():
        assert torch.equal(p, params[k]), k
        if grads[k] is None:
            assert p.grad is None, k
        else:
            assert torch.equal(p.grad, grads[k]), k


def test_every_registered_probe_is_accepted_by_the_run_config():
    config = ds.config.validate_config({"monitor": {"probes": sorted(PROBES)}})
    assert config.monitor.probes == sorted(PROBES)
