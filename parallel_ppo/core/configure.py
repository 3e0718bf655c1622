"""From YAML, flags and `--set section.key=value` to a validated Config: types checked, values bounded by each
field's rules (`config.Rules`), layouts derived (parallel workers × envs, a distributed split), and the first problem
named in one ConfigError. Messages name config keys (`section.key`); a command line adds its flags to them."""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
from typing import Any

from parallel_ppo.core.config import (
    CUT_NO_EARLIER,
    Config,
    Rules,
    config_fields,
    rules_of,
)
from parallel_ppo.core.config_yaml import load_yaml, parse_set, yaml_value
from parallel_ppo.core.episodes import check_names
from parallel_ppo.core.units import to_unit
from parallel_ppo.core.worker_rules import check_share, check_workers
from parallel_ppo.envs.batch import eval_levels
from parallel_ppo.envs.families import check_family
from parallel_ppo.errors import ConfigError

FLOAT32_MAX = 3.4028234663852886e38
"""The largest float32: a float setting without a maximum of its own meets float32 tensors (clip_coef, obs_clip)."""


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


def set_value(cfg: Config, dotted: str, value: Any, text: str | None = None) -> None:
    """Set `section.key` on `cfg`, checking that both exist and the value has the field's type; a text field given
    a number by `--set` takes the `text` it was given as (tracking.group=0815 is "0815", not 815)."""
    section_name, _, key = dotted.partition(".")
    if section_name not in _section_types() or not key:
        known = ", ".join(_section_types())
        raise ConfigError(f"unknown config key {dotted!r} (use section.key; sections: {known})")
    section = getattr(cfg, section_name)
    fields = {f.name: f for f in dataclasses.fields(section)}
    if key not in fields:
        raise ConfigError(f"unknown config key {dotted!r} (keys of {section_name}: {', '.join(fields)})")
    current, rules = getattr(section, key), rules_of(fields[key])
    if text is not None and isinstance(current, str) and not rules.auto and isinstance(value, (int, float)):
        value = text.strip()
    setattr(section, key, _read(dotted, value, current, rules))


def _read(key: str, value: Any, current: Any, rules: Rules) -> Any:
    """`value` as field `key` takes it: a duration with a unit in the field's unit, a comma-separated string as a
    list of names, `auto` where the field takes it, else of the type of the field's `current` value."""
    if rules.auto and value == "auto":
        return value
    if rules.unit and isinstance(value, str):
        try:
            value = to_unit(value, rules.unit)
        except ValueError as e:
            raise ConfigError(f"{key}: {e}{' (or auto)' if rules.auto else ''}") from None
    if rules.names:
        return _string_list(key, value)
    if rules.auto:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ConfigError(f"{key} must be {'a duration' if rules.unit else 'an integer'} or auto, got {value!r}")
        return _coerce(key, value, 0.0 if rules.unit else 0)
    value = _coerce(key, value, current)
    if isinstance(value, float) and rules.maximum is None and abs(value) > FLOAT32_MAX:  # overflows in the update
        raise ConfigError(f"{key} = {value!r} is larger than a float32 holds ({FLOAT32_MAX:.4g})")
    return value


def _string_list(path: str, value: Any) -> list[str]:
    """A list of strings (empty items dropped), or a string made one: a YAML list in brackets (a flag's), else split
    at commas. A string in brackets that is no YAML list (`[a,b`) is refused, not split."""
    if isinstance(value, str):
        listed = yaml_value(value) if value.lstrip().startswith("[") else value.split(",")
        if not isinstance(listed, list):
            raise ConfigError(f"{path}: {value!r} is not a valid YAML list; give one as [a, b] or a,b")
        value = listed
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
            try:
                set_value(cfg, f"{section_name}.{key}", value)
            except ConfigError as e:  # named with its source, as an unknown section is: a file's typo, not a flag's
                raise ConfigError(f"{source}: {e}") from None
            given.add(f"{section_name}.{key}")
    return given


LAYOUT = ("parallel.num_workers", "parallel.num_envs_per_worker")


