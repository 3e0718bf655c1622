"""Batched environments behind one small protocol: Procgen's native gym3 API here, gymnasium envs (classic
control, MuJoCo, Atari, any registered id) in `core.gym_envs`."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import warnings
from typing import Protocol

import numpy as np

from parallel_ppo.core.config import EnvConfig
from parallel_ppo.core.spaces import ActionSpace, EnvSpaces
from parallel_ppo.errors import ConfigError

PROCGEN_GAMES = ("bigfish", "bossfight", "caveflyer", "chaser", "climber", "coinrun", "dodgeball", "fruitbot",
                 "heist", "jumper", "leaper", "maze", "miner", "ninja", "plunder", "starpilot")
"""Procgen's games (procgen.env.ENV_NAMES; a test keeps them equal), known without loading Procgen."""

PROCGEN_EXPLORATION_GAMES = ("caveflyer", "climber", "coinrun", "heist", "jumper", "leaper", "maze", "ninja")
"""The games Procgen has an exploration level for (procgen.env.EXPLORATION_LEVEL_SEEDS)."""


LEVEL_LIMIT = 2**31 - 1
"""Procgen's level seeds are below this (31-bit; 0 levels means all of them)."""


def check_env(cfg: EnvConfig) -> None:
    """Raise ConfigError unless `cfg.id` is a Procgen game (in a mode it has) or a registered gymnasium id whose
    family has the env settings asked for (its spaces are checked where the env is first built: `env_spaces`)."""
    if cfg.id in PROCGEN_GAMES:
        if cfg.distribution_mode == "exploration" and cfg.id not in PROCGEN_EXPLORATION_GAMES:
            raise ConfigError(f"{cfg.id} has no exploration mode (games that do: "
                              f"{', '.join(PROCGEN_EXPLORATION_GAMES)})")
        if cfg.pixels or cfg.frame_stack > 1 or cfg.episodic_life or cfg.fire_reset:
            raise ConfigError(f"env.pixels, env.frame_stack, env.episodic_life and env.fire_reset apply to gymnasium "
                              f"envs; {cfg.id} is a Procgen game, which observes single 64×64 frames")
        if cfg.start_level + cfg.num_levels > LEVEL_LIMIT:
            raise ConfigError(f"levels {cfg.start_level}..{cfg.start_level + cfg.num_levels - 1} "
                              f"(env.start_level + env.num_levels) go past Procgen's last level {LEVEL_LIMIT - 1}")
        return
    from parallel_ppo.core.gym_envs import env_family

    env_family(cfg)


PROCGEN_EASY_RANGES = {
    "bigfish": (1.0, 40.0), "bossfight": (0.5, 13.0), "caveflyer": (3.5, 12.0), "chaser": (0.5, 13.0),
    "climber": (2.0, 12.6), "coinrun": (5.0, 10.0), "dodgeball": (1.5, 19.0), "fruitbot": (-1.5, 32.4),
    "heist": (3.5, 10.0), "jumper": (3.0, 10.0), "leaper": (3.0, 10.0), "maze": (5.0, 10.0),
    "miner": (1.5, 13.0), "ninja": (3.5, 10.0), "plunder": (4.5, 30.0), "starpilot": (2.5, 64.0),
}
"""(R_min, R_max) of each game in easy mode, as in the Procgen paper (Cobbe et al. 2020, appendix) and
openai/train-procgen. Jumper and leaper use R_min = 3, the easy-mode value; some copies carry the hard-mode
minimums (1 and 1.5) instead."""

def normalized_return(env: EnvConfig, value: float | None) -> float | None:
    """(R − R_min) / (R_max − R_min) for a Procgen game in easy mode; None where no constants apply."""
    if value is None or env.id not in PROCGEN_EASY_RANGES or env.distribution_mode != "easy":
        return None
    low, high = PROCGEN_EASY_RANGES[env.id]
    return (value - low) / (high - low)


TEST_LEVELS = 1_000_000
"""Test levels are the next TEST_LEVELS level seeds after the training range: disjoint from it by construction."""


