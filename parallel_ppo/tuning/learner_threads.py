"""The learner's torch threads chosen by measurement (`parallel.learner_threads: auto`): the fewest that train about
as fast as the most the run may give it (its `ceiling`: every core, the cores overlapped workers leave, a rank's
share).

More threads help a network only where its minibatch steps have arithmetic to share: on the 16-core Xeon, Lift's
64-unit MLP took 0.24 ms a sample at 1 and at 16 threads, while threads that buy nothing still spin at every
barrier and hold cores the workers could use. So one thread stays unless more are clearly faster (`pick_threads`,
the learner settings' rule: in every interleaved round), and a network too small to measure keeps one, unmeasured
(`learner_settings.is_small`). The choice is cached like the learner settings', per machine and settings, and a
cached choice of several threads gives way to other processes busy at the start (`within_load`): intra-op threads
that share a core with one stall (a camera config's update on 2 cores took over ten times as long on the cached 2
threads beside two other training runs as on one).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from parallel_ppo.core.config import Config
from parallel_ppo.core.model import learner_device
from parallel_ppo.envs.spaces import EnvSpaces
from parallel_ppo.runs import fingerprint
from parallel_ppo.tuning.cache import cache_path, cached_rates, machine_digest, read_cache, store
from parallel_ppo.tuning.compute_limit import (
    NetworkSteps,
    fixed_candidate,
    rate_figures,
    threads_kept,
    timed_loop,
)
from parallel_ppo.tuning.learner_settings import (
    MARGIN,
    ROUNDS,
    SMALL_FORWARD_FLOPS,
    clearly_faster,
    is_small,
    network_fields,
)
from parallel_ppo.tuning.other_load import BUSY_CORES, OtherLoad

THREADS_RULE = 2
"""Part of the cache key: a choice made by an earlier rule (1: bf16 forwards that cast the weights afresh each time, as
rollouts no longer do) is measured again."""

LOAD_PROBE_SECONDS = 1.0
"""How long a cached choice of several threads samples the other processes' load before the run takes it."""

MeasureThreads = Callable[[Config, EnvSpaces, float, list[int]], dict[str, Any]]


def load_now(seconds: float = LOAD_PROBE_SECONDS) -> float:
    """Cores other processes keep busy over the next `seconds`."""
    with OtherLoad() as load:
        time.sleep(seconds)
    return load.cores


def within_load(threads: int, ceiling: int, busy: float) -> int:
    """A thread count clear of `busy` cores of other work: `threads`, less the cores beyond the ceiling's free ones
    (at least one); a load under BUSY_CORES takes none."""
    if busy <= BUSY_CORES:
        return threads
    return max(1, min(threads, ceiling - math.ceil(busy - BUSY_CORES)))


def thread_counts(ceiling: int) -> list[int]:
    """The counts measured: 1, 2, 4, ... below `ceiling`, and the ceiling itself."""
    counts, t = [], 1
    while t < ceiling:
        counts.append(t)
        t *= 2
    return [*counts, max(1, ceiling)]


def pick_threads(rounds: dict[int, list[float]]) -> int:
    """One thread unless more train clearly faster (`clearly_faster`: by over MARGIN in every round); of the counts
    that do, the fewest whose median gain over one thread comes within MARGIN of the best count's (the 16 threads
    that beat 8 by 3% are not worth the 8 cores they take)."""
    gains = {t: float(np.median(np.divide(r, rounds[1]))) for t, r in rounds.items()
             if t > 1 and clearly_faster(r, rounds[1])}
    if not gains:
        return 1
    top = max(gains.values())
    return min(t for t, g in gains.items() if g * (1 + MARGIN) >= top)


def measure_threads(cfg: Config, spaces: EnvSpaces, seconds: float, counts: list[int]) -> dict[str, Any]:
    """The compute limit (`compute_limit.measure_compute_limit`'s, for the config's resolved learner settings) at
    each thread count, in ROUNDS interleaved rounds (reversed every other round) sharing `seconds`, a fifth for the
    forward passes; one untimed iteration after each change of threads. Returns each count's figures (by count, as
    text) and the other processes' load meanwhile."""
    candidate, steps = fixed_candidate(cfg), NetworkSteps(cfg, spaces, cfg.env.num_envs)
    share = seconds / (len(counts) * ROUNDS)
    forward: dict[int, list[list[float]]] = {t: [] for t in counts}
    train: dict[int, list[list[float]]] = {t: [] for t in counts}
    with threads_kept(), OtherLoad() as load:
        for r in range(ROUNDS):
            for t in counts[::-1 if r % 2 else 1]:
                torch.set_num_threads(t)
                forward[t].append(steps.timed_forward(candidate.precision, share / 5, 1, 1))
                train[t].append(timed_loop(steps.train(candidate), share * 4 / 5, 1, 1))
    figures = {str(t): rate_figures(forward[t], train[t], cfg.env.num_envs, cfg.training.batch_size,
                                cfg.training.n_epochs) for t in counts}
    return {"counts": figures, "other_load_cores": load.cores, "rounds": ROUNDS}


