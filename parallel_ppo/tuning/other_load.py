"""The load of other processes on this machine's cores while a measurement ran, and when it counts as busy: every
measurement records it beside its rates (no torch here, so a benchmark's flags are checked before torch loads)."""

from __future__ import annotations

import os
import time
from typing import Any

import psutil

BUSY_CORES = 0.1
"""Other processes' load (in cores) above which a measurement is flagged as taken on a busy machine."""


def busy(limit: dict[str, Any]) -> bool:
    """Whether other processes kept the machine busy (over BUSY_CORES) while `limit` was measured."""
    return float(limit.get("other_load_cores") or 0.0) > BUSY_CORES


class OtherLoad:
    """Cores kept busy by other processes while a block ran (not this process nor its waited-for children).

    A benchmark on a shared machine is only as good as its quiet: intra-op threads slow down several-fold
    when another busy process shares their cores, so every measurement records this next to its rates.
    """

    cores: float = 0.0

    @staticmethod
    def _busy_seconds() -> float:
        """Busy CPU seconds of the CPUs this process may run on (its affinity mask): other jobs pinned to other
        CPUs of the host are not load on ours."""
        per_cpu = psutil.cpu_times(percpu=True)
        try:
            mine = [per_cpu[i] for i in os.sched_getaffinity(0) if i < len(per_cpu)] or per_cpu
        except (AttributeError, OSError):
            mine = per_cpu
        return sum(sum(t) - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "guest", 0.0)
                   - getattr(t, "guest_nice", 0.0) for t in mine)

    @staticmethod
    def _own_seconds() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def __enter__(self) -> OtherLoad:
        self._start = (time.perf_counter(), self._busy_seconds(), self._own_seconds())
        return self

    def __exit__(self, *exc: object) -> None:
        wall, busy, own = self._start
        wall = time.perf_counter() - wall
        other = (self._busy_seconds() - busy) - (self._own_seconds() - own)
        self.cores = max(0.0, other / wall) if wall > 0 else 0.0
