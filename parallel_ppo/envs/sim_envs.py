"""A simulated robot env for measuring the trainer, not for learning: its step sleeps for a set physics time instead
of computing, so that many workers fit a few cores and only the trainer's own work (inference, the update, the
waits) competes for them (`make study-sim`)."""

from __future__ import annotations

import time
from typing import Any

import gymnasium
import numpy as np

from parallel_ppo.envs.config import EnvConfig


def make_sim(cfg: EnvConfig, options: dict[str, Any], render: bool, clock: Any, seed: int) -> gymnasium.Env:
    """`sim/Sleep` with the family's options (`envs.families.SIM`)."""
    return SleepingEnv(options["step_ms"], options["obs_size"], options["action_size"], options["horizon"],
                       options["slowest"])


class SleepingEnv(gymnasium.Env):
    """Robosuite Lift from state, as far as the trainer can tell: `obs_size` floats in, `action_size` continuous
    actions out, `horizon`-step episodes (a time limit). Each step sleeps `step_ms` milliseconds (the physics it
    stands for), times the episode's factor, drawn uniformly from 1 to `slowest` at each reset, and uses almost no
    CPU. The observation is noise from the env's seed; the reward,
    −mean(action²), teaches the policy to stay still; `is_success` is never reported."""

    metadata = {"render_modes": []}

    def __init__(self, step_ms: float, obs_size: int, action_size: int, horizon: int, slowest: float = 1.0) -> None:
        self.step_ms, self.slowest, self.horizon = step_ms, slowest, horizon
        self.step_seconds = step_ms / 1000
        self.observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (obs_size,), np.float32)
        self.action_space = gymnasium.spaces.Box(-1.0, 1.0, (action_size,), np.float32)
        self._t = 0

    def _observe(self) -> np.ndarray:
        return self.np_random.standard_normal(self.observation_space.shape, dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._t = 0
        if self.slowest > 1:
            self.step_seconds = self.step_ms / 1000 * self.np_random.uniform(1.0, self.slowest)
        return self._observe(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        time.sleep(self.step_seconds)
        self._t += 1
        reward = -float(np.mean(np.square(np.clip(action, -1.0, 1.0))))
        return self._observe(), reward, False, self._t >= self.horizon, {}