def derive_parallel_envs(cfg: Config, given: set[str], on_command_line: set[str], flagged: set[str]) -> None:
    """Parallel mode: env.num_envs is workers × envs per worker. A total given as a flag (in `flagged`) without the
    envs per worker is split evenly over the workers; any other value given for it is refused, unless it came from the
    config file and the layout from the command line (which wins over the file's figures)."""
    p = cfg.parallel
    for key, value in ((LAYOUT[0], p.num_workers), (LAYOUT[1], p.num_envs_per_worker)):
        if value <= 0:
            raise ConfigError(f"{key} must be positive, got {value}")
    if "env.num_envs" in flagged and LAYOUT[1] not in on_command_line:
        if cfg.env.num_envs <= 0 or cfg.env.num_envs % p.num_workers:
            raise ConfigError(
                f"env.num_envs = {cfg.env.num_envs} must split evenly over the {p.num_workers} workers (in "
                f"parallel mode envs = workers × envs per worker; {LAYOUT[0]} and {LAYOUT[1]} set them one by one)")
        p.num_envs_per_worker = cfg.env.num_envs // p.num_workers
    total = p.num_workers * p.num_envs_per_worker
    if total > (most := maximum_of("env.num_envs")):
        raise ConfigError(f"{p.num_workers} workers ({LAYOUT[0]}) × {p.num_envs_per_worker} envs per worker "
                          f"({LAYOUT[1]}) = {total} envs, more than the supported maximum of {most:.0f} a process")
    overridden = "env.num_envs" not in on_command_line and bool(on_command_line & set(LAYOUT))
    if "env.num_envs" in given and cfg.env.num_envs != total and not overridden:
        raise ConfigError(
            f"env.num_envs = {cfg.env.num_envs} conflicts with the parallel layout ({p.num_workers} workers × "
            f"{p.num_envs_per_worker} envs per worker = {total}): in parallel mode the total is derived, "
            f"so drop env.num_envs or set it to {total}")
    cfg.env.num_envs = total


def get_value(cfg: Config, key: str) -> Any:
    """The value of `section.key`."""
    section, _, name = key.partition(".")
    return getattr(getattr(cfg, section), name)


def validate(cfg: Config, world_size: int = 1) -> None:
    """Raise ConfigError for impossible or unknown settings, naming the first one found (`world_size`: the ranks
    of a distributed run, which share the minibatch when the envs are split over them)."""
    for key, f in config_fields():
        check_rules(key, get_value(cfg, key), rules_of(f))
    if cfg.training.anneal_steps and not cfg.training.anneal_lr:
        raise ConfigError("training.anneal_steps sets how long training.anneal_lr anneals; set anneal_lr true too, "
                          "or anneal_steps 0")
    if 0 < cfg.training.anneal_steps < cfg.run.total_steps:
        raise ConfigError(f"training.anneal_steps ({cfg.training.anneal_steps:,}) is below run.total_steps "
                          f"({cfg.run.total_steps:,}): the steps past it would train at a learning rate of 0")
    check_family(cfg.env)
    check_names(cfg.logging.episode_info)
    if cfg.logging.tensorboard:
        check_tensorboard()
    if cfg.tracking.wandb:
        check_wandb()
    if cfg.eval.interval_seconds > 0:
        eval_levels(cfg.env, cfg.eval.levels)
        if cfg.eval.video and not cfg.logging.tensorboard:
            raise ConfigError("eval.video records each evaluation's video in TensorBoard; set logging.tensorboard "
                              "true, or eval.video empty")
    _check_rollout(cfg, world_size if cfg.distributed.num_envs_total else 1)
    cut = cfg.distributed.sync_fraction  # one process alone has no other rank to cut, as one worker has none
    check_share("distributed.sync_fraction", cut, world_size, "ranks")
    batch = cfg.training.batch_size // (world_size if cfg.distributed.num_envs_total else 1)  # a rank's minibatch
    if cut < 1 and world_size > 1 and cfg.rollout_size // batch > cut_rollout_size(cfg):  # ranks must agree on them
        raise ConfigError(f"distributed.sync_fraction {cut} may cut a rank's rollout to {cut_rollout_size(cfg)} "
                          f"samples, fewer than its {cfg.rollout_size // batch} minibatches of {batch}: take larger "
                          "minibatches, or set it to 1")


def cut_rollout_size(cfg: Config) -> int:
    """The fewest samples a rollout cut for the stragglers' sake keeps (`core.config.CUT_NO_EARLIER` of its steps)."""
    return math.ceil(CUT_NO_EARLIER * cfg.training.n_steps) * cfg.env.num_envs


