"""A trained policy outside its run: the network with a checkpoint's weights and the config it was trained with,
acting the way the trainer's own policy acts (`act`), on one observation or a batch."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from parallel_ppo.core.arguments import switch
from parallel_ppo.core.checkpoint import check_checkpoint, check_layout, load_checkpoint
from parallel_ppo.core.config import Config
from parallel_ppo.core.configure import config_from_dict
from parallel_ppo.core.distributions import most_likely, sample
from parallel_ppo.core.model import autocast, module_device, network
from parallel_ppo.envs.batch import env_spaces
from parallel_ppo.envs.spaces import ActionSpace, EnvSpaces
from parallel_ppo.errors import ConfigError, RunDataError


def act(model: nn.Module, space: ActionSpace, obs: np.ndarray, precision: str, deterministic: bool,
        noise: np.ndarray | None = None) -> torch.Tensor:
    """The actions of `model` for a batch of observations, as the trainer takes them: the most likely one
    (`deterministic`), or sampled with the given noise (`ActionSpace.noise`: a row per observation). Continuous
    actions come unclipped, as the policy drew them (the env clips them to its bounds)."""
    device = module_device(model)
    with torch.no_grad(), autocast(precision, device.type):
        params, _ = model(torch.from_numpy(np.ascontiguousarray(obs)).to(device))
    params = params.float().cpu()
    if deterministic:
        return most_likely(space, params)
    assert noise is not None, "sampling needs noise for every observation"
    return sample(space, params, noise)[0]


@dataclass
class Policy:
    """A trained policy: `predict` maps observations to actions (numpy in, numpy out)."""

    cfg: Config
    """The config the policy was trained with (its env, network and precision)."""
    model: nn.Module
    checkpoint: Path
    state: dict[str, Any]
    """The checkpoint's counters (update, env_steps, ...) and the rest of what it holds."""
    seed: int = 0
    """Seeds the sampled actions of `predict`."""
    spaces: EnvSpaces | None = None
    """The env's spaces (None: read from the config's env)."""

    def __post_init__(self) -> None:
        self.spaces = self.spaces or env_spaces(self.cfg.env)
        self.obs_shape, self.obs_dtype, self.actions, self.layout = self.spaces
        self._rng = np.random.default_rng(self.seed)

    @classmethod
    def load(cls, where: str | Path, seed: int = 0) -> Policy:
        """The policy in a run directory (its checkpoint.pt) or a checkpoint file."""
        path = Path(where)
        file = path / "checkpoint.pt" if path.is_dir() else path
        state = load_checkpoint(file)
        try:
            cfg = config_from_dict(state["config"])
        except (ConfigError, AttributeError, TypeError) as e:
            raise RunDataError(f"checkpoint {file} holds an unusable config ({e})") from None
        spaces = env_spaces(cfg.env)
        check_layout(state, file, spaces.layout)
        model = network(cfg, spaces)
        check_checkpoint(state, file, model)  # the resumed run's check, of what a policy loads: counters, network
        model.load_state_dict(state["model"])
        model.eval()
        return cls(cfg, model, file, state, seed, spaces)

    @property
    def needed_keys(self) -> tuple[str, ...] | None:
        """The keys of a dict observation the policy reads (its actor's: `model.actor_keys`), None for others."""
        return getattr(self.model, "actor_keys", None)

    @property
    def run_dir(self) -> Path:
        return self.checkpoint.parent

    def predict(self, obs: Any, deterministic: bool = False) -> np.ndarray:
        """The action for one observation, or the actions for a batch (shape (N,), or (N, n) for continuous
        actions); observations as the env gives them (Procgen: uint8 frames H×W×C), normalized inside the network
        when the run normalized them. Sampled actions come from this policy's seeded generator, clipped to the
        action space's bounds as the env would clip them (float32); `deterministic` takes the most likely action."""
        deterministic = switch(deterministic, "deterministic")
        if self.layout is not None:
            obs, single = self._packed(obs)
        else:
            obs, single = self._checked(obs)
        batch = obs[None] if single else obs
        noise = None if deterministic else self.actions.noise([self._rng] * len(batch))
        actions = act(self.model, self.actions, batch, self.cfg.training.precision, deterministic, noise).numpy()
        if self.actions.continuous:
            actions = np.clip(actions, self.actions.low, self.actions.high).astype(np.float32)  # the env's Box dtype
        return actions[0] if single else actions

    def _checked(self, obs: Any) -> tuple[np.ndarray, bool]:
        """A Box observation or batch as the network takes it, and whether it was one observation."""
        obs = np.asarray(obs)
        if not np.can_cast(obs.dtype, self.obs_dtype, "same_kind"):
            raise ConfigError(f"predict expects {self.obs_dtype} observations as the env gives them, got {obs.dtype} "
                              f"(a float frame in [0, 1] would be read as black)")
        obs = _narrowed(obs, self.obs_dtype, "observations")
        single = obs.shape == tuple(self.obs_shape)
        if not single and obs.shape[1:] != tuple(self.obs_shape):
            raise ConfigError(f"predict expects an observation of shape {tuple(self.obs_shape)} or a batch of them, "
                              f"got shape {obs.shape}")
        return obs, single

    def _packed(self, obs: Any) -> tuple[np.ndarray, bool]:
        """A dict observation (`{key: value}`) or batch of them (`{key: values}`) as packed rows, and whether it was
        one observation (told by the shape of its first key, `DictLayout.is_one`). Only the actor's keys are needed
        (a critic's own are packed as zeros, which the actor never reads). Images must be uint8, as the env gives them
        (a float image in [0, 1] would be read as black)."""
        layout = self.layout
        if not isinstance(obs, Mapping):
            keys = ", ".join(p.key for p in layout.parts)
            raise ConfigError(f"predict expects a dict observation with the keys {keys}, got {type(obs).__name__}")
        for part in layout.images:
            if part.key in obs and not np.can_cast(np.asarray(obs[part.key]).dtype, np.uint8, "same_kind"):
                raise ConfigError(f"predict expects uint8 images as the env gives them; {part.key!r} is "
                                  f"{np.asarray(obs[part.key]).dtype}")
            if part.key in obs:
                obs = {**obs, part.key: _narrowed(np.asarray(obs[part.key]), np.dtype(np.uint8), repr(part.key))}
        single = layout.is_one(obs)
        try:
            return layout.pack(obs, batched=not single, needed=self.needed_keys), single
        except ValueError as e:
            raise ConfigError(f"predict: {e}") from None


def _narrowed(values: np.ndarray, dtype: np.dtype, what: str) -> np.ndarray:
    """`values` as `dtype`; integers outside its range (300 for a uint8 frame) are refused (ConfigError), not
    wrapped."""
    if values.size and np.dtype(dtype).kind in "iu" and not np.can_cast(values.dtype, dtype, "safe"):
        info = np.iinfo(dtype)
        if values.min() < info.min or values.max() > info.max:
            raise ConfigError(f"predict: {what} hold values outside {np.dtype(dtype)}'s {info.min}..{info.max} "
                              f"(from {values.min()} to {values.max()}), which it would wrap")
    return values.astype(dtype, copy=False)
