"""The learner's network as every process builds it (`network`: picked by `model.kind` and the observation), the
device it runs on, and the parameters a policy copy is made of."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator

import torch
from torch import nn
from torch.nn.utils import parameters_to_vector

from parallel_ppo.core.config import Config, ModelConfig
from parallel_ppo.core.dict_networks import AsymmetricActorCritic, DictVectors, MultiInputActorCritic, head_keys
from parallel_ppo.core.networks import (
    CNN_STAGES,
    ImpalaActorCritic,
    MlpActorCritic,
    NatureActorCritic,
    NormalizedObs,
    UniformPolicy,
)
from parallel_ppo.envs.observations import DictLayout
from parallel_ppo.envs.spaces import ActionSpace, EnvSpaces, as_action_space
from parallel_ppo.errors import ConfigError


def autocast(precision: str, device_type: str = "cpu") -> contextlib.AbstractContextManager:
    """bf16 autocast on `device_type` for `precision == "bf16"`, CUDA's TF32 products for tf32 (`tf32_products`),
    nothing for fp32 (`auto` must be resolved)."""
    if precision == "bf16":
        return torch.autocast(device_type, dtype=torch.bfloat16)
    if precision == "tf32":
        return tf32_products(device_type)
    if precision != "fp32":
        raise ValueError(f"precision {precision!r} must be resolved to fp32, bf16 or tf32 first (learner_settings)")
    return contextlib.nullcontext()


def kept_casts(precision: str, device_type: str = "cpu") -> contextlib.AbstractContextManager:
    """With `precision` bf16: while open, the bf16 `autocast` blocks inside keep their bf16 copies of the weights
    from one forward pass to the next, instead of casting them again in each (a third of a forward of 4 camera
    observations on the CPU); between them, everything runs as outside. Weights changed in place need
    `torch.clear_autocast_cache()`. (A disabled autocast: torch drops its casts when the outermost autocast block
    ends.) Nothing for another precision (DirectML has no autocast to disable)."""
    return torch.autocast(device_type, enabled=False) if precision == "bf16" else contextlib.nullcontext()


@contextlib.contextmanager
def tf32_products(device_type: str) -> Iterator[None]:
    """fp32 tensors whose matrix products and convolutions CUDA computes in TF32 within the block (the flags as they
    were after it); on any other device (the CPU workers acting for a CUDA learner) plain fp32."""
    if device_type != "cuda":
        yield
        return
    flags = (torch.backends.cuda.matmul, torch.backends.cudnn.conv)
    before = [flag.fp32_precision for flag in flags]
    for flag in flags:
        flag.fp32_precision = "tf32"
    try:
        yield
    finally:
        for flag, value in zip(flags, before, strict=True):
            flag.fp32_precision = value


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
    if device.type == "cpu" and device.index:  # torch takes cpu:5 as the CPU: a number that names nothing
        raise ConfigError(f"training.device = {name!r}: the CPU takes no device number; set it to cpu")
    if device.type == "cpu":
        return torch.device("cpu")
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

IMAGE_NETWORKS = {"impala": ImpalaActorCritic, "nature": NatureActorCritic}


def build_model(obs_shape: tuple[int, ...], actions: ActionSpace | int, cfg: ModelConfig,
                obs_clip: float | None = None, layout: DictLayout | None = None,
                predict_privileged: bool = False) -> nn.Module:
    """Pick the network by `cfg.kind` (or by the observation when `auto`: for a dict observation's `layout` the
    multi-input network with the IMPALA CNN, or the MLP over its vector keys where it has no image, the IMPALA CNN
    for images, else the MLP; `impala`, `nature` or `spatial` picks a dict's CNN; an actor and critic that read
    different keys or do not share their CNNs get a head each); an int `actions` means that many discrete actions.
    With `obs_clip`, observations (a dict's vector keys) are normalized inside it. `predict_privileged`: the actor
    gets a layer that predicts the vector keys only the critic reads (`training.predict_privileged`)."""
    actions = as_action_space(actions)
    kind = cfg.kind
    if predict_privileged:
        check_privileged(layout, cfg)
    if layout is not None:
        readers = ("mlp",) if not layout.images else tuple(CNN_STAGES)
        if kind not in ("auto", "random", *readers):
            raise ConfigError(f"model.kind {kind} cannot read this env's dict observation "
                              f"({', '.join(p.key for p in layout.parts)}): use model.kind auto or "
                              f"{' or '.join(readers)}")
        if kind != "random" and not layout.images:
            return DictVectors(layout, actions, cfg, obs_clip)
        if kind != "random":
            actor, critic = head_keys(layout, cfg)
            cnn = "impala" if kind == "auto" else kind
            if actor == critic and cfg.share_encoder:
                return MultiInputActorCritic(layout, actions, cfg, obs_clip, cnn)
            return AsymmetricActorCritic(layout, actions, cfg, obs_clip, cnn, predict_privileged)
    elif cfg.actor_keys or cfg.critic_keys:
        raise ConfigError(f"model.actor_keys and model.critic_keys name keys of a dict observation; this env's "
                          f"observation is one array {tuple(obs_shape)}")
    if kind == "auto":
        kind = "impala" if len(obs_shape) == 3 else "mlp"
    if kind == "spatial":
        raise ConfigError(f"model.kind spatial reads the image keys of a dict observation; this env's observation is "
                          f"one array {tuple(obs_shape)} (use impala or nature for frames)")
    if kind in IMAGE_NETWORKS:
        if len(obs_shape) != 3:
            raise ConfigError(f"model.kind {kind} needs image observations (H, W, C); this env has {obs_shape}")
        net = IMAGE_NETWORKS[kind](obs_shape, actions, cfg)
    elif kind == "random":
        net = UniformPolicy(actions)
    else:
        net = MlpActorCritic(obs_shape, actions, cfg)
    return net if obs_clip is None else NormalizedObs(net, obs_shape, obs_clip)


def check_privileged(layout: DictLayout | None, cfg: ModelConfig) -> None:
    """ConfigError unless the observation has frames (the multi-input network's) and the critic reads vector keys
    the actor does not: what `training.predict_privileged` predicts."""
    why = "this env's observation is one array" if layout is None else "its observation has no image key"
    if layout is not None and layout.images:
        actor, critic = head_keys(layout, cfg)
        if any(p.key in critic and p.key not in actor for p in layout.vectors):
            if cfg.kind != "random":
                return
            why = "model.kind random has no network"
        else:
            why = "model.critic_keys names no vector key that model.actor_keys leaves out"
    raise ConfigError(f"training.predict_privileged predicts, from what the actor reads, the vector keys only the "
                      f"critic reads; {why} (set it to 0)")


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
    return build_model(spaces.obs_shape, spaces.actions, cfg.model, clip, spaces.layout,
                       t.predict_privileged > 0)


def policy_tensors(model: nn.Module) -> list[torch.Tensor]:
    """What a policy copy needs besides its structure: the parameters, then the buffers (observation statistics),
    in one fixed order, as the coordinator publishes them to its workers."""
    return [*model.parameters(), *model.buffers()]


def parameter_checksum(model: nn.Module) -> str:
    """sha256 (first 16 hex digits) of the model's parameters and buffers (observation statistics) as float32 bytes:
    equal on every rank of a distributed run, or a bug."""
    vector = parameters_to_vector(policy_tensors(model)).detach().float().cpu().contiguous()
    return hashlib.sha256(vector.numpy().tobytes()).hexdigest()[:16]
