"""The thread policy, decided in one place: how many torch, Procgen and drawing threads each process of a run uses."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

from parallel_ppo.core.config import Config


@dataclass(frozen=True)
class ThreadPlan:
    """Threads per role. Synchronous workers sleep during the update, so the learner may use every core; overlapped
    ones (`parallel.overlap`) step through it, so it gets the cores they leave. One torch thread per worker degrades
    gracefully when processes share cores, where intra-op threads collapse."""

    learner: int
    """torch threads of the process that runs the update (and, sequentially, the inference)."""
    env: int
    """Procgen's stepping threads in each process that owns envs."""
    draw: int
    """Drawing threads of Mesa's software OpenGL in each process that owns envs (`draw_with`)."""
    worker: int | None = None
    """torch threads of each worker process (None: sequential, no workers)."""
    idle_learner: int = 0
    """torch threads of an overlapped learner once its workers have collected the rollout in flight
    (`parallel.idle_learner_threads`; `auto` chooses within this count); 0 where it keeps `learner` (`auto` with
    `refresh_params` off)."""

    def describe(self) -> dict[str, int]:
        """The plan as summary.json and the start line show it."""
        if self.worker is None:
            return {"learner": self.learner, "env": self.env}
        idle = {"learner_while_workers_wait": self.idle_learner} if self.idle_learner > self.learner else {}
        return {"learner": self.learner, **idle, "worker": self.worker, "env_per_worker": self.env,
                "draw_per_worker": self.draw}


def usable_cpus() -> int:
    """The logical CPUs this process may run on: its affinity mask (a Slurm job's, a `taskset`'s or a container's
    cpuset share, not the host's), or every CPU of the machine where the platform has no mask (macOS, Windows).
    Every decision made by counting cores (threads, default worker and process counts) counts these."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def thread_plan(cfg: Config, parallel: bool, ranks_on_host: int = 1) -> ThreadPlan:
    """Configured counts, or automatic ones (0; the learner's `auto` too, the ceiling its measurement chooses
    within: `tuning.learner_threads`): the learner and a sequential trainer's envs get every usable
    logical CPU (`usable_cpus`; shared evenly among the ranks of a distributed run on this host), an overlapped
    learner those its workers leave (`overlapped_learner_threads`), and every core again once they wait for the
    update (`idle_learner`; `auto` none with `refresh_params` off); a worker's envs step on one thread, since W
    workers already fill the cores, and draw on its share of the cores (at least one)."""
    cores = max(1, usable_cpus() // ranks_on_host)
    fixed = 0 if cfg.parallel.learner_threads == "auto" else cfg.parallel.learner_threads
    learner, env, idle = fixed or cores, cfg.env.env_threads, 0
    if parallel and cfg.parallel.lag:
        learner = fixed or overlapped_learner_threads(cores, cfg.parallel.num_workers)
        idle = cfg.parallel.idle_learner_threads
        idle = 0 if idle == "auto" and not cfg.parallel.refresh_params else cores if idle in ("auto", 0) else int(idle)
    if parallel:
        share = env or max(1, cores // cfg.parallel.num_workers)
        return ThreadPlan(learner=learner, env=env or 1, draw=share, worker=cfg.parallel.worker_threads,
                          idle_learner=idle)
    return ThreadPlan(learner=learner, env=env or cores, draw=env or cores)


def worker_cpus(slot: int, share: int) -> tuple[int, ...]:
    """The CPUs a pinned worker runs on (`parallel.pin_workers`): the `slot`-th block of `share` (its share of the
    cores, as it draws on) of those this process may use, round the list again where the blocks outnumber them."""
    cpus = sorted(os.sched_getaffinity(0))
    return tuple(cpus[(slot * share + i) % len(cpus)] for i in range(share))


def overlapped_learner_threads(cores: int, workers: int) -> int:
    """An overlapped learner's threads: the cores its workers leave, at least one. Intra-op threads that share a
    core with a busy process stall at every barrier (training throughput fell ~5× in one measurement), and a small
    network gains nothing from more (Lift's 64-unit MLP took 0.24 ms a sample at 1 and at 16 threads on the 16-core
    Xeon); a CNN may, so set `parallel.learner_threads` where its workers leave too few."""
    return max(1, cores - workers)


OWN_DRAW_THREADS = "PARALLEL_PPO_LP_NUM_THREADS"
"""The LP_NUM_THREADS this package set, inherited with it by the processes it starts: a value of the user's is kept,
one of ours is replaced by the plan of the process at hand (a worker started after a sequential run in one Python)."""


def draw_with(threads: int) -> None:
    """Mesa's software OpenGL (llvmpipe), which draws MuJoCo's and Genesis's frames where there is no GPU, starts a
    drawing thread per core in every process that draws: 16 workers on 16 cores start 256. This process draws with
    `threads` instead (its plan's `draw`), unless the user set LP_NUM_THREADS. Mesa reads it once per process, so
    this precedes the process's first frame. Measured on Lift's wrist camera (one run a point): 16 workers on 16
    cores made 1.14 times the steps/s with one thread each; 2 workers on 2 cores the same within run-to-run noise."""
    if user_draw_threads() is None:
        os.environ["LP_NUM_THREADS"] = os.environ[OWN_DRAW_THREADS] = str(threads)


@contextlib.contextmanager
def environ_kept(keys: tuple[str, ...]) -> Iterator[None]:
    """These environment variables as they were before the block, put back after it."""
    kept = {k: os.environ.get(k) for k in keys}
    try:
        yield
    finally:
        for k, v in kept.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def draw_threads_kept() -> contextlib.AbstractContextManager[None]:
    """LP_NUM_THREADS (and the marker of ours) as they were before the block, put back after it."""
    return environ_kept(("LP_NUM_THREADS", OWN_DRAW_THREADS))


def user_draw_threads() -> str | None:
    """LP_NUM_THREADS where the user set it (not this package)."""
    current = os.environ.get("LP_NUM_THREADS")
    return None if current is None or current == os.environ.get(OWN_DRAW_THREADS) else current
