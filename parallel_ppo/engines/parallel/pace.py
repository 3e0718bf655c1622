"""Which worker each rollout waited for: the slowest of every rollout, and whether it is the same one each time.

The coordinator waits for the slowest worker of a rollout (the `sync` phase), or cuts it short
(`parallel.sync_fraction`). A different one each time (chance: a slow episode, a scheduler's hiccup) is counted a
rollout to each worker about evenly; one worker slowest rollout after rollout (a core shared with another job, a
slower env) takes most of the count. summary.json's `worker_pace` tells the two apart (on a 16-core Xeon, 8
overlapped Lift workers left their learner waiting 1.09 s a rollout, its `sync` phase:
docs/results/intel-xeon-avx512-bf16-16c-h200/overlap_16c.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from parallel_ppo.core.collect import CollectResult


class WorkerPace:
    """Per worker, over the rollouts of this session that were not abandoned: the rollouts in which it was the
    slowest (the most seconds stepping, drawing and inferring per step taken: a worker cut short took fewer steps) and
    its busy seconds in all; and the seconds the slowest would have taken over the mean worker to collect a whole
    rollout at its pace (in a whole rollout, its busy seconds over the mean worker's)."""

    def __init__(self, workers: int, n_steps: int) -> None:
        self.slowest = [0] * workers
        self.busy = [0.0] * workers
        self.n_steps = n_steps
        self.rollouts = 0
        self.excess = 0.0

    def observe(self, results: Sequence[CollectResult], steps: Sequence[int]) -> None:
        """A rollout's results and steps taken, one per worker in order; not counted where one is missing or there is
        only one worker (no one waits for another). A worker restarted during it counts its re-collection alone."""
        if len(results) != len(self.slowest) or len(steps) != len(results) or len(results) < 2:
            return
        busy = [r.time_env + r.time_inference + r.time_render for r in results]
        pace = [b / max(s, 1) for b, s in zip(busy, steps, strict=True)]  # seconds a step
        slowest = max(range(len(pace)), key=pace.__getitem__)
        self.slowest[slowest] += 1
        self.busy = [total + b for total, b in zip(self.busy, busy, strict=True)]
        self.rollouts += 1
        self.excess += self.n_steps * (pace[slowest] - sum(pace) / len(pace))

    def record(self) -> dict[str, Any] | None:
        """summary.json's `worker_pace` (None before a rollout is counted): `rollouts` counted; per worker, `slowest`
        (rollouts in which it was) and `busy_seconds` (its mean a rollout); `slowest_share`, the largest count over
        the rollouts (1 / workers when each is slowest in turn, 1 when one always is); `slowest_excess_seconds`, the
        seconds the slowest would have taken over the mean worker for a whole rollout at its pace, a rollout's mean."""
        n = self.rollouts
        if not n:
            return None
        return {"rollouts": n, "slowest": list(self.slowest), "busy_seconds": [round(b / n, 4) for b in self.busy],
                "slowest_share": round(max(self.slowest) / n, 4), "slowest_excess_seconds": round(self.excess / n, 4)}
