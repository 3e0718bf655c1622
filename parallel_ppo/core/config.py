"""Typed run configuration: YAML sections, then CLI flags, then `--set section.key=value`, then validation."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import yaml


class ConfigError(ValueError):
    """A problem with user input; the entry points print it as one line and exit with status 2."""


def fail(prog: str, error: Exception, status: int) -> int:
    """Report `error` as the one line `PROG: error: ...` on stderr; returns the exit status to end with."""
    print(f"{prog}: error: {error}", file=sys.stderr)
    return status


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line (no usage dump) and exits with status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def positive_number(text: str) -> float:
    """argparse type: a finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """argparse type: a whole number above 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


@dataclass
class EnvConfig:
    id: str = "starpilot"
    """Procgen game (e.g. `starpilot`) or a gymnasium id with discrete actions (e.g. `CartPole-v1`)."""
    num_envs: int = 16
    """Total envs. Sequential: stepped by the one process. Parallel: derived, workers × envs per worker (a
    different value given for it is refused)."""
    distribution_mode: str = "easy"
    """Procgen difficulty: easy, hard, extreme, memory or exploration (exploration plays one fixed hard level
    per game, so num_levels and start_level do not apply; only the games Procgen has one for)."""
    num_levels: int = 200
    """Procgen: number of distinct levels (0 = unlimited)."""
    start_level: int = 0
    """Procgen: seed of the first level."""
    env_threads: int = 0
    """Procgen's own stepping threads per process (0 = automatic: 1 in a worker, all cores otherwise)."""


@dataclass
class ParallelConfig:
    num_workers: int = 2
    """Worker processes, each stepping its own batch of envs."""
    num_envs_per_worker: int = 8
    """Envs in each worker's batch."""
    worker_threads: int = 1
    """Torch/OpenMP threads in each worker process."""
    learner_threads: int = 0
    """Torch threads of the process that runs the update (0 = automatic: all logical cores)."""
    start_method: str = "forkserver"
    """How workers start: forkserver (forked from a process that loaded torch and Procgen once, so workers
    share that memory; the default) or spawn (each worker imports everything itself)."""
    worker_timeout: float = 5.0
    """Seconds a worker may make no progress before it is declared stuck."""
    max_worker_restarts: int = 3
    """Restarts allowed per worker slot before the run stops with an error."""


@dataclass
class ModelConfig:
    kind: str = "auto"
    """Network: `impala` (image observations), `mlp` (vector observations), `auto` to pick by shape, or
    `random` (uniform actions, no network: for measuring raw env throughput)."""
    impala_depths: list[int] = field(default_factory=lambda: [16, 32, 32])
    """Channels of the IMPALA CNN's three stages."""
    hidden_size: int = 256
    """Width of the IMPALA CNN's dense layer."""
    init: str = "reference"
    """IMPALA CNN weights: `reference` (PyTorch's default init for the convolutions and the dense layer,
    orthogonal heads with gain 0.01 for the actor and 1 for the critic, as CleanRL's ppo_procgen) or
    `orthogonal` (gain √2 on every layer: activations grow about 3× per stage on Procgen frames and the
    first values are near -10, which value clipping then undoes only 0.2 per update)."""
    mlp_hidden: list[int] = field(default_factory=lambda: [64, 64])
    """Hidden layer widths of the MLP (separate actor and critic towers)."""


@dataclass
class TrainingConfig:
    n_steps: int = 128
    """Steps per env per rollout."""
    batch_size: int = 256
    """SGD minibatch size; must divide n_steps × total envs."""
    microbatch_size: int | str = "auto"
    """Samples per forward/backward pass inside a minibatch (0 = the whole minibatch), or `auto`: the fastest
    of 64, 128 and the whole minibatch, measured on this machine before the run (`learner_settings`).
    Gradients add up to the minibatch's, so this trades nothing but memory and cache misses."""
    n_epochs: int = 3
    """Passes over each rollout."""
    learning_rate: float = 5e-4
    """Adam learning rate (Adam eps is 1e-5)."""
    anneal_lr: bool = False
    """Linearly anneal the learning rate to 0 over the run (by steps or by duration, whichever is bound)."""
    gamma: float = 0.999
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    clip_coef: float = 0.2
    """PPO ratio clip range."""
    clip_vloss: bool = True
    """Clip the value loss around the old values (by ±clip_coef)."""
    normalize_reward: bool = False
    """Divide rewards by a running std of the discounted return, as the reference Procgen PPOs do (episode
    returns in metrics and reports stay raw)."""
    reward_clip: float = 10.0
    """Clip normalized rewards to ±this (only with normalize_reward)."""
    ent_coef: float = 0.01
    """Entropy bonus coefficient."""
    vf_coef: float = 0.5
    """Value loss coefficient."""
    max_grad_norm: float = 0.5
    """Global gradient norm clip."""
    norm_adv: bool = True
    """Normalize advantages per minibatch."""
    target_kl: float = 0.0
    """Stop the epochs early when approx KL exceeds this (0 = never)."""
    precision: str = "auto"
    """Network arithmetic: fp32, bf16 (autocast; log-probs, losses and optimizer state stay fp32), or `auto`:
    the faster of the two for this network on this machine, measured before the run (`learner_settings`).
    bf16 was 1.7-2x faster than fp32 on one CPU of ours and 0.75x on another."""
    device: str = "auto"
    """Where the learner runs (`--device`): cpu, cuda, mps, or `auto` (cuda, else mps, else cpu). Parallel
    workers always run on the CPU and read the parameters from CPU shared memory."""


