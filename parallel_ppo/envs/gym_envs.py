"""Gymnasium envs as a BatchEnv: any registered id (or `module:EnvId`) with Box or Dict observations and Discrete or
Box actions; the makers of the gymnasium families (`envs.families`): Atari with the standard preprocessing,
MuJoCo observed through its state or frames rendered on the CPU, any other id as it is."""

from __future__ import annotations

import collections
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
import numpy as np

from parallel_ppo.envs.config import EnvConfig
from parallel_ppo.envs.families import check_family, mujoco_refusal, options_of
from parallel_ppo.envs.observations import DictLayout
from parallel_ppo.envs.spaces import EnvSpaces, action_space, check_channels, observation_dtype
from parallel_ppo.envs.views import check_render_modes, render_refusal, renderer_help, rgb_frame
from parallel_ppo.errors import ConfigError


class FrameStack:
    """The last `k` frames (H, W, C) of one image side by side along the channels (H, W, k·C); at an episode's
    start, its first frame `k` times."""

    def __init__(self, k: int) -> None:
        self.frames: collections.deque[np.ndarray] = collections.deque(maxlen=k)

    def start(self, frame: np.ndarray) -> np.ndarray:
        self.frames.extend([frame] * self.frames.maxlen)
        return np.concatenate(self.frames, axis=-1)

    def add(self, frame: np.ndarray) -> np.ndarray:
        self.frames.append(frame)
        return np.concatenate(self.frames, axis=-1)


class StackedFrames(gymnasium.Wrapper):
    """Image observations as their `FrameStack` of `k`."""

    def __init__(self, env: Any, k: int) -> None:
        super().__init__(env)
        h, w, c = env.observation_space.shape
        self.observation_space = gymnasium.spaces.Box(0, 255, (h, w, c * k), np.uint8)
        self.stack = FrameStack(k)

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict]:
        obs, info = self.env.reset(**kwargs)
        return self.stack.start(obs), info

    def step(self, action: Any) -> tuple:
        obs, *rest = self.env.step(action)
        return (self.stack.add(obs), *rest)


class PackedDict(gymnasium.Wrapper):
    """A `Dict` observation as one uint8 row by its `layout` (`envs.observations`): each image key (uint8
    (H, W, C)) with its last `k` frames side by side along the channels, each vector key (any numeric Box) as
    float32 values."""

    def __init__(self, env: Any, k: int) -> None:
        super().__init__(env)
        keys = {}
        for key, space in env.observation_space.spaces.items():
            if not isinstance(space, gymnasium.spaces.Box) or not np.issubdtype(space.dtype, np.number):
                raise ConfigError(f"the dict observation's key {key!r} is {space}; supported: Boxes of numbers "
                                  "(vectors, or uint8 (H, W, C) images)")
            if np.prod(space.shape) == 0:
                raise ConfigError(f"the dict observation's key {key!r} is empty ({space})")
            if len(space.shape) == 3 and space.dtype == np.uint8:  # an image; any other Box is read as numbers
                check_channels(space.shape, f"the dict observation's key {key!r}")
                h, w, c = space.shape
                keys[key] = ((h, w, c * k), True)
            else:
                keys[key] = (tuple(space.shape), False)
        self.layout = DictLayout.of(keys)
        if k > 1 and not self.layout.images:
            raise ConfigError(f"env.frame_stack = {k} stacks image frames, but this dict observation has no image "
                              f"key ({', '.join(keys)})")
        self.stacks = {p.key: FrameStack(k) for p in self.layout.images}
        self.observation_space = gymnasium.spaces.Box(0, 255, (self.layout.nbytes,), np.uint8)

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict]:
        obs, info = self.env.reset(**kwargs)
        stacked = {key: stack.start(obs[key]) for key, stack in self.stacks.items()}
        return self.layout.pack({**obs, **stacked}, batched=False), info

    def step(self, action: Any) -> tuple:
        obs, *rest = self.env.step(action)
        stacked = {key: stack.add(obs[key]) for key, stack in self.stacks.items()}
        return (self.layout.pack({**obs, **stacked}, batched=False), *rest)


