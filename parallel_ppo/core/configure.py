"""From YAML, flags and `--set section.key=value` to a validated Config: types checked, values bounded, layouts
derived (parallel workers × envs, a distributed split), and the first problem named in one ConfigError."""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import yaml

from parallel_ppo.core.config import Config
from parallel_ppo.core.config_yaml import load_yaml, parse_yaml
from parallel_ppo.core.envs import PROCGEN_MODES, check_env, eval_levels
from parallel_ppo.core.units import to_unit
from parallel_ppo.errors import ConfigError


def _section_types() -> dict[str, type]:
    return {f.name: type(getattr(Config(), f.name)) for f in dataclasses.fields(Config)}


def _coerce(path: str, value: Any, default: Any) -> Any:
    """Check `value` against the type of the field's default; ints are accepted where floats are."""
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{path} must be true or false, got {value!r}")
    if isinstance(default, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer() and abs(value) < 2**62:
            return int(value)
        raise ConfigError(f"{path} must be an integer, got {value!r}")
    if isinstance(default, float):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ConfigError(f"{path} must be a finite number, got {value!r}")
            return float(value)
        raise ConfigError(f"{path} must be a number, got {value!r}")
    if isinstance(default, str):
        if isinstance(value, str):
            return value
        raise ConfigError(f"{path} must be a string, got {value!r}")
    if isinstance(default, list):
        if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return value
        raise ConfigError(f"{path} must be a list of integers, got {value!r}")
    raise ConfigError(f"{path}: unsupported type")  # pragma: no cover - all fields are covered above


def set_value(cfg: Config, dotted: str, value: Any) -> None:
    """Set `section.key` on `cfg`, checking that both exist and the value has the field's type."""
    section_name, _, key = dotted.partition(".")
    if section_name not in _section_types() or not key:
        known = ", ".join(_section_types())
        raise ConfigError(f"unknown config key {dotted!r} (use section.key; sections: {known})")
    section = getattr(cfg, section_name)
    names = [f.name for f in dataclasses.fields(section)]
    if key not in names:
        raise ConfigError(f"unknown config key {dotted!r} (keys of {section_name}: {', '.join(names)})")
    if dotted in DURATIONS and isinstance(value, str):
        try:
            value = to_unit(value, DURATIONS[dotted])
        except ValueError as e:
            raise ConfigError(f"{dotted}: {e}") from None
    if dotted in STRING_LISTS:
        setattr(section, key, _string_list(dotted, value))
        return
    if dotted in AUTO_INTS:
        if value != "auto" and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise ConfigError(f"{dotted} must be an integer or auto, got {value!r}")
        setattr(section, key, value if value == "auto" else _coerce(dotted, value, 0))
        return
    setattr(section, key, _coerce(dotted, value, getattr(section, key)))


def _string_list(path: str, value: Any) -> list[str]:
    """A list of strings, or a comma-separated string split into one (empty items dropped)."""
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list) or not all(isinstance(v, (str, int, float)) and not isinstance(v, bool)
                                              for v in value):
        raise ConfigError(f"{path} must be a list of names or a comma-separated string, got {value!r}")
    return [str(v).strip() for v in value if str(v).strip()]


def apply_mapping(cfg: Config, data: dict[str, Any], source: str) -> set[str]:
    """Apply `{section: {key: value}}` onto `cfg`; returns the `section.key` names it set."""
    given: set[str] = set()
    for section_name, values in data.items():
        if section_name not in _section_types():
            known = ", ".join(_section_types())
            raise ConfigError(f"{source}: unknown section {section_name!r} (sections: {known})")
        if values is None:
            continue
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: section {section_name!r} must be a mapping of keys to values")
        for key, value in values.items():
            set_value(cfg, f"{section_name}.{key}", value)
            given.add(f"{section_name}.{key}")
    return given


def parse_set(item: str) -> tuple[str, Any]:
    """Split `section.key=value`; the value is read as YAML (so 64, 3e-4, true and [16, 32] work)."""
    key, eq, raw = item.partition("=")
    if not eq or not key.strip():
        raise ConfigError(f"--set expects section.key=value, got {item!r}")
    try:
        value = parse_yaml(raw) if raw.strip() else ""
    except (yaml.YAMLError, RecursionError):
        value = raw
    return key.strip(), value


