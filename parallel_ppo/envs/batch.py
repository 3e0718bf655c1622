"""Batched environments behind one small protocol, built by their family (`envs.families`): Procgen's native
gym3 API in `envs.procgen_envs`, gymnasium envs (classic control, MuJoCo, Atari, robot arms, any registered id) in
`envs.gym_envs`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from parallel_ppo.envs.config import EnvConfig
from parallel_ppo.envs.families import family_of
from parallel_ppo.envs.procgen_envs import LEVEL_LIMIT
from parallel_ppo.envs.spaces import ActionSpace, EnvSpaces
from parallel_ppo.errors import ConfigError

TEST_LEVELS = 1_000_000
"""Test levels are the next TEST_LEVELS level seeds after the training range: disjoint from it by construction."""


def no_test_levels(env: EnvConfig) -> str | None:
    """Why a run on `env` has no levels to hold out for a test, or None when it has (Procgen's unseen levels)."""
    if not family_of(env.id).levels:
        return f"{env.id} has no levels to hold out: evaluate it on its own distribution"
    if env.distribution_mode == "exploration":
        return "exploration mode plays one fixed level: there are no test levels"
    if env.num_levels == 0:
        return "the run trained on every level (num_levels 0): no level is held out"
    if env.start_level + env.num_levels >= LEVEL_LIMIT:
        return f"the run trained up to Procgen's last level {LEVEL_LIMIT - 1}: no level is left to hold out"
    return None


def resolve_levels(env: EnvConfig, levels: str) -> str:
    """`auto`: `test` where the run has levels to hold out (Procgen), else `train` (its only set); others as given."""
    if levels == "auto":
        return "train" if no_test_levels(env) else "test"
    return levels


def eval_levels(env: EnvConfig, levels: str) -> EnvConfig:
    """The env config to evaluate on: `train` (the run's own levels), `test` (levels it never saw) or `auto`."""
    if resolve_levels(env, levels) == "train":
        return dataclasses.replace(env)
    if why := no_test_levels(env):
        raise ConfigError(f"{why} (use levels train, or eval.levels=train)")
    start = env.start_level + env.num_levels
    return dataclasses.replace(env, start_level=start, num_levels=min(TEST_LEVELS, LEVEL_LIMIT - start))


class BatchEnv(Protocol):
    """`num_envs` envs stepped together. `step` auto-resets finished envs and returns the new first obs. An env
    whose `dones` are not the ends of scored episodes (Atari's episodic life) also has `game_over`: see
    `episodes_ended`; one that draws frames for its observations (cameras, pixels) has `render_seconds`, the
    seconds spent drawing them since it was built: see `render_seconds`; one whose episodes end with an info
    (gymnasium's) has `final_info(index, keys)`: see `episode_info`."""

    num_envs: int
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    actions: ActionSpace
    spaces: EnvSpaces
    """The three above, and a dict observation's layout."""

    def reset(self) -> np.ndarray:
        """Start every env; returns observations shaped (num_envs, *obs_shape)."""
        ...

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[int, np.ndarray]]:
        """Apply one action per env (an index, or a vector a Box env clips to its bounds); returns (next_obs,
        rewards float32, dones bool: this step ended it, cut).

        `cut` maps the envs whose episode a time limit cut short (truncated, not terminated) to their last
        observation: the learner bootstraps the value of that state, since the task itself went on.
        """
        ...

    def close(self) -> None: ...


def episodes_ended(env: BatchEnv, dones: np.ndarray) -> np.ndarray:
    """Where the last step ended an episode as it is scored: `dones`, except with Atari's episodic life, where a
    life lost ends the episode for learning only and the env says which games ended (`game_over`)."""
    game_over = getattr(env, "game_over", None)
    return dones if game_over is None else game_over


SUCCESS = "is_success"
"""The final-info entry that says whether an episode succeeded (gymnasium-robotics' convention, and this project's
robot families): read wherever an env reports it, as 1.0 or 0.0."""


def episode_info(env: BatchEnv, index: int, keys: Sequence[str]) -> tuple[dict[str, float], dict[str, str]]:
    """The entries `keys` of the final info of env `index`'s episode that the last step ended (`final_info`, where
    the env keeps one), as numbers (`SUCCESS` as 1.0 or 0.0); an entry it lacks, or holds as None or NaN, is left
    out. Apart: each entry that is not a number (a word, a list, a dict), as it looks, for the trainer to refuse."""
    final_info = getattr(env, "final_info", None)
    numbers: dict[str, float] = {}
    not_numbers: dict[str, str] = {}
    for key, value in ({} if final_info is None else final_info(index, keys)).items():
        if not _is_number(value):
            shown = repr(value)
            not_numbers[key] = f"{shown[:40]}{'…' if len(shown) > 40 else ''} ({type(value).__name__})"
        elif value is not None and not np.isnan(number := float(np.asarray(value).reshape(()))):
            numbers[key] = float(number > 0) if key == SUCCESS else number
    return numbers, not_numbers


def _is_number(value: object) -> bool:
    """Whether an info entry is a number: a bool, int, float or numpy number, or an array of one (None counts, as
    a number not given)."""
    if value is None or isinstance(value, (bool, int, float, np.bool_, np.integer, np.floating)):
        return True
    return isinstance(value, np.ndarray) and value.size == 1 and value.dtype.kind in "biuf"


def reported_success(env: BatchEnv, index: int) -> list[float]:
    """[1.0] or [0.0] where env `index`'s episode just ended and the env said whether it succeeded
    (`info["is_success"]`); [] otherwise."""
    return list(episode_info(env, index, (SUCCESS,))[0].values())


def render_seconds(env: BatchEnv) -> float:
    """Seconds `env` has spent drawing observed frames; 0 where it does not tell them apart from its step."""
    return getattr(env, "render_seconds", 0.0)


def env_seed(seed: int, env_index: int, stream: tuple[int, ...] = (0, 0)) -> int:
    """A 31-bit seed from the run seed, an env's global index and a stream (resume count, restart count)."""
    return int(np.random.SeedSequence([seed, env_index, *stream]).generate_state(1)[0] & 0x7FFFFFFF)


def env_spaces(cfg: EnvConfig) -> EnvSpaces:
    """The env's spaces: where its family knows them, without building it (Procgen's assets take ~350 MB per
    process); any other env is built once, which refuses the spaces this trainer cannot learn from (ConfigError)."""
    known = family_of(cfg.id).spaces
    if known is not None:
        return known
    env = make_batch_env(cfg, 0, 0, 1, 1)
    env.close()
    return env.spaces


def make_batch_env(cfg: EnvConfig, seed: int, first_env: int, num_envs: int, threads: int,
                   stream: tuple[int, ...] = (0, 0), render: bool = False) -> BatchEnv:
    """Build envs with global indices [first_env, first_env + num_envs), each seeded from (seed, index, stream),
    so any split of the same envs across workers steps identically. `render` makes `frame(i)` available."""
    seeds = [env_seed(seed, first_env + i, stream) for i in range(num_envs)]
    family = family_of(cfg.id)
    if family.native:
        return family.maker()(cfg, seeds, threads, render)
    from parallel_ppo.envs.gym_envs import GymnasiumBatchEnv

    return GymnasiumBatchEnv(cfg, seeds, render)
