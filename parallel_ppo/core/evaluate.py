"""Evaluation: a policy played on its training levels or on held-out test levels, counting complete episodes
only, with Procgen's normalized score and, on request, video frames (the env's render, what the policy sees, or
both side by side: `envs.views`). Used by `eval`, `demo` and the trainer's periodic evaluation; it always builds
envs of its own, never touching the training envs.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from torch import nn

from parallel_ppo.core.config import Config, EnvConfig
from parallel_ppo.core.metrics import metric
from parallel_ppo.core.policy import act
from parallel_ppo.envs.batch import (
    episodes_ended,
    eval_levels,
    make_batch_env,
    reported_success,
    resolve_levels,
)
from parallel_ppo.envs.procgen_envs import normalized_return
from parallel_ppo.envs.spaces import EnvSpaces
from parallel_ppo.envs.views import Views

EVAL_STREAM = 0xE7A1
"""Seeds eval envs apart from the training envs (which use the streams (resumes, restarts))."""

TEST_RETURN = metric("charts/test_return", "mean return of the evaluation after the update (empty where none ran)",
                     column="test_return_mean")
EVAL_METRICS = (TEST_RETURN,)
"""The in-training evaluation's metrics, as the writers ask for them."""


@dataclass
class EvalResult:
    """Complete episodes played by one evaluation."""

    returns: list[float]
    lengths: list[int]
    levels: str
    env: EnvConfig
    """The env config the episodes were played with (its level range)."""
    deterministic: bool
    seconds: float
    level_seeds: list[int] = dataclasses.field(default_factory=list)
    """Procgen level seeds the counted episodes started on."""
    successes: list[float] = dataclasses.field(default_factory=list)
    """1.0 or 0.0 for each counted episode whose env reported success (none for an env that does not)."""

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns))

    @property
    def success_rate(self) -> float | None:
        """Of the counted episodes whose env reported success, the fraction that succeeded (None: none reported)."""
        return float(np.mean(self.successes)) if self.successes else None

    def stats(self) -> dict[str, object]:
        """eval.json's entry: return statistics, the normalized mean and where the episodes were played."""
        r = np.asarray(self.returns)
        return {
            "mean": float(r.mean()), "std": float(r.std()), "median": float(np.median(r)), "min": float(r.min()),
            "max": float(r.max()), "episodes": len(r), "mean_length": float(np.mean(self.lengths)),
            "normalized_mean": normalized_return(self.env, float(r.mean())), "levels": self.levels,
            "start_level": self.env.start_level, "num_levels": self.env.num_levels,
            "deterministic": self.deterministic, "seconds": self.seconds, "success_rate": self.success_rate,
        }


FrameSink = Callable[[np.ndarray, float], bool | None]
"""Receives env 0's frame after each of its counted steps, with its episode return so far; returns True once it
wants no more (an evaluation's video of at most N frames), so no more are drawn."""


def eval_views(cfg: Config, spaces: EnvSpaces) -> Views | None:
    """What the video of each evaluation during training shows (`eval.video`; None: no video, or no evaluation), for
    an env of `spaces`; ConfigError naming the setting for a view the env has not."""
    if not cfg.eval.video or cfg.eval.interval_seconds <= 0:
        return None
    return Views.chosen(cfg.eval.video, spaces, cfg.env, "eval.video", cfg.model.actor_keys)


def check_render(cfg: Config, spaces: EnvSpaces) -> None:
    """Where eval.video shows the env's render (`eval_views`), one frame of it drawn before the run starts: a renderer
    that is missing (pygame, OpenGL), an env that does not render or a frame that is no image (`envs.views.rgb_frame`)
    stops the run in one line before its directory is written, not at its first evaluation."""
    views = eval_views(cfg, spaces)
    if views is None or not views.renders:
        return
    env = make_batch_env(cfg.env, cfg.run.seed, 0, 1, 1, (EVAL_STREAM, 0), render=True)
    try:
        env.reset()
        env.frame(0)
    finally:
        env.close()


def play_episodes(model: nn.Module, cfg: Config, levels: str, episodes: int, num_envs: int, deterministic: bool,
                  seed: int, stream: int = 0, frames: FrameSink | None = None, threads: int = 1,
                  until: Callable[[], bool] | None = None, views: Views | None = None) -> EvalResult:
    """Play `episodes` complete episodes on fresh envs and return them.

    Each of the `num_envs` envs plays its fixed share of the episodes and no more, so short episodes are not
    over-counted (stopping all envs at the first N finished episodes would favour them); episodes in progress when
    the last share is done are not counted. `until` may end it early (a demo of S seconds). `frames` receives env
    0's `views` side by side (None: its render) after each of its counted steps, until it returns True."""
    levels = resolve_levels(cfg.env, levels)
    env_cfg = eval_levels(cfg.env, levels)
    num_envs = max(1, min(num_envs, episodes))
    shares = np.array([episodes // num_envs + (i < episodes % num_envs) for i in range(num_envs)])
    env = make_batch_env(env_cfg, seed, 0, num_envs, threads, (EVAL_STREAM, stream), render=_renders(frames, views))
    rng = np.random.default_rng([seed, EVAL_STREAM, stream])
    start = time.perf_counter()
    returns: list[float] = []
    lengths: list[int] = []
    successes: list[float] = []
    starts = list(getattr(env, "level_seeds", lambda: [])())
    level_seeds: list[int] = []
    ret, length, done_count = np.zeros(num_envs), np.zeros(num_envs, dtype=np.int64), np.zeros(num_envs, dtype=int)
    obs, recording = env.reset(), frames is not None
    try:
        while (done_count < shares).any() and not (until and until()):
            actions = act(model, env.actions, obs, cfg.training.precision, deterministic,
                          env.actions.noise([rng] * num_envs))
            obs, rewards, dones, _ = env.step(actions.numpy())
            ret += rewards
            length += 1
            if recording and done_count[0] < shares[0]:
                recording = not frames(env.frame(0) if views is None else views.frame(env, obs[0]), float(ret[0]))
            ended = episodes_ended(env, dones)
            if ended.any():
                now = list(getattr(env, "level_seeds", lambda: [])())
                for i in np.flatnonzero(ended):
                    if done_count[i] < shares[i]:
                        returns.append(float(ret[i]))
                        lengths.append(int(length[i]))
                        successes += reported_success(env, i)
                        if starts:
                            level_seeds.append(starts[i])
                        done_count[i] += 1
                    ret[i], length[i] = 0.0, 0
                    if now:
                        starts[i] = now[i]
    finally:
        env.close()
    return EvalResult(returns, lengths, levels, env_cfg, deterministic, time.perf_counter() - start, level_seeds,
                      successes)


def _renders(frames: FrameSink | None, views: Views | None) -> bool:
    """Whether the eval envs must draw their render: for frames of the env's own view."""
    return frames is not None and (views is None or views.renders)