def no_test_levels(env: EnvConfig) -> str | None:
    """Why a run on `env` has no levels to hold out for a test, or None when it has (Procgen's unseen levels)."""
    if env.id not in PROCGEN_GAMES:
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
    `episodes_ended`."""

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


def reported_success(env: BatchEnv, index: int) -> list[float]:
    """[1.0] or [0.0] where env `index`'s episode just ended and the env said whether it succeeded
    (`successes`, e.g. gymnasium's `info["is_success"]`); [] otherwise."""
    successes = getattr(env, "successes", None)
    return [] if successes is None or np.isnan(successes[index]) else [float(successes[index])]


def import_procgen() -> None:
    """Import procgen quietly (it imports the old `gym`, which prints deprecation notices)."""
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        import procgen  # noqa: F401


def env_seed(seed: int, env_index: int, stream: tuple[int, ...] = (0, 0)) -> int:
    """A 31-bit seed from the run seed, an env's global index and a stream (resume count, restart count)."""
    return int(np.random.SeedSequence([seed, env_index, *stream]).generate_state(1)[0] & 0x7FFFFFFF)


class ProcgenBatchEnv:
    """Procgen through `ProcgenGym3Env`: uint8 HWC frames, stepped by procgen's own C++ threads.

    Procgen seeds the envs of a batch from one number, env n from the n-th draw of one generator, so a
    batch split differently would play other levels. Each env here is instead seeded on its own: it starts
    from the state of a one-env game seeded with its own seed (about 2 ms each), so any split of the same
    envs across processes plays the same levels.
    """

    def __init__(self, cfg: EnvConfig, seeds: list[int], threads: int, render: bool = False) -> None:
        """`render`: also draw Procgen's 512×512 frames (`frame`), which costs most of its speed: eval envs only."""
        import_procgen()
        from procgen import ProcgenGym3Env

        levels = {} if cfg.distribution_mode == "exploration" else {  # exploration fixes its own level
            "num_levels": cfg.num_levels, "start_level": cfg.start_level}

        def make(num: int, seed: int, num_threads: int) -> ProcgenGym3Env:
            return ProcgenGym3Env(num=num, env_name=cfg.id, distribution_mode=cfg.distribution_mode,
                                  rand_seed=seed, num_threads=num_threads,
                                  render_mode="rgb_array" if render else None, **levels)

        states = []
        for seed in seeds:
            single = make(1, seed, 0)
            states.extend(single.callmethod("get_state"))
            single.close()
        self._env = make(len(seeds), seeds[0], threads)
        self._env.callmethod("set_state", states)
        self.num_envs = len(seeds)
        self.obs_shape = tuple(self._env.ob_space["rgb"].shape)
        self.obs_dtype = np.dtype(np.uint8)
        self.actions = ActionSpace(int(self._env.ac_space.eltype.n))
        self.spaces = EnvSpaces(self.obs_shape, self.obs_dtype, self.actions)

    def reset(self) -> np.ndarray:
        _, ob, _ = self._env.observe()
        return ob["rgb"]

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[int, np.ndarray]]:
        self._env.act(actions.astype(np.int32, copy=False))
        rew, ob, first = self._env.observe()
        return ob["rgb"], rew.astype(np.float32, copy=False), first.astype(bool, copy=False), {}

    def frame(self, index: int) -> np.ndarray:
        """The high-resolution RGB frame of env `index` now (needs `render`)."""
        return self._env.get_info()[index]["rgb"]

    def level_seeds(self) -> list[int]:
        """The level each env is playing now."""
        return [int(info["level_seed"]) for info in self._env.get_info()]

    def close(self) -> None:
        self._env.close()


PROCGEN_OBS_SHAPE = (64, 64, 3)
PROCGEN_ACTIONS = 15
"""Every Procgen game shares these (RGB frames, the combined 15-button action set)."""


def env_spaces(cfg: EnvConfig) -> EnvSpaces:
    """The env's spaces without loading Procgen (its assets take ~350 MB per process); a gymnasium
    env is built once, which refuses the spaces this trainer cannot learn from (ConfigError)."""
    if cfg.id in PROCGEN_GAMES:
        return EnvSpaces(PROCGEN_OBS_SHAPE, np.dtype(np.uint8), ActionSpace(PROCGEN_ACTIONS))
    from parallel_ppo.core.gym_envs import GymnasiumBatchEnv

    env = GymnasiumBatchEnv(cfg, 1, [0])
    env.close()
    return env.spaces


def make_batch_env(cfg: EnvConfig, seed: int, first_env: int, num_envs: int, threads: int,
                   stream: tuple[int, ...] = (0, 0), render: bool = False) -> BatchEnv:
    """Build envs with global indices [first_env, first_env + num_envs), each seeded from (seed, index, stream),
    so any split of the same envs across workers steps identically. `render` makes `frame(i)` available."""
    seeds = [env_seed(seed, first_env + i, stream) for i in range(num_envs)]
    if cfg.id in PROCGEN_GAMES:
        return ProcgenBatchEnv(cfg, seeds, threads, render)
    from parallel_ppo.core.gym_envs import GymnasiumBatchEnv

    return GymnasiumBatchEnv(cfg, num_envs, seeds, render)