def check_rules(key: str, value: Any, rules: Rules) -> None:
    """Raise ConfigError, naming `key`, its value and the rule, where `value` breaks one of the field's `rules`."""
    if rules.choices and value not in rules.choices:
        raise ConfigError(f"{key} must be one of {', '.join(c or repr(c) for c in rules.choices)}; got {value!r}")
    if rules.widths and (not value or any(w <= 0 or w > 4096 for w in value)):
        raise ConfigError(f"{key} must be a non-empty list of widths in 1..4096, got {value}")
    if rules.auto and value == "auto":
        return
    if rules.positive and value <= 0:
        raise ConfigError(f"{key} must be positive, got {value}")
    if rules.maximum is not None and value > rules.maximum:
        raise ConfigError(f"{key} = {value} is larger than the supported maximum {rules.maximum}")
    if rules.non_negative and value < 0:
        raise ConfigError(f"{key} must not be negative, got {value}")
    if rules.unit_interval and not 0 <= value <= 1:
        raise ConfigError(f"{key} must be in [0, 1], got {value}")


def resume_mismatch(stored: Config, current: Config) -> str | None:
    """The first field that must match on resume (`Rules.resume`: it makes the envs or the network) whose value in
    `current` differs from `stored`'s (the config a checkpoint was made with), as `section.key=STORED, not CURRENT`,
    or `training.predict_privileged` turned on or off (it adds a layer); None where they all match."""
    for key, f in config_fields():
        was, now = get_value(stored, key), get_value(current, key)
        if rules_of(f).resume and was != now:
            return f"{key}={was!r}, not {now!r}"
    was, now = stored.training.predict_privileged, current.training.predict_privileged
    if (was > 0) != (now > 0):  # its weight may change, not whether the network has the layer that predicts
        return f"training.predict_privileged={was!r} (its network {'with' if was > 0 else 'without'} the layer that " \
               f"predicts), not {now!r}"
    return None


def check_wandb() -> None:
    """W&B tracking needs wandb, an optional dependency: refuse it, naming the install, where it is missing."""
    _check_installed("wandb", "tracking.wandb needs wandb for W&B tracking: pip install 'parallel_ppo[wandb]'")


def check_tensorboard() -> None:
    """TensorBoard events need the tensorboard package, which an environment may lack though it is a dependency:
    refuse them, naming the fix, where it is missing (before anything is written, not when training starts)."""
    _check_installed("tensorboard", "logging.tensorboard needs the tensorboard package, which is not installed: "
                                    "pip install tensorboard, or set logging.tensorboard=false")


def _check_installed(module: str, refusal: str) -> None:
    """Raise ConfigError `refusal` where `module` cannot be imported."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise ConfigError(refusal) from None


def _check_rollout(cfg: Config, world_size: int = 1) -> None:
    """The minibatch must fit in the rollout and divide it; with the envs split over `world_size` ranks, the
    minibatch is all ranks' and must also split evenly over them."""
    rollout, batch = cfg.rollout_size * world_size, cfg.training.batch_size
    ranks = f" × {world_size} ranks" if world_size > 1 else ""
    sizes = f"({cfg.training.n_steps} steps × {cfg.env.num_envs} envs{ranks} = {rollout})"
    if batch > rollout:
        raise ConfigError(f"batch size {batch} is larger than the rollout {sizes}: set training.batch_size to at "
                          f"most {rollout}")
    if rollout % batch:
        raise ConfigError(f"batch size {batch} does not divide the rollout {sizes}: set training.batch_size to a "
                          f"divisor of {rollout}")
    if batch % world_size:  # then each share divides its rank's rollout, as the whole divides all of them
        raise ConfigError(f"batch size {batch} (the minibatch of all ranks) does not split evenly over "
                          f"{world_size} ranks")


