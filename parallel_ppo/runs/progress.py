"""A run's progress while it trains: a tqdm bar when stdout is a terminal, else a plain line every few seconds
through Python's logging (what a batch job's log should hold: no carriage returns, no padding), or nothing. Only
the process that logs the run (rank 0 of a distributed run) makes one."""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any, Protocol

LOGGER = logging.getLogger("parallel_ppo.progress")
"""Where the progress lines go (level INFO); the command lines print it to stdout (`progress_to_stdout`)."""


class Progress(Protocol):
    def update(self, row: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def time_left(elapsed: float, env_steps: int, budget_seconds: float, total_steps: int) -> float:
    """Seconds until the run stops: the duration left, or sooner, the step budget left at the run's mean rate."""
    left = budget_seconds - elapsed
    if total_steps and env_steps > 0 and elapsed > 0:
        left = min(left, (total_steps - env_steps) * elapsed / env_steps)
    return max(0.0, left)


def fmt_time(seconds: float) -> str:
    """`H:MM:SS`."""
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def describe(row: dict[str, Any], budget_seconds: float, total_steps: int) -> str:
    """`update 12 | 24,576/100,000 steps | 231 SPS | return 5.40 | success 45% | 0:01:46 elapsed, 0:05:27 left`
    (the success rate where the env reports one); before the first episode ends, `no episode finished yet` and the
    mean reward per env step of the update's rollout instead of the return."""
    elapsed = row["wall_time"]
    steps = f"{row['env_steps']:,}" + (f"/{total_steps:,}" if total_steps else "")
    left = time_left(elapsed, row["env_steps"], budget_seconds, total_steps)
    return (f"update {row['update']} | {steps} steps | {row['sps']:.0f} SPS | {_episodes(row)} | "
            f"{fmt_time(elapsed)} elapsed, {fmt_time(left)} left")


def _episodes(row: dict[str, Any]) -> str:
    """The episodes' part of a progress line: the mean return and success rate, or the reward so far."""
    ret, success, reward = (row.get(c) for c in ("episodic_return_mean", "success_rate", "reward_per_step"))
    if _known(ret):
        return f"return {ret:.2f}" + (f" | success {success:.0%}" if _known(success) else "")
    per_step = f" (reward {reward:.3g} per step)" if _known(reward) else ""
    return f"no episode finished yet{per_step}"


def _known(value: Any) -> bool:
    return value is not None and not math.isnan(value)


class ProgressBar:
    """A tqdm bar on the terminal: the share of the run done (by time or steps, whichever ends it first)."""

    def __init__(self, label: str, budget_seconds: float, total_steps: int) -> None:
        from tqdm import tqdm

        self._budget, self._total_steps = budget_seconds, total_steps
        self._bar = tqdm(total=1.0, desc=f"[{label}]", file=sys.stdout, dynamic_ncols=True, leave=True,
                         postfix=[""], bar_format="{desc} {percentage:3.0f}%|{bar}| {postfix[0]}")

    def update(self, row: dict[str, Any]) -> None:
        elapsed = row["wall_time"]
        left = time_left(elapsed, row["env_steps"], self._budget, self._total_steps)
        self._bar.n = elapsed / (elapsed + left) if elapsed + left > 0 else 1.0
        self._bar.postfix = [describe(row, self._budget, self._total_steps)]  # a list: shown without tqdm's ", "
        self._bar.refresh()

    def close(self) -> None:
        self._bar.close()


class ProgressLines:
    """One INFO line on `LOGGER` for the first update and then at most one every `interval` seconds. `own_output`:
    print the lines to stdout where no handler would show them (`logging.progress: on`)."""

    def __init__(self, budget_seconds: float, total_steps: int, interval: float, own_output: bool = False) -> None:
        self._budget, self._total_steps, self._interval = budget_seconds, total_steps, interval
        self._last: float | None = None
        self._own = ExitStack()
        if own_output and not (LOGGER.hasHandlers() and LOGGER.isEnabledFor(logging.INFO)):
            self._own.enter_context(progress_to_stdout())

    def update(self, row: dict[str, Any]) -> None:
        now = time.monotonic()
        if self._last is None or now - self._last >= self._interval:
            self._last = now
            LOGGER.info("%s", describe(row, self._budget, self._total_steps))

    def close(self) -> None:
        self._own.close()


def make_progress(mode: str, label: str, budget_seconds: float, total_steps: int,
                  interval: float) -> Progress | None:
    """What `logging.progress` (`mode`) shows here: a bar on a terminal, lines elsewhere, or None (`off`)."""
    if mode == "off":
        return None
    if sys.stdout.isatty():
        return ProgressBar(label, budget_seconds, total_steps)
    return ProgressLines(budget_seconds, total_steps, interval, own_output=mode == "on")


@contextmanager
def progress_to_stdout(prefix: str = "") -> Iterator[None]:
    """While inside, `LOGGER`'s lines print to stdout as `2026-11-23 21:30:00 PREFIX: update 12 | ...` (and not also
    through the root logger's handlers)."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(f"%(asctime)s {prefix}: %(message)s" if prefix else
                                           "%(asctime)s %(message)s", datefmt="%Y-%m-%d %H:%M:%S"))
    saved = LOGGER.level, LOGGER.propagate
    LOGGER.addHandler(handler)
    LOGGER.setLevel(logging.INFO)
    LOGGER.propagate = False
    try:
        yield
    finally:
        LOGGER.removeHandler(handler)
        LOGGER.setLevel(saved[0])
        LOGGER.propagate = saved[1]
