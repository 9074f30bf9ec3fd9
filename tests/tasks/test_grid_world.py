"""GridWorld: scripted policies with closed-form returns; the exact adversary's worst cell."""

from __future__ import annotations

import pytest
import torch

from dynascope.optim.es import worst_case
from dynascope.tasks.grid_world import GridWorld

# Boustrophedon sweep: row 0 rightwards, up, row 1 leftwards, ... visits all 25 cells in 24
# moves; the treasure at sweep position k (1..24) is found after k steps.
_SNAKE_ACTION = torch.tensor(
    [
        [2 if j < 4 else 0 for j in range(5)]
        if i % 2 == 0
        else [3 if j > 0 else 0 for j in range(5)]
        for i in range(5)
    ]
)
_SNAKE_ORDER = [(i, j if i % 2 == 0 else 4 - j) for i in range(5) for j in range(5)]


def _snake_policy(tokens):
    last = tokens[:, -1]
    i = last[:, :5].argmax(-1)
    j = last[:, 5:10].argmax(-1)
    return (
        torch.nn.functional.one_hot(_SNAKE_ACTION[i, j], 4)
        .float()[:, None]
        .expand(-1, tokens.shape[1], -1)
    )


def _down_policy(tokens):
    out = torch.zeros(tokens.shape[0], tokens.shape[1], 4)
    out[..., 1] = 1.0
    return out


def test_sweeping_policy_returns_twice_one_minus_a_tenth_of_the_sweep_position():
    env = GridWorld()
    treasure = env.treasures()
    seeds = torch.zeros(24, 3)
    returns = env.rollout(_snake_policy, treasure, seeds)
    expected = torch.tensor(
        [2 * (1.0 - 0.1 * _SNAKE_ORDER.index((int(t) // 5, int(t) % 5))) for t in treasure]
    )
    torch.testing.assert_close(returns, expected, rtol=0, atol=1e-5)  # float32 sums of 0.1


def test_a_policy_that_never_moves_pays_every_step():
    env = GridWorld()
    returns = env.rollout(_down_policy, env.treasures(), torch.zeros(24, 1))
    torch.testing.assert_close(returns, torch.full((24,), -5.0), rtol=0, atol=1e-5)


def test_exact_adversary_picks_the_last_cell_of_the_sweep():
    env = GridWorld()
    per_input = lambda p: -env.rollout(_snake_policy, env.treasures(), torch.zeros(24, 1))  # noqa: E731
    worst = worst_case(per_input)({})
    # the last sweep cell (4, 4) is found after 24 steps in each episode: -2 * (1 - 2.4) = 2.8
    assert worst.item() == pytest.approx(2.8, abs=1e-5)


def test_bad_input():
    with pytest.raises(ValueError, match="size must be an int >= 2"):
        GridWorld(size=1)
