"""Config validation: one-line errors that name the field, the value and what is allowed."""

from __future__ import annotations

import pytest

from dynascope.config import (
    ConfigError,
    RunConfig,
    apply_overrides,
    build_model,
    build_task,
    load_config,
    validate_config,
)

BAD = [
    ({"modle": {}}, r"^modle: unknown field \(allowed: name, seed, device"),
    (
        {"model": {"d_modle": 3}},
        r"^model\.d_modle: unknown field \(allowed: name, n_layers, d_model",
    ),
    (
        {"model": {"d_model": 64, "n_heads": 5}},
        r"n_heads must divide d_model \(got d_model=64, n_heads=5\)",
    ),
    ({"model": {"d_model": "wide"}}, r"^model\.d_model: .*integer.*\(got 'wide'\)"),
    ({"model": {"d_head": 0}}, r"^model\.d_head: .*greater than or equal to 1"),
    (
        {"model": {"attention": "cosine"}},
        r"^model\.attention: Input should be 'softmax' or 'linear'",
    ),
    (
        {"model": {"name": "lstm"}},
        r"^model\.name: unknown model 'lstm' \(allowed: transformer, vit, fcn\)$",
    ),
    (
        {"task": {"name": "sorting"}},
        r"^task\.name: unknown task 'sorting' \(allowed: .*char_lm, digits, modular_arithmetic\)",
    ),
    (
        {"task": {"name": "associative_recall", "n_pairs": 20}},
        r"n_pairs must be <= n_keys \(got n_pairs=20, n_keys=16\)",
    ),
    (
        {"task": {"name": "char_lm", "path": "/no/such/dir"}},
        r"^task\.path: no such file or directory: '/no/such/dir'",
    ),
    (
        {"task": {"name": "associative_recall", "bogus": 1}},
        r"^task\.bogus: unknown field \(allowed: name, n_keys",
    ),
    ({"optimizer": {"lr": -1}}, r"^optimizer\.lr: Input should be greater than 0 \(got -1\)"),
    (
        {"optimizer": {"name": "lion"}},
        r"^optimizer\.name: Input should be 'adamw', 'adam' or 'sgd'",
    ),
    (
        {"optimizer": {"weight_decay": {"attention": -0.1}}},
        r"^optimizer\.weight_decay\.attention: .*greater than or equal to 0",
    ),
    (
        {"optimizer": {"weight_decay": {"mlp": 0.1}}},
        r"^optimizer\.weight_decay\.mlp: unknown field \(allowed: attention, matrices, vectors\)",
    ),
    ({"optimizer": {"betas": [0.9, 1.5]}}, r"^optimizer\.betas: betas must lie in \[0, 1\)"),
    ({"optimizer": {"mode": "both"}}, r"^optimizer\.mode: Input should be 'decoupled' or 'l2'"),
    ({"train": {"batch_size": 0}}, r"^train\.batch_size: .*greater than or equal to 1 \(got 0\)"),
    ({"train": {"steps": 1.5}}, r"^train\.steps: .*integer"),
    ({"monitor": {"every": 0}}, r"^monitor\.every: .*greater than or equal to 1"),
    (
        {"monitor": {"probes": ["qk_spectrum", "entropy"]}},
        r"^monitor\.probes: unknown probe 'entropy' \(allowed: ",
    ),
    ({"name": "../escape"}, r"^name: must use only letters, digits and _ \. = \+ -"),
    ({"name": ".hidden"}, r"^name: must not start with '\.'"),
    ({"device": "tpu"}, r"^device: Input should be 'cpu' or 'cuda'"),
    ({"seed": -1}, r"^seed: .*greater than or equal to 0"),
    ({"optimizer": {"lr": float("inf")}}, r"^optimizer\.lr: Input should be a finite number"),
    (
        {"optimizer": {"weight_decay": {"attention": float("nan")}}},
        r"^optimizer\.weight_decay\.attention: Input should be a finite number",
    ),
]


@pytest.mark.parametrize(("data", "pattern"), BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_config_gives_one_line_error(data, pattern):
    with pytest.raises(ConfigError, match=pattern) as info:
        validate_config(data)
    assert "\n" not in str(info.value)


def test_several_errors_are_counted_on_one_line():
    with pytest.raises(ConfigError, match=r"\(and 1 more\)$"):
        validate_config({"seed": -1, "device": "tpu"})


def test_top_level_must_be_a_mapping():
    with pytest.raises(ConfigError, match="expected a mapping at the top level"):
        validate_config([1, 2])


def test_defaults_validate_and_round_trip():
    cfg = validate_config({})
    assert cfg == RunConfig()
    assert validate_config(cfg.model_dump(mode="json")) == cfg


def test_overrides_go_through_validation():
    cfg = validate_config({}, ["model.n_heads=4", "optimizer.weight_decay.attention=0.1"])
    assert cfg.model.n_heads == 4 and cfg.optimizer.weight_decay.attention == 0.1
    with pytest.raises(ConfigError, match="n_heads must divide d_model"):
        validate_config({}, ["model.n_heads=5"])
    with pytest.raises(ConfigError, match=r"--set expects KEY=VALUE"):
        validate_config({}, ["model.n_heads"])
    with pytest.raises(ConfigError, match=r"--set seed.x: seed is not a mapping"):
        apply_overrides({"seed": 1}, ["seed.x=2"])


def test_load_config_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="is a directory, not a YAML file"):
        load_config(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {d_model: [\n")
    with pytest.raises(ConfigError, match="invalid YAML at line"):
        load_config(bad)
    code = tmp_path / "code.yaml"
    code.write_text("model: !!python/object/apply:os.system ['echo hi']\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(code)


def test_build_task_and_model_sizes_follow_the_task():
    cfg = validate_config(
        {"task": {"name": "associative_recall", "n_keys": 5, "n_values": 7, "n_pairs": 3}}
    )
    task = build_task(cfg.task)
    model = build_model(cfg.model, task)
    assert model.W_E.shape[0] == 12 and task.n_ctx == 7


def test_build_task_reports_task_errors_as_config_errors():
    cfg = validate_config({"task": {"name": "char_lm", "text": "abc", "n_ctx": 64}})
    with pytest.raises(ConfigError):
        build_task(cfg.task)
