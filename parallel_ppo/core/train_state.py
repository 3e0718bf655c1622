"""What a training run carries from update to update and across a resume: the learner, its random streams,
counters and episode windows (`TrainState`), and the check that a checkpoint fits a fresh one."""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from parallel_ppo.core.checkpoint import check_checkpoint, check_counts, check_layout, next_resume_count
from parallel_ppo.core.collect import CollectResult
from parallel_ppo.core.config import Config
from parallel_ppo.core.episodes import EpisodeWindows, info_keys
from parallel_ppo.core.metrics import metric
from parallel_ppo.core.model import learner_device
from parallel_ppo.core.normalization import ObsNormalizer
from parallel_ppo.core.ppo import build_learner
from parallel_ppo.core.reward_scale import RewardScaler
from parallel_ppo.envs.batch import SUCCESS
from parallel_ppo.envs.spaces import EnvSpaces

SUCCESS_RATE = metric("charts/success_rate", "of the last logging.return_window episodes whose env reported success "
                      "(info is_success), the fraction that succeeded; empty where none did", column="success_rate",
                      summary=True)


def mean_or_nan(values: deque) -> float:
    return float(np.mean(values)) if values else float("nan")


@dataclass
class TrainState:
    """Everything a resumed run carries on with: the learner, its random streams, counters and episode windows."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    generator: torch.Generator
    """Draws the minibatch permutations."""
    episode_returns: deque[float]
    episode_lengths: deque[int]
    reward_scaler: RewardScaler | None
    """Present when `training.normalize_reward` is on."""
    obs_normalizer: ObsNormalizer | None
    """Present when `training.normalize_obs` is on: the float64 statistics behind the network's buffers."""
    episode_info: EpisodeWindows
    """The final-info entries of the last episodes (`core.episodes`): is_success's 1.0 or 0.0, and those of
    `logging.episode_info`."""
    update: int = 0
    env_steps: int = 0
    episodes: int = 0
    elapsed_before: float = 0.0
    """Wall seconds of the sessions before this one (a resumed run)."""
    resumes: int = 0
    restarts: int = 0
    """Resumes that a restart made by itself (torchrun's `--max-restarts`, `--resume-if-exists`)."""

    @classmethod
    def new(cls, cfg: Config, spaces: EnvSpaces, world_size: int = 1) -> TrainState:
        """A fresh learner; the reward scaler follows the envs of all `world_size` ranks."""
        torch.manual_seed(cfg.run.seed)
        model, optimizer = build_learner(spaces, cfg, learner_device(cfg))
        window = cfg.logging.return_window
        t = cfg.training
        scaler = RewardScaler(cfg.env.num_envs * world_size, t.gamma, t.reward_clip) if t.normalize_reward else None
        return cls(model, optimizer, torch.Generator().manual_seed(cfg.run.seed), deque(maxlen=window),
                   deque(maxlen=window), scaler, ObsNormalizer(spaces) if t.normalize_obs else None,
                   EpisodeWindows(info_keys(cfg), window, {SUCCESS: SUCCESS_RATE}))

    @classmethod
    def from_checkpoint(cls, cfg: Config, spaces: EnvSpaces, checkpoint: dict[str, Any],
                        world_size: int = 1) -> TrainState:
        """The state saved by `to_checkpoint`, with one more resume counted; a checkpoint that does not fit it is
        a RunDataError (`check`), before anything is loaded."""
        state = cls.new(cfg, spaces, world_size)
        state.check(checkpoint)
        state.model.load_state_dict(checkpoint["model"])
        state.optimizer.load_state_dict(checkpoint["optimizer"])
        state.generator.set_state(checkpoint["generator"])
        torch.set_rng_state(checkpoint["torch_rng"])
        state.episode_returns.extend(checkpoint["episode_returns"])
        state.episode_lengths.extend(checkpoint["episode_lengths"])
        state.episode_info.load_state_dict(checkpoint.get("episode_info", {SUCCESS: checkpoint.get(
            "episode_successes", [])}))  # episode_successes: the success window of checkpoints before episode_info
        if state.reward_scaler is not None and checkpoint.get("reward_scaler") is not None:
            state.reward_scaler.load_state_dict(checkpoint["reward_scaler"])
        if state.obs_normalizer is not None and checkpoint.get("obs_normalizer") is not None:
            state.obs_normalizer.load_state_dict(checkpoint["obs_normalizer"])
        state.update, state.env_steps = checkpoint["update"], checkpoint["env_steps"]
        state.episodes, state.elapsed_before = checkpoint["episodes"], checkpoint["elapsed"]
        state.resumes, state.restarts = next_resume_count(checkpoint), checkpoint.get("restarts", 0)
        return state

    def check(self, checkpoint: dict[str, Any], path: Path | str = "checkpoint.pt") -> None:
        """Refuse (RunDataError) a checkpoint that does not fit this state: its network, optimizer, random streams,
        counters, episode windows and running statistics."""
        statistics = {"reward_scaler": self.reward_scaler, "obs_normalizer": self.obs_normalizer}
        check_checkpoint(checkpoint, Path(path), self.model, self.optimizer,
                         {key: None if s is None else s.state_dict() for key, s in statistics.items()})

    def to_checkpoint(self, cfg: Config, mode: str, elapsed: float, world_size: int = 1) -> dict[str, Any]:
        """Tensors and plain data only (checkpoints are loaded with weights_only=True). In a distributed run the
        ranks hold the same state (parameters, optimizer, minibatch stream, global counters and episode windows,
        one reward scaler over all envs), so rank 0's checkpoint is the run's."""
        return {
            "world_size": world_size,
            "config": cfg.to_dict(), "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "update": self.update, "env_steps": self.env_steps, "episodes": self.episodes, "elapsed": elapsed,
            "episode_returns": list(self.episode_returns), "episode_lengths": list(self.episode_lengths),
            "episode_info": self.episode_info.state_dict(),
            "generator": self.generator.get_state(), "torch_rng": torch.get_rng_state(),
            "resumes": self.resumes, "restarts": self.restarts, "mode": mode,
            "reward_scaler": self.reward_scaler.state_dict() if self.reward_scaler is not None else None,
            "obs_normalizer": self.obs_normalizer.state_dict() if self.obs_normalizer is not None else None,
        }

    def record(self, result: CollectResult, steps: int) -> None:
        """Count one finished update and the episodes its rollout completed."""
        self.update += 1
        self.env_steps += steps
        self.episodes += len(result.episode_returns)
        self.episode_returns.extend(result.episode_returns)
        self.episode_lengths.extend(result.episode_lengths)
        self.episode_info.extend(result.episode_info)


def check_checkpoint_fits(cfg: Config, spaces: EnvSpaces, checkpoint: dict[str, Any], path: Path) -> None:
    """Refuse (RunDataError naming what differs) a checkpoint that a fresh learner of `cfg` could not take: the one
    check of a resumed run, before it writes a file (`Policy.load` checks the network it loads into with
    `check_checkpoint`). Built on the CPU; the global random state is left as it was."""
    check_counts(checkpoint, path)  # first: the world size below is one of them
    check_layout(checkpoint, path, spaces.layout)
    on_cpu = dataclasses.replace(cfg, training=dataclasses.replace(cfg.training, device="cpu"))
    with torch.random.fork_rng(devices=[]):
        fresh = TrainState.new(on_cpu, spaces, checkpoint.get("world_size", 1))
    fresh.check(checkpoint, path)