class EpisodicLife(gymnasium.Wrapper):
    """A life lost ends the episode for learning (terminated) but not the game: the reset that follows plays on with
    a no-op step unless the game is over. `games` counts the games that ended, for the metrics."""

    def __init__(self, env: Any) -> None:
        super().__init__(env)
        self.lives, self.game_over, self.games = 0, True, 0

    def step(self, action: Any) -> tuple:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        self.games += self.game_over
        lives = self.env.unwrapped.ale.lives()
        terminated = terminated or 0 < lives < self.lives
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict]:
        if not self.game_over:
            obs, _, terminated, truncated, info = self.env.step(0)
            self.game_over = terminated or truncated
            self.games += self.game_over
        if self.game_over:
            obs, info = self.env.reset(**kwargs)
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info


class FireReset(gymnasium.Wrapper):
    """FIRE (action 1), then action 2, after every reset: games such as Breakout wait for FIRE to start."""

    @staticmethod
    def applies(env: Any) -> bool:
        """Whether the game has FIRE as action 1 (and an action 2), as CleanRL's wrapper expects."""
        meanings = env.unwrapped.get_action_meanings()
        return len(meanings) >= 3 and meanings[1] == "FIRE"

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict]:
        self.env.reset(**kwargs)
        for action in (1, 2):
            obs, _, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        return obs, info


def quiet_mujoco_deprecations() -> None:
    """MuJoCo (4.0 did, on HalfCheetah's `settotalmass`) can warn on stderr, once per env built, that gymnasium's own
    model files use deprecated attributes: nothing a user can act on. Other MuJoCo warnings still print."""
    import mujoco

    if mujoco.get_mju_user_warning() is None:
        mujoco.set_mju_user_warning(_mujoco_warning)


def _mujoco_warning(message: str) -> None:
    if "is deprecated" not in message:
        print(f"MuJoCo warning: {message}", file=sys.stderr, flush=True)


def fast_render(env: Any) -> None:
    """`fast_scene` for a gymnasium MuJoCo env, multisampling off before its renderer makes its offscreen buffer."""
    unwrapped = env.unwrapped
    unwrapped.model.vis.quality.offsamples = 0  # the viewer, made on first use, makes the buffer
    fast_scene(unwrapped.model, unwrapped.mujoco_renderer._get_viewer("rgb_array").scn)


def fast_scene(model: Any, scene: Any) -> None:
    """Turn off what costs most on a software renderer: multisampling (in the model: it takes effect where an
    offscreen buffer is made next), shadows, reflections and the skybox (in the scene)."""
    import mujoco

    model.vis.quality.offsamples = 0
    for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION, mujoco.mjtRndFlag.mjRND_SKYBOX):
        scene.flags[flag] = 0


class RenderClock:
    """Seconds spent drawing observed frames, summed over the envs of a batch that share it."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def time(self, draw: Any, *args: Any, **kwargs: Any) -> Any:
        """`draw(*args, **kwargs)`, its seconds added."""
        start = time.perf_counter()
        try:
            return draw(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start


class OwnContext(gymnasium.Wrapper):
    """A gymnasium MuJoCo env that draws in its own OpenGL context and frees its GL objects there at close. MuJoCo
    uses whichever context is current: a closed env's render context freed later by the garbage collector deleted
    the live env's buffers, and every later frame read back black, without an error."""

    def render(self) -> Any:
        for viewer in self.env.unwrapped.mujoco_renderer._viewers.values():
            viewer.make_context_current()
        return self.env.render()

    def close(self) -> None:
        for viewer in self.env.unwrapped.mujoco_renderer._viewers.values():
            viewer.make_context_current()
            viewer.con.free()  # now, in its own context: its later destructor frees nothing
        super().close()


class TimedRender(gymnasium.Wrapper):
    """`render()` timed on a RenderClock: below `AddRenderObservation`, that is the observation's frame."""

    def __init__(self, env: Any, clock: RenderClock) -> None:
        super().__init__(env)
        self.clock = clock

    def render(self) -> Any:
        return self.clock.time(self.env.render)


def registered_name(cfg: EnvConfig) -> str:
    """The id gymnasium registered (`module:EnvId` without its module, which `family_of` imported)."""
    return cfg.id.rpartition(":")[2]


