"""Step a BatchEnv with a policy into a rollout buffer (slice): used by the sequential trainer and by workers."""

from __future__ import annotations

import contextlib
import math
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch
from torch import nn

from parallel_ppo.core.buffer import RolloutBuffer
from parallel_ppo.core.config import CUT_NO_EARLIER, Config
from parallel_ppo.core.distributions import sample
from parallel_ppo.core.episodes import info_keys
from parallel_ppo.core.model import autocast, kept_casts, module_device
from parallel_ppo.core.pause import pause_point
from parallel_ppo.core.timing import PhaseTimer
from parallel_ppo.envs.batch import (
    BatchEnv,
    env_seed,
    episode_info,
    episodes_ended,
    make_batch_env,
    render_seconds,
)
from parallel_ppo.errors import one_line

StopCheck = Callable[[], bool]
"""Asked once per step: True when the run is stopping, so the rollout is abandoned (its data is never used)."""


def never() -> bool:
    return False


class PeerCut(Protocol):
    """DD-PPO's pre-emption of stragglers among learners (`distributed.sync_fraction`): asked before each step of a
    rollout (`EnvRunner.collect`'s `cut_short`), true once enough of the others have ended theirs; told when this
    one's rollout has ended."""

    def __call__(self) -> bool: ...

    def ended(self) -> None: ...


class RolloutError(RuntimeError):
    """A rollout source failed in a way the trainer cannot work around (e.g. a worker slot out of restarts); `trace`:
    the traceback of the error beneath it, where there is one (an env's, a worker's), for the run's error.txt."""

    def __init__(self, message: str, trace: str | None = None) -> None:
        super().__init__(message)
        self.trace = trace


@dataclass
class CollectResult:
    """What one rollout produced besides the buffer contents."""

    episode_returns: list[float]
    episode_lengths: list[int]
    time_env: float
    time_inference: float
    fresh_envs: list[int] = field(default_factory=list)
    """Envs (columns of the buffer) that began a new episode at this rollout's first step although the last one
    had not ended: a restarted worker's. Their running reward statistics start again."""
    time_render: float = 0.0
    """Of the envs' step time, the seconds they spent drawing observed frames (not in `time_env`)."""
    episode_info: dict[str, list[float]] = field(default_factory=dict)
    """Per final-info entry collected (`core.episodes`), its value in each finished episode whose info had it."""
    not_numbers: dict[str, str] = field(default_factory=dict)
    """Entries that a finished episode's info gave as something else than a number, as they looked (refused)."""
    reward_sum: float = 0.0
    """The raw rewards of every env step of the rollout, summed."""

    @classmethod
    def merged(cls, parts: Sequence[CollectResult], time_env: float, time_inference: float, time_render: float,
               fresh_envs: list[int]) -> CollectResult:
        """One result of several sources' (workers', ranks'): their episodes in order, their info entries by name
        and their rewards, with the timings and fresh envs given."""
        out = cls([], [], time_env, time_inference, fresh_envs, time_render)
        for part in parts:
            out.episode_returns += part.episode_returns
            out.episode_lengths += part.episode_lengths
            for key, values in part.episode_info.items():
                out.episode_info.setdefault(key, []).extend(values)
            out.not_numbers = {**part.not_numbers, **out.not_numbers}
            out.reward_sum += part.reward_sum
        return out


