"""Running statistics and the observation normalizer: the learner's float64 mean and variance of every
observation seen (of a dict observation, its vector keys), published into the network's buffers
(`model.NormalizedObs`, `model.MultiInputActorCritic`, `model.DictVectors`) once per rollout."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from parallel_ppo.envs.spaces import EnvSpaces

EPS = 1e-8


class RunningMeanStd:
    """Mean and variance of a stream of batches (Chan et al.'s parallel update, in float64), per element of
    `shape`; a batch is (n, *shape)."""

    def __init__(self, shape: tuple[int, ...] = ()) -> None:
        self.mean, self.var, self.count = np.zeros(shape), np.ones(shape), 1e-4  # the references' starting point

    def update(self, batch: np.ndarray) -> None:
        n = batch.shape[0]
        batch_mean, batch_var = batch.mean(axis=0), batch.var(axis=0)
        delta = batch_mean - self.mean
        total = self.count + n
        self.mean = self.mean + delta * n / total
        self.var = (self.var * self.count + batch_var * n + delta**2 * self.count * n / total) / total
        self.count = total


class ObsNormalizer:
    """The observation statistics of a run. `update` takes a whole rollout (every rank's: the caller gathers
    them, so all ranks compute the same numbers) after the update that learned from it, and writes mean and std
    into the network, so the next rollout and its update both see the same normalization."""

    def __init__(self, spaces: EnvSpaces) -> None:
        self.spaces = spaces
        shape = spaces.obs_shape if spaces.layout is None else (spaces.layout.vector_size,)
        self.stats = RunningMeanStd(shape)

    def values(self, obs: torch.Tensor) -> torch.Tensor:
        """What the statistics are of, in a rollout's observations (T, N, *obs_shape): the observations, or a dict
        observation's vector keys (T, N, vector_size) without its images (what the ranks exchange)."""
        if self.spaces.layout is None:
            return obs
        rows = obs.reshape(-1, *self.spaces.obs_shape)
        return self.spaces.layout.unpack(rows)[1].reshape(*obs.shape[:-1], -1)

    def update(self, values: torch.Tensor, model: nn.Module) -> None:
        """Fold in a rollout's `values` (T, N, *shape) and publish the result into `model`."""
        self.stats.update(values.reshape(-1, *self.stats.mean.shape).double().numpy())
        self.publish(model)

    def publish(self, model: nn.Module) -> None:
        """Write the statistics into the network's `obs_mean` and `obs_std` buffers."""
        model.obs_mean.copy_(torch.from_numpy(self.stats.mean))
        model.obs_std.copy_(torch.from_numpy(np.sqrt(self.stats.var + EPS)))

    def state_dict(self) -> dict[str, Any]:
        s = self.stats
        return {"mean": torch.from_numpy(s.mean.copy()), "var": torch.from_numpy(s.var.copy()), "count": s.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mean = state["mean"].double().numpy()
        if mean.shape != self.stats.mean.shape:
            raise ValueError(f"observation statistics are for shape {mean.shape}, not {self.stats.mean.shape}")
        self.stats.mean, self.stats.var = mean.copy(), state["var"].double().numpy().copy()
        self.stats.count = float(state["count"])
