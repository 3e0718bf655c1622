"""The networks of a dict observation (packed rows, `envs.observations`): the multi-input network (a CNN per image
key, an MLP over the vector keys, one dense layer), its asymmetric form whose critic reads keys the actor does not,
and the MLP over a dict of vectors. The actor reads `model.actor_keys`, the critic `model.critic_keys`."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from parallel_ppo.core.config import ModelConfig
from parallel_ppo.core.networks import (
    CNN_STAGES,
    MlpActorCritic,
    image_features,
    log_std_for,
    orthogonal,
    policy_output,
    tanh_layers,
    torch_default,
)
from parallel_ppo.envs.observations import DictLayout
from parallel_ppo.envs.spaces import ActionSpace
from parallel_ppo.errors import ConfigError


def head_keys(layout: DictLayout, cfg: ModelConfig) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The keys the actor and the critic read (`model.actor_keys`, `model.critic_keys`; empty: every key), in the
    layout's order; ConfigError for a key the observation lacks."""
    every = [p.key for p in layout.parts]
    for name, keys in (("actor_keys", cfg.actor_keys), ("critic_keys", cfg.critic_keys)):
        unknown = [k for k in keys if k not in every]
        if unknown:
            raise ConfigError(f"model.{name}: {', '.join(unknown)} is not a key of this env's observation "
                              f"(its keys: {', '.join(every)})")
    actor = tuple(k for k in every if not cfg.actor_keys or k in cfg.actor_keys)
    return actor, tuple(k for k in every if not cfg.critic_keys or k in cfg.critic_keys)


def vector_ranges(layout: DictLayout, keys: tuple[str, ...]) -> list[tuple[int, int]]:
    """Where `keys`' values lie in the vector of every vector key side by side: (start, end) ranges, adjacent ones
    merged."""
    ranges: list[tuple[int, int]] = []
    start = 0
    for part in layout.vectors:
        if part.key in keys:
            if ranges and ranges[-1][1] == start:
                ranges[-1] = (ranges[-1][0], start + part.size)
            else:
                ranges.append((start, start + part.size))
        start += part.size
    return ranges


class DictNetwork(nn.Module):
    """A network of packed dict observations (`envs.observations`): it unpacks each row and normalizes the vector
    keys with `obs_clip`, their statistics being buffers that `core.normalization` sets. Its actor reads
    `actor_keys`, its critic `critic_keys` (`head_keys`)."""

    def __init__(self, layout: DictLayout, obs_clip: float | None, cfg: ModelConfig) -> None:
        super().__init__()
        self.layout, self.clip = layout, obs_clip
        self.actor_keys, self.critic_keys = head_keys(layout, cfg)
        self.actor_ranges, self.critic_ranges = (vector_ranges(layout, self.actor_keys),
                                                 vector_ranges(layout, self.critic_keys))
        if obs_clip is not None:
            self.register_buffer("obs_mean", torch.zeros(layout.vector_size))
            self.register_buffer("obs_std", torch.ones(layout.vector_size))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Packed uint8 rows (B, nbytes) → (policy outputs (B, A or 2n), values (B,))."""
        return self.forward_parts(*self.layout.unpack(obs))

    def forward_parts(self, images: dict[str, torch.Tensor], vector: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The same from the unpacked observation: uint8 (B, H, W, C) per image key, the vector keys' float32
        values side by side (B, vector_size)."""
        raise NotImplementedError

    def forward_actor(self, images: dict[str, torch.Tensor], vector: torch.Tensor) -> torch.Tensor:
        """The policy outputs alone, from the actor's keys (the others' values are not read)."""
        return self.forward_parts(images, vector)[0]

    def picked(self, vector: torch.Tensor, ranges: list[tuple[int, int]]) -> torch.Tensor:
        """The columns of the vector keys' values (B, vector_size) in `ranges`, side by side."""
        if ranges == [(0, self.layout.vector_size)]:
            return vector
        return torch.cat([vector[:, a:b] for a, b in ranges], dim=1) if ranges else vector[:, :0]

    def normalized(self, vector: torch.Tensor) -> torch.Tensor:
        """The vector keys' values, normalized and clipped where the network normalizes them."""
        if self.clip is None:
            return vector
        return ((vector - self.obs_mean) / self.obs_std).clamp(-self.clip, self.clip)

    def image_readers(self, keys: tuple[str, ...], cnn: str, cfg: ModelConfig,
                      init: Callable[[nn.Module], nn.Module]) -> tuple[list[str], nn.ModuleList, list[int]]:
        """The image keys among `keys`, a CNN for each, and the width of each one's features."""
        names, cnns, widths = [], nn.ModuleList(), []
        for part in self.layout.images:
            if part.key in keys:
                stages, flat = CNN_STAGES[cnn](part.shape, cfg, init)
                names.append(part.key)
                cnns.append(stages)
                widths.append(flat)
        return names, cnns, widths


