"""The thread policy, decided in one place: how many torch, Procgen and drawing threads each process of a run uses."""

from __future__ import annotations

import os
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
    """The env's own threads in each process that owns envs: Procgen's stepping threads and the drawing threads of
    Mesa's software OpenGL (`draw_with_env_threads`)."""
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


OWN_DRAW_THREADS = "PARALLEL_PPO_LP_NUM_THREADS"
"""The LP_NUM_THREADS this package set, inherited with it by the processes it starts: a value of the user's is kept,
one of ours is replaced by the plan of the process at hand (a worker started after a sequential run in one Python)."""


def draw_with_env_threads(env_threads: int) -> None:
    """Mesa's software OpenGL (llvmpipe), which draws MuJoCo's and Genesis's frames where there is no GPU, starts a
    drawing thread per core in every process that draws: 16 workers on 16 cores start 256. This process draws with
    its plan's env threads instead (one in a worker), unless the user set LP_NUM_THREADS. Mesa reads it once per
    process, so this precedes the process's first frame. Measured (Lift's wrist camera): 16 workers on 16 cores made
    1.14 times the steps/s with one thread each; 2 workers on 2 cores the same."""
    current = os.environ.get("LP_NUM_THREADS")
    if current is None or current == os.environ.get(OWN_DRAW_THREADS):
        os.environ["LP_NUM_THREADS"] = os.environ[OWN_DRAW_THREADS] = str(env_threads)
