"""The rules a parallel run's worker settings keep together (overlap, lag, cuts, pinning), and the share of workers
or ranks a cut waits for: refused in one line (ConfigError) before anything starts."""

from __future__ import annotations

import math
import os

from parallel_ppo.core.config import ParallelConfig, share_waited_for
from parallel_ppo.errors import ConfigError


def check_share(name: str, fraction: float, count: int, what: str) -> None:
    """Refuse a `sync_fraction` below 1 that waits for every one of `count` workers or ranks (one alone has none to
    cut), naming the largest that leaves one to cut."""
    if fraction < 1 and count > 1 and share_waited_for(fraction, count) == count:
        raise ConfigError(f"{name} {fraction} of {count} {what} waits for all of them: set it to at most "
                          f"{math.floor(1000 * (count - 1) / count) / 1000}, or to 1")


def check_workers(p: ParallelConfig, world_size: int) -> None:
    """Refuse worker settings that cannot hold for a parallel run of `world_size` ranks (ConfigError, one line)."""
    if world_size > 1 and p.sync_fraction < 1:  # sequential ranks ignore it, as one process does
        raise ConfigError(f"parallel.sync_fraction {p.sync_fraction} cuts the rollouts of slow workers short, not "
                          f"within {world_size} distributed ranks: set it to 1 (distributed.sync_fraction cuts those "
                          "of slow sequential ranks)")
    check_share("parallel.sync_fraction", p.sync_fraction, p.num_workers, "workers")
    if p.drop_lagged and p.lag and not p.refresh_params:
        raise ConfigError("parallel.drop_lagged learns from the steps taken with the parameters of the update only, "
                          "and without parallel.refresh_params every step is taken with older ones: set one of them")
    if p.max_lagged_share < 1 and p.lag and not p.refresh_params:
        raise ConfigError(f"parallel.max_lagged_share {p.max_lagged_share} has workers wait for an update's "
                          "parameters mid-rollout, which they take only with parallel.refresh_params: set it to true, "
                          "or this to 1")
    if p.early_start and p.lag and not p.refresh_params:
        raise ConfigError("parallel.early_start publishes each update's parameters before the rollout in flight has "
                          "ended, which a worker restarted in it would take without parallel.refresh_params: set it "
                          "to true, or early_start to false")
    if p.early_start and p.lag and p.sync_fraction < 1:
        raise ConfigError(f"parallel.early_start has a worker that ended its rollout start the next, where "
                          f"parallel.sync_fraction {p.sync_fraction} ends the slowest ones' early instead: set one of "
                          "them off (sync_fraction to 1)")
    if world_size > 1 and p.drop_lagged and p.lag:
        raise ConfigError(f"parallel.drop_lagged leaves each rank a share of its rollout that timing sets, which "
                          f"{world_size} distributed ranks do not agree on: set it to false")
    if p.pin_workers and not hasattr(os, "sched_setaffinity"):
        raise ConfigError("parallel.pin_workers pins workers to CPUs, which this platform does not let a process do "
                          "(Linux does): set it to false")