def vector_head(ranges: list[tuple[int, int]], width: int, cfg: ModelConfig,
                init: Callable[[nn.Module], nn.Module]) -> tuple[nn.Sequential, nn.Module]:
    """A head's tanh MLP over the vector keys in `ranges` (none where it reads none) and its dense layer over those
    and `width` image features."""
    vectors = sum(b - a for a, b in ranges)
    layers, size = tanh_layers(vectors, cfg.mlp_hidden if vectors else [])
    return nn.Sequential(*layers), init(nn.Linear(width + size, cfg.hidden_size))


class MultiInputActorCritic(DictNetwork):
    """The network of a dict observation: a CNN over each image key (the IMPALA CNN's stages, or the Nature CNN's
    with `cnn` nature), the vector keys side by side through a tanh MLP (normalized first, with `obs_clip`), and one
    dense layer over all their features for the policy and value heads, as Stable-Baselines3's MultiInputPolicy
    joins its extractors."""

    def __init__(self, layout: DictLayout, actions: ActionSpace, cfg: ModelConfig,
                 obs_clip: float | None = None, cnn: str = "impala") -> None:
        super().__init__(layout, obs_clip, cfg)
        init = torch_default if cfg.init == "reference" else orthogonal  # see ModelConfig.init
        self.images, self.cnns, widths = self.image_readers(self.actor_keys, cnn, cfg, init)
        self.mlp, self.dense = vector_head(self.actor_ranges, sum(widths), cfg, init)
        self.actor = orthogonal(nn.Linear(cfg.hidden_size, actions.n), gain=0.01)
        self.log_std = log_std_for(actions)
        self.critic = orthogonal(nn.Linear(cfg.hidden_size, 1), gain=1.0)

    def forward_parts(self, images: dict[str, torch.Tensor], vector: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = [image_features(cnn, images[key]) for cnn, key in zip(self.cnns, self.images, strict=True)]
        if self.actor_ranges:
            features.append(self.mlp(self.picked(self.normalized(vector), self.actor_ranges)))
        x = torch.relu(self.dense(torch.cat(features, dim=1)))
        return policy_output(self.actor(x), self.log_std), self.critic(x).squeeze(-1)


class AsymmetricActorCritic(DictNetwork):
    """The multi-input network with a head of its own for the actor and for the critic: each reads its keys through
    the image keys' CNNs, a tanh MLP over its vector keys, and its own dense layer. The critic may read keys the
    actor does not (privileged state: `model.critic_keys`) and leave out the actor's frames (Pinto et al.'s critic of
    state alone). An image key both heads read has one CNN for both with `model.share_encoder` (trained by both
    losses), else one each; an image key only the actor reads has the actor's own CNN. With `predict_privileged`, a
    linear layer over the actor's features predicts the vector keys only the critic reads (`forward_privileged`)."""

    def __init__(self, layout: DictLayout, actions: ActionSpace, cfg: ModelConfig,
                 obs_clip: float | None = None, cnn: str = "impala", predict_privileged: bool = False) -> None:
        super().__init__(layout, obs_clip, cfg)
        init = torch_default if cfg.init == "reference" else orthogonal  # see ModelConfig.init
        self.critic_images, self.cnns, widths = self.image_readers(self.critic_keys, cnn, cfg, init)
        width = dict(zip(self.critic_images, widths, strict=True))
        self.shared = [key for key in self.critic_images if cfg.share_encoder and key in self.actor_keys]
        self.own_images, self.actor_cnns, own_widths = self.image_readers(
            tuple(k for k in self.actor_keys if k not in self.shared), cnn, cfg, init)
        width.update(zip(self.own_images, own_widths, strict=True))
        self.actor_images = [p.key for p in layout.images if p.key in self.actor_keys]
        self.actor_mlp, self.actor_dense = vector_head(self.actor_ranges, sum(width[k] for k in self.actor_images),
                                                       cfg, init)
        self.critic_mlp, self.critic_dense = vector_head(self.critic_ranges, sum(widths), cfg, init)
        self.actor = orthogonal(nn.Linear(cfg.hidden_size, actions.n), gain=0.01)
        self.log_std = log_std_for(actions)
        self.critic = orthogonal(nn.Linear(cfg.hidden_size, 1), gain=1.0)
        self.privileged_ranges = vector_ranges(layout, tuple(k for k in self.critic_keys if k not in self.actor_keys))
        self.predictor = init(nn.Linear(cfg.hidden_size, sum(b - a for a, b in self.privileged_ranges))
                              ) if predict_privileged else None

    def forward_parts(self, images: dict[str, torch.Tensor], vector: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._forward(images, self.normalized(vector))[:2]

    def forward_privileged(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Packed rows → (policy outputs, values, each row's mean squared error of the privileged keys' normalized
        values as the actor's features predict them)."""
        images, vector = self.layout.unpack(obs)
        vector = self.normalized(vector)
        outputs, values, features = self._forward(images, vector)
        target = self.picked(vector, self.privileged_ranges)
        return outputs, values, (self.predictor(features).float() - target).square().mean(dim=1)

    def forward_actor(self, images: dict[str, torch.Tensor], vector: torch.Tensor) -> torch.Tensor:
        return policy_output(self.actor(self._actor(images, self.normalized(vector), {})), self.log_std)

    def _forward(self, images: dict[str, torch.Tensor],
                 vector: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(policy outputs, values, the actor's features) from the unpacked observation, its vector normalized."""
        seen = {key: image_features(cnn, images[key]) for cnn, key in zip(self.cnns, self.critic_images, strict=True)}
        values = self._head(seen, self.critic_images, self.picked(vector, self.critic_ranges), self.critic_mlp,
                            self.critic_dense)
        features = self._actor(images, vector, {k: seen[k] for k in self.shared})
        return policy_output(self.actor(features), self.log_std), self.critic(values).squeeze(-1), features

    def _actor(self, images: dict[str, torch.Tensor], vector: torch.Tensor,
               seen: dict[str, torch.Tensor]) -> torch.Tensor:
        """The actor's features from its keys (`seen`: the shared CNNs' features, where computed already)."""
        seen = dict(seen)
        for key in self.shared:
            if key not in seen:
                seen[key] = image_features(self.cnns[self.critic_images.index(key)], images[key])
        seen.update((key, image_features(cnn, images[key])) for cnn, key in zip(self.actor_cnns, self.own_images,
                                                                                 strict=True))
        return self._head(seen, self.actor_images, self.picked(vector, self.actor_ranges), self.actor_mlp,
                          self.actor_dense)

    @staticmethod
    def _head(features: dict[str, torch.Tensor], keys: list[str], vector: torch.Tensor, mlp: nn.Module,
              dense: nn.Module) -> torch.Tensor:
        """A head's features: its image keys' CNN features and its vector keys' MLP, through its dense layer."""
        parts = [features[key] for key in keys]
        if len(mlp):  # layers only where the head reads vector keys
            parts.append(mlp(vector))
        return torch.relu(dense(torch.cat(parts, dim=1)))


class DictVectors(DictNetwork):
    """The MLP over a dict observation without image keys (gymnasium-robotics' goals, robosuite's state): its
    vector keys side by side, normalized first with `obs_clip`, as one vector observation would be."""

    def __init__(self, layout: DictLayout, actions: ActionSpace, cfg: ModelConfig,
                 obs_clip: float | None = None) -> None:
        super().__init__(layout, obs_clip, cfg)
        self.net = MlpActorCritic((sum(b - a for a, b in self.actor_ranges),), actions, cfg,
                                  sum(b - a for a, b in self.critic_ranges))

    def forward_parts(self, images: dict[str, torch.Tensor], vector: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        vector = self.normalized(vector)
        return self.net.heads(self.picked(vector, self.actor_ranges), self.picked(vector, self.critic_ranges))
