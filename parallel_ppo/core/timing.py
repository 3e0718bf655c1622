"""Named phase timers: accumulate seconds per phase, read and reset once per update."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

from parallel_ppo.core.metrics import metric

PHASES = ("env", "render", "inference", "sync", "gae", "update", "allreduce", "publish", "eval", "log")
"""The phases every run reports, in data-flow order: `env` is the envs' step (their physics) less the frames they
draw for their observations (cameras, pixels), which are `render` where the env tells them apart."""
PHASE_NOTES = {"env": " (the envs' step less the frames they draw)",
               "render": " (drawing the frames the envs observe: cameras, pixels)"}
PHASE_METRICS = {name: metric(f"time/{name}", f"seconds of the update spent in phase {name}{PHASE_NOTES.get(name, '')}")
                 for name in PHASES}
"""Each phase's metric: `time/<phase>`, metrics.csv column `time_<phase>`."""


class PhaseTimer:
    """Accumulates wall-clock seconds per phase (one of PHASES: each has its declared metric)."""

    def __init__(self) -> None:
        self._totals: defaultdict[str, float] = defaultdict(float)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        _check(name)
        start = time.perf_counter()
        try:
            yield
        finally:
            self._totals[name] += time.perf_counter() - start

    def add(self, name: str, seconds: float) -> None:
        _check(name)
        self._totals[name] += seconds

    def pop(self) -> dict[str, float]:
        """Seconds per phase since the last pop (every name in PHASES present), then reset."""
        out = {name: self._totals.get(name, 0.0) for name in PHASES}
        self._totals.clear()
        return out


def _check(name: str) -> None:
    if name not in PHASES:
        raise ValueError(f"phase {name!r} is not one of PHASES ({', '.join(PHASES)}): add it there")
