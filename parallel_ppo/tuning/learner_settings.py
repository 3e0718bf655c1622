"""The learner's settings that depend on the machine, chosen by measurement: precision and microbatch `auto`.

The fastest arithmetic and forward/backward chunk differ between CPUs (bf16 autocast is much faster than fp32
on a CPU with native bf16 and slower on one without), so `auto` measures the candidates on this machine before the run,
in place of the compute-limit measurement, and keeps the defaults unless another setting is clearly faster
(`pick`). The choice is cached per hardware fingerprint and settings, so later runs measure only their own; one
measured while other processes kept the machine busy is used once, not cached, and made from each candidate's
fastest iterations as well as from the rounds (load only ever adds time: a 2.6x gain must not be lost to a round
that another process slowed); a quiet one from the rounds, or from a large median gain that the fastest iterations
confirm (one disturbed round must not keep a 1.5x gain out).
Two rules keep a choice from resting on noise: bf16 is a candidate only where the device computes it natively
(`bf16_is_native`), tf32 only on a CUDA GPU that has it (`tf32_is_native`), and a network too small for the choice
to matter keeps the defaults unmeasured (`is_small`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from parallel_ppo.core.config import Config
from parallel_ppo.core.model import autocast, learner_device
from parallel_ppo.envs.spaces import EnvSpaces
from parallel_ppo.errors import ConfigError
from parallel_ppo.runs import fingerprint
from parallel_ppo.tuning.cache import cache_path, cached_rates, machine_digest, number, read_cache, store
from parallel_ppo.tuning.compute_limit import (
    BUSY_BUDGET,
    Candidate,
    extra_passes,
    for_candidate,
    matmul_peak,
    measure_compute_limit,
    network_flops,
    on_one_thread,
)
from parallel_ppo.tuning.other_load import BUSY_CORES, OtherLoad, busy

PRECISIONS = ("fp32", "bf16", "tf32")
"""Every precision a learner may use; tf32 on a CUDA GPU only (`tf32_is_native`)."""
MICROBATCHES = (64, 128, 0)
"""Chunk sizes `microbatch_size: auto` tries (0 = the whole minibatch); those not below the minibatch are dropped."""
DEFAULT = Candidate("fp32", 64)
"""What `auto` keeps unless a measurement shows something faster (and with nothing measured or cached)."""
SMALL_DEFAULT = Candidate("fp32", 0)
"""What `auto` keeps, unmeasured, for a network below SMALL_FORWARD_FLOPS: fp32 and the whole minibatch."""
SMALL_FORWARD_FLOPS = 1e5
"""Forward FLOPs per sample (`compute_limit.network_flops`) below which a network keeps SMALL_DEFAULT without a
measurement. Below it a training step is mostly per-operation overhead, not arithmetic, so neither setting can win
by much and a measurement ranks noise. On our AMD EPYC with avx512_bf16 (2 threads, minibatch 256, 5 rounds):
MLPs of 0.018, 0.068 and 0.27 MFLOP ran bf16 at 0.64, 0.70 and 0.88x fp32, of 0.6, 1.1 and 4.2 MFLOP at 1.14,
1.35 and 1.63x; 64-sample chunks ran CartPole's MLP (0.018 MFLOP) at 0.44x the whole minibatch. The threshold
is 5x above CartPole's MLP, 3x below the smallest network where bf16 won, 600x below the IMPALA CNN (61 MFLOP)."""
MARGIN = 0.10
"""Another candidate replaces the default only when it is faster by more than this in every round (`clearly_faster`):
where the choice matters the candidates differ by more (bf16 1.5x fp32 for the IMPALA CNN on our AMD EPYC with
avx512_bf16, 0.75x on our Xeon; 64-sample chunks 1.2x the whole minibatch here), and gains below it are within what
one measurement ranks wrongly (on our Xeon, fp32 chunks of 64 and of the whole minibatch measured 169 and 180 SPS
before runs that reached 186 and 177 SPS)."""
ROUNDS = 7
"""Interleaved measurement rounds (ABC, CBA, ABC, ...), each timing every candidate: a slow spell of the machine
does not fall on one candidate alone, and the rounds' ratios tell a gain from the noise (`clearly_faster`). One
timed iteration per candidate and round at least: six IMPALA candidates at minibatch 256 take 20-30 s on a 2-core
CPU, once per machine and settings."""
CACHE_RULE = 6
"""Part of the cache key: choices made by an earlier rule (one median per candidate, a 3% precision margin; the
rounds alone on a quiet machine; bf16 forwards that cast the weights afresh each time, as rollouts no longer do) are
not reused."""