FLAGS = {
    "run.duration": "--duration", "run.total_steps": "--total-steps", "run.output_dir": "--output-dir",
    "env.id": "--env", "run.seed": "--seed", "training.batch_size": "--batch-size", "env.num_envs": "--num-envs",
    "parallel.num_workers": "--num-workers", "parallel.num_envs_per_worker": "--num-envs-per-worker",
    "training.device": "--device", "distributed.num_envs_total": "--num-envs-total",
    "tracking.wandb": "--track", "tracking.project": "--wandb-project", "tracking.entity": "--wandb-entity",
    "tracking.group": "--wandb-group", "tracking.tags": "--wandb-tags",
}
"""Config fields that the trainers' command lines also set, with their flags."""
TRACKING_FLAGS = ("tracking.project", "tracking.entity", "tracking.group", "tracking.tags")
"""Fields whose flags mean nothing without `--track`."""


def field_name(key: str) -> str:
    """`section.key`, with its command-line flag where it has one: what a message names for the user to fix."""
    return f"{key} ({FLAGS[key]})" if key in FLAGS else key


LAYOUT = ("parallel.num_workers", "parallel.num_envs_per_worker")


def derive_parallel_envs(cfg: Config, given: set[str], on_command_line: set[str], flagged: set[str]) -> None:
    """Parallel mode: env.num_envs is workers × envs per worker. The `--num-envs` flag (in `flagged`) without the envs
    per worker is split evenly over the workers; any other value given for it is refused, unless it came from the
    config file and the layout from the command line (which wins over the file's figures)."""
    p = cfg.parallel
    for key, value in ((LAYOUT[0], p.num_workers), (LAYOUT[1], p.num_envs_per_worker)):
        if value <= 0:
            raise ConfigError(f"{field_name(key)} must be positive, got {value}")
    if "env.num_envs" in flagged and LAYOUT[1] not in on_command_line:
        if cfg.env.num_envs <= 0 or cfg.env.num_envs % p.num_workers:
            raise ConfigError(
                f"{field_name('env.num_envs')} = {cfg.env.num_envs} must split evenly over the {p.num_workers} "
                f"workers (in parallel mode envs = workers × envs per worker; --num-workers and "
                f"--num-envs-per-worker set them one by one)")
        p.num_envs_per_worker = cfg.env.num_envs // p.num_workers
    total = p.num_workers * p.num_envs_per_worker
    overridden = "env.num_envs" not in on_command_line and bool(on_command_line & set(LAYOUT))
    if "env.num_envs" in given and cfg.env.num_envs != total and not overridden:
        raise ConfigError(
            f"env.num_envs = {cfg.env.num_envs} conflicts with the parallel layout ({p.num_workers} workers × "
            f"{p.num_envs_per_worker} envs per worker = {total}): in parallel mode the total is derived, "
            f"so drop env.num_envs or set it to {total}")
    cfg.env.num_envs = total


POSITIVE = ("run.duration", "env.num_envs", "parallel.num_workers", "parallel.num_envs_per_worker",
            "parallel.worker_threads", "training.n_steps", "training.batch_size", "training.n_epochs",
            "model.hidden_size", "logging.return_window", "run.checkpoint_interval", "parallel.worker_timeout",
            "training.learning_rate", "training.max_grad_norm", "training.clip_coef", "training.reward_clip",
            "training.obs_clip", "env.frame_size", "eval.episodes", "eval.num_envs", "distributed.timeout_seconds",
            "logging.progress_seconds")
MAXIMUM = {"env.num_envs": 4096, "training.n_steps": 100_000, "parallel.num_workers": 512, "run.seed": 2**31 - 1,
           "distributed.num_envs_total": 2**20, "env.frame_size": 1024, "env.frame_stack": 64,
           "run.duration": 24 * 365, "env.start_level": 2**31 - 1, "env.num_levels": 2**31 - 1,
           "model.hidden_size": 65536, "distributed.timeout_seconds": 7 * 24 * 3600,
           "run.checkpoint_interval": 10**9, "parallel.worker_timeout": 10**9, "eval.interval_seconds": 10**9,
           "logging.progress_seconds": 10**9}
NON_NEGATIVE = ("env.num_levels", "env.start_level", "env.env_threads", "env.frame_stack", "parallel.learner_threads",
                "training.microbatch_size", "parallel.max_worker_restarts", "run.total_steps", "training.anneal_steps",
                "run.seed", "training.ent_coef", "training.vf_coef", "training.target_kl", "run.limit_seconds",
                "eval.interval_seconds", "distributed.num_envs_total")
