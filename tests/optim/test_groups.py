"""Parameter groups by role and per-group weight decay, decoupled (AdamW) or as an L2 penalty.

Oracles: roles from parameter names (independent of shapes); one optimizer step with a zero
gradient, where decoupled decay multiplies every parameter by exactly (1 - lr * λ_group) and the
L2 mode leaves it unchanged; the penalty Σ_g λ_g/2 Σ_θ ‖θ‖² summed by hand.
"""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_transformer
from torch import nn

from dynascope.optim import ROLES, build_optimizer, l2_penalty, parameter_groups, parameter_roles

# Distinct λ per role, so a parameter in the wrong group shows up as a wrong factor.
LAMBDA = {"attention": 0.5, "matrices": 0.25, "vectors": 0.125}
LR = 0.1


def expected_role(name: str) -> str:
    """The role a parameter of :class:`Transformer` should get, from its name alone."""
    leaf = name.rsplit(".", 1)[-1]
    if ".attn." in name and leaf in ("W_Q", "W_K", "W_V", "W_O"):
        return "attention"
    if leaf.startswith("b_") or ".ln" in name or name.startswith("ln"):
        return "vectors"  # biases (b_U, b_in, b_out, b_Q..b_O) and LayerNorm gains/biases
    return "matrices"  # W_E, W_pos, W_U, MLP W_in / W_out


def _roles_by_name(model: nn.Module) -> dict[str, str]:
    roles = {name: role for name, _, role in parameter_roles(model)}
    assert set(roles) == {name for name, _ in model.named_parameters()}
    return roles


def test_roles_of_transformer_parameters():
    model = tiny_transformer()
    roles = _roles_by_name(model)
    assert roles == {name: expected_role(name) for name in roles}
    assert sorted(n for n, r in roles.items() if r == "attention") == sorted(
        f"blocks.{i}.attn.{w}" for i in range(2) for w in ("W_Q", "W_K", "W_V", "W_O")
    )
    for name in ("W_E", "W_pos", "W_U", "blocks.0.mlp.W_in", "blocks.1.mlp.W_out"):
        assert roles[name] == "matrices"
    for name in ("b_U", "blocks.0.ln1.weight", "blocks.1.mlp.b_in", "ln_final.bias"):
        assert roles[name] == "vectors"


def test_attention_biases_are_vectors():
    model = tiny_transformer(use_bias=True)
    roles = _roles_by_name(model)
    assert roles == {name: expected_role(name) for name in roles}


@pytest.mark.parametrize("use_bias", [False, True])
def test_every_parameter_in_exactly_one_group(use_bias):
    model = tiny_transformer(use_bias=use_bias)
    groups = parameter_groups(model, LAMBDA)
    assert [g["role"] for g in groups] == list(ROLES)
    names = [n for g in groups for n in g["names"]]
    params = [p for g in groups for p in g["params"]]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())
    assert len({id(p) for p in params}) == len(params) == len(list(model.parameters()))
    for g in groups:
        assert g["weight_decay"] == LAMBDA[g["role"]]
        assert len(g["names"]) == len(g["params"])


def test_frozen_parameters_and_models_without_attention():
    model = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 2))
    model[2].bias.requires_grad_(False)
    groups = parameter_groups(model, {"matrices": 0.1})  # roles not given get 0
    assert {g["role"]: g["names"] for g in groups} == {
        "matrices": ["0.weight", "2.weight"],
        "vectors": ["0.bias", "1.weight", "1.bias"],
    }
    assert {g["role"]: g["weight_decay"] for g in groups} == {"matrices": 0.1, "vectors": 0.0}


def _zero_gradient_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    # 0 * Σθ: every parameter gets a zero gradient (not None, which optimizers skip entirely).
    loss = 0.0 * sum(p.sum() for p in model.parameters())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


@pytest.mark.parametrize("name", ["adamw", "adam", "sgd"])
def test_decoupled_decay_multiplies_by_one_minus_lr_lambda(name):
    model = tiny_transformer()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer, groups = build_optimizer(model, name=name, lr=LR, weight_decay=LAMBDA)
    assert {g["role"]: g["weight_decay"] for g in groups} == LAMBDA
    _zero_gradient_step(model, optimizer)
    roles = _roles_by_name(model)
    # With g = 0 Adam's update m / (sqrt(v) + eps) is exactly 0 and AdamW computes θ(1 - lr λ):
    # bit-exact. SGD computes θ - lr(λθ), equal up to one rounding (float64, default tolerance).
    tol = {} if name == "sgd" else {"rtol": 0.0, "atol": 0.0}
    for n, p in model.named_parameters():
        expected = before[n] * (1 - LR * LAMBDA[roles[n]])
        torch.testing.assert_close(p.detach(), expected, **tol, msg=n)


