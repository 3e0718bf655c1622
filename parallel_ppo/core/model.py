"""Actor-critic networks (the IMPALA CNN and the Nature CNN for image observations, an MLP for vector ones), each
with a policy head for discrete or continuous actions, and observation normalization inside the network."""

from __future__ import annotations

import contextlib
import hashlib
import math
from collections.abc import Callable

import torch
from torch import nn
from torch.nn.utils import parameters_to_vector

from parallel_ppo.core.config import Config, ModelConfig
from parallel_ppo.envs.observations import DictLayout
from parallel_ppo.envs.spaces import ActionSpace, EnvSpaces, as_action_space
from parallel_ppo.errors import ConfigError


def autocast(precision: str, device_type: str = "cpu") -> contextlib.AbstractContextManager:
    """bf16 autocast on `device_type` for `precision == "bf16"`, nothing for fp32 (`auto` must be resolved)."""
    if precision == "bf16":
        return torch.autocast(device_type, dtype=torch.bfloat16)
    if precision != "fp32":
        raise ValueError(f"precision {precision!r} must be resolved to fp32 or bf16 first (learner_settings)")
    return contextlib.nullcontext()


def directml_device() -> str | None:
    """DirectML's torch device (Windows, any DirectX 12 GPU) when `torch_directml` is installed, else None."""
    try:
        import torch_directml
    except Exception:  # not installed, or an install that cannot load: no DirectML
        return None
    return str(torch_directml.device())


def available_device() -> str:
    """`auto`'s pick: CUDA (ROCm builds answer as CUDA), else XPU, else MPS, else DirectML, else the CPU."""
    if torch.cuda.is_available():
        return "cuda"
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return "xpu"
    if torch.backends.mps.is_available():
        return "mps"
    return directml_device() or "cpu"