UNIT_INTERVAL = ("training.gamma", "training.gae_lambda")
DURATIONS = {"run.duration": "h", "run.checkpoint_interval": "s", "run.limit_seconds": "s",
             "eval.interval_seconds": "s", "parallel.worker_timeout": "s", "distributed.timeout_seconds": "s",
             "logging.progress_seconds": "s"}
"""Time fields, with the unit of a bare number: each also takes text with a unit (`90m`, `30s`; core/units.py)."""
STRING_LISTS = ("tracking.tags",)
"""List fields of names (strings), which also take a comma-separated string."""
AUTO_INTS = ("training.microbatch_size",)
"""Integer fields that also take `auto` (chosen by measurement before a run)."""
DEVICES = ("auto", "cpu", "cuda", "mps")
CHOICES = {"training.precision": ("auto", "fp32", "bf16"), "training.device": DEVICES,
           "model.kind": ("auto", "impala", "nature", "mlp", "random"),
           "model.init": ("reference", "orthogonal"),
           "logging.progress": ("auto", "on", "off"), "parallel.start_method": ("spawn", "forkserver"),
           "env.distribution_mode": PROCGEN_MODES, "eval.levels": ("auto", "train", "test"),
           "run.preempt_signal": ("", "SIGUSR1", "SIGUSR2"), "run.on_preempt": ("stop", "checkpoint")}
LAYER_WIDTHS = ("model.impala_depths", "model.mlp_hidden")


def get_value(cfg: Config, key: str) -> Any:
    """The value of `section.key`."""
    section, _, name = key.partition(".")
    return getattr(getattr(cfg, section), name)


def validate(cfg: Config, world_size: int = 1) -> None:
    """Raise ConfigError for impossible or unknown settings, naming the first one found (`world_size`: the ranks
    of a distributed run, which share the minibatch when the envs are split over them)."""
    for key in POSITIVE:
        if get_value(cfg, key) <= 0:
            raise ConfigError(f"{field_name(key)} must be positive, got {get_value(cfg, key)}")
    for key, cap in MAXIMUM.items():
        if get_value(cfg, key) > cap:
            raise ConfigError(f"{field_name(key)} = {get_value(cfg, key)} is larger than the supported maximum {cap}")
    for key in NON_NEGATIVE:
        if get_value(cfg, key) != "auto" and get_value(cfg, key) < 0:
            raise ConfigError(f"{field_name(key)} must not be negative, got {get_value(cfg, key)}")
    for key in UNIT_INTERVAL:
        if not 0 <= get_value(cfg, key) <= 1:
            raise ConfigError(f"{key} must be in [0, 1], got {get_value(cfg, key)}")
    for key, allowed in CHOICES.items():
        if get_value(cfg, key) not in allowed:
            raise ConfigError(f"{key} must be one of {', '.join(allowed)}; got {get_value(cfg, key)!r}")
    if cfg.training.anneal_steps and not cfg.training.anneal_lr:
        raise ConfigError("training.anneal_steps sets how long training.anneal_lr anneals; set anneal_lr true too, "
                          "or anneal_steps 0")
    if 0 < cfg.training.anneal_steps < cfg.run.total_steps:
        raise ConfigError(f"training.anneal_steps ({cfg.training.anneal_steps:,}) is below run.total_steps "
                          f"({cfg.run.total_steps:,}): the steps past it would train at a learning rate of 0")
    check_env(cfg.env)
    if cfg.tracking.wandb:
        check_wandb()
    if cfg.eval.interval_seconds > 0:
        eval_levels(cfg.env, cfg.eval.levels)
    for key in LAYER_WIDTHS:
        widths = get_value(cfg, key)
        if not widths or any(w <= 0 or w > 4096 for w in widths):
            raise ConfigError(f"{key} must be a non-empty list of widths in 1..4096, got {widths}")
    _check_rollout(cfg, world_size if cfg.distributed.num_envs_total else 1)


def check_wandb() -> None:
    """W&B tracking needs wandb, an optional dependency: refuse it, naming the install, where it is missing."""
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise ConfigError("W&B tracking (--track, tracking.wandb) needs wandb: pip install 'parallel_ppo[wandb]'") \
            from None


