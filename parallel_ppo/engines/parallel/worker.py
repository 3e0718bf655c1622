"""A worker process: owns a batch of envs and a policy copy; collects one rollout per request."""

from __future__ import annotations

import functools
import os
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection

import setproctitle
import torch
from torch import nn

from parallel_ppo.core.allocator import retain_freed_memory
from parallel_ppo.core.buffer import RolloutBuffer
from parallel_ppo.core.collect import CollectResult, EnvRunner
from parallel_ppo.core.config import Config
from parallel_ppo.core.lifetime import exit_when_orphaned, parent_process_watch, signal_on_parent_death
from parallel_ppo.core.pause import pause_point
from parallel_ppo.core.threads import draw_with
from parallel_ppo.engines.parallel.published import PolicyCopy, PublishedPolicy, await_newer
from parallel_ppo.envs.spaces import EnvSpaces
from parallel_ppo.errors import one_line


@dataclass
class WorkerSpec:
    """Everything a worker needs, sent once at start (the tensors travel as shared-memory handles)."""

    index: int
    first_env: int
    num_envs: int
    stream: tuple[int, int]  # (resume count, restart count of this slot): seeds fresh envs on each start
    cfg: Config
    spaces: EnvSpaces
    buffers: tuple[RolloutBuffer, ...]  # the shared buffers (two with parallel.overlap); only its env slice of each
    policy: PublishedPolicy  # the learner's parameters and buffers, published by the coordinator
    progress: torch.Tensor  # int64 per worker: env steps taken, a heartbeat the coordinator watches
    abandon: torch.Tensor  # one int64, set by the coordinator when the run stops: end the rollout where it is
    cut: torch.Tensor  # one int64, set by the coordinator once enough workers are done: end the rollout short
    env_threads: int  # the env's own stepping threads
    draw_threads: int  # Mesa's software OpenGL's drawing threads (`draw_with`)
    torch_threads: int  # torch/OpenMP threads
    env_offset: int = 0  # global index of this rank's first env (distributed runs): seeds follow global indices
    cpus: tuple[int, ...] | None = None  # the CPUs it is pinned to (`parallel.pin_workers`), else None: anywhere


# Messages on a worker's pipe. In: Collect or Stop. Out: Ready once started, then Done per rollout, or Failed.
@dataclass(frozen=True)
class Collect:
    """Coordinator → worker: take the published policy and fill your slice of buffer `slot` with one rollout;
    `refresh`: take the policy again before each step, whenever a newer one is published."""

    slot: int = 0
    refresh: bool = False
    hold: tuple[int, int] | None = None
    """With `refresh`, (t, version): before step t, wait for a newer policy than `version` (`max_lagged_share`)."""


@dataclass(frozen=True)
class Stop:
    """Coordinator → worker: close your envs and exit."""


@dataclass(frozen=True)
class Ready:
    """Worker → coordinator: envs and policy built; waiting for Collect."""

    pid: int
    start_seconds: float  # building and resetting its envs took this long: the watchdog's unit (`watchdog`)


@dataclass(frozen=True)
class Done:
    """Worker → coordinator: the slice is filled."""

    result: CollectResult


@dataclass(frozen=True)
class Failed:
    """Worker → coordinator: an error no restart can fix (a bad config, a bug), with its traceback."""

    summary: str
    traceback: str


PRELOAD_ENV_VAR = "PARALLEL_PPO_PRELOAD_ENV"
"""Set to the env id before the forkserver starts, where the env's family has a `preload`
(`envs.families.Family`): the forkserver's module (`preload`) calls it there once, for every worker to share
what it loads."""

IGNORED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
"""A scheduler's stop or pre-emption signal reaches the whole process group; the coordinator alone decides."""

ORPHAN_GRACE = 5.0
"""Seconds a worker whose coordinator has gone lives on where its env step hangs (`exit_when_orphaned`)."""

FAULT_ENV_VAR = "PARALLEL_PPO_INJECT_FAULT"
"""Testing hook: `W:N` makes worker W raise in its N-th rollout, to exercise failure paths."""