def derive_distributed_envs(cfg: Config, world_size: int, parallel: bool, on_command_line: set[str]) -> None:
    """A distributed rank's share of the envs: `distributed.num_envs_total` split evenly over the ranks (and,
    in parallel mode, over the rank's workers), in place of env.num_envs and the envs per worker from the
    config; the command line's own figure for either (`on_command_line`) is refused where it differs."""
    total = cfg.distributed.num_envs_total
    if total < 0:
        raise ConfigError(f"distributed.num_envs_total must not be negative, got {total}")
    if total % world_size:
        raise ConfigError(f"distributed.num_envs_total = {total} does not split evenly over {world_size} ranks")
    per_rank = total // world_size
    if per_rank > (most := maximum_of("env.num_envs")):
        raise ConfigError(f"distributed.num_envs_total = {total} gives {per_rank} envs per rank, more than the "
                          f"supported maximum of {most:.0f} a process")
    derived = {"env.num_envs": per_rank}
    if parallel:
        workers = cfg.parallel.num_workers
        if workers <= 0:
            raise ConfigError(f"parallel.num_workers must be positive, got {workers}")
        if per_rank % workers:
            raise ConfigError(f"distributed.num_envs_total = {total} gives {per_rank} envs per rank, which does not "
                              f"split evenly over {workers} workers (parallel.num_workers)")
        derived["parallel.num_envs_per_worker"] = per_rank // workers
    for key, value in derived.items():
        if key in on_command_line and get_value(cfg, key) != value:
            raise ConfigError(f"{key} = {get_value(cfg, key)} conflicts with distributed.num_envs_total = {total}, "
                              f"which gives {value} over {world_size} ranks: give one of them")
        set_value(cfg, key, value)


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
        given |= apply_mapping(cfg, changed_fields(config_file), "the Config given")
    elif config_file:
        given |= apply_mapping(cfg, load_yaml(config_file), str(config_file))
    on_command_line: set[str] = set()
    for key, value in flags.items():
        if value is not None:
            set_value(cfg, key, value)
            on_command_line.add(key)
    for item in sets:
        key, value = parse_set(item)
        set_value(cfg, key, value, item.partition("=")[2])
        on_command_line.add(key)
    given |= on_command_line
    if cfg.distributed.num_envs_total:
        if world_size is None:
            raise ConfigError("distributed.num_envs_total splits envs over the ranks of a distributed run; this "
                              "one is not distributed: give the envs of this one process")
        derive_distributed_envs(cfg, world_size, parallel, on_command_line)
    elif parallel:  # each rank of a distributed run without a total takes the layout given for one process
        derive_parallel_envs(cfg, given, on_command_line, {k for k, v in flags.items() if v is not None})
    if parallel and (world_size or 1) > 1 and cfg.distributed.sync_fraction < 1:
        raise ConfigError(f"distributed.sync_fraction {cfg.distributed.sync_fraction} cuts the rollouts of sequential "
                          "ranks; these step their envs in workers, whose rollouts it does not cut: set it to 1")
    validate(cfg, world_size or 1)
    if parallel:
        check_workers(cfg.parallel, world_size or 1)
    unused = [key for key in tracking_settings() if flags.get(key) is not None]
    if unused and not cfg.tracking.wandb:
        raise ConfigError(f"{' and '.join(unused)} set up W&B tracking, which is off: turn on tracking.wandb")
    return cfg


def tracking_settings() -> list[str]:
    """The W&B settings besides `tracking.wandb`, which mean nothing while it is off: given as flags then (not in a
    config file, which may be shared by runs tracked and not), they are refused as a forgotten switch."""
    return [key for key, _ in config_fields() if key.startswith("tracking.") and key != "tracking.wandb"]


def changed_fields(cfg: Config) -> dict[str, dict[str, Any]]:
    """`{section: {key: value}}` of the fields of `cfg` that differ from the defaults (each section must still be
    its own kind: one replaced by another value is refused, naming it)."""
    defaults = Config()
    for section in dataclasses.fields(Config):
        kind = type(getattr(defaults, section.name))
        if not isinstance(value := getattr(cfg, section.name), kind):
            raise ConfigError(f"config section {section.name} must be {kind.__name__}, got {type(value).__name__}")
    default = defaults.to_dict()
    return {section: {k: v for k, v in values.items() if v != default[section][k]}
            for section, values in cfg.to_dict().items()}


def config_from_dict(data: dict[str, Any]) -> Config:
    """Rebuild a Config from `Config.to_dict()` output (as stored in config.yaml and checkpoints)."""
    if not isinstance(data, dict):
        raise ConfigError(f"stored config is {type(data).__name__}, not a mapping of sections")
    cfg = Config()
    apply_mapping(cfg, data, "stored config")
    return cfg


def maximum_of(key: str) -> float:
    """The largest value the setting `key` (`eval.episodes`) takes."""
    maximum = next(rules_of(f).maximum for name, f in config_fields() if name == key)
    assert maximum is not None, f"{key} has no maximum"
    return maximum
