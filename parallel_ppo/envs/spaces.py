"""What a policy acts on: discrete choices or a box of real numbers, described without gymnasium or torch; which of
gymnasium's spaces the trainer takes (gymnasium imported where they are read)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from parallel_ppo.errors import ConfigError

if TYPE_CHECKING:
    from parallel_ppo.envs.observations import DictLayout


@dataclass(frozen=True)
class ActionSpace:
    """`n` discrete actions, or (`low`, `high` given) a box of `n` real-valued action dimensions."""

    n: int
    low: tuple[float, ...] | None = None
    high: tuple[float, ...] | None = None

    @property
    def continuous(self) -> bool:
        return self.low is not None

    @property
    def policy_outputs(self) -> int:
        """Numbers the network emits per observation: logits, or a mean and a log-std per dimension."""
        return 2 * self.n if self.continuous else self.n

    @property
    def shape(self) -> tuple[int, ...]:
        """One env's action in the rollout: a scalar index, or `n` floats."""
        return (self.n,) if self.continuous else ()

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32) if self.continuous else np.dtype(np.int64)

    def noise(self, rngs: list[np.random.Generator]) -> np.ndarray:
        """One env's randomness per generator: a uniform number (inverse-CDF sampling of a discrete action) or
        `n` standard normals. Drawn per env, so an env's actions do not depend on how the envs are batched."""
        if self.continuous:
            return np.array([g.standard_normal(self.n) for g in rngs], np.float32).reshape(len(rngs), self.n)
        return np.array([g.random() for g in rngs])

    def sample_uniform(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """`count` random actions (benchmarks' stand-in for a policy): uniform within finite bounds, else N(0, 1)."""
        if not self.continuous:
            return rng.integers(0, self.n, size=count)
        low, high = np.asarray(self.low), np.asarray(self.high)
        finite = np.isfinite(low) & np.isfinite(high)
        actions = rng.standard_normal((count, self.n))
        actions[:, finite] = rng.uniform(low[finite], high[finite], size=(count, int(finite.sum())))
        return actions.astype(np.float32)

    def describe(self) -> str:
        if not self.continuous:
            return f"Discrete({self.n})"
        bounds = {(lo, hi) for lo, hi in zip(self.low, self.high, strict=True)}
        if len(bounds) == 1:
            lo, hi = bounds.pop()
            return f"Box({lo:g}, {hi:g}, ({self.n},))"
        return f"Box(({self.n},))"

    def to_dict(self) -> dict[str, object]:
        """Plain data (inf as None) for JSON and checkpoints."""
        def plain(values: tuple[float, ...] | None) -> list[float | None] | None:
            return None if values is None else [v if math.isfinite(v) else None for v in values]
        return {"n": self.n, "low": plain(self.low), "high": plain(self.high)}


def as_action_space(actions: ActionSpace | int) -> ActionSpace:
    """An ActionSpace, where a bare int means that many discrete actions."""
    return actions if isinstance(actions, ActionSpace) else ActionSpace(int(actions))


class EnvSpaces(NamedTuple):
    """What the trainer needs to know of an env before it builds the network and buffers."""

    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    actions: ActionSpace
    layout: DictLayout | None = None
    """Where each key of a dict observation sits in the packed uint8 rows of shape `obs_shape` (None: a Box)."""


def check_channels(shape: tuple[int, ...], what: str) -> None:
    """ConfigError for an image `shape` laid out channels first (C, H, W): a first dimension smaller than both others
    (an image of frames stacked channels last, 84×84×12, passes); `what` names it."""
    if shape[0] < min(shape[1], shape[2]):
        raise ConfigError(f"{what} is an image {shape} laid out channels first, whose rows would be read as "
                          f"{shape[-1]} channels; an image must be H×W×C, channels last (env.frame_stack stacks "
                          "frames)")


def action_space(space: Any, env_id: str) -> ActionSpace:
    """Our description of a gymnasium action space; ConfigError naming any other space."""
    import gymnasium  # here: a Procgen run needs none of it

    supported = "supported: Discrete(n) starting at 0, or a Box of floats of shape (n,), n ≥ 1"
    if isinstance(space, gymnasium.spaces.Discrete):
        if space.start != 0:
            raise ConfigError(f"{env_id} has the action space {space}, starting at {space.start}; {supported}")
        return ActionSpace(int(space.n))
    if isinstance(space, gymnasium.spaces.Box) and len(space.shape) == 1 and space.shape[0] > 0:
        if not np.issubdtype(space.dtype, np.floating):
            raise ConfigError(f"{env_id} has {space.dtype} actions {space}; {supported} (integer choices: Discrete)")
        return ActionSpace(int(space.shape[0]), tuple(map(float, space.low)), tuple(map(float, space.high)))
    raise ConfigError(f"{env_id} has the action space {space}; {supported}")


def observation_dtype(space: Any, env_id: str) -> np.dtype:
    """uint8 for (H, W, C) images, float32 for vectors; ConfigError naming any other space."""
    import gymnasium

    if not isinstance(space, gymnasium.spaces.Box):
        raise ConfigError(f"{env_id} has the observation space {type(space).__name__} ({space}); supported: a Box of "
                          "vectors or of uint8 (H, W, C) images")
    if math.prod(space.shape) == 0:
        raise ConfigError(f"{env_id} has the observation space {space}, which holds no value; supported: a Box of "
                          "vectors or of uint8 (H, W, C) images")
    if len(space.shape) == 3:
        if space.dtype != np.uint8:
            raise ConfigError(f"{env_id} has {space.dtype} images {space.shape}; image observations must be uint8 "
                              "(H, W, C) in 0..255")
        return np.dtype(np.uint8)
    if len(space.shape) not in (1, 2) or not np.issubdtype(space.dtype, np.number):
        raise ConfigError(f"{env_id} has the observation space {space}; supported: vectors or (H, W, C) images")
    return np.dtype(np.float32)
