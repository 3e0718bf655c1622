"""Named phase timers: accumulate seconds per phase, read and reset once per update."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

PHASES = ("env", "inference", "sync", "gae", "update", "allreduce", "publish", "eval", "log")
"""The phases every run reports, in data-flow order (metrics.csv columns `time_<phase>`)."""


class PhaseTimer:
    """Accumulates wall-clock seconds per named phase."""

    def __init__(self) -> None:
        self._totals: defaultdict[str, float] = defaultdict(float)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self._totals[name] += time.perf_counter() - start

    def add(self, name: str, seconds: float) -> None:
        self._totals[name] += seconds

    def pop(self) -> dict[str, float]:
        """Seconds per phase since the last pop (every name in PHASES present), then reset."""
        out = {name: self._totals.get(name, 0.0) for name in PHASES}
        out.update({k: v for k, v in self._totals.items() if k not in out})
        self._totals.clear()
        return out
