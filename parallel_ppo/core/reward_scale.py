"""Reward normalization as the reference Procgen PPOs do it: rewards divided by a running standard deviation
of each env's discounted return, then clipped.

It runs on the learner over the whole rollout, in time order, so a parallel update sees exactly the
rewards a sequential one does; its state travels in the checkpoint.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from parallel_ppo.core.normalization import RunningMeanStd


class RewardScaler:
    """Scales rewards by 1 / sqrt(Var[discounted return] + eps) and clips them to ±`clip`.

    As in baselines' VecNormalize (which openai/train-procgen uses) and CleanRL's ppo_procgen: at every
    step each env's return accumulator takes `ret = gamma * ret + reward`, the running variance takes
    the envs' accumulators, the step's rewards are divided by the running std, and accumulators of envs
    whose episode ended at that step start again from 0.
    """

    EPS = 1e-8

    def __init__(self, num_envs: int, gamma: float, clip: float) -> None:
        self.gamma, self.clip = gamma, clip
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.stats = RunningMeanStd()

    def __call__(self, rewards: torch.Tensor, dones: torch.Tensor, taken: torch.Tensor | None = None) -> torch.Tensor:
        """Normalized copy of a rollout's (T, N) rewards; `dones[t]` marks episodes that ended at step t. With `taken`
        (`RolloutBuffer.taken`), only the steps taken count: an env whose rollout was cut keeps its accumulator for
        the next rollout."""
        raw = rewards.double().numpy()
        took = np.ones(raw.shape, dtype=bool) if taken is None else taken.numpy()
        ended = (dones.numpy() > 0.5) & took
        scaled = np.empty_like(raw)
        for t in range(raw.shape[0]):
            self.returns[took[t]] = self.returns[took[t]] * self.gamma + raw[t, took[t]]
            if took[t].any():
                self.stats.update(self.returns[took[t]])
            scaled[t] = np.clip(raw[t] / np.sqrt(self.stats.var + self.EPS), -self.clip, self.clip)
            self.returns[ended[t]] = 0.0
        return torch.from_numpy(scaled.astype(np.float32))

    def start_episodes(self, envs: list[int]) -> None:
        """These envs begin new episodes without having ended the last (a restarted worker's): their accumulators
        start again from 0."""
        self.returns[envs] = 0.0

    def state_dict(self) -> dict[str, Any]:
        """Plain data for the checkpoint."""
        s = self.stats
        return {"returns": torch.from_numpy(self.returns.copy()), "mean": float(s.mean), "var": float(s.var),
                "count": s.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The running statistics of a checkpoint; the accumulators stay at 0, since a resumed run's envs start new
        episodes."""
        returns = state["returns"].double().numpy()
        if returns.shape != self.returns.shape:
            raise ValueError(f"reward normalization state is for {returns.shape[0]} envs, not {self.returns.size}")
        self.stats.mean, self.stats.var, self.stats.count = state["mean"], state["var"], state["count"]