class EnvRunner:
    """A BatchEnv with its current observations, per-env action generators and running episode totals."""

    def __init__(self, env: BatchEnv, seed: int, first_env: int, precision: str = "fp32",
                 stream: tuple[int, ...] = (0, 0), gamma: float = 0.0, info_keys: Sequence[str] = ()) -> None:
        """`gamma` discounts the value bootstrapped where a time limit cut an episode (0: no bootstrap); `info_keys`:
        the final-info entries read from each ended episode (`core.episodes.info_keys`)."""
        self.env = env
        self.info_keys = tuple(info_keys)
        self.precision = precision
        self.gamma = gamma
        self.rngs = [np.random.default_rng(env_seed(seed, first_env + i, stream) ^ 0x5EED)
                     for i in range(env.num_envs)]
        self.obs = env.reset()
        self.ep_return = np.zeros(env.num_envs, dtype=np.float64)
        self.ep_length = np.zeros(env.num_envs, dtype=np.int64)
        self.rollouts = 0

    @classmethod
    def for_run(cls, env: BatchEnv, cfg: Config, first_env: int, stream: tuple[int, ...]) -> EnvRunner:
        """The runner of a run's envs (`cfg`: its seed, precision, discount and final-info entries to read)."""
        return cls(env, cfg.run.seed, first_env, cfg.training.precision, stream, cfg.training.gamma, info_keys(cfg))

    def collect(self, model: nn.Module, buf: RolloutBuffer, progress: torch.Tensor | None = None,
                stopping: StopCheck = never, cut_short: StopCheck = never, refresh: Callable[[], int] | None = None,
                hold: tuple[int, Callable[[], None]] | None = None) -> CollectResult:
        """Fill `buf` (n_steps × this runner's envs) with one rollout of `model`; `progress` counts steps done. When
        `stopping()` turns true, the rollout ends where it is, its buffer half-written; when `cut_short()` does, once
        `CUT_NO_EARLIER` of its steps are taken, it ends as a whole rollout of `buf.lengths` steps. `refresh`, before
        each step, brings `model` up to the newest published policy (its version to `buf.versions`); `hold` (t, wait):
        before step t, `wait()` (for the parameters of the update under way: `parallel.max_lagged_share`)."""
        result = CollectResult([], [], 0.0, 0.0)
        t_env, t_inf, drawn = 0.0, 0.0, render_seconds(self.env)
        device = module_device(model)
        self.rollouts += 1
        cut_after, steps, held = math.ceil(CUT_NO_EARLIER * buf.n_steps), buf.n_steps, None
        with torch.no_grad(), kept_casts(self.precision, device.type):
            for t in range(buf.n_steps):
                if t == buf.n_steps // 2:
                    pause_point("rollout", self.rollouts)
                if hold is not None and t == hold[0]:
                    hold[1]()
                if stopping():
                    return self._result(result, t_env, t_inf, drawn)
                if t >= cut_after and cut_short():
                    steps = t
                    break
                start = time.perf_counter()
                if refresh is not None:
                    buf.versions[t] = version = refresh()
                    if version != held:  # new parameters, written in place: their kept casts are stale
                        torch.clear_autocast_cache()
                        held = version
                actions = self._act(model, buf, t, device)
                mid = time.perf_counter()
                self.obs, rewards, dones, cut = self.env.step(actions)
                self._count_episodes(rewards, dones, result)
                end = time.perf_counter()
                buf.rewards[t] = torch.from_numpy(rewards)
                buf.bootstrap[t] = torch.from_numpy(self.gamma * self._values(model, cut)) if cut and self.gamma else 0
                buf.dones[t] = torch.from_numpy(dones.astype(np.float32))
                t_inf += mid - start + time.perf_counter() - end
                t_env += end - mid
                if progress is not None:
                    progress += 1
            start = time.perf_counter()
            buf.last_obs.copy_(torch.from_numpy(self.obs))  # valued as stored, as `_act` does each step's
            with autocast(self.precision, device.type):
                _, last_values = model(buf.last_obs.to(device))
            buf.last_values.copy_(last_values.float())
            buf.lengths.fill_(steps)
            t_inf += time.perf_counter() - start
        return self._result(result, t_env, t_inf, drawn)

    def _act(self, model: nn.Module, buf: RolloutBuffer, t: int, device: torch.device) -> np.ndarray:
        """Step `t` of the rollout: the current observations stored, `model`'s actions sampled for them (returned),
        their log-probs and the values stored."""
        obs_t = buf.obs[t]
        obs_t.copy_(torch.from_numpy(self.obs))
        with autocast(self.precision, device.type):
            logits, values = model(obs_t.to(device))
        actions, logprobs = sample(self.env.actions, logits.cpu(), self.env.actions.noise(self.rngs))
        buf.actions[t], buf.logprobs[t], buf.values[t] = actions, logprobs, values.cpu().float()
        return actions.numpy()

    def _result(self, result: CollectResult, t_env: float, t_inf: float, drawn: float) -> CollectResult:
        """The rollout's result with its timings, the frames drawn since `drawn` (the envs' render_seconds) moved from
        env to render."""
        result.time_render = render_seconds(self.env) - drawn
        result.time_env, result.time_inference = t_env - result.time_render, t_inf
        return result

    def _count_episodes(self, rewards: np.ndarray, dones: np.ndarray, result: CollectResult) -> None:
        """Add a step to each env's episode (raw rewards) and to the rollout's reward sum; add to `result` the return
        and length of the episodes that ended (whole games with episodic life) and their final info's entries."""
        self.ep_return += rewards
        self.ep_length += 1
        result.reward_sum += float(rewards.sum(dtype=np.float64))
        for i in np.flatnonzero(episodes_ended(self.env, dones)):
            result.episode_returns.append(float(self.ep_return[i]))
            result.episode_lengths.append(int(self.ep_length[i]))
            numbers, not_numbers = episode_info(self.env, i, self.info_keys)
            for key, value in numbers.items():
                result.episode_info.setdefault(key, []).append(value)
            result.not_numbers.update(not_numbers)
            self.ep_return[i] = 0.0
            self.ep_length[i] = 0

    def _values(self, model: nn.Module, cut: dict[int, np.ndarray]) -> np.ndarray:
        """Per env: the value of the last state of an episode a time limit cut short, 0 for the others.

        The done flag stops GAE at that step, so adding gamma times this value to its reward (through
        `buf.bootstrap`, kept apart from the raw reward so that reward normalization scales only the reward)
        is the bootstrap the episode would have had if the task had not been cut (a time limit is not a
        terminal state).
        """
        bootstrap = np.zeros(self.env.num_envs, dtype=np.float32)
        device = module_device(model)
        with autocast(self.precision, device.type):
            _, values = model(torch.from_numpy(np.stack(list(cut.values()))).to(device))
        bootstrap[list(cut)] = values.float().cpu().numpy()
        return bootstrap

    def close(self) -> None:
        self.env.close()


