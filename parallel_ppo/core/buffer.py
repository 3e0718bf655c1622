"""Rollout storage (observations kept in their native dtype, uint8 for frames), GAE, and minibatches."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from parallel_ppo.envs.observations import DictLayout
from parallel_ppo.envs.spaces import ActionSpace, as_action_space


@dataclass
class RolloutBuffer:
    """One rollout of `n_steps` × `num_envs`. `dones[t]` is 1 where the action at step t ended the episode.

    Every field is a torch tensor so that the parallel trainer can place the whole buffer in shared
    memory and let each worker write its env slice in place.
    """

    obs: torch.Tensor  # (T, N, *obs_shape), uint8 for images
    actions: torch.Tensor  # (T, N) int64 indices, or (T, N, n) float32 for continuous actions (unclipped samples)
    logprobs: torch.Tensor  # (T, N) float32
    values: torch.Tensor  # (T, N) float32
    rewards: torch.Tensor  # (T, N) float32, as the env gave them
    bootstrap: torch.Tensor  # (T, N) float32: gamma × V(last state) where a time limit cut the episode at t, else 0
    dones: torch.Tensor  # (T, N) float32
    last_values: torch.Tensor  # (N,) float32: value of the observation after each env's last step
    last_obs: torch.Tensor  # (N, *obs_shape): that observation (the learner values it again where it lagged)
    lengths: torch.Tensor  # (N,) int64: steps each env took; below n_steps where a straggler's rollout was cut
    versions: torch.Tensor  # (T, N) int32: the published policy's version each step acted with (overlapped workers)

    @staticmethod
    def bytes_per_step(obs_shape: tuple[int, ...], obs_dtype: np.dtype, actions: ActionSpace | int = 1) -> int:
        """Bytes one env step takes in the buffer: its observation, its action, five float32s and an int32."""
        space = as_action_space(actions)
        action_bytes = int(np.prod(space.shape, dtype=np.int64)) * space.dtype.itemsize
        return int(np.prod(obs_shape)) * np.dtype(obs_dtype).itemsize + action_bytes + 6 * 4

    @classmethod
    def allocate(cls, n_steps: int, num_envs: int, obs_shape: tuple[int, ...], obs_dtype: np.dtype,
                 actions: ActionSpace | int = 1, shared: bool = False) -> RolloutBuffer:
        """Zeroed storage; `actions` (a space, or an int for discrete) sets the action's shape and dtype."""
        torch_dtype = torch.from_numpy(np.zeros(0, dtype=obs_dtype)).dtype
        space = as_action_space(actions)

        def zeros(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            t = torch.zeros(shape, dtype=dtype)
            return t.share_memory_() if shared else t

        lengths = zeros(num_envs, dtype=torch.int64)
        lengths.fill_(n_steps)  # a whole rollout, until a cut one says otherwise

        return cls(
            obs=zeros(n_steps, num_envs, *obs_shape, dtype=torch_dtype),
            actions=zeros(n_steps, num_envs, *space.shape,
                          dtype=torch.float32 if space.continuous else torch.int64),
            logprobs=zeros(n_steps, num_envs),
            values=zeros(n_steps, num_envs),
            rewards=zeros(n_steps, num_envs),
            bootstrap=zeros(n_steps, num_envs),
            dones=zeros(n_steps, num_envs),
            last_values=zeros(num_envs),
            last_obs=zeros(num_envs, *obs_shape, dtype=torch_dtype),
            lengths=lengths,
            versions=zeros(n_steps, num_envs, dtype=torch.int32),
        )

    @property
    def n_steps(self) -> int:
        return self.actions.shape[0]

    @property
    def num_envs(self) -> int:
        return self.actions.shape[1]

    def env_slice(self, start: int, stop: int) -> RolloutBuffer:
        """A view of envs [start, stop): writes through it land in this buffer."""
        return RolloutBuffer(
            obs=self.obs[:, start:stop], actions=self.actions[:, start:stop],
            logprobs=self.logprobs[:, start:stop], values=self.values[:, start:stop],
            rewards=self.rewards[:, start:stop], bootstrap=self.bootstrap[:, start:stop],
            dones=self.dones[:, start:stop],
            last_values=self.last_values[start:stop], last_obs=self.last_obs[start:stop],
            lengths=self.lengths[start:stop],
            versions=self.versions[:, start:stop],
        )

    def taken(self) -> torch.Tensor | None:
        """(T, N) bool: the steps the envs took, where some rollout was cut short (`parallel.sync_fraction`; the rows
        after a cut hold an older rollout's data); None where every env took all `n_steps`."""
        if bool((self.lengths == self.n_steps).all()):
            return None
        return torch.arange(self.n_steps)[:, None] < self.lengths


NOT_FINITE_SOURCES = (("rewards", "a reward of {env}"), ("obs", "an observation of {env}"),
                      ("last_obs", "an observation of {env}"), ("values", "the model's value estimate"),
                      ("last_values", "the model's value estimate"), ("bootstrap", "the model's value estimate"))
"""What each float field of a rollout holds, in the order a value that is not a finite number is traced back."""


def not_finite_error(buffer: RolloutBuffer, env_id: str, layout: DictLayout | None = None) -> str | None:
    """The error of a rollout holding a value that is not a finite number (NaN, infinity), one line naming the first
    field it is in (the env's rewards and observations before the model's values, which follow from them), the step
    and the env; None where every value is finite. A dict observation's vector keys are read from its packed rows
    (`layout`). A rollout is checked before GAE: one such value would make every parameter NaN in the update, and the
    run go on learning nothing."""
    for name, what in NOT_FINITE_SOURCES:
        tensor = getattr(buffer, name)
        if layout is not None and name in ("obs", "last_obs"):  # the float32 values in its packed rows
            tensor = layout.vector_values(tensor.contiguous())
        if not tensor.is_floating_point() or bool(torch.isfinite(tensor).all()):
            continue
        at = [int(i) for i in (~torch.isfinite(tensor)).nonzero()[0]]
        where = f"the last step of env {at[0]}" if name.startswith("last_") else f"step {at[0]} of env {at[1]}"
        cause = ("the model diverged: a lower training.learning_rate, or normalized rewards, may keep it finite"
                 if what.startswith("the model") else "the run stops before an update learns from it")
        return (f"{what.format(env=env_id)} at {where} of the rollout is {float(tensor[tuple(at)])}, not a finite "
                f"number: {cause}")
    return None


def compute_gae(rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor, last_values: torch.Tensor,
                gamma: float, gae_lambda: float,
                taken: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over (T, N) tensors; returns (advantages, returns).

    No value is bootstrapped across an episode end: where `dones[t]` is 1 the next state belongs to a
    new episode, so both the TD target and the advantage recursion stop there. With `taken` (`RolloutBuffer.taken`),
    env n's rollout ends at its last step taken, bootstrapped from `last_values[n]` (the value after it); the steps
    not taken get advantage 0.
    """
    n_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    next_adv = torch.zeros_like(last_values)
    next_values = last_values
    for t in reversed(range(n_steps)):
        not_done = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_values * not_done - values[t]
        next_adv = delta + gamma * gae_lambda * not_done * next_adv
        if taken is None:
            next_values = values[t]
        else:  # an env whose rollout ends before t starts its recursion afresh at its last step
            next_adv = torch.where(taken[t], next_adv, 0.0)
            next_values = torch.where(taken[t], values[t], last_values)
        advantages[t] = next_adv
    return advantages, advantages + values


def minibatch_indices(rows: torch.Tensor, count: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """A fresh permutation of `rows` (sample indices), cut into `count` minibatches of equal size (where `count`
    divides it, as for a whole rollout; else sizes differ by one)."""
    yield from torch.tensor_split(rows[torch.randperm(len(rows), generator=generator)], count)
