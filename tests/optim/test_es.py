"""ES: optimum of a quadratic and of a small regression, gradient direction vs autograd, PGPE."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.func import functional_call

from dynascope.optim.es import PGPE, OpenAIES, centered_ranks, vectorize, worst_case
from dynascope.optim.lq import lq_loss


def _quadratic(target):
    return vectorize(lambda p: (p["theta"] - target).square().sum())


def test_openai_es_finds_the_optimum_of_a_quadratic():
    g = torch.Generator().manual_seed(0)
    target = torch.linspace(-1.0, 1.0, 8)
    es = OpenAIES({"theta": torch.zeros(8)}, population=40, sigma=0.05, lr=0.05, generator=g)
    for _ in range(400):
        es.step(_quadratic(target))
    # Adam with lr 0.05 and centered ranks jitters around the optimum by about lr; 0.05 covers it
    torch.testing.assert_close(es.center["theta"].detach(), target, atol=0.05, rtol=0)


def test_pgpe_finds_the_optimum_of_a_quadratic_and_shrinks_its_std():
    g = torch.Generator().manual_seed(1)
    target = torch.linspace(-1.0, 1.0, 8)
    es = PGPE(
        {"theta": torch.zeros(8)},
        population=40,
        center_lr=0.05,
        std_lr=0.05,
        init_std=0.3,
        generator=g,
    )
    for _ in range(400):
        es.step(_quadratic(target))
    torch.testing.assert_close(es.center["theta"].detach(), target, atol=0.05, rtol=0)
    assert es.std["theta"].max() < 0.3  # near the optimum exploration shrinks


def test_es_fits_a_small_regression_through_functional_call():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(64, 3, generator=g)
    w_true = torch.tensor([[1.5, -2.0, 0.5]])
    y = x @ w_true.T + 0.3
    model = nn.Linear(3, 1)
    objective = vectorize(lambda p: (functional_call(model, p, (x,)) - y).square().mean())
    es = OpenAIES(model, population=50, sigma=0.02, lr=0.03, generator=g)
    for _ in range(600):
        es.step(objective)
    # noiseless data: the least-squares optimum is w_true, b = 0.3; ES reaches it within 0.05
    torch.testing.assert_close(model.weight.detach(), w_true, atol=0.05, rtol=0)
    torch.testing.assert_close(model.bias.detach(), torch.tensor([0.3]), atol=0.05, rtol=0)


def test_gradient_estimate_points_along_autograd():
    # Smooth objective (tanh MLP regression, 49 parameters). With raw losses, antithetic
    # pairs and a small sigma, E[g] = grad + O(sigma^2); for h pairs the estimate's cosine with
    # the true gradient is about sqrt(h / (h + d)) = 0.98 at h = 2000, d = 49; asked >= 0.9.
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(4, 7), nn.Tanh(), nn.Linear(7, 1)).double()
    x = torch.randn(32, 4, dtype=torch.float64)
    y = torch.randn(32, 1, dtype=torch.float64)
    loss = (model(x) - y).square().mean()
    grads = torch.autograd.grad(loss, list(model.parameters()))
    es = OpenAIES(
        model,
        population=4000,
        sigma=1e-3,
        lr=0.1,
        fitness_shaping="none",
        generator=torch.Generator().manual_seed(4),
    )
    objective = vectorize(lambda p: (functional_call(model, p, (x,)) - y).square().mean())
    estimate = es.gradient(objective(es.ask()))
    flat_es = torch.cat([estimate[k].flatten() for k, _ in model.named_parameters()])
    flat_ag = torch.cat([gr.flatten() for gr in grads])
    cosine = torch.nn.functional.cosine_similarity(flat_es, flat_ag, dim=0)
    assert cosine >= 0.9, cosine


def test_worst_case_is_lq_at_infinity():
    losses = torch.tensor([[0.2, 0.4], [1.0, 3.0], [0.5, 0.5]])
    objective = worst_case(lambda p: losses * p["s"])
    value = objective({"s": torch.tensor(2.0)})
    assert value.item() == lq_loss(losses * 2.0, math.inf).item() == 4.0
    batched = vectorize(objective)({"s": torch.tensor([1.0, 2.0])})
    torch.testing.assert_close(batched, torch.tensor([2.0, 4.0]))


def test_centered_ranks_hand_built():
    torch.testing.assert_close(
        centered_ranks(torch.tensor([3.0, -1.0, 10.0])), torch.tensor([0.0, -0.5, 0.5])
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"population": 3, "sigma": 0.1, "lr": 0.1}, "population must be even"),
        ({"population": 0, "sigma": 0.1, "lr": 0.1}, "population must be an int > 0"),
        ({"population": 4, "sigma": 0.0, "lr": 0.1}, "sigma must be a number > 0"),
        ({"population": 4, "sigma": 0.1, "lr": 0.1, "optimizer": "rmsprop"}, "optimizer must"),
        ({"population": 4, "sigma": 0.1, "lr": 0.1, "fitness_shaping": "z"}, "fitness_shaping"),
    ],
)
def test_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        OpenAIES({"w": torch.zeros(2)}, **kwargs)


def test_tell_before_ask_and_wrong_loss_shape_are_errors():
    es = OpenAIES({"w": torch.zeros(2)}, population=4, sigma=0.1, lr=0.1)
    with pytest.raises(ValueError, match="ask\\(\\) must be called"):
        es.tell(torch.zeros(4))
    es.ask()
    with pytest.raises(ValueError, match="losses must have shape"):
        es.tell(torch.zeros(3))


def test_pgpe_update_equals_the_written_formula():
    # Oracle: the update written out by hand from the drawn noise (SGD centre, raw losses).
    es = PGPE(
        {"w": torch.tensor([0.5, -1.0])},
        population=4,
        center_lr=0.1,
        std_lr=0.05,
        init_std=0.2,
        optimizer="sgd",
        fitness_shaping="none",
        max_std_change=10.0,
        generator=torch.Generator().manual_seed(5),
    )
    population = es.ask()["w"]  # [4, 2]: theta + e1, theta + e2, theta - e1, theta - e2
    e = es._noise["w"]  # [2, 2]
    losses = population.square().sum(dim=1)
    f = -losses
    plus, minus = f[:2], f[2:]
    grad_mu = ((plus - minus)[:, None] / 2 * e).mean(0)
    b = f.mean()
    sigma = torch.full((2,), 0.2)
    grad_sigma = (((plus + minus) / 2 - b)[:, None] * (e**2 - sigma**2) / sigma).mean(0)
    es.tell(losses)
    torch.testing.assert_close(es.center["w"].detach(), torch.tensor([0.5, -1.0]) + 0.1 * grad_mu)
    torch.testing.assert_close(es.std["w"], sigma + 0.05 * grad_sigma)


def test_openai_es_antithetic_gradient_equals_the_written_formula():
    es = OpenAIES(
        {"w": torch.tensor([1.0, 2.0, 3.0])},
        population=6,
        sigma=0.1,
        lr=0.1,
        fitness_shaping="none",
        generator=torch.Generator().manual_seed(6),
    )
    population = es.ask()["w"]
    eps = es._noise["w"]  # [3, 3]
    losses = population.square().sum(dim=1)
    expected = ((losses[:3] - losses[3:])[:, None] * eps).sum(0) / (2 * 0.1 * 3)
    torch.testing.assert_close(es.gradient(losses)["w"], expected)
