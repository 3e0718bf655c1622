"""What a policy sees, as RGB frames a person can watch: each image of its observation as the network receives it
(resized and stacked by the env; a run's augmentation comes later, in the update, and is never shown), the newest
frame of a stack, beside the env's own render (a third-person camera), side by side in one frame of a video."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium.envs.registration import load_env_creator
from gymnasium.error import DependencyNotInstalled

from parallel_ppo.envs.config import EnvConfig
from parallel_ppo.envs.families import RENDERER_HELP, family_of, registry_entry
from parallel_ppo.envs.spaces import EnvSpaces
from parallel_ppo.errors import ConfigError

ENV_VIEW, AGENT_VIEW = "env", "agent"
"""The views by name: the env's own render, and every image the policy observes (or one image key by its name)."""
MIN_HEIGHT = 256
"""Without the env's render to match, the policy's images are shown enlarged by a whole factor to at least this."""


def render_refusal(env_id: str, e: Exception, gl: bool) -> ConfigError:
    """The one line for an env whose render failed with `e`: it has none, a package is missing (gymnasium's own line
    names it) or, for an env that draws through OpenGL (`gl`), the renderer may be missing (`renderer_help`)."""
    if isinstance(e, NotImplementedError):
        return ConfigError(f"{env_id} has no render to draw: it has no view env to show")
    if isinstance(e, DependencyNotInstalled):
        return ConfigError(f"cannot render {env_id}: {e}")
    return ConfigError(f"cannot render {env_id}: {type(e).__name__}: {e}{renderer_help(e, gl)}")


def renderer_help(e: Exception, gl: bool) -> str:
    """`RENDERER_HELP` after "; " where `e` may be OpenGL's: the env draws through it (`gl`: MuJoCo's or Genesis's
    renderer) and `e` is no missing package (gymnasium's own line names that); else nothing."""
    return f"; {RENDERER_HELP}" if gl and not isinstance(e, DependencyNotInstalled) else ""


def check_render_modes(env_id: str) -> None:
    """ConfigError where the gymnasium env `env_id` does not render: its class's metadata lists no `rgb_array` render
    mode (gymnasium's default lists none). A creator without metadata of its own (a function) is taken at its word."""
    entry_point = registry_entry(env_id).entry_point
    creator = load_env_creator(entry_point) if isinstance(entry_point, str) else entry_point
    metadata = getattr(creator, "metadata", None)
    if isinstance(metadata, dict) and "rgb_array" not in (metadata.get("render_modes") or ()):
        raise ConfigError(f"{env_id} does not render: its metadata lists no rgb_array render mode (render_modes: "
                          f"{metadata.get('render_modes')}), so it has no view env to show")


def rgb_frame(env_id: str, frame: Any) -> np.ndarray:
    """`frame`, the render of env `env_id`, as RGB uint8 (H, W, 3): a gray one ((H, W) or (H, W, 1)) repeated in the
    three colours, an RGBA one without its alpha; ConfigError naming the env for anything else."""
    if isinstance(frame, np.ndarray) and frame.dtype == np.uint8 and frame.ndim in (2, 3):
        image = frame[..., None] if frame.ndim == 2 else frame
        if image.shape[-1] in (1, 3, 4):
            return np.repeat(image, 3, axis=-1) if image.shape[-1] == 1 else np.ascontiguousarray(image[..., :3])
    what = (f"{frame.dtype} values of shape {frame.shape}" if isinstance(frame, np.ndarray) else
            "None" if frame is None else f"a {type(frame).__name__}")
    raise ConfigError(f"{env_id}'s render gave {what}, not an image a video can show: uint8 of shape (H, W, 3) "
                      "(RGB), (H, W, 4) (RGBA) or (H, W) (gray)")


@dataclass(frozen=True)
class ImageView:
    """One image the policy observes: the whole observation (`offset` None) or a dict key's image at `offset` bytes
    of the packed row, (H, W, k·C) with the newest of its `k` stacked frames in the last `channels`."""

    name: str
    shape: tuple[int, ...]
    channels: int
    offset: int | None = None

    def frame(self, obs: np.ndarray) -> np.ndarray:
        """Its newest frame in one env's observation `obs`, as RGB uint8 (H, W, 3): a gray frame repeated in the
        three colours, channels past the third (alpha) dropped."""
        image = obs if self.offset is None else obs[self.offset:self.offset + math.prod(self.shape)].reshape(self.shape)
        newest = image[..., image.shape[-1] - self.channels:]
        return np.repeat(newest[..., :1], 3, axis=-1) if self.channels < 3 else np.ascontiguousarray(newest[..., :3])