def _check_rollout(cfg: Config, world_size: int = 1) -> None:
    """The minibatch must fit in the rollout and divide it; with the envs split over `world_size` ranks, the
    minibatch is all ranks' and must also split evenly over them."""
    rollout, batch = cfg.rollout_size * world_size, cfg.training.batch_size
    ranks = f" × {world_size} ranks" if world_size > 1 else ""
    sizes = f"({cfg.training.n_steps} steps × {cfg.env.num_envs} envs{ranks} = {rollout})"
    if batch > rollout:
        raise ConfigError(f"batch size {batch} is larger than the rollout {sizes}: set --batch-size to at most "
                          f"{rollout}")
    if rollout % batch:
        raise ConfigError(f"batch size {batch} does not divide the rollout {sizes}: set --batch-size to a divisor "
                          f"of {rollout}")
    if batch % world_size:  # then each share divides its rank's rollout, as the whole divides all of them
        raise ConfigError(f"batch size {batch} (the minibatch of all ranks) does not split evenly over "
                          f"{world_size} ranks")


def derive_distributed_envs(cfg: Config, world_size: int, parallel: bool) -> None:
    """A distributed rank's share of the envs: `distributed.num_envs_total` split evenly over the ranks (and,
    in parallel mode, over the rank's workers), in place of env.num_envs and the envs per worker from the
    config."""
    total = cfg.distributed.num_envs_total
    flag = field_name("distributed.num_envs_total")
    if total % world_size:
        raise ConfigError(f"{flag} = {total} does not split evenly over {world_size} ranks")
    per_rank = total // world_size
    if parallel:
        workers = cfg.parallel.num_workers
        if workers <= 0:
            raise ConfigError(f"{field_name('parallel.num_workers')} must be positive, got {workers}")
        if per_rank % workers:
            raise ConfigError(f"{flag} = {total} gives {per_rank} envs per rank, which does not split evenly over "
                              f"{workers} workers ({field_name('parallel.num_workers')})")
        cfg.parallel.num_envs_per_worker = per_rank // workers
    cfg.env.num_envs = per_rank


def build_config(
    config_file: str | os.PathLike | Config | None,
    flags: dict[str, Any],
    sets: list[str],
    parallel: bool,
    world_size: int | None = None,
) -> Config:
    """Defaults ← YAML file (or a Config built in code) ← CLI flags (`{"section.key": value}`, None = not given)
    ← `--set` items; validated, as a new Config (a Config given is not changed). Of a Config built in code, the
    fields that differ from the defaults count as given (a parallel layout then derives env.num_envs unless it
    was changed).

    `world_size`: the ranks of a distributed run (None: not distributed), among which the envs of
    `distributed.num_envs_total` are split."""
    cfg = Config()
    given: set[str] = set()
    if isinstance(config_file, Config):  # its fields that differ from the defaults count as given
        given |= apply_mapping(cfg, changed_fields(config_file), "config")
    elif config_file:
        given |= apply_mapping(cfg, load_yaml(config_file), str(config_file))
    on_command_line: set[str] = set()
    for key, value in flags.items():
        if value is not None:
            set_value(cfg, key, value)
            on_command_line.add(key)
    for item in sets:
        key, value = parse_set(item)
        set_value(cfg, key, value)
        on_command_line.add(key)
    given |= on_command_line
    if cfg.distributed.num_envs_total:
        if world_size is None:
            raise ConfigError(f"{field_name('distributed.num_envs_total')} splits envs over the ranks of a "
                              "--distributed run; without --distributed give the envs of this one process")
        derive_distributed_envs(cfg, world_size, parallel)
    elif parallel:  # each rank of a distributed run without a total takes the layout given for one process
        derive_parallel_envs(cfg, given, on_command_line, {k for k, v in flags.items() if v is not None})
    validate(cfg, world_size or 1)
    if not cfg.tracking.wandb and (unused := [FLAGS[k] for k in TRACKING_FLAGS if flags.get(k) is not None]):
        raise ConfigError(f"{' and '.join(unused)} set up W&B tracking, which is off: add --track (tracking.wandb)")
    return cfg


def changed_fields(cfg: Config) -> dict[str, dict[str, Any]]:
    """`{section: {key: value}}` of the fields of `cfg` that differ from the defaults."""
    default = Config().to_dict()
    return {section: {k: v for k, v in values.items() if v != default[section][k]}
            for section, values in cfg.to_dict().items()}


def config_from_dict(data: dict[str, Any]) -> Config:
    """Rebuild a Config from `Config.to_dict()` output (as stored in config.yaml and checkpoints)."""
    if not isinstance(data, dict):
        raise ConfigError(f"stored config is {type(data).__name__}, not a mapping of sections")
    cfg = Config()
    apply_mapping(cfg, data, "stored config")
    return cfg
