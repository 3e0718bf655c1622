"""The learner's settings that depend on the machine, chosen by measurement: precision and microbatch `auto`.

The fastest arithmetic and forward/backward chunk differ between CPUs (bf16 autocast was 1.7-2x faster than
fp32 on one of ours and 0.75x on another), so `auto` measures the candidates on this machine before the run,
in place of the compute-limit measurement, and keeps the defaults unless another setting is clearly faster
(`pick`). The choice is cached per hardware fingerprint and settings, so later runs measure only their own.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from parallel_ppo.bench.roofline import Candidate, for_candidate, matmul_peak, measure_compute_limit
from parallel_ppo.core.config import Config
from parallel_ppo.core.files import write_json
from parallel_ppo.core.model import learner_device
from parallel_ppo.core.spaces import ActionSpace, as_action_space
from parallel_ppo.runs import fingerprint

PRECISIONS = ("fp32", "bf16")
MICROBATCHES = (64, 128, 0)
"""Chunk sizes `microbatch_size: auto` tries (0 = the whole minibatch); those not below the minibatch are dropped."""
DEFAULT = Candidate("fp32", 64)
"""What `auto` keeps unless a measurement shows something faster (and with nothing measured or cached)."""
CHUNK_MARGIN = 0.10
"""Another chunk replaces the default one only when its compute limit is higher by more than this: a 10 s
measurement cannot rank chunks closer than that (on our Xeon, fp32 chunks of 64 and of the whole minibatch
measured 169 and 180 SPS before runs that reached 186 and 177 SPS)."""
PRECISION_MARGIN = 0.03
"""Another precision replaces the default one when it is faster by more than this (bf16 and fp32 differ by
15-100% on our CPUs; keeping fp32 against a bf16 up to 3% faster costs at most 3%)."""
ROUNDS = 2
"""Interleaved measurement rounds: a slow spell of the machine does not fall on one candidate alone. With one
warm-up and at least two timed iterations per candidate and round, six IMPALA candidates at minibatch 256 took
18 s in all on our 2-core Xeon (10 s timed, the rest warm-up and set-up), once per machine and settings."""
CACHE_DIR_VARIABLE = "PARALLEL_PPO_CACHE_DIR"

Measure = Callable[..., dict[str, Any]]


def cache_path() -> Path:
    """$PARALLEL_PPO_CACHE_DIR, else $XDG_CACHE_HOME/parallel_ppo, else ~/.cache/parallel_ppo; then the file."""
    root = os.environ.get(CACHE_DIR_VARIABLE)
    if not root:
        root = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "parallel_ppo")
    return Path(root) / "learner_settings.json"


def candidates(cfg: Config) -> list[Candidate]:
    """Every combination the config leaves open (one candidate when nothing is `auto`)."""
    t = cfg.training
    precisions = PRECISIONS if t.precision == "auto" else (t.precision,)
    if t.microbatch_size == "auto":
        sizes = [m for m in MICROBATCHES if 0 < m < t.batch_size] + [0]
    else:
        sizes = [t.microbatch_size]
    return [Candidate(p, m) for p in precisions for m in sizes]


def preferred(cfg: Config, options: list[Candidate]) -> Candidate:
    """The default among `options`: DEFAULT's value for each field left auto, the config's for the others."""
    t = cfg.training
    default = Candidate(DEFAULT.precision if t.precision == "auto" else t.precision,
                        DEFAULT.microbatch_size if t.microbatch_size == "auto" else t.microbatch_size)
    return default if default in options else options[0]


def pick(options: list[Candidate], rates: dict[str, float], default: Candidate) -> Candidate:
    """The candidate to keep, given each one's measured compute limit: per precision, the default chunk unless
    another is faster by more than CHUNK_MARGIN; then the default precision unless another (at its chunk) is
    faster by more than PRECISION_MARGIN."""
    def better(best: Candidate, base: Candidate, margin: float) -> Candidate:
        return best if rates[best.label] > (1 + margin) * rates[base.label] else base

    per_precision = {}
    for precision in dict.fromkeys(c.precision for c in options):
        same = [c for c in options if c.precision == precision]
        base = Candidate(precision, default.microbatch_size)
        per_precision[precision] = better(max(same, key=lambda c: rates[c.label]),
                                          base if base in same else same[0], CHUNK_MARGIN)
    fastest = max(per_precision.values(), key=lambda c: rates[c.label])
    return better(fastest, per_precision.get(default.precision, fastest), PRECISION_MARGIN)


def _digest(cfg: Config, **fields: Any) -> str:
    """A cache key: `fields` with what every measurement here depends on (CPU, torch, threads, device)."""
    hw = fingerprint.hardware()
    machine = {"cpu": hw["cpu_model"], "cores": hw["logical_cores"], "torch": torch.__version__,
               "threads": torch.get_num_threads(), "device": str(learner_device(cfg))}
    return hashlib.sha256(json.dumps({**machine, **fields}, sort_keys=True).encode()).hexdigest()[:16]


def cache_key(cfg: Config, obs_shape: tuple[int, ...], actions: ActionSpace | int, options: list[Candidate]) -> str:
    """What the choice depends on: the machine (`_digest`), the network and batch sizes."""
    return _digest(cfg, model=dataclasses.asdict(cfg.model), obs_shape=list(obs_shape),
                   actions=as_action_space(actions).to_dict(), batch_size=cfg.training.batch_size,
                   rollout_batch=cfg.env.num_envs, n_epochs=cfg.training.n_epochs,
                   candidates=[c.label for c in options])


def read_cache(path: Path) -> dict[str, Any]:
    """The cached choices; an unreadable or foreign file counts as empty (it is only a cache: it is rewritten)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