Measure = Callable[..., dict[str, Any]]


def cpu_has_native_bf16() -> bool:
    """Whether this CPU does bf16 arithmetic in hardware (`fingerprint.cpu_kind`)."""
    return "bf16" in fingerprint.cpu_kind()


def bf16_is_native(device: torch.device) -> bool:
    """Whether bf16 is worth measuring on `device`: the CPU's flags (`cpu_has_native_bf16`), CUDA's own answer; other
    devices (XPU, MPS, DirectML) keep fp32, unmeasured (autocast to bf16 is not supported on all of them)."""
    if device.type == "cpu":
        return cpu_has_native_bf16()
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return False


def tf32_is_native(device: torch.device) -> bool:
    """Whether `device` has TF32: an NVIDIA GPU of compute capability 8.0 (Ampere) or later (not a ROCm build's)."""
    nvidia = device.type == "cuda" and torch.version.cuda is not None
    return nvidia and torch.cuda.get_device_capability(device) >= (8, 0)


def check_precision(cfg: Config) -> None:
    """ConfigError where the config asks for tf32 on a learner without it (`tf32_is_native`)."""
    device = learner_device(cfg)
    if cfg.training.precision == "tf32" and not tf32_is_native(device):
        raise ConfigError(f"training.precision tf32 needs an NVIDIA GPU of compute capability 8.0 or later; this "
                          f"learner runs on {device} (use fp32, bf16 or auto)")


def is_small(cfg: Config, spaces: EnvSpaces) -> bool:
    """Whether the network is too small for precision or chunk to matter (SMALL_FORWARD_FLOPS)."""
    return network_flops(cfg, spaces)["forward_flops"] < SMALL_FORWARD_FLOPS


def candidates(cfg: Config, with_bf16: bool = True, with_tf32: bool = False) -> list[Candidate]:
    """Every combination the config leaves open (one candidate when nothing is `auto`); an `auto` precision tries
    fp32, bf16 with `with_bf16` and tf32 with `with_tf32`. An `auto` chunk on a GPU (any device but the CPU) is the
    whole minibatch: chunks keep a CPU's working set in its caches, while a GPU needs large batches to fill its
    units."""
    t = cfg.training
    tried = {"fp32": True, "bf16": with_bf16, "tf32": with_tf32}
    precisions = tuple(p for p in PRECISIONS if tried[p]) if t.precision == "auto" else (t.precision,)
    if t.microbatch_size == "auto" and learner_device(cfg).type != "cpu":
        sizes = [0]
    elif t.microbatch_size == "auto":
        sizes = [m for m in MICROBATCHES if 0 < m < t.batch_size] + [0]
    else:
        sizes = [t.microbatch_size]
    return [Candidate(p, m) for p in precisions for m in sizes]


def preferred(cfg: Config, options: list[Candidate], small: bool = False) -> Candidate:
    """The default among `options`: DEFAULT's (SMALL_DEFAULT's for a `small` network) value for each field left
    auto, the config's for the others."""
    t, base = cfg.training, SMALL_DEFAULT if small else DEFAULT
    default = Candidate(base.precision if t.precision == "auto" else t.precision,
                        base.microbatch_size if t.microbatch_size == "auto" else t.microbatch_size)
    return default if default in options else options[0]