def make_atari(cfg: EnvConfig, options: dict[str, Any], render: bool, clock: RenderClock, seed: int) -> Any:
    """An ale-py game preprocessed as the Atari references do: 84×84 grayscale, 4-frame skip, no-op starts."""
    from gymnasium.wrappers import AtariPreprocessing

    env = gymnasium.make(registered_name(cfg), frameskip=1, **({"render_mode": "rgb_array"} if render else {}))
    env = AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=cfg.frame_size, grayscale_obs=True,
                             grayscale_newaxis=True, scale_obs=False)
    if cfg.episodic_life:
        env = EpisodicLife(env)
    if cfg.fire_reset and FireReset.applies(env):  # games without FIRE start by themselves
        env = FireReset(env)
    return env


def draw_headless() -> None:
    """MuJoCo draws headless through EGL unless MUJOCO_GL says otherwise (it would try GLFW first, which fails without
    a display and prints its failure)."""
    os.environ.setdefault("MUJOCO_GL", "egl")


def make_mujoco(cfg: EnvConfig, options: dict[str, Any], render: bool, clock: RenderClock, seed: int) -> Any:
    """A gymnasium MuJoCo env observing its state, or (`env.pixels`) its frames rendered on the CPU."""
    try:
        quiet_mujoco_deprecations()
    except Exception as e:  # importing MuJoCo sets up OpenGL (MUJOCO_GL)
        raise mujoco_refusal(cfg.id, "MuJoCo", e) from None
    if render or cfg.pixels:
        draw_headless()
    if not cfg.pixels:
        env = make_plain(cfg, options, render, clock, seed)
        return OwnContext(env) if render else env
    env = gymnasium.make(registered_name(cfg), render_mode="rgb_array", width=cfg.frame_size,
                         height=cfg.frame_size)
    if cfg.fast_render:
        fast_render(env)
    return gymnasium.wrappers.AddRenderObservation(TimedRender(OwnContext(env), clock), render_only=True)


def make_plain(cfg: EnvConfig, options: dict[str, Any], render: bool, clock: RenderClock, seed: int) -> Any:
    """Any registered gymnasium id (`module:EnvId` imports the module first) as it is; refused where `render` is
    asked of one that does not render (`check_render_modes`)."""
    if render:
        check_render_modes(cfg.id)
    return gymnasium.make(registered_name(cfg), **({"render_mode": "rgb_array"} if render else {}))


def stacked(env: Any, cfg: EnvConfig, default_stack: int) -> Any:
    """`env` with its image frames stacked (`env.frame_stack`, 0: `default_stack` for images, else 1) and a dict
    observation packed into one row; ConfigError (the env closed) for a stack of vectors or an image laid out
    channels first (`check_channels`)."""
    image = isinstance(env.observation_space, gymnasium.spaces.Box) and len(env.observation_space.shape) == 3
    if image and env.observation_space.dtype == np.uint8:  # a float one is refused as such
        try:
            check_channels(env.observation_space.shape, f"{cfg.id}'s observation")
        except ConfigError:
            env.close()
            raise
    k = cfg.frame_stack or (default_stack if image else 1)
    if isinstance(env.observation_space, gymnasium.spaces.Dict):
        try:
            return PackedDict(env, k)
        except ConfigError:
            env.close()
            raise
    if k > 1 and not image:
        env.close()
        raise ConfigError(f"env.frame_stack = {k} stacks image frames, but {cfg.id} observes vectors "
                          f"{env.observation_space.shape}")
    return StackedFrames(env, k) if k > 1 else env


def _wrapper(env: Any, kind: type) -> Any:
    """The wrapper of type `kind` in `env`'s chain, or None."""
    while isinstance(env, gymnasium.Wrapper) and not isinstance(env, kind):
        env = env.env
    return env if isinstance(env, kind) else None


