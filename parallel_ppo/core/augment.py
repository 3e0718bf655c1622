"""Random shift of image observations in the PPO update (DrQ, Kostrikov et al. 2020; RAD, Laskin et al. 2020): each
frame moved by a whole number of pixels in each direction, its edge pixels repeated, which is padding by `pad` and
cropping back at a random offset. Frames stay uint8; a dict observation's images are shifted inside its packed rows."""

from __future__ import annotations

import numpy as np
import torch

from parallel_ppo.core.config import Config
from parallel_ppo.envs.observations import DictLayout
from parallel_ppo.envs.spaces import EnvSpaces
from parallel_ppo.errors import ConfigError


def shift_frames(frames: torch.Tensor, shifts: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 (B, H, W, C) frames, frame b moved by `shifts[b]` = (dy, dx) pixels, edge pixels repeated (padding by the
    edges and cropping at the shift), written to `out` (a new tensor where None). Frames in host memory go through
    numpy: the part of each frame still in view is copied once, then the rows and columns moved out of view are
    filled with the edge (a third of the time of torch's slicing, per frame); others are padded once and cropped."""
    out = torch.empty_like(frames) if out is None else out
    if frames.device.type != "cpu":
        return _crop_padded(frames, shifts, out)
    h, w = frames.shape[1:3]
    src, dst = frames.numpy(), out.numpy()
    # a shift of H - 1 or more repeats the edge row everywhere, as H - 1 does
    for i, (dy, dx) in enumerate(np.clip(shifts.numpy().astype(np.int64), [1 - h, 1 - w], [h - 1, w - 1]).tolist()):
        rows, cols = h - abs(dy), w - abs(dx)  # in view
        top, left = max(0, -dy), max(0, -dx)  # where they land
        frame = dst[i]
        frame[top:top + rows, left:left + cols] = src[i, top + dy:top + dy + rows, left + dx:left + dx + cols]
        frame[:top] = frame[top]
        frame[top + rows:] = frame[top + rows - 1]
        frame[:, :left] = frame[:, left:left + 1]
        frame[:, left + cols:] = frame[:, left + cols - 1:left + cols]
    return out


def _crop_padded(frames: torch.Tensor, shifts: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """`shift_frames` on any device: the frames padded by their edges once, then each one's window copied."""
    h, w = frames.shape[1:3]
    pad = int(shifts.abs().max()) if len(shifts) else 0
    rows = torch.cat([frames[:, :1].expand(-1, pad, -1, -1), frames, frames[:, -1:].expand(-1, pad, -1, -1)], 1)
    padded = torch.cat([rows[:, :, :1].expand(-1, -1, pad, -1), rows, rows[:, :, -1:].expand(-1, -1, pad, -1)], 2)
    for i, (dy, dx) in enumerate(shifts.tolist()):
        out[i] = padded[i, pad + dy:pad + dy + h, pad + dx:pad + dx + w]
    return out


class RandomShift:
    """Shifts the frames of a minibatch's observations (image observations, or the chosen image keys of a dict
    observation's packed rows) by up to `pad` pixels, each frame by its own shift (`draw`)."""

    def __init__(self, pad: int, layout: DictLayout | None, keys: list[str]) -> None:
        self.pad, self.layout = pad, layout
        self.parts = [p for p in layout.images if not keys or p.key in keys] if layout is not None else []
        moved = sorted((p.offset, p.offset + p.nbytes) for p in self.parts)
        ends = [0] + [end for _, end in moved], [start for start, _ in moved] + [layout.nbytes if layout else 0]
        self.kept = [(a, b) for a, b in zip(*ends, strict=True) if a < b]
        """The byte ranges of a packed row that the shift leaves as they are (vectors, images not moved)."""

    def draw(self, steps: int, envs: int, epochs: int, generator: torch.Generator) -> torch.Tensor:
        """The shifts of a rollout of `steps` × `envs` (every rank's envs: each rank takes its own columns, so a
        sample's shift is the one it has in one process) for each of the update's `epochs`: (steps, envs, epochs,
        frames, 2) whole pixels (dy, dx) in [-pad, pad], a frame for each image moved."""
        frames = max(1, len(self.parts))
        return torch.randint(-self.pad, self.pad + 1, (steps, envs, epochs, frames, 2), generator=generator,
                             dtype=torch.int8)

    def __call__(self, obs: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
        """`obs` (B, *obs_shape) with its frames moved by `shifts` (B, frames, 2): a new tensor, `obs` unchanged."""
        if self.layout is None:  # the shifts stay on the CPU: their values pick each frame's window
            return shift_frames(obs, shifts[:, 0])
        out, (images, _) = torch.empty_like(obs), self.layout.unpack(obs)
        for a, b in self.kept:
            out[:, a:b] = obs[:, a:b]
        for i, part in enumerate(self.parts):  # into the image's bytes of each row
            moved = out[:, part.offset:part.offset + part.nbytes].view(-1, *part.shape)
            shift_frames(images[part.key], shifts[:, i], moved)
        return out


AUGMENT_STREAM = 0xA5
"""Tells the augmentation's seed sequences from the envs' (`envs.batch.env_seed`), made of the same numbers."""


def update_generator(seed: int, update: int) -> torch.Generator:
    """The augmentation's random stream for the update after `update` of a run seeded `seed`: the same on every rank
    and after a resume, whatever else the run drew (the minibatches' permutations differ with a rank's share)."""
    stream = np.random.SeedSequence([seed, update], spawn_key=(AUGMENT_STREAM,))  # not an env's seed's stream
    return torch.Generator().manual_seed(int(stream.generate_state(1)[0]))


def random_shift(cfg: Config, spaces: EnvSpaces) -> RandomShift | None:
    """The run's augmentation (`training.augment_shift`, `training.augment_keys`), None where off; ConfigError for
    keys that are not image keys, or an env without images."""
    t, layout = cfg.training, spaces.layout
    if not t.augment_shift:
        if t.augment_keys:
            raise ConfigError("training.augment_keys names the image keys training.augment_shift moves; set "
                              "augment_shift too (e.g. 4)")
        if t.augment_regularizer or t.augment_anchor:
            name = "augment_regularizer weighs" if t.augment_regularizer else "augment_anchor anchors the ratio on"
            raise ConfigError(f"training.{name} the shifted frames of training.augment_shift; set augment_shift too "
                              "(e.g. 4)")
        return None
    if t.augment_anchor and t.augment_regularizer:
        raise ConfigError("training.augment_anchor anchors PPO's ratio on the shifted frames, which "
                          "augment_regularizer keeps out of the loss; set one of them")
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
