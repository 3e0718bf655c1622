"""The networks of one array observation (the IMPALA CNN and the Nature CNN over uint8 frames, tanh MLPs over
vectors), their building blocks, which the dict-observation networks (`core.dict_networks`) share, and the policy
heads: logits for discrete actions, a Gaussian's mean and state-independent log-std for continuous ones."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from parallel_ppo.core.config import ModelConfig
from parallel_ppo.envs.spaces import ActionSpace
from parallel_ppo.errors import ConfigError


def orthogonal(layer: nn.Module, gain: float = math.sqrt(2), bias: float = 0.0) -> nn.Module:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.constant_(layer.bias, bias)
    return layer


def torch_default(layer: nn.Module) -> nn.Module:
    layer.reset_parameters()
    return layer


def log_std_for(actions: ActionSpace) -> nn.Parameter | None:
    """The Gaussian's log-std for continuous actions: one learned number per dimension, independent of the state
    (as the continuous-control references do), starting at 0 (std 1). None for discrete actions."""
    return nn.Parameter(torch.zeros(actions.n)) if actions.continuous else None


def policy_output(actor_out: torch.Tensor, log_std: nn.Parameter | None) -> torch.Tensor:
    """The actor's logits as they are, or its (B, n) means followed by the log-std: the (B, 2n) output the
    Gaussian is read from (`core.distributions`)."""
    if log_std is None:
        return actor_out
    return torch.cat([actor_out, log_std.to(actor_out.dtype).expand_as(actor_out)], dim=-1)


class ResidualBlock(nn.Module):
    def __init__(self, channels: int, init: Callable[[nn.Module], nn.Module]) -> None:
        super().__init__()
        self.conv0 = init(nn.Conv2d(channels, channels, 3, padding=1))
        self.conv1 = init(nn.Conv2d(channels, channels, 3, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class ConvStage(nn.Module):
    """Conv 3×3 → max-pool 3×3 stride 2 → two residual blocks."""

    def __init__(self, in_channels: int, out_channels: int, init: Callable[[nn.Module], nn.Module]) -> None:
        super().__init__()
        self.conv = init(nn.Conv2d(in_channels, out_channels, 3, padding=1))
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.res0 = ResidualBlock(out_channels, init)
        self.res1 = ResidualBlock(out_channels, init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.res1(self.res0(self.pool(self.conv(x))))


def impala_stages(frame: tuple[int, ...], depths: list[int],
                  init: Callable[[nn.Module], nn.Module]) -> tuple[nn.Sequential, int]:
    """The IMPALA CNN's stages over (H, W, C) frames, and the size of their flattened output."""
    h, w, c = frame
    stages = []
    for depth in depths:
        stages.append(ConvStage(c, depth, init))
        c, h, w = depth, (h + 1) // 2, (w + 1) // 2
    return nn.Sequential(*stages), c * h * w


def image_features(stages: nn.Module, frames: torch.Tensor) -> torch.Tensor:
    """uint8 (B, H, W, C) frames through CNN `stages`, scaled to [0, 1] first, flattened after a ReLU."""
    x = frames.permute(0, 3, 1, 2).float().mul_(1.0 / 255.0)  # a channels-last view: no transpose copy
    return torch.relu(stages(x)).flatten(1)


