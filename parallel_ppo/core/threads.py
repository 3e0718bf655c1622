"""The thread policy, decided in one place: how many torch and Procgen threads each process of a run uses."""

from __future__ import annotations

from dataclasses import dataclass

import psutil

from parallel_ppo.core.config import Config


@dataclass(frozen=True)
class ThreadPlan:
    """Threads per role. Parallel workers sleep during the update, so the learner may use every core; one
    torch thread per worker degrades gracefully when processes share cores, where intra-op threads collapse."""

    learner: int
    """torch threads of the process that runs the update (and, sequentially, the inference)."""
    env: int
    """Procgen stepping threads of each process that owns envs."""
    worker: int | None = None
    """torch threads of each worker process (None: sequential, no workers)."""

    def describe(self) -> dict[str, int]:
        """The plan as summary.json and the start line show it."""
        if self.worker is None:
            return {"learner": self.learner, "env": self.env}
        return {"learner": self.learner, "worker": self.worker, "env_per_worker": self.env}


def thread_plan(cfg: Config, parallel: bool, ranks_on_host: int = 1) -> ThreadPlan:
    """Configured counts, or automatic ones (0): the learner and a sequential trainer's envs get every logical
    core (shared evenly among the ranks of a distributed run on this host); a worker's envs get one thread,
    since W workers already fill the cores."""
    cores = max(1, (psutil.cpu_count(logical=True) or 1) // ranks_on_host)
    learner = cfg.parallel.learner_threads or cores
    if parallel:
        return ThreadPlan(learner=learner, env=cfg.env.env_threads or 1, worker=cfg.parallel.worker_threads)
    return ThreadPlan(learner=learner, env=cfg.env.env_threads or cores)