@dataclass
class LearnerChoice:
    """The learner's resolved settings and how they were decided."""

    precision: str
    microbatch_size: int
    device: str
    source: str
    """`config` (nothing was auto), `measured` (now), `cached` (an earlier measurement) or `unmeasured`
    (auto with run.limit_seconds 0 and nothing cached: the default)."""
    rates: dict[str, float] = dataclasses.field(default_factory=dict)
    """Compute limit (env steps/s) measured for each candidate, by label (precision/microbatch)."""
    device_source: str = "config"
    cache: str | None = None
    limit: dict[str, Any] | None = None
    """The chosen candidate's full compute-limit measurement, when measured now."""

    def resolve(self, cfg: Config) -> Config:
        """`cfg` with these settings in place of `auto` (a new config: workers, config.yaml and checkpoints carry
        them)."""
        return dataclasses.replace(cfg, training=dataclasses.replace(
            cfg.training, precision=self.precision, microbatch_size=self.microbatch_size, device=self.device))

    def to_dict(self) -> dict[str, Any]:
        """summary.json's `learner` entry."""
        return {"precision": self.precision, "microbatch_size": self.microbatch_size, "device": self.device,
                "source": self.source, "device_source": self.device_source, "rates": self.rates,
                "cache": self.cache}

    def describe(self) -> str:
        """One line for the start of a run."""
        chunk = self.microbatch_size or "whole minibatch"
        device = self.device + (" (auto)" if self.device_source == "auto" else "")
        text = f"{self.precision}, microbatch {chunk}, on {device}"
        ranked = ", ".join(f"{label} {sps:.0f}" for label, sps in
                           sorted(self.rates.items(), key=lambda kv: -kv[1]))
        if self.source == "measured":
            return f"{text}: measured now, compute limit SPS {ranked}; cached in {self.cache}"
        if self.source == "cached":
            return f"{text}: from the measurement cached in {self.cache} ({ranked}; delete it to measure again)"
        if self.source == "unmeasured":
            return f"{text}: auto without a measurement (run.limit_seconds is 0)"
        return f"{text}: as configured"