def image_views(spaces: EnvSpaces, env: EnvConfig) -> tuple[ImageView, ...]:
    """The images the policy of an env with `spaces` observes: each image key of a dict observation, else the
    observation itself where it is an image (H, W, C), else none. Frames are stacked as `envs.gym_envs.stacked`
    stacks them: `env.frame_stack`, or (0) the family's default for an image observation and 1 for a dict's keys."""
    if spaces.layout is not None:
        k = env.frame_stack or 1
        return tuple(ImageView(p.key, p.shape, max(1, p.shape[-1] // k), p.offset) for p in spaces.layout.images)
    if len(spaces.obs_shape) == 3:
        k = env.frame_stack or family_of(env.id).frame_stack
        return (ImageView("observation", spaces.obs_shape, max(1, spaces.obs_shape[-1] // k)),)
    return ()


def side_by_side(frames: Sequence[np.ndarray], height: int) -> np.ndarray:
    """RGB `frames` left to right, each scaled by nearest neighbour to `height` rows (its width in proportion)."""
    scaled = []
    for frame in frames:
        h, w = frame.shape[:2]
        if h != height:
            width = max(1, round(w * height / h))
            frame = frame[(np.arange(height) * h // height)[:, None], np.arange(width) * w // width]
        scaled.append(frame)
    return np.concatenate(scaled, axis=1)


@dataclass(frozen=True)
class Views:
    """The views of a video, left to right: None for the env's render, else an image the policy observes."""

    views: tuple[ImageView | None, ...]

    @classmethod
    def chosen(cls, names: Sequence[str], spaces: EnvSpaces, env: EnvConfig, setting: str,
               actor_keys: Sequence[str] = ()) -> Views:
        """The views `names` asks for (`env`, `agent`: every image the policy observes, or an image key), in
        order and each once; ConfigError, naming `setting` (where the names were given), for a name the env has
        no view of. `actor_keys`: the keys of a dict observation the policy reads (empty: all; `agent` shows only
        these, a key named shows its image either way)."""
        every = image_views(spaces, env)
        keys = {v.name: v for v in every} if spaces.layout is not None else {}
        images = [v for v in every if not actor_keys or spaces.layout is None or v.name in actor_keys]
        chosen: list[ImageView | None] = []
        for name in names:
            if name == AGENT_VIEW and not images:
                why = (f"it reads none of {env.id}'s images (model.actor_keys: {', '.join(actor_keys)})" if every else
                       f"{env.id} gives it none (it observes {_observed(spaces)})")
                raise ConfigError(f"{setting}: the view {AGENT_VIEW} shows the images the policy observes, and "
                                  f"{why}; show the view {ENV_VIEW}{' or an image key' if keys else ''}")
            if name not in (ENV_VIEW, AGENT_VIEW, *keys):
                known = [ENV_VIEW, *([AGENT_VIEW] if images else []), *keys]
                raise ConfigError(f"{setting}: no view {name!r} (the views of {env.id}: {', '.join(known)})")
            chosen += [None] if name == ENV_VIEW else images if name == AGENT_VIEW else [keys[name]]
        if not chosen:
            raise ConfigError(f"{setting}: no view named (the views: {ENV_VIEW}, {AGENT_VIEW})")
        return cls(tuple(dict.fromkeys(chosen)))

    @property
    def names(self) -> list[str]:
        """Its views left to right: `env`, or an image's key (`observation` for an image observation)."""
        return [ENV_VIEW if v is None else v.name for v in self.views]

    @property
    def renders(self) -> bool:
        """Whether it shows the env's render (so the envs must draw one)."""
        return None in self.views

    def frame(self, env: Any, obs: np.ndarray) -> np.ndarray:
        """Env 0 of the batch env `env` (its render by `env.frame(0)`) and its observation `obs` now, as one RGB
        frame: the views side by side at the height of the render, or without it, the policy's images enlarged by
        the least whole factor that makes them `MIN_HEIGHT` tall."""
        panels = [env.frame(0) if v is None else v.frame(obs) for v in self.views]
        if self.renders:
            height = panels[self.views.index(None)].shape[0]
        else:
            tallest = max(p.shape[0] for p in panels)
            height = tallest * -(-MIN_HEIGHT // tallest)
        return side_by_side(panels, height)


def _observed(spaces: EnvSpaces) -> str:
    if spaces.layout is not None:
        return f"a dict of vectors: {', '.join(p.key for p in spaces.layout.parts)}"
    return f"{spaces.obs_dtype} values of shape {spaces.obs_shape}"