class ImpalaActorCritic(nn.Module):
    """IMPALA CNN (Espeholt et al. 2018) over uint8 HWC frames, scaled to [0, 1] inside the network."""

    def __init__(self, obs_shape: tuple[int, ...], actions: ActionSpace, cfg: ModelConfig) -> None:
        super().__init__()
        init = torch_default if cfg.init == "reference" else orthogonal  # see ModelConfig.init
        self.stages, flat = impala_stages(obs_shape, cfg.impala_depths, init)
        self.dense = init(nn.Linear(flat, cfg.hidden_size))
        self.actor = orthogonal(nn.Linear(cfg.hidden_size, actions.n), gain=0.01)
        self.log_std = log_std_for(actions)
        self.critic = orthogonal(nn.Linear(cfg.hidden_size, 1), gain=1.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 (B, H, W, C) → (policy outputs (B, A or 2n), values (B,))."""
        x = torch.relu(self.dense(image_features(self.stages, obs)))
        return policy_output(self.actor(x), self.log_std), self.critic(x).squeeze(-1)


def nature_stages(frame: tuple[int, ...], init: Callable[[nn.Module], nn.Module] = orthogonal
                  ) -> tuple[nn.Sequential, int]:
    """The Nature DQN CNN's convolutions (Mnih et al. 2015) over (H, W, C) frames, and the size of their flattened
    output; ConfigError for frames smaller than the 36×36 they shrink by."""
    h, w, c = frame
    if min(h, w) < 36:
        raise ConfigError(f"the Nature CNN needs frames of at least 36×36 (its convolutions shrink them by 36); "
                          f"this env has {h}×{w}")
    convs = nn.Sequential(init(nn.Conv2d(c, 32, 8, stride=4)), nn.ReLU(), init(nn.Conv2d(32, 64, 4, stride=2)),
                          nn.ReLU(), init(nn.Conv2d(64, 64, 3, stride=1)))
    return convs, 64 * ((h - 36) // 8 + 1) * ((w - 36) // 8 + 1)


class SpatialSoftmax(nn.Module):
    """Each channel of a feature map as one keypoint: the softmax over its positions, and the expected position
    (x, y) under it, in [0, 1] across the map (Levine et al. 2016, as robomimic's image encoders end)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, K, H, W) → (B, 2K): each keypoint's x and y."""
        b, k, h, w = x.shape
        weights = torch.softmax(x.flatten(2).float(), dim=-1).view(b, k, h, w)
        ys = torch.linspace(0.0, 1.0, h, device=x.device)
        xs = torch.linspace(0.0, 1.0, w, device=x.device)
        return torch.cat([(weights.sum(2) * xs).sum(-1), (weights.sum(3) * ys).sum(-1)], dim=1)


def spatial_stages(frame: tuple[int, ...], keypoints: int,
                   init: Callable[[nn.Module], nn.Module] = orthogonal) -> tuple[nn.Sequential, int]:
    """Two strided convolutions (5×5 and 3×3, stride 2, 32 channels), a 1×1 one to `keypoints` maps and their
    spatial softmax: where things are in the frame, 2 × `keypoints` numbers in [0, 1]. ConfigError for frames under
    16×16."""
    h, w, c = frame
    if min(h, w) < 16:
        raise ConfigError(f"model.kind spatial needs frames of at least 16×16; this env has {h}×{w}")
    convs = nn.Sequential(init(nn.Conv2d(c, 32, 5, stride=2)), nn.ReLU(), init(nn.Conv2d(32, 32, 3, stride=2)),
                          nn.ReLU(), init(nn.Conv2d(32, keypoints, 1)), SpatialSoftmax())
    return convs, 2 * keypoints


CNN_STAGES = {"impala": lambda frame, cfg, init: impala_stages(frame, cfg.impala_depths, init),
              "nature": lambda frame, cfg, init: nature_stages(frame, init),
              "spatial": lambda frame, cfg, init: spatial_stages(frame, cfg.keypoints, init)}
"""The CNNs an image (or a dict's image key) is read by: `model.kind` → (stages, flattened size) of a frame."""


class NatureActorCritic(nn.Module):
    """The Nature DQN CNN as CleanRL's ppo_atari uses it, over uint8 HWC frame stacks."""

    def __init__(self, obs_shape: tuple[int, ...], actions: ActionSpace, cfg: ModelConfig) -> None:
        super().__init__()
        self.convs, flat = nature_stages(obs_shape)
        self.dense = orthogonal(nn.Linear(flat, cfg.hidden_size))
        self.actor = orthogonal(nn.Linear(cfg.hidden_size, actions.n), gain=0.01)
        self.log_std = log_std_for(actions)
        self.critic = orthogonal(nn.Linear(cfg.hidden_size, 1), gain=1.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.relu(self.dense(image_features(self.convs, obs)))
        return policy_output(self.actor(x), self.log_std), self.critic(x).squeeze(-1)


def tanh_layers(size: int, widths: list[int]) -> tuple[list[nn.Module], int]:
    """Linear + tanh layers of `widths` over `size` inputs (orthogonally initialized), and their output width."""
    layers: list[nn.Module] = []
    for hidden in widths:
        layers += [orthogonal(nn.Linear(size, hidden)), nn.Tanh()]
        size = hidden
    return layers, size


class MlpActorCritic(nn.Module):
    """Separate tanh MLP towers for actor and critic (CleanRL's classic-control and continuous-control agent)."""

    def __init__(self, obs_shape: tuple[int, ...], actions: ActionSpace, cfg: ModelConfig,
                 critic_size: int | None = None) -> None:
        super().__init__()
        size = math.prod(obs_shape)

        def tower(inputs: int, out: int, gain: float) -> nn.Sequential:
            layers, width = tanh_layers(inputs, cfg.mlp_hidden)
            return nn.Sequential(*layers, orthogonal(nn.Linear(width, out), gain=gain))

        self.actor = tower(size, actions.n, 0.01)
        self.critic = tower(size if critic_size is None else critic_size, 1, 1.0)
        self.log_std = log_std_for(actions)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = obs.flatten(1).float()
        return self.heads(x, x)

    def heads(self, actor_in: torch.Tensor, critic_in: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The towers on their own inputs (a critic that reads more than the actor: `critic_size` wide)."""
        return policy_output(self.actor(actor_in), self.log_std), self.critic(critic_in).squeeze(-1)


class UniformPolicy(nn.Module):
    """Uniformly random discrete actions (or N(0, 1) continuous ones) and zero values: a no-compute policy for
    measuring raw env throughput."""

    def __init__(self, actions: ActionSpace) -> None:
        super().__init__()
        self.outputs = actions.policy_outputs
        self.unused = nn.Parameter(torch.zeros(1))  # parameter plumbing (publish, optimizer) stays uniform

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch = obs.shape[0]
        return torch.zeros(batch, self.outputs) + 0 * self.unused, torch.zeros(batch) + 0 * self.unused


class NormalizedObs(nn.Module):
    """A network behind observation normalization: (obs − mean) / std, clipped to ±`clip`. The statistics are
    buffers set by the learner (`core.normalization`), so they travel with the parameters to workers, ranks,
    checkpoints and every policy loaded from them."""

    def __init__(self, net: nn.Module, obs_shape: tuple[int, ...], clip: float) -> None:
        super().__init__()
        self.net = net
        self.clip = clip
        self.register_buffer("obs_mean", torch.zeros(obs_shape))
        self.register_buffer("obs_std", torch.ones(obs_shape))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.net(((obs.float() - self.obs_mean) / self.obs_std).clamp(-self.clip, self.clip))
