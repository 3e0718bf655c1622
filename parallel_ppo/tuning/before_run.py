"""What a run measures before it trains: the learner's `auto` settings and threads, the network's compute limit and
FLOPs, and this machine's matmul peaks, for one process or every rank of a distributed run."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from parallel_ppo.core.config import Config
from parallel_ppo.core.group import ALONE, Group
from parallel_ppo.envs.spaces import EnvSpaces
from parallel_ppo.tuning.compute_limit import measure_compute_limit, network_flops
from parallel_ppo.tuning.learner_settings import LearnerChoice, choose, matmul_peaks
from parallel_ppo.tuning.learner_threads import ThreadChoice, choose_threads


@dataclass(frozen=True)
class Tuning:
    """The measurements a run makes before its first update."""

    learner: LearnerChoice
    threads: ThreadChoice
    """The learner's torch threads (set for this process when `tune` returns)."""
    compute_limit: dict[str, Any] | None = None
    """The bare network's compute limit (None when `run.limit_seconds` is 0)."""
    roofline: dict[str, Any] | None = None
    """The network's FLOPs and the matmul peaks (GFLOP/s); None when `run.limit_seconds` is 0."""

    def record(self) -> dict[str, Any]:
        """summary.json's `learner` entry: how the settings were decided, and under `threads` the thread count."""
        return {**self.learner.to_dict(), "threads": self.threads.to_dict()}

    def start_lines(self) -> list[str]:
        """The run's start lines about the learner: its settings, and its threads where the config left them open."""
        return [f"learner {self.learner.describe()}"] + ([self.threads.describe()] if self.threads.source != "config"
                                                          else [])


def tune(cfg: Config, spaces: EnvSpaces, ceiling: int, group: Group = ALONE) -> Tuning:
    """Before any env or worker exists: choose the learner's `auto` settings (precision, microbatch, device) on the
    `ceiling` threads the thread plan gives the learner, then its `auto` threads within them (a distributed run's
    ranks take rank 0's count, at most their own ceiling), and set this process's torch threads to them; then
    measure the compute limit with them (the candidates' measurement already holds it when it ran now on the same
    threads) and the machine's arithmetic roofline; each measurement is skipped when `run.limit_seconds` is 0. `cfg`
    is not changed.

    The ranks of a distributed run measure at once, each on its own minibatch (its share of it when the envs are
    split) and its threads, and all take rank 0's choice; the compute limit and the matmul peaks are rank 0's times
    the ranks."""
    seconds = cfg.run.limit_seconds
    local = dataclasses.replace(cfg, training=group.local_training(cfg))
    torch.set_num_threads(ceiling)
    choice = group.broadcast(choose(local, spaces, seconds, beside_ranks=group.distributed))
    chosen = choice.resolve(local)
    threads = group.broadcast(choose_threads(chosen, spaces, seconds, ceiling, beside_ranks=group.distributed))
    threads = dataclasses.replace(threads, threads=min(threads.threads, ceiling), ceiling=ceiling)
    torch.set_num_threads(threads.threads)
    if seconds <= 0:
        return Tuning(choice, threads)
    limit = (choice.limit if threads.threads == ceiling else None) or measure_compute_limit(chosen, spaces, seconds)
    peaks = matmul_peaks(chosen)
    roofline = {**network_flops(chosen, spaces), "peak_gflops": peaks}
    if group.distributed:  # each rank measured with its own threads, while the others measured too
        limit = {**limit, "rank_limit_sps": limit["limit_sps"], "limit_sps": limit["limit_sps"] * group.world_size}
        roofline |= {"rank_peak_gflops": peaks,
                     "peak_gflops": {k: v * group.world_size for k, v in peaks.items()}}
    return Tuning(choice, threads, limit, roofline)
