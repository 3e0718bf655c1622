"""Procgen's games through its native gym3 API: the games, their levels and score ranges, and the batch env."""

from __future__ import annotations

import contextlib
import io
import warnings
from typing import Any

import numpy as np

from parallel_ppo.envs.config import EnvConfig
from parallel_ppo.envs.spaces import ActionSpace, EnvSpaces
from parallel_ppo.errors import ConfigError

PROCGEN_GAMES = ("bigfish", "bossfight", "caveflyer", "chaser", "climber", "coinrun", "dodgeball", "fruitbot",
                 "heist", "jumper", "leaper", "maze", "miner", "ninja", "plunder", "starpilot")
"""Procgen's games (procgen.env.ENV_NAMES; a test keeps them equal), known without loading Procgen."""

PROCGEN_EXPLORATION_GAMES = ("caveflyer", "climber", "coinrun", "heist", "jumper", "leaper", "maze", "ninja")
"""The games Procgen has an exploration level for (procgen.env.EXPLORATION_LEVEL_SEEDS)."""


LEVEL_LIMIT = 2**31 - 1
"""Procgen's level seeds are below this (31-bit; 0 levels means all of them)."""


PROCGEN_OBS_SHAPE = (64, 64, 3)
PROCGEN_ACTIONS = 15
"""Every Procgen game shares these (RGB frames, the combined 15-button action set)."""

PROCGEN_SPACES = EnvSpaces(PROCGEN_OBS_SHAPE, np.dtype(np.uint8), ActionSpace(PROCGEN_ACTIONS))
"""A Procgen game's spaces, known without loading Procgen (its assets take ~350 MB per process)."""


def check_procgen(cfg: EnvConfig) -> None:
    """ConfigError unless the game has the mode asked for and the levels fit in Procgen's range."""
    if cfg.distribution_mode == "exploration" and cfg.id not in PROCGEN_EXPLORATION_GAMES:
        raise ConfigError(f"{cfg.id} has no exploration mode (games that do: {', '.join(PROCGEN_EXPLORATION_GAMES)})")
    if cfg.start_level + cfg.num_levels > LEVEL_LIMIT:
        raise ConfigError(f"levels {cfg.start_level}..{cfg.start_level + cfg.num_levels - 1} "
                          f"(env.start_level + env.num_levels) go past Procgen's last level {LEVEL_LIMIT - 1}")



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


def import_procgen() -> None:
    """Import procgen quietly (it imports the old `gym`, which prints deprecation notices)."""
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        import procgen  # noqa: F401


PROCGEN_LIBRARIES_HELP = ("its compiled games load the system's libGL and GLib (Debian/Ubuntu: sudo apt-get install "
                          "libgl1 libglib2.0-0)")
"""The fix for a native library that cannot load, as docs/install.md and scripts/check_system.py give it."""


def procgen_env(**kwargs: Any) -> Any:
    """`ProcgenGym3Env(**kwargs)`; ConfigError (one line, the fix) where Procgen's native library cannot load,
    which the first env made loads (importing procgen does not)."""
    import_procgen()
    from procgen import ProcgenGym3Env

    try:
        return ProcgenGym3Env(**kwargs)
    except OSError as e:  # cffi's "cannot load library '.../libenv.so': <why>.  Additionally, ..."
        why = str(e).split("  Additionally,")[0].rstrip(".")
        raise ConfigError(f"Procgen {why}; {PROCGEN_LIBRARIES_HELP}") from None


def preload_procgen(env_id: str) -> None:
    """Procgen's preload (`Family.preload`): load the game assets (~350 MB per process) in this process, so that
    the processes forked from it share them."""
    procgen_env(num=1, env_name=env_id, num_threads=0).close()


class ProcgenBatchEnv:
    """Procgen through `ProcgenGym3Env`: uint8 HWC frames, stepped by procgen's own C++ threads.

    Procgen seeds the envs of a batch from one number, env n from the n-th draw of one generator, so a
    batch split differently would play other levels. Each env here is instead seeded on its own: it starts
    from the state of a one-env game seeded with its own seed (about 2 ms each), so any split of the same
    envs across processes plays the same levels.
    """

    def __init__(self, cfg: EnvConfig, seeds: list[int], threads: int, render: bool = False) -> None:
        """`render`: also draw Procgen's 512×512 frames (`frame`), which costs most of its speed: eval envs only."""
        levels = {} if cfg.distribution_mode == "exploration" else {  # exploration fixes its own level
            "num_levels": cfg.num_levels, "start_level": cfg.start_level}

        def make(num: int, seed: int, num_threads: int) -> Any:
            return procgen_env(num=num, env_name=cfg.id, distribution_mode=cfg.distribution_mode, rand_seed=seed,
                               num_threads=num_threads, render_mode="rgb_array" if render else None, **levels)

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
