"""Config option ``model.sigma_reparam`` (S12): validation, the builders, and a short run."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dynascope.config import ConfigError, build_model, build_task, validate_config
from dynascope.nn import sigma_reparam_modules
from dynascope.store import load_run
from dynascope.train import run_training

VIT = {"name": "vit", "d_model": 12, "n_heads": 3, "d_mlp": 20, "pooling": "mean"}
DIGITS = {"name": "digits", "patch_size": 2}


def _model(model, task=DIGITS):
    cfg = validate_config({"model": model, "task": task})
    torch.manual_seed(0)
    return cfg, build_model(cfg.model, build_task(cfg.task))


def test_defaults_leave_models_unconverted():
    cfg, model = _model(VIT)
    assert cfg.model.sigma_reparam is False and not sigma_reparam_modules(model)
    cfg = validate_config({})
    assert cfg.model.sigma_reparam is False


def test_vit_with_sigma_reparam_and_without_layernorm():
    _, plain = _model(VIT)
    cfg, model = _model({**VIT, "sigma_reparam": True, "use_ln": False})
    assert cfg.model.sigma_reparam_scope == "per_matrix"
    assert cfg.model.sigma_reparam_gamma_init == "sigma0"
    assert "blocks.0.attn.W_Q" in sigma_reparam_modules(model)
    assert not any(isinstance(m, nn.LayerNorm) for m in model.modules())
    # same seed, same initial weights (Ŵ = W at init): conversion draws no random numbers
    torch.testing.assert_close(model.blocks[0].attn.W_Q, plain.blocks[0].attn.W_Q, atol=1e-6,
                               rtol=0)  # fmt: skip


def test_transformer_options_reach_the_parametrizations():
    task = {"name": "associative_recall", "n_keys": 6, "n_values": 5, "n_pairs": 3}
    model_cfg = {
        "name": "transformer",
        "d_model": 12,
        "n_heads": 3,
        "sigma_reparam": True,
        "sigma_reparam_scope": "per_head",
        "sigma_reparam_gamma_init": "one",
    }
    _, model = _model(model_cfg, task)
    reparam = sigma_reparam_modules(model)["blocks.0.attn.W_K"]
    assert reparam.scope == "per_head" and torch.equal(reparam.gamma, torch.ones(3))
    assert "W_U" in sigma_reparam_modules(model) and "W_E" not in str(sigma_reparam_modules(model))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.sigma_reparam_scope=per_row", r"model\.sigma_reparam_scope: Input should be"),
        ("model.sigma_reparam_gamma_init=zero", r"model\.sigma_reparam_gamma_init: Input should"),
        ("model.sigma_reparam=3", r"model\.sigma_reparam: Input should be a valid boolean"),
    ],
)
def test_bad_values_are_one_line_errors(override, message):
    with pytest.raises(ConfigError, match=message):
        validate_config({"model": VIT, "task": DIGITS}, [override])


def test_a_sigma_reparam_run_trains_checkpoints_and_resumes(tmp_path):
    cfg = validate_config(
        {
            "model": {**VIT, "sigma_reparam": True, "use_ln": False},
            "task": DIGITS,
            "optimizer": {"name": "adam", "lr": 1e-2},
            "train": {"steps": 6, "batch_size": 16, "eval_every": 3, "checkpoint_every": 3,
                      "log_every": 3},
            "monitor": {"probes": ["attention_entropy", "qk_spectrum"], "schedule": "every",
                        "every": 3},
        }
    )  # fmt: skip
    straight = run_training(cfg, tmp_path / "a")
    assert straight.status == "finished"
    run_training(cfg.model_copy(update={"train": cfg.train.model_copy(update={"steps": 3})}),
                 tmp_path / "b")  # fmt: skip
    (tmp_path / "b" / "config.yaml").write_text((tmp_path / "a" / "config.yaml").read_text())
    resumed = run_training(cfg, tmp_path / "b", resume=True)
    assert resumed.status == "finished"
    a, b = load_run(tmp_path / "a"), load_run(tmp_path / "b")
    for key in ("train.loss", "attn.mean.entropy", "val.accuracy"):
        torch.testing.assert_close(
            torch.tensor(b.scalar(key).to_numpy()), torch.tensor(a.scalar(key).to_numpy())
        )