def clearly_faster(other: list[float], base: list[float]) -> bool:
    """Whether `other` beat `base` clearly in interleaved rounds (each list: one compute limit per round): by more
    than MARGIN in every round, and with the median of the rounds' ratios other/base above 1 by more than their
    spread (half their range). With ROUNDS rounds of independent noise, simulated, a tie passes in about 0.1% of
    the measurements at most, whatever the noise's size, and a 1.5x gain in 99% when the rounds scatter by 10%."""
    ratios = np.asarray(other, dtype=float) / np.asarray(base, dtype=float)
    spread = float(ratios.max() - ratios.min()) / 2
    return bool(ratios.min() > 1 + MARGIN and float(np.median(ratios)) - 1 > spread)


def faster_at_best(other: float, base: float) -> bool:
    """Whether a candidate whose fastest iterations imply compute limit `other` beats one whose imply `base` by more
    than MARGIN: the rule on a busy machine, where another process may slow any round but never speeds one up."""
    return other > (1 + MARGIN) * base


def pick(options: list[Candidate], rounds: dict[str, list[float]], default: Candidate,
         best: dict[str, float] | None = None, busy: bool = False) -> Candidate:
    """The candidate to keep, given each one's compute limit per interleaved round (by label): the default unless
    another is `clearly_faster` than it or, with `best` (each one's compute limit from its fastest iterations),
    `faster_at_best`: alone where other work kept the machine `busy`, else with a median gain of the rounds over
    twice MARGIN too (a quiet measurement that one disturbed round kept from a 1.5x gain); of several that win, the
    fastest against the default (the median of the rounds' ratios; busy, the ratio of the fastest iterations).
    Every candidate meets the default itself, so bf16 on whole minibatches 1.5x faster is not lost where bf16 at the
    default chunk wins by less than the rule asks."""
    def median_gain(c: Candidate) -> float:
        return float(np.median(np.divide(rounds[c.label], rounds[default.label])))

    def wins(c: Candidate) -> bool:
        if clearly_faster(rounds[c.label], rounds[default.label]):
            return True
        at_best = best is not None and faster_at_best(best[c.label], best[default.label])
        return at_best and (busy or median_gain(c) > 1 + 2 * MARGIN)

    def gain(c: Candidate) -> float:
        return best[c.label] / best[default.label] if best is not None and busy else median_gain(c)

    default = default if default in options else options[0]
    winners = [c for c in options if c != default and wins(c)]
    return max(winners, key=gain) if winners else default


def network_fields(cfg: Config, spaces: EnvSpaces) -> dict[str, Any]:
    """What a learner measurement depends on besides the machine: the network, the observation and action spaces,
    the batch sizes and epochs."""
    observation: dict[str, Any] = {"obs_shape": list(spaces.obs_shape)}
    if spaces.layout is not None:
        observation["layout"] = spaces.layout.to_dict()
    fields = {"model": dataclasses.asdict(cfg.model), **observation, "actions": spaces.actions.to_dict(),
              "batch_size": cfg.training.batch_size, "rollout_batch": cfg.env.num_envs,
              "n_epochs": cfg.training.n_epochs}
    return {**fields, **extra_passes(cfg)}  # only where set: earlier keys stay valid


def cache_key(cfg: Config, spaces: EnvSpaces, options: list[Candidate]) -> str:
    """What the choice depends on: the machine (`machine_digest`), the network and batch sizes."""
    return machine_digest(cfg, **network_fields(cfg, spaces), candidates=[c.label for c in options], rule=CACHE_RULE)