class SequentialCollector:
    """The rollout source of the sequential trainer: one process steps all envs with the learner's model."""

    mode = "sequential"
    restarts = 0  # no workers to restart
    pace = None  # no workers to wait for
    policy_lag = 0  # the learner's own model collects
    lagged_share = 0.0
    lagged: torch.Tensor | None = None

    def __init__(self, cfg: Config, env_threads: int, resumes: int = 0, env_offset: int = 0,
                 cut: PeerCut | None = None) -> None:
        """`env_offset`: the global index of the first env (a distributed rank's share starts there); `cut`: what
        ends a rollout once enough other ranks have ended theirs (`Group.rollout_cut`)."""
        self.cut = cut
        stream = (resumes, 0)
        env = make_batch_env(cfg.env, cfg.run.seed, env_offset, cfg.env.num_envs, env_threads, stream)
        self.spaces = env.spaces
        self.env_id = cfg.env.id
        try:
            self.runner = EnvRunner.for_run(env, cfg, env_offset, stream)
        except Exception as e:  # the user's env failed in reset(), as a parallel worker that fails to start
            with contextlib.suppress(Exception):
                env.close()
            raise RolloutError(f"the envs of {self.env_id} failed to start: {one_line(e)}") from e
        self.buffer = RolloutBuffer.allocate(cfg.training.n_steps, cfg.env.num_envs, env.obs_shape, env.obs_dtype,
                                             env.actions)
        self.layout = {"num_workers": 0, "num_envs_per_worker": cfg.env.num_envs, "num_envs": cfg.env.num_envs}

    def collect(self, model: nn.Module, timers: PhaseTimer, stopping: StopCheck = never) -> CollectResult:
        """One rollout; an env that fails (raises, or returns what its spaces do not describe) is a RolloutError,
        so the run stops with its checkpoint and summary as the parallel trainer does when a worker fails."""
        try:
            result = self.runner.collect(model, self.buffer, stopping=stopping, cut_short=self.cut or never)
        except Exception as e:
            raise RolloutError(f"the rollout on {self.env_id} failed: {one_line(e)}", traceback.format_exc()) from e
        if self.cut is not None:  # the other ranks' count: a lost store is theirs to report, not the env's
            self.cut.ended()
        timers.add("env", result.time_env)
        timers.add("render", result.time_render)
        timers.add("inference", result.time_inference)
        return result

    def during_update(self) -> None:
        """Nothing is in flight during the update: its envs wait for it."""

    def abandon_rollout(self) -> None:
        """Nothing is ever in flight: the rollout is collected inside `collect`."""

    def close(self) -> None:
        self.runner.close()
