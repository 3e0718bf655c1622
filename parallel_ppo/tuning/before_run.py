"""What a run measures before it trains: the learner's `auto` settings and threads, the network's compute limit and
FLOPs, and this machine's matmul peaks, for one process or every rank of a distributed run."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from parallel_ppo.core.config import Config
from parallel_ppo.core.group import ALONE, Group
from parallel_ppo.core.model import learner_device
from parallel_ppo.core.threads import ThreadPlan
from parallel_ppo.envs.spaces import EnvSpaces
from parallel_ppo.tuning.compute_limit import measure_compute_limit, network_flops, threads_kept
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
    idle_threads: ThreadChoice | None = None
    """An overlapped learner's threads while its workers wait for the update (`parallel.idle_learner_threads`),
    where they are more than its own."""

    def resolve(self, planned: ThreadPlan) -> ThreadPlan:
        """The thread plan with the learner's chosen counts in place of its ceilings."""
        idle = self.idle_threads.threads if self.idle_threads is not None else 0
        return dataclasses.replace(planned, learner=self.threads.threads, idle_learner=idle)

    def record(self) -> dict[str, Any]:
        """summary.json's `learner` entry: how the settings were decided, under `threads` the thread count, and
        under `idle_threads` those of an overlapped learner whose workers wait."""
        idle = {"idle_threads": self.idle_threads.to_dict()} if self.idle_threads is not None else {}
        return {**self.learner.to_dict(), "threads": self.threads.to_dict(), **idle}

    def start_lines(self) -> list[str]:
        """The run's start lines about the learner: its settings, its threads where the config left them open, and
        those it takes while its workers wait."""
        lines = [f"learner {self.learner.describe()}"]
        lines += [self.threads.describe()] if self.threads.source != "config" else []
        if self.idle_threads is not None:
            lines.append(self.idle_threads.describe(" while its workers wait for the update"))
        return lines


def tune(cfg: Config, spaces: EnvSpaces, ceiling: int, group: Group = ALONE, idle_ceiling: int = 0,
         say: Callable[[str], None] | None = None) -> Tuning:
    """Before any env or worker exists: choose the learner's `auto` settings (precision, microbatch, device) on the
    `ceiling` threads the thread plan gives the learner, then its `auto` threads within them (a distributed run's
    ranks take rank 0's count, at most their own ceiling), and an overlapped learner's threads while its workers
    wait (`idle_threads`, within `idle_ceiling`), and set this process's torch threads to the first; then
    measure the compute limit with them (the candidates' measurement already holds it when it ran now on the same
    threads) and the machine's arithmetic roofline; each measurement is skipped when `run.limit_seconds` is 0. `cfg`
    is not changed.

    The ranks of a distributed run measure at once, each on its own minibatch (its share of it when the envs are
    split) and its threads, and all take rank 0's choice; the compute limit and the matmul peaks are rank 0's times
    the ranks. `say` is told first, where anything is measured, that the run measures (`measuring_line`)."""
    seconds = cfg.run.limit_seconds
    if say is not None and seconds > 0:
        say(measuring_line(seconds))
    local = dataclasses.replace(cfg, training=group.local_training(cfg))
    torch.set_num_threads(ceiling)
    choice = group.broadcast(choose(local, spaces, seconds, beside_ranks=group.distributed))
    chosen = choice.resolve(local)
    threads = rank_zeros(choose_threads(chosen, spaces, seconds, ceiling, beside_ranks=group.distributed), ceiling,
                         group)
    idle = idle_threads(chosen, spaces, seconds, threads.threads, idle_ceiling, group)
    torch.set_num_threads(threads.threads)
    if seconds <= 0:
        return Tuning(choice, threads, idle_threads=idle)
    limit = (choice.limit if threads.threads == ceiling else None) or measure_compute_limit(chosen, spaces, seconds)
    peaks = matmul_peaks(chosen, beside_ranks=group.distributed)
    roofline = {**network_flops(chosen, spaces), "peak_gflops": peaks}
    if group.distributed:  # each rank measured with its own threads, while the others measured too
        limit = {**limit, "rank_limit_sps": limit["limit_sps"], "limit_sps": limit["limit_sps"] * group.world_size}
        roofline |= {"rank_peak_gflops": peaks,
                     "peak_gflops": {k: v * group.world_size for k, v in peaks.items()}}
    return Tuning(choice, threads, limit, roofline, idle)


def measuring_line(seconds: float) -> str:
    """The line said before a run measures the machine, which can take minutes before anything else is said."""
    return (f"measuring the learner on this machine before the run ({seconds:g} s a measurement, minutes for a large "
            "network or on a busy machine; choices cached for later runs; --set run.limit_seconds=0 skips it)")


def idle_threads(chosen: Config, spaces: EnvSpaces, seconds: float, own: int, ceiling: int,
                 group: Group = ALONE) -> ThreadChoice | None:
    """An overlapped learner's threads once its workers wait for the update (`parallel.idle_learner_threads`,
    `chosen` the config with the learner's settings resolved): a configured count (`ceiling`), or `auto`'s choice
    within `ceiling` (`choose_threads` on the threads a synchronous learner chooses on, so the two share a cached
    choice where the learner settings resolve alike; a distributed run's ranks take rank 0's, at most their own
    ceiling); None where that is no more than its `own`, or the update runs on another device than the CPU."""
    if ceiling <= 0:  # no lending (the config's: alike on every rank)
        return None
    wanted = ceiling > own and learner_device(chosen).type == "cpu"
    if chosen.parallel.idle_learner_threads != "auto":
        return ThreadChoice(ceiling, ceiling, "config") if wanted else None
    auto = dataclasses.replace(chosen, parallel=dataclasses.replace(chosen.parallel, learner_threads="auto"))
    with threads_kept():
        torch.set_num_threads(ceiling)
        choice = choose_threads(auto, spaces, seconds, ceiling, beside_ranks=group.distributed) if wanted else None
        choice = rank_zeros(choice, ceiling, group)  # every rank, so that each makes the same collective calls
    return choice if wanted and choice is not None and choice.threads > own else None


def rank_zeros(choice: ThreadChoice | None, ceiling: int, group: Group) -> ThreadChoice | None:
    """Rank 0's thread choice (this process's alone), at most this rank's `ceiling`."""
    choice = group.broadcast(choice)
    return None if choice is None else dataclasses.replace(choice, threads=min(choice.threads, ceiling),
                                                            ceiling=ceiling)