@dataclass
class RunConfig:
    duration: float = 1.0
    """Wall-clock budget in hours; the run stops at the first update boundary after it."""
    total_steps: int = 0
    """Stop after this many env steps (0 = no step limit)."""
    seed: int = 1
    """Seed for torch, action sampling and envs."""
    output_dir: str = ""
    """Run directory (empty = benchmarks/<mode>_<timestamp>)."""
    checkpoint_interval: float = 300.0
    """Seconds between checkpoints (one is always written at the end)."""
    limit_seconds: float = 10.0
    """Seconds spent measuring the bare network's compute limit before training, so that summary.json can
    report the run's efficiency against it (0 = skip)."""


@dataclass
class EvalConfig:
    interval_seconds: float = 0.0
    """Evaluate the policy every this many seconds of training, and once at the end (0 = never). It plays on
    fresh envs of its own, in the learner's process; its time is the `eval` phase of the update after it."""
    episodes: int = 16
    """Complete episodes per evaluation."""
    num_envs: int = 8
    """Envs an evaluation plays at once (each plays its share of the episodes)."""
    levels: str = "test"
    """`test`: Procgen levels the run never trains on; `train`: its own levels (or the gymnasium env itself)."""
    deterministic: bool = False
    """Take the most likely action instead of sampling."""


@dataclass
class DistributedConfig:
    num_envs_total: int = 0
    """Envs over all ranks of a `--distributed` run, split evenly among them, and then `training.batch_size` is the
    minibatch of all ranks, split too: one global problem shared out (strong scaling). 0, the default: each rank
    runs the env layout and the minibatch given for one process, and the global figures are those × the ranks
    (the scaling rule that keeps each rank's work the same at any rank count)."""
    timeout_seconds: float = 45.0
    """How long a rank waits on the others in one exchange before it gives up (a rank that hung): with the update
    in progress, under a minute. A rank that died is noticed at once. (The wait for rank 0's logging, checkpoints
    and evaluation after an update has a timeout of an hour.)"""


@dataclass
class LoggingConfig:
    tensorboard: bool = True
    """Write TensorBoard events under <output_dir>/logs."""
    progress: str = "auto"
    """Console progress line: auto (only on a terminal), on, or off."""
    return_window: int = 100
    """Episodes in the rolling mean of returns and lengths."""


