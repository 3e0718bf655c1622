"""A testing hook: hold a run at a chosen point, so that a test can send it a signal exactly there."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

PAUSE_ENV_VAR = "PARALLEL_PPO_PAUSE_AT"
"""`rollout:N:FILE`, `update:N:FILE`, `workerW:N:FILE` or `start:R:FILE`: halfway through rollout N (in every process
that steps envs), before update N, as parallel worker W starts its rollout N, or as rank R has joined the others,
write this process's pid to FILE, then wait until the test writes FILE.go (`release_file`; at most `PAUSE_SECONDS`),
so that a slow machine cannot end the hold before the test has acted (a rank held at its start sleeps
`START_PAUSE_SECONDS`, longer than the collective timeout a test sets)."""

PAUSE_SECONDS = 60.0
START_PAUSE_SECONDS = 3.0


def release_file(path: str | Path) -> Path:
    """The file whose existence ends a hold that wrote its pid to `path`."""
    return Path(f"{path}.go")


def pause_point(point: str, count: int) -> None:
    """Pause here if `PAUSE_ENV_VAR` names this point and count."""
    spec = os.environ.get(PAUSE_ENV_VAR)
    if not spec:
        return
    where, number, path = spec.split(":", 2)
    if where != point or int(number) != count:
        return
    Path(path).write_text(str(os.getpid()))
    if point == "start":
        time.sleep(START_PAUSE_SECONDS)
        return
    deadline = time.monotonic() + PAUSE_SECONDS
    while not release_file(path).exists():
        if time.monotonic() > deadline:  # a test that forgot to release: say so, its action may land after the hold
            print(f"pause: held {PAUSE_SECONDS:g} s at {point} {count} without {release_file(path)}; going on",
                  file=sys.stderr)
            return
        time.sleep(0.01)