@dataclass
class LearnerChoice:
    """The learner's resolved settings and how they were decided."""

    precision: str
    microbatch_size: int
    device: str
    source: str
    """`config` (nothing was auto), `no-native-bf16` (only the precision was auto, and fp32 is the one the device
    computes natively), `default` (a network too small for the choice to matter: SMALL_DEFAULT, unmeasured),
    `measured` (now), `cached` (an earlier measurement) or `unmeasured` (auto with run.limit_seconds 0 and nothing
    cached: the default)."""
    rates: dict[str, float] = dataclasses.field(default_factory=dict)
    """Compute limit (env steps/s) measured for each candidate, by label (precision/microbatch)."""
    device_source: str = "config"
    cache: str | None = None
    native_bf16: bool | None = None
    """With precision `auto`: whether the device computes bf16 natively (bf16 was a candidate); None otherwise."""
    limit: dict[str, Any] | None = None
    """The chosen candidate's full compute-limit measurement, when measured now."""
    busy_cores: float | None = None
    """Cores other processes kept busy while it measured (None: nothing measured now). Above BUSY_CORES the choice
    is not cached, and the fastest iterations count too (`pick`), except beside a distributed run's own ranks, which
    measure at once: there the rounds alone decide, and the choice is cached."""
    stored: bool = False
    """Whether the measured choice was written to the cache (`cache`)."""
    measured_threads: int | None = None
    """1 where other load made the candidates be ranked on one thread (`on_one_thread`; `rates` are then those); None
    where they were measured on the learner's ceiling of threads (the thread plan's; `auto` threads come after)."""

    def resolve(self, cfg: Config) -> Config:
        """`cfg` with these settings in place of `auto` (a new config: workers, config.yaml and checkpoints carry
        them)."""
        return dataclasses.replace(cfg, training=dataclasses.replace(
            cfg.training, precision=self.precision, microbatch_size=self.microbatch_size, device=self.device))

    def to_dict(self) -> dict[str, Any]:
        """summary.json's `learner` entry."""
        return {"precision": self.precision, "microbatch_size": self.microbatch_size, "device": self.device,
                "source": self.source, "device_source": self.device_source, "rates": self.rates,
                "cache": self.cache, "stored": self.stored, "native_bf16": self.native_bf16,
                "busy_cores": self.busy_cores, "measured_threads": self.measured_threads}

    def describe(self) -> str:
        """One line for the start of a run."""
        chunk = self.microbatch_size or "whole minibatch"
        device = self.device + (" (auto)" if self.device_source == "auto" else "")
        text = f"{self.precision}, microbatch {chunk}, on {device}"
        ranked = ", ".join(f"{label} {sps:.0f}" for label, sps in
                           sorted(self.rates.items(), key=lambda kv: -kv[1]))
        no_bf16 = f"no native bf16 on this {self.device.split(':')[0]}"
        if self.native_bf16 is False and self.source in ("measured", "cached", "unmeasured"):
            text += f" (bf16 not tried: {no_bf16})"
        rule = f"the default unless beaten by over {MARGIN:.0%} in each of {ROUNDS} rounds"
        busy = (self.busy_cores or 0.0) > BUSY_CORES
        if busy and not self.stored:
            rule += " or at its fastest iterations, which other processes' load slows least"
        elif not busy:
            rule += f", or by over {2 * MARGIN:.0%} in their median and {MARGIN:.0%} at its fastest iterations"
        where = (f"cached in {self.cache}" if self.stored else
                 "not cached: the next run measures again" if busy else f"not cached: {self.cache} is not writable")
        how = f" while other processes kept {self.busy_cores:.2f} cores busy" if busy else ""
        if self.measured_threads == 1:
            how += (", ranked on one thread (such load stalls a step on several threads unevenly; the run trains on "
                    "its own)")
        measured = f"measured now{how}, compute limit SPS {ranked} ({rule}); {where}"
        said = {"measured": measured,
                "cached": f"from the measurement cached in {self.cache} ({ranked}, {rule}; delete it to measure "
                          "again)",
                "unmeasured": "auto without a measurement (run.limit_seconds is 0)",
                "default": f"the default for a network under {SMALL_FORWARD_FLOPS / 1e6:g} MFLOP per sample "
                           "(too small for the choice to matter; not measured)",
                "no-native-bf16": f"fp32, as {no_bf16}"}
        return f"{text}: {said.get(self.source, 'as configured')}"


