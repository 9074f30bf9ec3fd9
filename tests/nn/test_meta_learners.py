"""Meta-learners (MAML learned init, ANIL, linear hypernetwork): the batched base MLP against a
per-task loop, what each learner adapts, and the first-order straight-through gradient."""

from __future__ import annotations

import math

import pytest
import torch

from dynascope.nn.meta_learners import MetaLearner, batched_mlp, mlp_shapes, soft_cross_entropy


def test_batched_mlp_matches_a_per_task_loop():
    # Oracle: each task's layers applied one by one with plain matmuls, float64.
    shapes = mlp_shapes(3, 5, 2, 4)
    assert shapes == [(3, 5), (5, 5), (5, 4)]
    g = torch.Generator().manual_seed(0)
    P = sum(a * b + b for a, b in shapes)
    flat = torch.randn(2, P, generator=g, dtype=torch.float64)
    x = torch.randn(2, 6, 3, generator=g, dtype=torch.float64)
    for t in range(2):
        h, off = x[t], 0
        for i, (a, b) in enumerate(shapes):
            W, bias = (
                flat[t, off : off + a * b].reshape(a, b),
                flat[t, off + a * b : off + a * b + b],
            )
            off += a * b + b
            h = h @ W / math.sqrt(a) + bias
            h = torch.relu(h) if i < 2 else h
        torch.testing.assert_close(batched_mlp(flat, shapes, x)[t], h, rtol=1e-12, atol=1e-12)


def test_each_learner_adapts_what_it_should():
    g = torch.Generator().manual_seed(1)
    v = torch.randn(3, 10, generator=g)
    maml = MetaLearner("learned_init", 4, 2, 5, 1, generator=g)
    assert maml.v_0.numel() == (4 * 5 + 5) + (5 * 2 + 2)
    anil = MetaLearner("anil", 4, 2, 5, 1, generator=g)
    params = anil.task_params(torch.randn(3, 12, generator=g))
    torch.testing.assert_close(params[:, :25], anil.body.detach().expand(3, -1))  # shared body
    hnet = MetaLearner("hnet_linear", 4, 2, 5, 1, d_embedding=10, generator=g)
    torch.testing.assert_close(hnet.task_params(v), v @ hnet.theta)


@pytest.mark.parametrize("kind", ["learned_init", "anil", "hnet_linear"])
def test_adaptation_lowers_the_support_loss_and_starts_from_v0(kind):
    g = torch.Generator().manual_seed(2)
    learner = MetaLearner(kind, 4, 3, 8, 2, d_embedding=6, generator=g)
    x = torch.randn(5, 16, 4, generator=g)
    y = torch.softmax(torch.randn(5, 16, 3, generator=g), -1)
    v0 = learner.adapt(x, y, steps=0, lr=0.1)
    torch.testing.assert_close(v0.detach(), learner.v_0.detach().expand(5, -1))
    v = learner.adapt(x, y, steps=20, lr=0.05)
    before = soft_cross_entropy(learner(x, v0), y)
    after = soft_cross_entropy(learner(x, v), y)
    assert (after < before).all()


def test_first_order_passes_the_gradient_straight_to_v0():
    g = torch.Generator().manual_seed(3)
    learner = MetaLearner("learned_init", 2, 2, 3, 1, generator=g)
    x = torch.randn(4, 5, 2, generator=g)
    y = torch.softmax(torch.randn(4, 5, 2, generator=g), -1)
    v = learner.adapt(x, y, steps=3, lr=0.1, second_order=False)
    (grad,) = torch.autograd.grad(v.sum(), learner.v_0)
    torch.testing.assert_close(grad, torch.full_like(grad, 4.0))  # ∂v_t/∂v_0 = I for 4 tasks


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="kind must be learned_init, anil or hnet_linear"):
        MetaLearner("reptile", 2, 2, 3)
    with pytest.raises(ValueError, match="d_mlp must be >= 1"):
        MetaLearner("anil", 2, 2, 0)
    with pytest.raises(ValueError, match=r"flat must be \[tasks, P=17\]"):
        batched_mlp(torch.zeros(2, 3), mlp_shapes(2, 3, 1, 2), torch.zeros(2, 1, 2))
    with pytest.raises(ValueError, match="x must be"):
        batched_mlp(torch.zeros(2, 17), mlp_shapes(2, 3, 1, 2), torch.zeros(2, 1, 3))