def _injected_fault(index: int) -> int:
    worker, _, rollout = os.environ.get(FAULT_ENV_VAR, "").partition(":")
    return int(rollout) if worker.isdigit() and rollout.isdigit() and int(worker) == index else 0


def process_title(spec: WorkerSpec) -> str:
    first = spec.env_offset + spec.first_env
    return f"parallel_ppo worker {spec.index} envs {first}-{first + spec.num_envs - 1} ({spec.cfg.env.id})"


def _rollout(spec: WorkerSpec, message: Collect, runner: EnvRunner, model: nn.Module, policy: PolicyCopy,
             buf: RolloutBuffer, orphaned: Callable[[], bool]) -> CollectResult:
    """One rollout into `buf` as `message` asks, with the published policy taken first (and before each step, with
    `refresh`), until the coordinator abandons it or is gone (`orphaned`: no one would read the rest)."""

    def stopping() -> bool:
        return bool(spec.abandon) or orphaned()

    policy.refresh()
    hold = None if message.hold is None else (
        message.hold[0], functools.partial(await_newer, spec.policy, message.hold[1], stopping))
    return runner.collect(model, buf, spec.progress[spec.index], stopping=stopping,
                          cut_short=lambda: bool(spec.cut), refresh=policy.refresh if message.refresh else None,
                          hold=hold)


def _tied_to_coordinator() -> Callable[[], bool]:
    """Leave the group's signals to the coordinator and end with it; returns the check that it has gone."""
    for sig in IGNORED_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal_on_parent_death(signal.SIGKILL)  # it ignores SIGTERM, and must not outlive the run
    exit_when_orphaned(ORPHAN_GRACE)  # where its env step hangs, the check below is never made
    return parent_process_watch()  # the coordinator gone, which a forkserver's child gets no signal for


def worker_main(spec: WorkerSpec, conn: Connection) -> None:
    """Serve rollout requests (Collect) until told to Stop or the coordinator goes away."""
    orphaned = _tied_to_coordinator()
    setproctitle.setproctitle(process_title(spec))
    torch.set_num_threads(spec.torch_threads)
    draw_with(spec.draw_threads)
    retain_freed_memory()
    runner = None
    try:
        if spec.cpus is not None:
            os.sched_setaffinity(0, spec.cpus)
        from parallel_ppo.core.model import network
        from parallel_ppo.envs.batch import make_batch_env

        cfg = spec.cfg
        first = spec.env_offset + spec.first_env
        started = time.perf_counter()
        env = make_batch_env(cfg.env, cfg.run.seed, first, spec.num_envs, spec.env_threads, spec.stream)
        if env.spaces != spec.spaces:
            raise RuntimeError(f"env spaces {env.spaces} differ from the coordinator's {spec.spaces}")
        runner = EnvRunner.for_run(env, cfg, first, spec.stream)
        start_seconds = time.perf_counter() - started
        policy = PolicyCopy(spec.policy, model := network(cfg, spec.spaces), orphaned)  # the model's own tensors
        slices = [b.env_slice(spec.first_env, spec.first_env + spec.num_envs) for b in spec.buffers]
        fail_at = _injected_fault(spec.index)
        conn.send(Ready(os.getpid(), start_seconds))
        rollouts = 0
        while isinstance(message := conn.recv(), Collect):  # blocks in the kernel between rollouts: no busy-waiting
            rollouts += 1
            pause_point(f"worker{spec.index}", rollouts)
            if rollouts == fail_at:
                raise RuntimeError(f"fault injected by {FAULT_ENV_VAR} in rollout {rollouts}")
            result = _rollout(spec, message, runner, model, policy, slices[message.slot], orphaned)
            if orphaned():  # the rollout ended where it was, for no one: nothing is sent, and the worker ends
                break
            conn.send(Done(result))
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        pass  # the coordinator is gone or stopping
    except BaseException as e:
        try:
            conn.send(Failed(one_line(e, limit=1000), traceback.format_exc()))  # the whole of it in the traceback
        except OSError:
            pass
    finally:
        if runner is not None:
            runner.close()
        conn.close()
