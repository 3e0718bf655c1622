"""Which worker each rollout waited for: the slowest of every rollout, and whether it is the same one each time.

The coordinator waits for the slowest worker of a rollout (the `sync` phase). A different one each time (chance: a
slow episode, a scheduler's hiccup) is counted a rollout to each worker about evenly; one worker slowest rollout after
rollout (a core shared with another job, a slower env) takes most of the count. summary.json's `worker_pace` tells
the two apart (on a 16-core Xeon, 8 and 16 overlapped Lift workers waited 1.09 and 0.58 s a rollout for their
slowest, 16 synchronous ones 1.70 s: docs/results/intel-xeon-avx512-bf16-16c-h200/overlap_16c.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from parallel_ppo.core.collect import CollectResult


class WorkerPace:
    """Per worker, over the rollouts every worker collected whole (none cut short, none abandoned): the rollouts in
    which it was the slowest (the most seconds stepping, drawing and inferring) and its seconds in all; and the
    slowest's seconds over the mean worker's."""

    def __init__(self, workers: int) -> None:
        self.slowest = [0] * workers
        self.busy = [0.0] * workers
        self.rollouts = 0
        self.excess = 0.0

    def observe(self, results: Sequence[CollectResult]) -> None:
        """A rollout's results, one per worker in order; not counted where one is missing (an abandoned rollout) or
        there is only one worker (no one waits for another)."""
        if len(results) != len(self.slowest) or len(results) < 2:
            return
        busy = [r.time_env + r.time_inference + r.time_render for r in results]
        slowest = max(range(len(busy)), key=busy.__getitem__)
        self.slowest[slowest] += 1
        self.busy = [total + b for total, b in zip(self.busy, busy, strict=True)]
        self.rollouts += 1
        self.excess += busy[slowest] - sum(busy) / len(busy)

    def record(self) -> dict[str, Any] | None:
        """summary.json's `worker_pace` (None before a rollout is counted): `rollouts` counted; per worker, `slowest`
        (rollouts in which it was) and `busy_seconds` (its mean a rollout); `slowest_share`, the largest count over
        the rollouts (1 / workers when each is slowest in turn, 1 when one always is); `slowest_excess_seconds`, the
        slowest's busy seconds over the mean worker's, a rollout's mean."""
        n = self.rollouts
        if not n:
            return None
        return {"rollouts": n, "slowest": list(self.slowest), "busy_seconds": [round(b / n, 4) for b in self.busy],
                "slowest_share": round(max(self.slowest) / n, 4), "slowest_excess_seconds": round(self.excess / n, 4)}


ONE_SLOWEST_SHARE = 0.8
"""The share of a run's rollouts one worker must be the slowest of for the run to name it: by chance, with two
workers, 16 or more of 20 rollouts happen about once in 85 runs, and far less often over more rollouts or workers."""
MIN_ROLLOUTS = 20
"""Rollouts counted before a run names a worker the slowest."""


def one_slowest_line(record: dict[str, Any] | None) -> str | None:
    """A closing line for a run whose rollouts kept waiting for the same worker (`ONE_SLOWEST_SHARE` of at least
    `MIN_ROLLOUTS`, `record` being summary.json's `worker_pace`), else None."""
    if record is None or record["rollouts"] < MIN_ROLLOUTS or record["slowest_share"] < ONE_SLOWEST_SHARE:
        return None
    worker = max(range(len(record["slowest"])), key=record["slowest"].__getitem__)
    return (f"worker {worker} was the slowest in {record['slowest_share']:.0%} of {record['rollouts']} rollouts (the "
            f"slowest was busy {record['slowest_excess_seconds']:.3g} s a rollout longer than the mean worker, and the "
            "others waited for it): a core it shares with another job, or slower envs, would do that "
            "(summary.json's worker_pace; parallel.sync_fraction below 1 cuts the slowest short instead)")