@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_l2_mode_moves_decay_into_the_penalty(name):
    model = tiny_transformer()
    optimizer, groups = build_optimizer(model, name=name, lr=LR, weight_decay=LAMBDA, mode="l2")
    assert groups is optimizer.param_groups
    assert {g["role"]: g["weight_decay"] for g in groups} == dict.fromkeys(ROLES, 0.0)
    assert {g["role"]: g["l2"] for g in groups} == LAMBDA

    roles = _roles_by_name(model)
    by_hand = sum(
        LAMBDA[roles[n]] / 2 * (p.detach() ** 2).sum() for n, p in model.named_parameters()
    )
    torch.testing.assert_close(l2_penalty(groups), by_hand)

    # The penalty's gradient is λθ per parameter.
    model.zero_grad()
    l2_penalty(groups).backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, LAMBDA[roles[n]] * p.detach(), msg=n)

    # The optimizer itself no longer decays: a zero-gradient step changes nothing.
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    _zero_gradient_step(model, optimizer)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), before[n], rtol=0, atol=0, msg=n)


def test_l2_penalty_is_zero_without_decay():
    model = tiny_transformer()
    _, groups = build_optimizer(model, name="adamw", lr=LR, weight_decay={}, mode="l2")
    torch.testing.assert_close(l2_penalty(groups), torch.zeros(()))
    _, decoupled = build_optimizer(model, name="adamw", lr=LR, weight_decay=LAMBDA)
    torch.testing.assert_close(l2_penalty(decoupled), torch.zeros(()))  # no "l2" entries


def test_bad_weight_decay():
    model = tiny_transformer()
    with pytest.raises(ValueError, match=r"^weight_decay\.attention must be >= 0 \(got -0\.1\)$"):
        parameter_groups(model, {"attention": -0.1})
    with pytest.raises(
        ValueError,
        match=r"^weight_decay role must be one of attention, matrices, vectors \(got 'mlp'\)$",
    ):
        parameter_groups(model, {"mlp": 0.1})
    with pytest.raises(ValueError, match=r"^weight_decay\.vectors must be >= 0"):
        build_optimizer(model, name="adamw", lr=LR, weight_decay={"vectors": -1.0})


@pytest.mark.parametrize("lr", [0.0, -1e-3])
def test_non_positive_lr(lr):
    with pytest.raises(ValueError, match=rf"^optimizer\.lr must be > 0 \(got {lr}\)$"):
        build_optimizer(tiny_transformer(), name="adamw", lr=lr, weight_decay={})


def test_unknown_optimizer_name_and_mode():
    model = tiny_transformer()
    with pytest.raises(
        ValueError, match=r"^optimizer\.name must be one of adamw, adam, sgd \(got 'lion'\)$"
    ):
        build_optimizer(model, name="lion", lr=LR, weight_decay={})
    with pytest.raises(
        ValueError, match=r"^optimizer\.mode must be one of decoupled, l2 \(got 'both'\)$"
    ):
        build_optimizer(model, name="adamw", lr=LR, weight_decay={}, mode="both")


def test_roles_of_fused_and_separate_attention_layouts():
    """torch MHA's packed in_proj_weight and GPT-2's fused c_attn are attention weights."""
    import transformers

    from dynascope.optim import parameter_roles

    mha = nn.Sequential(nn.MultiheadAttention(12, 3), nn.Linear(12, 4))
    assert {n: r for n, _, r in parameter_roles(mha)} == {
        "0.in_proj_weight": "attention",
        "0.in_proj_bias": "vectors",
        "0.out_proj.weight": "attention",
        "0.out_proj.bias": "vectors",
        "1.weight": "matrices",
        "1.bias": "vectors",
    }
    config = transformers.GPT2Config(
        vocab_size=11, n_positions=7, n_embd=12, n_layer=1, n_head=3, bos_token_id=0, eos_token_id=0
    )
    roles = {n: r for n, _, r in parameter_roles(transformers.GPT2LMHeadModel(config))}
    assert [n for n, r in roles.items() if r == "attention"] == [
        "transformer.h.0.attn.c_attn.weight",
        "transformer.h.0.attn.c_proj.weight",
    ]
    assert roles["transformer.h.0.mlp.c_fc.weight"] == "matrices"
    assert roles["transformer.h.0.attn.c_attn.bias"] == "vectors"
