"""Telling a hung worker from a slow one: a worker is alive while it steps its envs or computes.

A robosuite reset, a first camera frame or a simulator's first JIT compilation can keep a worker from stepping for
seconds, many more on a loaded machine, while it works the whole time; a worker that truly hangs (a deadlock, a
simulator waiting on a socket) does neither. So a worker counts as making progress while its step counter moves or
its process uses CPU time (all its threads: MuJoCo, Mesa's drawing threads, numba) or waits for a core to run on (a
worker the scheduler keeps waiting, beside a busier job or run at a low priority, is slow, not hung), and is
restarted only after `bound` seconds of neither. The bound follows what the worker's envs were measured to take: by
default (`parallel.worker_timeout: auto`) FACTOR times the slowest worker's start (building and resetting its envs,
a reset of every env at once being what one step of a batch can cost when their episodes end together), at least
FLOOR seconds. One that computes without a step for CEILING seconds is hung as well (a loop that never ends).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import psutil

FLOOR = 20.0
"""The fewest seconds of neither stepping nor computing after which `auto` declares a worker hung."""
FACTOR = 10.0
"""`auto`'s bound in units of the slowest worker's measured start: room for a machine several times busier than
when it was measured, and for a batch whose envs all reset in one step."""
BUSY_SHARE = 0.05
"""A worker computes, for the watchdog, when its `work_seconds` grew by at least this share of a core over the time
since its last sign of progress (and by at least MIN_CPU_SECONDS): a blocked or sleeping process neither runs nor
waits to."""
MIN_CPU_SECONDS = 0.01
CEILING = 600.0
"""A worker that computes without taking a step for this many seconds, or twice the bound where that is longer, is
hung too: a loop that never ends (far beyond any reset or compilation)."""


def auto_bound(start_seconds: float) -> float:
    """`parallel.worker_timeout: auto`'s bound for a worker whose envs took `start_seconds` to build and reset."""
    return max(FLOOR, FACTOR * start_seconds)


def in_seconds(value: float) -> str:
    """`value` seconds as the watchdog's lines write it: to a tenth, without a trailing zero (`28.3 s`, `2 s`)."""
    return f"{value:.1f}".rstrip("0").rstrip(".") + " s"


def rule() -> str:
    """`auto`'s rule in words."""
    return f"{FACTOR:g} x the slowest worker's start, at least {FLOOR:g} s"


def describe(rank: int | None, timeout: float | str, bound: float, slowest_start: float) -> str:
    """One line for the start of a run: how long a worker (of distributed `rank`) may neither step nor compute before
    it is restarted, and why (`parallel.worker_timeout`, `timeout`: a number or `auto`)."""
    whose = "a worker" if rank is None else f"rank {rank}'s worker"
    line = f"{whose} that neither steps nor computes for {in_seconds(bound)} is restarted"
    if timeout != "auto":
        return f"{line} (parallel.worker_timeout)"
    return (f"{line} (parallel.worker_timeout auto: {rule()}; the slowest worker built and reset its envs in "
            f"{slowest_start:.1f} s)")


def work_seconds(pid: int) -> float | None:
    """Seconds process `pid` has run (user and system CPU time, every thread's) or, on Linux, waited for a core to
    run on (the kernel's run-queue wait of each live thread, added when the thread gets a core: a wait that never
    ends shows only then, and a thread that ends takes its wait with it), or None when it is gone."""
    try:
        times = psutil.Process(pid).cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    return times.user + times.system + run_queue_seconds(pid)


def run_queue_seconds(pid: int) -> float:
    """Seconds the live threads of process `pid` have waited on a run queue (/proc/PID/task/*/schedstat's second
    field); 0 where the kernel keeps no such account."""
    waited = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                waited += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):  # a thread that ended meanwhile
            continue
    return waited / 1e9


@dataclass
class _Mark:
    steps: int
    stepped: float  # when the step counter last moved
    cpu: float
    worked: float  # when it last stepped or computed


@dataclass
class Watchdog:
    """Per worker slot: when it last stepped, and when it last stepped or computed."""

    bound: float
    marks: dict[int, _Mark] = field(default_factory=dict)

    def forget(self, slot: int) -> None:
        """A new process in `slot` (restarted), or a new rollout: start afresh at its next reading."""
        self.marks.pop(slot, None)

    def read(self, slot: int, steps: int, cpu: float | None, now: float) -> tuple[float, float]:
        """Given `slot`'s step counter and `work_seconds` (`cpu`) now: the seconds it has neither stepped nor
        computed, and the seconds it has not stepped."""
        cpu = -1.0 if cpu is None else cpu
        mark = self.marks.get(slot)
        if mark is None or steps != mark.steps:
            mark = self.marks[slot] = _Mark(steps, now, cpu, now)
        elif cpu - mark.cpu >= max(MIN_CPU_SECONDS, BUSY_SHARE * (now - mark.worked)):
            mark.cpu, mark.worked = cpu, now
        elif cpu >= 0:  # below the mark where a thread that ended took its run-queue wait with it: count from here
            mark.cpu = min(mark.cpu, cpu)
        return now - mark.worked, now - mark.stepped

    def hung(self, slot: int, steps: int, cpu: float | None, now: float) -> str | None:
        """Why `slot` counts as hung (neither stepped nor computed for `bound`, or computed without a step for
        `ceiling`: a loop that never ends), or None."""
        idle, stepless = self.read(slot, steps, cpu, now)
        if idle > self.bound:
            return f"neither stepped nor computed for {in_seconds(self.bound)}"
        if stepless > self.ceiling:
            return f"computed without taking a step for {in_seconds(self.ceiling)}"
        return None

    @property
    def ceiling(self) -> float:
        """Seconds a worker may compute without taking a step (CEILING, or twice the bound where longer)."""
        return max(CEILING, 2 * self.bound)