class GymnasiumBatchEnv:
    """Gymnasium envs in a `SyncVectorEnv` that resets finished envs in the same step; continuous actions are
    clipped to the space's bounds here, at the env."""

    def __init__(self, cfg: EnvConfig, seeds: list[int], render: bool = False) -> None:
        """One env per seed, each built by its family's maker (`envs.families`)."""
        self._seeds, self._id = seeds, cfg.id
        self._family = family = check_family(cfg)
        options, make = options_of(cfg, family), family.maker()
        self._clock = clock = RenderClock()

        def builder(seed: int) -> Callable[[], Any]:  # not holding `self`: a closed batch env is freed at once
            return lambda: stacked(make(cfg, options, render, clock, seed), cfg, family.frame_stack)

        num_envs = len(seeds)
        try:
            self._env = gymnasium.vector.SyncVectorEnv([builder(seed) for seed in seeds],
                                                       autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP)
        except ConfigError:
            raise
        except Exception as e:  # a registered id whose dependencies are missing, a renderer that cannot start
            cameras = any(options[name] for name, option in family.options.items() if option.camera)
            help_ = renderer_help(e, cfg.pixels or cameras or render and family.gl)
            raise ConfigError(f"cannot create gymnasium env {cfg.id!r}: {type(e).__name__}: {e}{help_}") from None
        packed = _wrapper(self._env.envs[0], PackedDict)
        self.layout = packed.layout if packed is not None else None
        """A dict observation's layout (None: a Box)."""
        try:
            self.actions = action_space(self._env.single_action_space, cfg.id)
            obs_space = self._env.single_observation_space
            self.obs_dtype = np.dtype(np.uint8) if packed is not None else observation_dtype(obs_space, cfg.id)
        except ConfigError:
            self._env.close()
            raise
        self.num_envs = num_envs
        self.obs_shape = tuple(obs_space.shape)
        self._lives = [_wrapper(e, EpisodicLife) for e in self._env.envs] if cfg.episodic_life else []
        self._games = np.zeros(num_envs, dtype=np.int64)
        self.game_over: np.ndarray | None = None
        """With episodic life: where the last step ended a game (its `dones` end lives too); else None."""
        self._final_info: dict[str, Any] = {}
        """The last step's `info["final_info"]`: per entry, the values of the envs whose episode it ended, and the
        mask `_entry` of those that had the entry."""
        if self.actions.continuous:
            self._low, self._high = np.array(self.actions.low), np.array(self.actions.high)
            self._action_dtype = self._env.single_action_space.dtype

    @property
    def render_seconds(self) -> float:
        return self._clock.seconds

    @property
    def spaces(self) -> EnvSpaces:
        return EnvSpaces(self.obs_shape, self.obs_dtype, self.actions, self.layout)

    def reset(self) -> np.ndarray:
        obs, _ = self._env.reset(seed=self._seeds)
        return obs.astype(self.obs_dtype, copy=False)

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[int, np.ndarray]]:
        if self.actions.continuous:
            actions = np.clip(actions, self._low, self._high).astype(self._action_dtype, copy=False)
        obs, rew, term, trunc, info = self._env.step(actions)
        self._final_info = info.get("final_info", {})
        cut = {int(i): np.asarray(info["final_obs"][i], dtype=self.obs_dtype)
               for i in np.flatnonzero(np.logical_and(trunc, np.logical_not(term)))}
        if self._lives:
            games = np.array([w.games for w in self._lives])
            self.game_over, self._games = games > self._games, games
        return obs.astype(self.obs_dtype, copy=False), rew.astype(np.float32), np.logical_or(term, trunc), cut

    def final_info(self, index: int, keys: Sequence[str]) -> dict[str, Any]:
        """The entries `keys` of the info that env `index` returned on the step that ended its episode, where the last
        step ended one and the entry was there (a nested dict entry as gymnasium gathers it, over all envs)."""
        found = {}
        for key in keys:
            values, had = self._final_info.get(key), self._final_info.get(f"_{key}")
            if values is not None and had is not None and had[index]:
                found[key] = values if isinstance(values, dict) else values[index]
        return found

    def frame(self, index: int) -> np.ndarray:
        """The RGB frame of env `index` now (needs `render`, or pixels): its render as `rgb_frame` takes it."""
        try:
            frame = self._env.envs[index].render()
        except Exception as e:  # MuJoCo makes its renderer on the first frame
            raise render_refusal(self._id, e, self._family.gl) from None
        return rgb_frame(self._id, frame)

    def close(self) -> None:
        self._env.close()
