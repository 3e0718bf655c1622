"""Actor-critic networks: the IMPALA CNN for image observations and an MLP for vector observations."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import torch
from torch import nn

from parallel_ppo.core.config import Config, ModelConfig
from parallel_ppo.errors import ConfigError


def autocast(precision: str, device_type: str = "cpu") -> contextlib.AbstractContextManager:
    """bf16 autocast on `device_type` for `precision == "bf16"`, nothing for fp32 (`auto` must be resolved)."""
    if precision == "bf16":
        return torch.autocast(device_type, dtype=torch.bfloat16)
    if precision != "fp32":
        raise ValueError(f"precision {precision!r} must be resolved to fp32 or bf16 first (learner_settings)")
    return contextlib.nullcontext()


def available_device() -> str:
    """`auto`'s pick: cuda, else mps, else cpu."""
    if torch.cuda.is_available():
        return "cuda"
    if torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def resolve_device(name: str) -> torch.device:
    """The learner's device for `training.device`; one asked for by name must exist (ConfigError if not)."""
    if name == "auto":
        return torch.device(available_device())
    present = {"cpu": True, "cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available()}
    if not present.get(name, False):
        raise ConfigError(f"--device {name}: no {name.upper()} device is available to this torch "
                          f"({torch.__version__}); use --device cpu or auto")
    return torch.device(name)


def module_device(model: nn.Module) -> torch.device:
    """Where `model`'s parameters live (the CPU for a model without any)."""
    return next(model.parameters(), torch.empty(0)).device


def learner_device(cfg: Config) -> torch.device:
    """Where the config's learner runs."""
    return resolve_device(cfg.training.device)


def _init(layer: nn.Module, gain: float = math.sqrt(2), bias: float = 0.0) -> nn.Module:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.constant_(layer.bias, bias)
    return layer


def _torch_default(layer: nn.Module) -> nn.Module:
    layer.reset_parameters()
    return layer


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


class ImpalaActorCritic(nn.Module):
    """IMPALA CNN (Espeholt et al. 2018) over uint8 HWC frames, scaled to [0, 1] inside the network."""

    def __init__(self, obs_shape: tuple[int, ...], num_actions: int, cfg: ModelConfig) -> None:
        super().__init__()
        h, w, c = obs_shape
        init = _torch_default if cfg.init == "reference" else _init  # see ModelConfig.init
        stages = []
        for depth in cfg.impala_depths:
            stages.append(ConvStage(c, depth, init))
            c, h, w = depth, (h + 1) // 2, (w + 1) // 2
        self.stages = nn.Sequential(*stages)
        self.dense = init(nn.Linear(c * h * w, cfg.hidden_size))
        self.actor = _init(nn.Linear(cfg.hidden_size, num_actions), gain=0.01)
        self.critic = _init(nn.Linear(cfg.hidden_size, 1), gain=1.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 (B, H, W, C) → (logits (B, A), values (B,))."""
        x = obs.permute(0, 3, 1, 2).float().mul_(1.0 / 255.0)  # a channels-last view: no transpose copy
        x = self.stages(x)
        x = torch.relu(self.dense(torch.relu(x).flatten(1)))
        return self.actor(x), self.critic(x).squeeze(-1)


class MlpActorCritic(nn.Module):
    """Separate tanh MLP towers for actor and critic (CleanRL's classic-control agent)."""

    def __init__(self, obs_shape: tuple[int, ...], num_actions: int, cfg: ModelConfig) -> None:
        super().__init__()
        size = math.prod(obs_shape)

        def tower(out: int, gain: float) -> nn.Sequential:
            layers: list[nn.Module] = []
            width = size
            for hidden in cfg.mlp_hidden:
                layers += [_init(nn.Linear(width, hidden)), nn.Tanh()]
                width = hidden
            return nn.Sequential(*layers, _init(nn.Linear(width, out), gain=gain))

        self.actor = tower(num_actions, 0.01)
        self.critic = tower(1, 1.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = obs.flatten(1).float()
        return self.actor(x), self.critic(x).squeeze(-1)


class UniformPolicy(nn.Module):
    """Uniformly random actions and zero values: a no-compute policy for measuring raw env throughput."""

    def __init__(self, num_actions: int) -> None:
        super().__init__()
        self.num_actions = num_actions
        self.unused = nn.Parameter(torch.zeros(1))  # parameter plumbing (publish, optimizer) stays uniform

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch = obs.shape[0]
        return torch.zeros(batch, self.num_actions) + 0 * self.unused, torch.zeros(batch) + 0 * self.unused


def build_model(obs_shape: tuple[int, ...], num_actions: int, cfg: ModelConfig) -> nn.Module:
    """Pick the network by `cfg.kind` (or by observation rank when `auto`)."""
    kind = cfg.kind
    if kind == "random":
        return UniformPolicy(num_actions)
    if kind == "auto":
        kind = "impala" if len(obs_shape) == 3 else "mlp"
    if kind == "impala":
        if len(obs_shape) != 3:
            raise ConfigError(f"model.kind impala needs image observations (H, W, C); this env has {obs_shape}")
        return ImpalaActorCritic(obs_shape, num_actions, cfg)
    return MlpActorCritic(obs_shape, num_actions, cfg)