def choose(cfg: Config, obs_shape: tuple[int, ...], obs_dtype: np.dtype, actions: ActionSpace | int, seconds: float, *,
           measure: Measure = measure_compute_limit, path: Path | None = None) -> LearnerChoice:
    """Resolve `auto` precision, microbatch and device for this config on this machine (cfg is not changed).

    With something to choose: the cached choice when there is one, else a measurement of every candidate in
    `seconds` (the run's limit budget), whose winner (`pick`) is cached; with `seconds` 0 and nothing cached,
    the default (`preferred`).
    `measure` is `roofline.measure_compute_limit` or a stand-in with its signature.
    """
    device = str(learner_device(cfg))
    device_source = "auto" if cfg.training.device == "auto" else "config"
    options = candidates(cfg)
    if len(options) == 1:
        only = options[0]
        return LearnerChoice(only.precision, only.microbatch_size, device, "config", device_source=device_source)
    path = path or cache_path()
    key = cache_key(cfg, obs_shape, actions, options)
    entry = read_cache(path).get(key)
    if isinstance(entry, dict) and Candidate(entry.get("precision"), entry.get("microbatch_size")) in options:
        return LearnerChoice(entry["precision"], entry["microbatch_size"], device, "cached",
                             dict(entry.get("rates", {})), device_source, str(path))
    if seconds <= 0:
        default = preferred(cfg, options)
        return LearnerChoice(default.precision, default.microbatch_size, device, "unmeasured",
                             device_source=device_source)
    limit = measure_candidates(cfg, obs_shape, obs_dtype, actions, seconds, measure)
    rates = {label: r["limit_sps"] for label, r in limit["candidates"].items()}
    choice = LearnerChoice(limit["precision"], limit["microbatch_size"], device, "measured", rates, device_source,
                           str(path), limit)
    if not store(path, key, {"precision": choice.precision, "microbatch_size": choice.microbatch_size,
                              "rates": rates, "cpu": fingerprint.cpu_model(), "torch": torch.__version__,
                              "threads": torch.get_num_threads()}):
        choice.cache = f"nowhere ({path} is not writable)"
    return choice


def measure_candidates(cfg: Config, obs_shape: tuple[int, ...], obs_dtype: np.dtype, actions: ActionSpace | int,
                       seconds: float, measure: Measure = measure_compute_limit) -> dict[str, Any]:
    """The compute limit of every setting the config leaves open, told from the one `pick` keeps (its precision,
    microbatch and rates at the top level, every candidate's rates under `candidates`)."""
    options = candidates(cfg)
    if len(options) == 1:
        return measure(cfg, obs_shape, actions, seconds, obs_dtype=obs_dtype, candidates=options)
    limit = measure(cfg, obs_shape, actions, seconds, obs_dtype=obs_dtype, candidates=options, rounds=ROUNDS,
                    warmup_iters=1, min_iters=2)
    rates = {label: r["limit_sps"] for label, r in limit["candidates"].items()}
    return for_candidate(limit, pick(options, rates, preferred(cfg, options)))


def store(path: Path, key: str, entry: dict[str, Any]) -> bool:
    """Add `entry` to the cache file (atomically); False when it cannot be written (a read-only home: the run
    goes on, and measures again next time)."""
    cache = read_cache(path)
    cache[key] = entry
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, cache)
    except OSError:
        return False
    return True


def matmul_peaks(cfg: Config, seconds: float = 1.0, path: Path | None = None) -> dict[str, float]:
    """This machine's fp32 and bf16 matmul peaks (GFLOP/s) on the learner's device and threads, cached like the
    choice (a second each, once per machine)."""
    device = learner_device(cfg)
    path = path or cache_path()
    key = "matmul_peak/" + _digest(cfg)
    entry = read_cache(path).get(key)
    if isinstance(entry, dict) and all(isinstance(entry.get(p), (int, float)) for p in PRECISIONS):
        return {p: float(entry[p]) for p in PRECISIONS}
    peaks = {"fp32": matmul_peak(torch.float32, seconds, device), "bf16": matmul_peak(torch.bfloat16, seconds, device)}
    store(path, key, peaks)
    return peaks


def resolve(cfg: Config, seconds: float) -> tuple[Config, LearnerChoice]:
    """Choose (`choose`) for the config's own env: the config with the choice in place of `auto`, and the choice."""
    from parallel_ppo.core.envs import env_spaces

    obs_shape, obs_dtype, actions = env_spaces(cfg.env)
    choice = choose(cfg, obs_shape, obs_dtype, actions, seconds)
    return choice.resolve(cfg), choice
