"""FCN: a hand-computed forward, parity with nn.Linear layers, shapes, errors, and its config."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dynascope.config import ConfigError, build_model, build_task, validate_config
from dynascope.nn.fcn import FCN
from dynascope.probes.base import ProbeContext
from dynascope.probes.norms import LastLayerNorm, last_layer_name


def _tiny() -> FCN:
    """d_in 2 -> hidden 3 -> d_out 2 with hand-set weights."""
    model = FCN(2, (3,), 2)
    with torch.no_grad():
        model.blocks[0].W.copy_(torch.tensor([[1.0, -1.0, 0.5], [2.0, 1.0, -1.0]]))
        model.blocks[0].b.copy_(torch.tensor([0.0, 1.0, -2.0]))
        model.W_U.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
        model.b_U.copy_(torch.tensor([0.5, -0.5]))
    return model


def test_forward_on_tiny_weights_by_hand():
    # x = (1, 2): pre-activation (1+4, -1+2+1, 0.5-2-2) = (5, 2, -3.5) -> relu (5, 2, 0)
    # logits = (5 + 0 + 0.5, 0 + 2 + 0 - 0.5) = (5.5, 1.5)
    # x = (-1, 0): pre (-1, 1+1, -0.5-2) = (-1, 2, -2.5) -> relu (0, 2, 0) -> (0.5, 1.5)
    x = torch.tensor([[1.0, 2.0], [-1.0, 0.0]])
    expected = torch.tensor([[5.5, 1.5], [0.5, 1.5]])
    torch.testing.assert_close(_tiny()(x), expected, rtol=0, atol=0)


@pytest.mark.parametrize("activation", ["relu", "gelu", "tanh"])
def test_same_seed_same_weights_and_outputs_as_nn_linear_layers(activation):
    """The init draws exactly nn.Linear's defaults, in nn.Linear's order (transposed)."""
    torch.manual_seed(3)
    model = FCN(5, (7, 4), 3, activation=activation).double()
    torch.manual_seed(3)
    act = {"relu": nn.ReLU(), "gelu": nn.GELU(), "tanh": nn.Tanh()}[activation]
    ref = nn.Sequential(nn.Linear(5, 7), act, nn.Linear(7, 4), act, nn.Linear(4, 3)).double()
    for block, linear in zip(model.blocks, (ref[0], ref[2]), strict=True):
        torch.testing.assert_close(block.W, linear.weight.T, rtol=0, atol=0)
        torch.testing.assert_close(block.b, linear.bias, rtol=0, atol=0)
    torch.testing.assert_close(model.W_U, ref[4].weight.T, rtol=0, atol=0)
    x = torch.randn(2, 5, dtype=torch.float64)
    # addmm vs linear may round differently: float64, tolerance a few ulps
    torch.testing.assert_close(model(x), ref(x), rtol=0, atol=1e-13)


def test_shapes_and_flattened_patches():
    torch.manual_seed(0)
    model = FCN(12, (5,), 7)
    x = torch.randn(2, 3, 4)  # [batch, n_ctx, d_patch], flattened row-major
    assert model(x).shape == (2, 7)
    torch.testing.assert_close(model(x), model(x.reshape(2, 12)), rtol=0, atol=0)
    assert model(torch.randn(2, 1, 12)).shape == (2, 7)
    linear = FCN(12, (), 7)  # no hidden layer: a linear classifier
    assert [n for n, _ in linear.named_parameters()] == ["W_U", "b_U"]
    assert linear(x).shape == (2, 7)


def test_parameter_names_and_the_last_layer_probe_reads_W_U():
    model = FCN(4, (6, 5), 3)
    names = [n for n, _ in model.named_parameters()]
    # the model's own parameters come first in named_parameters (torch's order)
    assert names == ["W_U", "b_U", "blocks.0.W", "blocks.0.b", "blocks.1.W", "blocks.1.b"]
    assert model.W_U.shape == (5, 3) and model.b_U.shape == (3,)
    assert last_layer_name(model) == "W_U"
    out = LastLayerNorm()(model, ProbeContext(step=0))
    assert out["last_layer.norm"] == pytest.approx(
        float(torch.linalg.norm(model.W_U.detach().double()))
    )


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"d_in": 0}, r"d_in must be an integer >= 1 \(got d_in=0\)"),
        ({"d_out": True}, r"d_out must be an integer >= 1 \(got d_out=True\)"),
        ({"hidden": (4, 0)}, r"hidden\[1\] must be an integer >= 1 \(got 0\)"),
        ({"activation": "swish"}, r"activation must be one of relu, gelu, tanh \(got 'swish'\)"),
    ],
)
def test_bad_arguments(kwargs, pattern):
    args = {"d_in": 4, "hidden": (3,), "d_out": 2, **kwargs}
    activation = args.pop("activation", "relu")
    with pytest.raises(ValueError, match=pattern):
        FCN(args["d_in"], args["hidden"], args["d_out"], activation=activation)


def test_bad_input_width():
    with pytest.raises(ValueError, match=r"x must flatten to d_in=4 values per input"):
        FCN(4, (3,), 2)(torch.randn(2, 5))
    with pytest.raises(ValueError, match=r"x must be \[batch, d_in\]"):
        FCN(4, (3,), 2)(torch.randn(4))


# -- config ------------------------------------------------------------------------------------
def _digits_fcn(**model):
    return {
        "model": {"name": "fcn", **model},
        "task": {"name": "digits", "patch_size": 4, "n_train": 100},
    }


def test_config_validates_and_builds_for_digits():
    config = validate_config(_digits_fcn())
    assert config.model.hidden == [256, 256] and config.model.activation == "relu"
    task = build_task(config.task)
    model = build_model(config.model, task)
    assert isinstance(model, FCN)
    assert model.d_in == 64 and model.hidden == (256, 256) and model.d_out == 10  # 4 patches of 16
    batch = task.batch("train", 3, torch.Generator().manual_seed(0))
    assert model(batch["x"]).shape == (3, 10)
    assert validate_config(_digits_fcn(hidden=[])).model.hidden == []


@pytest.mark.parametrize(
    "model, pattern",
    [
        ({"hidden": [32, 0]}, r"^model\.hidden\.1: Input should be greater than or equal to 1"),
        ({"activation": "swish"}, r"^model\.activation: Input should be 'relu', 'gelu' or 'tanh'"),
        ({"hidden": [True]}, r"^model\.hidden\.0: expected a number, not a boolean"),
        ({"width": 3}, r"^model\.width: unknown field \(allowed: name, hidden, activation\)$"),
    ],
)
def test_bad_config_values_give_one_line_errors(model, pattern):
    with pytest.raises(ConfigError, match=pattern) as info:
        validate_config(_digits_fcn(**model))
    assert "\n" not in str(info.value)


def test_fcn_on_a_sequence_task_is_a_config_error():
    config = validate_config({"model": {"name": "fcn"}, "task": {"name": "associative_recall"}})
    with pytest.raises(ConfigError, match=r"^model\.name: fcn classifies vector inputs"):
        build_model(config.model, build_task(config.task))