def resolve_device(name: str) -> torch.device:
    """The learner's device for `training.device` (`auto`, or any torch device string); one asked for by name must
    exist and take a tensor (ConfigError naming it if not)."""
    if name == "auto":
        return torch.device(available_device())
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ConfigError(f"training.device = {name!r} is not a torch device (cpu, cuda, cuda:1, xpu, mps, "
                          "privateuseone:0, or auto)") from None
    if device.type == "cpu":
        return device
    if device.type == "privateuseone":
        directml_device()  # importing torch_directml registers its backend
    if device.type == "meta":
        raise ConfigError("training.device = 'meta' holds no data to train on; set it to cpu, a GPU or auto")
    try:
        torch.empty(1, device=device)
    except Exception as e:  # whatever the backend raises for a device it does not have
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0].split(". ")[0][:120]
        raise ConfigError(f"training.device = {name!r}: no such device is available to this torch "
                          f"({torch.__version__}: {reason}); set it to cpu or auto") from None
    return device


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
        init = _torch_default if cfg.init == "reference" else _init  # see ModelConfig.init
        self.stages, flat = impala_stages(obs_shape, cfg.impala_depths, init)
        self.dense = init(nn.Linear(flat, cfg.hidden_size))
        self.actor = _init(nn.Linear(cfg.hidden_size, actions.n), gain=0.01)
        self.log_std = log_std_for(actions)
        self.critic = _init(nn.Linear(cfg.hidden_size, 1), gain=1.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 (B, H, W, C) → (policy outputs (B, A or 2n), values (B,))."""
        x = torch.relu(self.dense(image_features(self.stages, obs)))
        return policy_output(self.actor(x), self.log_std), self.critic(x).squeeze(-1)


def nature_stages(frame: tuple[int, ...], init: Callable[[nn.Module], nn.Module] = _init
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


CNN_STAGES = {"impala": lambda frame, cfg, init: impala_stages(frame, cfg.impala_depths, init),
              "nature": lambda frame, cfg, init: nature_stages(frame, init)}
"""The CNNs an image (or a dict's image key) is read by: `model.kind` → (stages, flattened size) of a frame."""


class NatureActorCritic(nn.Module):
    """The Nature DQN CNN as CleanRL's ppo_atari uses it, over uint8 HWC frame stacks."""

    def __init__(self, obs_shape: tuple[int, ...], actions: ActionSpace, cfg: ModelConfig) -> None:
        super().__init__()
        self.convs, flat = nature_stages(obs_shape)
        self.dense = _init(nn.Linear(flat, cfg.hidden_size))
        self.actor = _init(nn.Linear(cfg.hidden_size, actions.n), gain=0.01)
        self.log_std = log_std_for(actions)
        self.critic = _init(nn.Linear(cfg.hidden_size, 1), gain=1.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.relu(self.dense(image_features(self.convs, obs)))
        return policy_output(self.actor(x), self.log_std), self.critic(x).squeeze(-1)


def tanh_layers(size: int, widths: list[int]) -> tuple[list[nn.Module], int]:
    """Linear + tanh layers of `widths` over `size` inputs (orthogonally initialized), and their output width."""
    layers: list[nn.Module] = []
    for hidden in widths:
        layers += [_init(nn.Linear(size, hidden)), nn.Tanh()]
        size = hidden
    return layers, size


class MlpActorCritic(nn.Module):
    """Separate tanh MLP towers for actor and critic (CleanRL's classic-control and continuous-control agent)."""

    def __init__(self, obs_shape: tuple[int, ...], actions: ActionSpace, cfg: ModelConfig) -> None:
        super().__init__()
        size = math.prod(obs_shape)

        def tower(out: int, gain: float) -> nn.Sequential:
            layers, width = tanh_layers(size, cfg.mlp_hidden)
            return nn.Sequential(*layers, _init(nn.Linear(width, out), gain=gain))

        self.actor = tower(actions.n, 0.01)
        self.critic = tower(1, 1.0)
        self.log_std = log_std_for(actions)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = obs.flatten(1).float()
        return policy_output(self.actor(x), self.log_std), self.critic(x).squeeze(-1)


class DictNetwork(nn.Module):
    """A network of packed dict observations (`envs.observations`): it unpacks each row and normalizes the vector
    keys with `obs_clip`, their statistics being buffers that `core.normalization` sets."""

    def __init__(self, layout: DictLayout, obs_clip: float | None) -> None:
        super().__init__()
        self.layout, self.clip = layout, obs_clip
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

    def normalized(self, vector: torch.Tensor) -> torch.Tensor:
        """The vector keys' values, normalized and clipped where the network normalizes them."""
        if self.clip is None:
            return vector
        return ((vector - self.obs_mean) / self.obs_std).clamp(-self.clip, self.clip)


class MultiInputActorCritic(DictNetwork):
    """The network of a dict observation: a CNN over each image key (the IMPALA CNN's stages, or the Nature CNN's
    with `cnn` nature), the vector keys side by side through a tanh MLP (normalized first, with `obs_clip`), and one
    dense layer over all their features for the policy and value heads, as Stable-Baselines3's MultiInputPolicy
    joins its extractors."""

    def __init__(self, layout: DictLayout, actions: ActionSpace, cfg: ModelConfig,
                 obs_clip: float | None = None, cnn: str = "impala") -> None:
        super().__init__(layout, obs_clip)
        init = _torch_default if cfg.init == "reference" else _init  # see ModelConfig.init
        self.cnns = nn.ModuleList()
        width = 0
        for part in layout.images:
            stages, flat = CNN_STAGES[cnn](part.shape, cfg, init)
            self.cnns.append(stages)
            width += flat
        layers, size = tanh_layers(layout.vector_size, cfg.mlp_hidden if layout.vector_size else [])
        self.mlp = nn.Sequential(*layers)
        self.dense = init(nn.Linear(width + size, cfg.hidden_size))
        self.actor = _init(nn.Linear(cfg.hidden_size, actions.n), gain=0.01)
        self.log_std = log_std_for(actions)
        self.critic = _init(nn.Linear(cfg.hidden_size, 1), gain=1.0)

    def forward_parts(self, images: dict[str, torch.Tensor], vector: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = [image_features(cnn, images[part.key]) for cnn, part in zip(self.cnns, self.layout.images,
                                                                               strict=True)]
        if self.layout.vector_size:
            features.append(self.mlp(self.normalized(vector)))
        x = torch.relu(self.dense(torch.cat(features, dim=1)))
        return policy_output(self.actor(x), self.log_std), self.critic(x).squeeze(-1)


class DictVectors(DictNetwork):
    """The MLP over a dict observation without image keys (gymnasium-robotics' goals, robosuite's state): its
    vector keys side by side, normalized first with `obs_clip`, as one vector observation would be."""

    def __init__(self, layout: DictLayout, actions: ActionSpace, cfg: ModelConfig,
                 obs_clip: float | None = None) -> None:
        super().__init__(layout, obs_clip)
        self.net = MlpActorCritic((layout.vector_size,), actions, cfg)

    def forward_parts(self, images: dict[str, torch.Tensor], vector: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.net(self.normalized(vector))


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


IMAGE_NETWORKS = {"impala": ImpalaActorCritic, "nature": NatureActorCritic}


def build_model(obs_shape: tuple[int, ...], actions: ActionSpace | int, cfg: ModelConfig,
                obs_clip: float | None = None, layout: DictLayout | None = None) -> nn.Module:
    """Pick the network by `cfg.kind` (or by the observation when `auto`: for a dict observation's `layout` the
    multi-input network with the IMPALA CNN, or the MLP over its vector keys where it has no image, the IMPALA CNN
    for images, else the MLP; `impala` or `nature` picks a dict's CNN); an int `actions` means that many discrete
    actions. With `obs_clip`, observations (a dict's vector keys) are normalized inside it."""
    actions = as_action_space(actions)
    kind = cfg.kind
    if layout is not None:
        readers = ("mlp",) if not layout.images else tuple(CNN_STAGES)
        if kind not in ("auto", "random", *readers):
            raise ConfigError(f"model.kind {kind} cannot read this env's dict observation "
                              f"({', '.join(p.key for p in layout.parts)}): use model.kind auto or "
                              f"{' or '.join(readers)}")
        if kind != "random" and not layout.images:
            return DictVectors(layout, actions, cfg, obs_clip)
        if kind != "random":
            return MultiInputActorCritic(layout, actions, cfg, obs_clip, "impala" if kind == "auto" else kind)
    if kind == "auto":
        kind = "impala" if len(obs_shape) == 3 else "mlp"
    if kind in IMAGE_NETWORKS:
        if len(obs_shape) != 3:
            raise ConfigError(f"model.kind {kind} needs image observations (H, W, C); this env has {obs_shape}")
        net = IMAGE_NETWORKS[kind](obs_shape, actions, cfg)
    elif kind == "random":
        net = UniformPolicy(actions)
    else:
        net = MlpActorCritic(obs_shape, actions, cfg)
    return net if obs_clip is None else NormalizedObs(net, obs_shape, obs_clip)


def network(cfg: Config, spaces: EnvSpaces) -> nn.Module:
    """The run's network as every process builds it: `build_model` with the config's observation normalization."""
    t = cfg.training
    if t.normalize_obs and spaces.layout is None and len(spaces.obs_shape) == 3:
        raise ConfigError(f"training.normalize_obs normalizes vector observations; {cfg.env.id} observes images "
                          f"{spaces.obs_shape}, which the network scales to [0, 1] itself (drop normalize_obs)")
    if t.normalize_obs and spaces.layout is not None and cfg.model.kind == "random":
        raise ConfigError("training.normalize_obs has nothing to normalize for model.kind random on a dict "
                          "observation (drop normalize_obs)")
    if t.normalize_obs and spaces.layout is not None and not spaces.layout.vector_size:
        raise ConfigError(f"training.normalize_obs normalizes vector observations; {cfg.env.id}'s dict observation "
                          "has image keys only (drop normalize_obs)")
    clip = t.obs_clip if t.normalize_obs else None
    return build_model(spaces.obs_shape, spaces.actions, cfg.model, clip, spaces.layout)


def policy_tensors(model: nn.Module) -> list[torch.Tensor]:
    """What a policy copy needs besides its structure: the parameters, then the buffers (observation statistics),
    in one fixed order, as the coordinator publishes them to its workers."""
    return [*model.parameters(), *model.buffers()]


def parameter_checksum(model: nn.Module) -> str:
    """sha256 (first 16 hex digits) of the model's parameters and buffers (observation statistics) as float32 bytes:
    equal on every rank of a distributed run, or a bug."""
    vector = parameters_to_vector(policy_tensors(model)).detach().float().cpu().contiguous()
    return hashlib.sha256(vector.numpy().tobytes()).hexdigest()[:16]