@dataclass
class ThreadChoice:
    """The learner's thread count and how it was decided."""

    threads: int
    ceiling: int
    """The most the run may give the learner (the thread plan's count)."""
    source: str
    """`config` (a number was set), `ceiling` (one is all the run leaves the learner), `device` (the update runs on
    a GPU or another device: the ceiling, unmeasured), `default` (a network too small to measure: one thread),
    `measured` (now), `cached` (an earlier measurement) or `unmeasured` (run.limit_seconds 0 and nothing cached: the
    ceiling)."""
    rates: dict[str, float] = field(default_factory=dict)
    """Compute limit (env steps/s) measured at each thread count, by count."""
    busy_cores: float | None = None
    """Cores other processes kept busy while it measured (above BUSY_CORES the choice is not cached), or, for a
    cached choice of several threads, at the start."""
    stored: bool = False
    cached_threads: int | None = None
    """The cached count, where the load at the start took it down to `threads`."""

    def to_dict(self) -> dict[str, Any]:
        """summary.json's `learner.threads` entry."""
        return {"threads": self.threads, "ceiling": self.ceiling, "source": self.source, "rates": self.rates,
                "busy_cores": self.busy_cores, "stored": self.stored, "cached_threads": self.cached_threads}

    def describe(self, when: str = "") -> str:
        """One line for the start of a run (`when`: the part of the run the count is for, if not all of it)."""
        rates = ", ".join(f"{t} thread{'s' * (t != '1')} {sps:.0f}" for t, sps in self.rates.items())
        said = {"measured": f"measured now, compute limit SPS {rates}",
                "cached": f"from the measurement cached ({rates})",
                "default": f"a network under {SMALL_FORWARD_FLOPS / 1e6:g} MFLOP per sample gains nothing from "
                           "more (not measured)",
                "unmeasured": "every one the run may use, unmeasured (run.limit_seconds is 0)",
                "ceiling": "the one the run leaves the learner",
                "device": "every one the run may use (the update runs on another device: not measured)"}
        rule = (f"; one unless more are faster by over {MARGIN:.0%} in each of {ROUNDS} rounds, then the fewest "
                f"within {MARGIN:.0%} of the fastest") if self.rates else ""
        kept = ""
        if self.cached_threads is not None:
            kept = (f"; {self.threads} instead of {self.cached_threads} while other processes keep "
                    f"{self.busy_cores:.1f} cores busy (threads stall beside them)")
        if self.source == "measured" and not self.stored:
            busy = (self.busy_cores or 0.0) > BUSY_CORES
            kept = ", not cached: " + ("other processes kept the machine busy" if busy else "the cache is not writable")
        why = said.get(self.source, "as configured")
        return f"learner threads {self.threads} of {self.ceiling}{when}: {why}{rule}{kept}"


def choose_threads(cfg: Config, spaces: EnvSpaces, seconds: float, ceiling: int, *,
                   measure: MeasureThreads | None = None, path: Path | None = None,
                   beside_ranks: bool = False, load: Callable[[], float] = load_now) -> ThreadChoice:
    """Resolve `parallel.learner_threads: auto` within `ceiling` for `cfg` (its learner settings resolved): one for
    a small network (`is_small`), the ceiling for a learner on another device than the CPU, else the cached choice
    (of several threads, `within_load` of the other processes' `load` now, unless `seconds` is 0 or the load is a
    distributed run's own ranks, `beside_ranks`), else a measurement of `thread_counts` in `seconds` (`measure`,
    default `measure_threads`) whose `pick_threads` is cached unless other processes kept the machine busy (not
    counting `beside_ranks`); with `seconds` 0 and nothing cached, the ceiling."""
    configured = cfg.parallel.learner_threads
    if configured != "auto":
        return ThreadChoice(configured or ceiling, ceiling, "config")
    if ceiling <= 1:
        return ThreadChoice(1, ceiling, "ceiling")
    if learner_device(cfg).type != "cpu":
        return ThreadChoice(ceiling, ceiling, "device")
    if is_small(cfg, spaces):
        return ThreadChoice(1, ceiling, "default")
    counts = thread_counts(ceiling)
    path = path or cache_path()
    key = "learner_threads/" + machine_digest(
        cfg, **network_fields(cfg, spaces), precision=cfg.training.precision,
        microbatch_size=cfg.training.microbatch_size, counts=counts, rule=THREADS_RULE)
    entry = read_cache(path).get(key)
    if (isinstance(entry, dict) and type(entry.get("threads")) is int and entry["threads"] in counts
            and (rates := cached_rates(entry)) is not None):
        cached = ThreadChoice(entry["threads"], ceiling, "cached", rates)
        if cached.threads > 1 and seconds > 0 and not beside_ranks:
            cached.busy_cores = round(load(), 2)
            threads = within_load(cached.threads, ceiling, cached.busy_cores)
            if threads < cached.threads:
                cached.cached_threads, cached.threads = cached.threads, threads
        return cached
    if seconds <= 0:
        return ThreadChoice(ceiling, ceiling, "unmeasured")
    measured = (measure or measure_threads)(cfg, spaces, seconds, counts)
    figures = measured["counts"]
    chosen = pick_threads({t: figures[str(t)]["round_sps"] for t in counts})
    rates = {str(t): figures[str(t)]["limit_sps"] for t in counts}
    busy = float(measured.get("other_load_cores") or 0.0)
    choice = ThreadChoice(chosen, ceiling, "measured", rates, busy)
    if busy <= BUSY_CORES or beside_ranks:  # threads measured beside other work stall: that ranking is the load's
        choice.stored = store(path, key, {"threads": chosen, "rates": rates, "cpu": fingerprint.cpu_model(),
                                          "torch": torch.__version__})
    return choice