@dataclass
class Config:
    env: EnvConfig = field(default_factory=EnvConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    run: RunConfig = field(default_factory=RunConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    @property
    def rollout_size(self) -> int:
        """Env steps collected per update."""
        return self.training.n_steps * self.env.num_envs

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


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
    if dotted in AUTO_INTS:
        if value != "auto" and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise ConfigError(f"{dotted} must be an integer or auto, got {value!r}")
        setattr(section, key, value if value == "auto" else _coerce(dotted, value, 0))
        return
    setattr(section, key, _coerce(dotted, value, getattr(section, key)))


class _YamlLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 scalars: only true/false are booleans (`progress: off` stays the string
    "off") and numbers with an exponent but no point (`3e-4`, `1e5`) are numbers, not strings."""


_YamlLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_YamlLoader.add_implicit_resolver("tag:yaml.org,2002:bool",
                                  re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_YamlLoader.add_implicit_resolver("tag:yaml.org,2002:float",
                                  re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
                                  list("-+0123456789."))


def _yaml_load(text: str) -> Any:
    return yaml.load(text, Loader=_YamlLoader)  # a SafeLoader subclass: plain data only


def load_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """Read a config file into nested dicts; missing, unreadable or malformed files are ConfigErrors."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        data = _yaml_load(p.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file {p}: {e}") from None
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise ConfigError(f"config file {p} is not valid YAML{at}") from None
    except RecursionError:
        raise ConfigError(f"config file {p} is nested too deeply to be a config") from None
    if data is None:
        raise ConfigError(f"config file {p} is empty")
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must be a mapping of sections (env, parallel, training, ...)")
    return data


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
        value = _yaml_load(raw) if raw.strip() else ""
    except (yaml.YAMLError, RecursionError):
        value = raw
    return key.strip(), value


PROCGEN_MODES = ("easy", "hard", "extreme", "memory", "exploration")

PROCGEN_GAMES = ("bigfish", "bossfight", "caveflyer", "chaser", "climber", "coinrun", "dodgeball", "fruitbot",
                 "heist", "jumper", "leaper", "maze", "miner", "ninja", "plunder", "starpilot")
"""Procgen's games (procgen.env.ENV_NAMES; a test keeps them equal), known without loading Procgen."""

PROCGEN_EXPLORATION_GAMES = ("caveflyer", "climber", "coinrun", "heist", "jumper", "leaper", "maze", "ninja")
"""The games Procgen has an exploration level for (procgen.env.EXPLORATION_LEVEL_SEEDS)."""


def check_env(cfg: EnvConfig) -> None:
    """Raise ConfigError unless `cfg.id` is a Procgen game (in a mode it has) or a registered gymnasium id."""
    if cfg.id in PROCGEN_GAMES:
        if cfg.distribution_mode == "exploration" and cfg.id not in PROCGEN_EXPLORATION_GAMES:
            raise ConfigError(f"{cfg.id} has no exploration mode (games that do: "
                              f"{', '.join(PROCGEN_EXPLORATION_GAMES)})")
        return
    import gymnasium

    if cfg.id not in gymnasium.envs.registry:
        raise ConfigError(f"unknown game or env id {cfg.id!r}: use a Procgen game ({', '.join(PROCGEN_GAMES)}) "
                          "or a gymnasium id such as CartPole-v1")


TEST_LEVELS = 1_000_000
"""Test levels are the next TEST_LEVELS level seeds after the training range: disjoint from it by construction."""


def eval_levels(env: EnvConfig, levels: str) -> EnvConfig:
    """The env config to evaluate on: `train` (the run's own levels) or `test` (levels it never saw)."""
    if levels == "train":
        return dataclasses.replace(env)
    if env.id not in PROCGEN_GAMES:
        raise ConfigError(f"{env.id} has no levels to hold out: evaluate it on its own distribution (levels train, "
                          "or eval.levels=train)")
    if env.distribution_mode == "exploration":
        raise ConfigError("exploration mode plays one fixed level: there are no test levels (use levels train)")
    if env.num_levels == 0:
        raise ConfigError("the run trained on every level (num_levels 0): no level is held out (use levels train)")
    start = env.start_level + env.num_levels
    return dataclasses.replace(env, start_level=start, num_levels=min(TEST_LEVELS, 2**31 - 1 - start))


FLAGS = {
    "run.duration": "--duration", "run.total_steps": "--total-steps", "run.output_dir": "--output-dir",
    "env.id": "--env", "run.seed": "--seed", "training.batch_size": "--batch-size", "env.num_envs": "--num-envs",
    "parallel.num_workers": "--num-workers", "parallel.num_envs_per_worker": "--num-envs-per-worker",
    "training.device": "--device", "distributed.num_envs_total": "--num-envs-total",
}
"""Config fields that the trainers' command lines also set, with their flags."""


def field_name(key: str) -> str:
    """`section.key`, with its command-line flag where it has one: what a message names for the user to fix."""
    return f"{key} ({FLAGS[key]})" if key in FLAGS else key


def derive_parallel_envs(cfg: Config, given: set[str]) -> None:
    """Parallel mode: env.num_envs is workers × envs per worker. A different value given for it is refused."""
    p = cfg.parallel
    for key, value in (("parallel.num_workers", p.num_workers),
                       ("parallel.num_envs_per_worker", p.num_envs_per_worker)):
        if value <= 0:
            raise ConfigError(f"{field_name(key)} must be positive, got {value}")
    total = p.num_workers * p.num_envs_per_worker
    if "env.num_envs" in given and cfg.env.num_envs != total:
        raise ConfigError(
            f"env.num_envs = {cfg.env.num_envs} conflicts with the parallel layout ({p.num_workers} workers × "
            f"{p.num_envs_per_worker} envs per worker = {total}): in parallel mode the total is derived, "
            f"so drop env.num_envs or set it to {total}")
    cfg.env.num_envs = total


POSITIVE = ("run.duration", "env.num_envs", "parallel.num_workers", "parallel.num_envs_per_worker",
            "parallel.worker_threads", "training.n_steps", "training.batch_size", "training.n_epochs",
            "model.hidden_size", "logging.return_window", "run.checkpoint_interval", "parallel.worker_timeout",
            "training.learning_rate", "training.max_grad_norm", "training.clip_coef", "training.reward_clip",
            "eval.episodes", "eval.num_envs", "distributed.timeout_seconds")
MAXIMUM = {"env.num_envs": 4096, "training.n_steps": 100_000, "parallel.num_workers": 512, "run.seed": 2**31 - 1,
           "distributed.num_envs_total": 2**20,
           "run.duration": 24 * 365}
NON_NEGATIVE = ("env.num_levels", "env.start_level", "env.env_threads", "parallel.learner_threads",
                "training.microbatch_size", "parallel.max_worker_restarts", "run.total_steps", "run.seed",
                "training.ent_coef", "training.vf_coef", "training.target_kl", "run.limit_seconds",
                "eval.interval_seconds", "distributed.num_envs_total")
UNIT_INTERVAL = ("training.gamma", "training.gae_lambda")
AUTO_INTS = ("training.microbatch_size",)
"""Integer fields that also take `auto` (chosen by measurement before a run)."""
DEVICES = ("auto", "cpu", "cuda", "mps")
CHOICES = {"training.precision": ("auto", "fp32", "bf16"), "training.device": DEVICES,
           "model.kind": ("auto", "impala", "mlp", "random"),
           "model.init": ("reference", "orthogonal"),
           "logging.progress": ("auto", "on", "off"), "parallel.start_method": ("spawn", "forkserver"),
           "env.distribution_mode": PROCGEN_MODES, "eval.levels": ("train", "test")}
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
    check_env(cfg.env)
    if cfg.eval.interval_seconds > 0:
        eval_levels(cfg.env, cfg.eval.levels)
    for key in LAYER_WIDTHS:
        widths = get_value(cfg, key)
        if not widths or any(w <= 0 or w > 4096 for w in widths):
            raise ConfigError(f"{key} must be a non-empty list of widths in 1..4096, got {widths}")
    _check_rollout(cfg, world_size if cfg.distributed.num_envs_total else 1)


def _check_rollout(cfg: Config, world_size: int = 1) -> None:
    """The minibatch must fit in the rollout and divide it; with the envs split over `world_size` ranks, the
    minibatch is all ranks' and must also split evenly over them."""
    rollout, batch = cfg.rollout_size * world_size, cfg.training.batch_size
    ranks = f" × {world_size} ranks" if world_size > 1 else ""
    sizes = f"({cfg.training.n_steps} steps × {cfg.env.num_envs} envs{ranks} = {rollout})"
    if batch > rollout:
        raise ConfigError(f"batch size {batch} is larger than the rollout {sizes}")
    if rollout % batch:
        raise ConfigError(f"batch size {batch} does not divide the rollout {sizes}")
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
    config_file: str | None,
    flags: dict[str, Any],
    sets: list[str],
    parallel: bool,
    world_size: int | None = None,
) -> Config:
    """Defaults ← YAML file ← CLI flags (`{"section.key": value}`, None = not given) ← `--set` items; validated.

    `world_size`: the ranks of a distributed run (None: not distributed), among which the envs of
    `distributed.num_envs_total` are split."""
    cfg = Config()
    given: set[str] = set()
    if config_file:
        given |= apply_mapping(cfg, load_yaml(config_file), config_file)
    for key, value in flags.items():
        if value is not None:
            set_value(cfg, key, value)
            given.add(key)
    for item in sets:
        key, value = parse_set(item)
        set_value(cfg, key, value)
        given.add(key)
    if cfg.distributed.num_envs_total:
        if world_size is None:
            raise ConfigError(f"{field_name('distributed.num_envs_total')} splits envs over the ranks of a "
                              "--distributed run; without --distributed give the envs of this one process")
        derive_distributed_envs(cfg, world_size, parallel)
    elif parallel:  # each rank of a distributed run without a total takes the layout given for one process
        derive_parallel_envs(cfg, given)
    validate(cfg, world_size or 1)
    return cfg


def config_from_dict(data: dict[str, Any]) -> Config:
    """Rebuild a Config from `Config.to_dict()` output (as stored in config.yaml and checkpoints)."""
    cfg = Config()
    apply_mapping(cfg, data, "stored config")
    return cfg