def choose(cfg: Config, spaces: EnvSpaces, seconds: float, *, measure: Measure = measure_compute_limit,
           path: Path | None = None, beside_ranks: bool = False) -> LearnerChoice:
    """Resolve `auto` precision, microbatch and device for this config on this machine (cfg is not changed).

    With something to choose: bf16 only on a device that computes it natively (`bf16_is_native`); the defaults
    for a network too small for the choice to matter (`is_small`); else the cached choice when there is one, else
    a measurement of every candidate in `seconds` (the run's limit budget), whose winner (`pick`) is cached; with
    `seconds` 0 and nothing cached, the default (`preferred`).
    A choice measured while other processes kept the machine busy is not cached, unless those may be the run's own
    ranks measuring at the same time (`beside_ranks`, a distributed run).
    `measure` is `compute_limit.measure_compute_limit` or a stand-in with its signature.
    """
    check_precision(cfg)
    device = learner_device(cfg)
    known = {"device": str(device), "device_source": "auto" if cfg.training.device == "auto" else "config",
             "native_bf16": bf16_is_native(device) if cfg.training.precision == "auto" else None}
    options = candidates(cfg, known["native_bf16"] is not False,
                         cfg.training.precision == "auto" and tf32_is_native(device))
    if len(options) == 1 and known["native_bf16"] is None:
        return LearnerChoice(options[0].precision, options[0].microbatch_size, source="config", **known)
    if is_small(cfg, spaces):  # the same choice on every CPU, native bf16 or not
        default = preferred(cfg, options, small=True)
        return LearnerChoice(default.precision, default.microbatch_size, source="default", **known)
    if len(options) == 1:
        return LearnerChoice(options[0].precision, options[0].microbatch_size, source="no-native-bf16", **known)
    path = path or cache_path()
    key = cache_key(cfg, spaces, options)
    entry = read_cache(path).get(key)
    if (isinstance(entry, dict) and type(entry.get("microbatch_size")) is int and (rates := cached_rates(entry))
            is not None and Candidate(entry.get("precision"), entry["microbatch_size"]) in options):
        return LearnerChoice(entry["precision"], entry["microbatch_size"], source="cached", rates=rates,
                             cache=str(path), **known)
    if seconds <= 0:
        default = preferred(cfg, options)
        return LearnerChoice(default.precision, default.microbatch_size, source="unmeasured", **known)
    limit = measure_candidates(cfg, spaces, seconds, measure, options, small=False, beside_ranks=beside_ranks)
    ranking = limit.get("ranking")
    rates = ranking["rates"] if ranking else {label: r["limit_sps"] for label, r in limit["candidates"].items()}
    choice = LearnerChoice(limit["precision"], limit["microbatch_size"], source="measured", rates=rates,
                           cache=str(path), limit=limit, busy_cores=float(limit.get("other_load_cores") or 0.0),
                           measured_threads=1 if ranking else None, **known)
    if not busy(limit) or beside_ranks:  # one made beside other work would stick for later runs
        choice.stored = store(path, key, {"precision": choice.precision, "microbatch_size": choice.microbatch_size,
                                          "rates": rates, "cpu": fingerprint.cpu_model(), "torch": torch.__version__,
                                          "threads": torch.get_num_threads()})
    return choice


