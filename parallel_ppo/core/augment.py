"""Random shift of image observations in the PPO update (DrQ, Kostrikov et al. 2020; RAD, Laskin et al. 2020): each
frame moved by a whole number of pixels in each direction, its edge pixels repeated, which is padding by `pad` and
cropping back at a random offset. Frames stay uint8; a dict observation's images are shifted inside its packed rows."""

from __future__ import annotations

import torch

from parallel_ppo.core.config import Config
from parallel_ppo.envs.observations import DictLayout
from parallel_ppo.envs.spaces import EnvSpaces
from parallel_ppo.errors import ConfigError


def shift_frames(frames: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
    """uint8 (B, H, W, C) frames, frame b moved by `shifts[b]` = (dy, dx) pixels, edge pixels repeated."""
    b, h, w = frames.shape[:3]
    rows = (torch.arange(h, device=frames.device) + shifts[:, :1]).clamp_(0, h - 1)  # (B, H)
    cols = (torch.arange(w, device=frames.device) + shifts[:, 1:]).clamp_(0, w - 1)  # (B, W)
    batch = torch.arange(b, device=frames.device)[:, None, None]
    return frames[batch, rows[:, :, None], cols[:, None, :]]


class RandomShift:
    """Shifts the frames of a minibatch's observations (image observations, or the chosen image keys of a dict
    observation's packed rows) by up to `pad` pixels, each frame its own shift from the update's generator."""

    def __init__(self, pad: int, layout: DictLayout | None, keys: list[str]) -> None:
        self.pad, self.layout = pad, layout
        self.parts = [p for p in layout.images if not keys or p.key in keys] if layout is not None else []

    def __call__(self, obs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """`obs` (B, *obs_shape) with its frames shifted: a new tensor, `obs` unchanged."""
        if self.layout is None:
            return shift_frames(obs, self._shifts(obs, generator))
        out, (images, _) = obs.clone(), self.layout.unpack(obs)
        for part in self.parts:
            moved = shift_frames(images[part.key], self._shifts(obs, generator))
            out[:, part.offset:part.offset + part.nbytes] = moved.reshape(len(obs), -1)
        return out

    def _shifts(self, obs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """(B, 2) whole-pixel shifts in [-pad, pad], drawn on the CPU (one stream on every device)."""
        return torch.randint(-self.pad, self.pad + 1, (len(obs), 2), generator=generator).to(obs.device)


def random_shift(cfg: Config, spaces: EnvSpaces) -> RandomShift | None:
    """The run's augmentation (`training.augment_shift`, `training.augment_keys`), None where off; ConfigError for
    keys that are not image keys, or an env without images."""
    t, layout = cfg.training, spaces.layout
    if not t.augment_shift:
        if t.augment_keys:
            raise ConfigError("training.augment_keys names the image keys training.augment_shift moves; set "
                              "augment_shift too (e.g. 4)")
        return None
    if layout is None:
        if len(spaces.obs_shape) != 3:
            raise ConfigError(f"training.augment_shift moves image observations; {cfg.env.id} observes vectors "
                              f"{tuple(spaces.obs_shape)}")
        if t.augment_keys:
            raise ConfigError(f"training.augment_keys names keys of a dict observation; {cfg.env.id}'s observation "
                              "is one image (drop augment_keys)")
        return RandomShift(t.augment_shift, None, [])
    images = [p.key for p in layout.images]
    wrong = [k for k in t.augment_keys if k not in images]
    if wrong or not images:
        raise ConfigError(f"training.augment_shift moves image keys; {', '.join(wrong) or cfg.env.id} "
                          f"{'is not one' if wrong else 'has none'} (image keys: {', '.join(images) or 'none'})")
    return RandomShift(t.augment_shift, layout, t.augment_keys)
