"""5x5 grid-world treasure hunt over two episodes (von Oswald et al. 2025, Table 3).

Glossary:
    size        grid side (5); cell ``(i, j)``, row i counted from the bottom, column j from the
                left. The agent starts each episode at ``(0, 0)``, the lower-left corner.
    treasure    cell index ``i * size + j`` of the hidden treasure, one of the ``size^2 - 1``
                non-start cells (the adversary's choice; :meth:`GridWorld.treasures` lists them).
    A           4 actions: 0 up (i+1), 1 down (i-1), 2 right (j+1), 3 left (j-1); a move into a
                wall leaves the agent in place.
    T_ep        steps per episode (25); ``n_episodes`` (2) episodes, so at most 50 steps.
    d_obs       ``2 * size + 1``: observation token ``[one-hot(i), one-hot(j), new_episode]``.
    d_seed      width of the Gaussian seed r appended to every token (the agent's randomness).
    d_token     ``d_obs + d_seed``: what the policy reads per step.

Dynamics (every step of an unfinished rollout): reward -0.1, move; if the agent lands on the
treasure, reward +1 and the episode ends; an episode also ends after T_ep steps. At an episode's
end the agent returns to the start and the next observation carries ``new_episode = 1`` (so a
memory-based policy can walk straight back in episode 2). The rollout is finished after
``n_episodes`` episodes; later steps change nothing. The treasure is never observed, only
found. Returns are in ``[-0.1 * n_episodes * T_ep, n_episodes * 0.9]``.

The policy is autoregressive over the growing token sequence ``[o_0, o_1, ...]`` (``o_0`` the
start observation) and acts by the argmax of its last position's 4 logits; all randomness is in
the seed. (The paper feeds the seed as one Gaussian first token; here it is appended to every
token, as for recall: the same information for a causal model.) The loop always runs
``n_episodes * T_ep`` steps with masks instead of branches, so it runs under
``torch.func.vmap`` (population-batched evolution strategies).

References:
    von Oswald, Kobayashi, Akram, Steger (2025), "Learning Randomized Algorithms with
    Transformers", ICLR, arXiv 2408.10818, sec. 5 and Table 3 (task details beyond the grid
    size, episode count, step count and rewards are ours).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .base import _check_int

__all__ = ["GridWorld"]

# (delta_i, delta_j) per action: up, down, right, left
_MOVES = ((1, 0), (-1, 0), (0, 1), (0, -1))


class GridWorld:
    """The two-episode treasure hunt; see the module docstring.

    Args:
        size: grid side, ``>= 2``.
        steps_per_episode: T_ep, ``>= 1``.
        n_episodes: ``>= 1``.
        step_reward: reward per step (negative: a cost), ``-0.1`` in the paper.
        treasure_reward: reward for finding the treasure, ``1.0`` in the paper.
    Raises:
        ValueError: if a size or count is not an int in range.
    References:
        von Oswald et al. (2025), arXiv 2408.10818, sec. 5.
    """

    def __init__(
        self,
        *,
        size: int = 5,
        steps_per_episode: int = 25,
        n_episodes: int = 2,
        step_reward: float = -0.1,
        treasure_reward: float = 1.0,
    ) -> None:
        _check_int("size", size, 2)
        _check_int("steps_per_episode", steps_per_episode, 1)
        _check_int("n_episodes", n_episodes, 1)
        self.size = size
        self.steps_per_episode = steps_per_episode
        self.n_episodes = n_episodes
        self.step_reward = float(step_reward)
        self.treasure_reward = float(treasure_reward)
        self.d_obs = 2 * size + 1
        self.n_steps = n_episodes * steps_per_episode
        self.n_actions = 4

    def treasures(self, device: torch.device | str | None = None) -> Tensor:
        """All non-start treasure cells, int64 ``[size^2 - 1]`` (the exact adversary's options)."""
        return torch.arange(1, self.size**2, device=device)

    def _observe(self, i: Tensor, j: Tensor, new_episode: Tensor) -> Tensor:
        eye = torch.eye(self.size, device=i.device)
        return torch.cat([eye[i], eye[j], new_episode[..., None].float()], dim=-1)

    def rollout(
        self, policy: Callable[[Tensor], Tensor], treasure: Tensor, seeds: Tensor
    ) -> Tensor:
        """Play ``n_episodes`` episodes for every (treasure, seed) row.

        Args:
            policy: ``tokens [rows, t, d_obs + d_seed] -> logits [rows, t, 4]`` (causal: the
                action at step t reads positions ``<= t``).
            treasure: int64 ``[rows]`` cell indices, each in ``[1, size^2)``.
            seeds: ``[rows, d_seed]``, appended to every token.
        Returns:
            ``[rows]`` total returns.
        """
        rows = treasure.shape[0]
        device = treasure.device
        ti, tj = treasure // self.size, treasure % self.size
        i = torch.zeros(rows, dtype=torch.long, device=device)
        j = torch.zeros_like(i)
        episode = torch.zeros_like(i)
        t_in_episode = torch.zeros_like(i)
        total = torch.zeros(rows, device=device, dtype=seeds.dtype)
        moves = torch.tensor(_MOVES, device=device)  # [4, 2]
        token = self._observe(i, j, torch.zeros_like(i))
        tokens = [torch.cat([token, seeds], dim=-1)]
        for _ in range(self.n_steps):
            logits = policy(torch.stack(tokens, dim=1))[:, -1]  # [rows, 4]
            action = logits.argmax(dim=-1)
            active = episode < self.n_episodes
            ni = (i + moves[action, 0]).clamp(0, self.size - 1)
            nj = (j + moves[action, 1]).clamp(0, self.size - 1)
            found = active & (ni == ti) & (nj == tj)
            total = total + active * self.step_reward + found * self.treasure_reward
            t_in_episode = t_in_episode + active.long()
            ends = found | (active & (t_in_episode >= self.steps_per_episode))
            episode = episode + ends.long()
            t_in_episode = torch.where(ends, torch.zeros_like(t_in_episode), t_in_episode)
            i = torch.where(ends, torch.zeros_like(ni), torch.where(active, ni, i))
            j = torch.where(ends, torch.zeros_like(nj), torch.where(active, nj, j))
            token = self._observe(i, j, ends.long())
            tokens.append(torch.cat([token, seeds], dim=-1))
        return total