def measure_candidates(cfg: Config, spaces: EnvSpaces, seconds: float, measure: Measure = measure_compute_limit,
                       options: list[Candidate] | None = None, small: bool | None = None,
                       beside_ranks: bool = False) -> dict[str, Any]:
    """The compute limit of every setting the config leaves open (`options`, default: `candidates` with bf16 where
    it is native), told from the one a trainer keeps (its precision, microbatch and rates at the top level, every
    candidate's rates under `candidates`): `pick_measured`'s, or the default for a network too small to choose for
    (`small`, default: `is_small`). `beside_ranks`: the load is a distributed run's own ranks measuring at once."""
    check_precision(cfg)
    if options is None:
        device = learner_device(cfg)
        options = candidates(cfg, cfg.training.precision != "auto" or bf16_is_native(device), tf32_is_native(device))
    if len(options) == 1:
        return measure(cfg, spaces, seconds, candidates=options)

    def measured(budget: float = seconds) -> dict[str, Any]:
        return measure(cfg, spaces, budget, candidates=options, rounds=ROUNDS, warmup_iters=1, min_iters=1)

    limit = ranked = measured()
    if is_small(cfg, spaces) if small is None else small:
        return for_candidate(limit, preferred(cfg, options, small=True))
    if busy(limit) and not beside_ranks and torch.get_num_threads() > 1 and learner_device(cfg).type == "cpu":
        ranked = on_one_thread(lambda: measured(BUSY_BUDGET * seconds))
    result = for_candidate(limit, pick_measured(ranked, options, preferred(cfg, options), beside_ranks))
    if ranked is not limit:  # the run's own threads' figures stay its compute limit; one thread only ranked them
        result["ranking"] = {"threads": 1, "other_load_cores": ranked["other_load_cores"],
                             "rates": {label: r["limit_sps"] for label, r in ranked["candidates"].items()}}
    return result


def pick_measured(limit: dict[str, Any], options: list[Candidate], default: Candidate,
                  beside_ranks: bool = False) -> Candidate:
    """`pick` on a `measure_compute_limit` result of `options`: by its rounds, and by each candidate's fastest
    iterations too where other processes kept the machine busy while it measured (not a distributed run's own
    ranks, `beside_ranks`: that choice is cached, so the stricter rule alone decides it)."""
    rounds = {label: r["round_sps"] for label, r in limit["candidates"].items()}
    best = None if beside_ranks else {label: r.get("best_sps", r["limit_sps"]) for label, r in
                                      limit["candidates"].items()}
    return pick(options, rounds, default, best, busy(limit) and not beside_ranks)


def matmul_peaks(cfg: Config, seconds: float = 1.0, path: Path | None = None,
                 beside_ranks: bool = False) -> dict[str, float]:
    """This machine's fp32 and bf16 matmul peaks (GFLOP/s) on the learner's device and threads, and tf32's on a CUDA
    GPU that has it (`tf32_is_native`), cached like the choice (a second each, once per machine; on the CPU not where
    other processes kept it busy meanwhile, but for a distributed run's own ranks, `beside_ranks`)."""
    device = learner_device(cfg)
    names = [p for p in PRECISIONS if p != "tf32" or tf32_is_native(device)]
    path = path or cache_path()
    key = "matmul_peak/" + machine_digest(cfg)
    entry = read_cache(path).get(key)
    if isinstance(entry, dict) and all(number(entry.get(p)) and entry[p] > 0 for p in names):
        return {p: float(entry[p]) for p in names}
    peaks = {}
    with OtherLoad() as other:
        for p in names:
            with autocast("tf32" if p == "tf32" else "fp32", device.type):
                peaks[p] = matmul_peak(torch.bfloat16 if p == "bf16" else torch.float32, seconds, device)
    if other.cores <= BUSY_CORES or beside_ranks or device.type != "cpu":  # not one a CPU measured beside other work
        store(path, key, peaks)
    return peaks


def resolve(cfg: Config, seconds: float) -> tuple[Config, LearnerChoice]:
    """Choose (`choose`) for the config's own env: the config with the choice in place of `auto`, and the choice."""
    from parallel_ppo.envs.batch import env_spaces

    choice = choose(cfg, env_spaces(cfg.env), seconds)
    return choice.resolve(cfg), choice
