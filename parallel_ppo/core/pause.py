"""A testing hook: hold a run at a chosen point, so that a test can send it a signal exactly there."""

from __future__ import annotations

import os
import time
from pathlib import Path

PAUSE_ENV_VAR = "PARALLEL_PPO_PAUSE_AT"
"""`rollout:N:FILE`, `update:N:FILE` or `start:R:FILE`: halfway through rollout N (in every process that steps
envs), before update N, or as rank R has joined the others, write this process's pid to FILE, then sleep
`PAUSE_SECONDS` (a rank held at its start: `START_PAUSE_SECONDS`, longer than the collective timeout a test sets)."""

PAUSE_SECONDS = 1.0
START_PAUSE_SECONDS = 3.0


def pause_point(point: str, count: int) -> None:
    """Pause here if `PAUSE_ENV_VAR` names this point and count."""
    spec = os.environ.get(PAUSE_ENV_VAR)
    if not spec:
        return
    where, number, path = spec.split(":", 2)
    if where == point and int(number) == count:
        Path(path).write_text(str(os.getpid()))
        time.sleep(START_PAUSE_SECONDS if point == "start" else PAUSE_SECONDS)
