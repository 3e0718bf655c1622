"""Every figure derived from runs, defined once: steady-state SPS, speed-up, efficiency, return at a wall time or a
step count, time to a threshold, and the throughput and compute figures of a run's summary."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from parallel_ppo.core.config import EnvConfig
from parallel_ppo.envs.procgen_envs import normalized_return


class Logged(Protocol):
    """What the figures over time read of a run (`runs.reading.Run` is one): metrics.csv as numpy columns."""

    metrics: dict[str, np.ndarray]


def steady_span(env_steps: Sequence[float], wall_time: Sequence[float]) -> tuple[float, float]:
    """The env steps and seconds that steady-state SPS divides: from the end of update 1 to the end of the
    last update, so start-up, the compute-limit measurement and update 1's first-touch costs are left out
    (logging and checkpoints in between are in). A run of one update has no steady state: its span is then
    that update, from the run's start."""
    if len(env_steps) == 1:
        return float(env_steps[0]), float(wall_time[0])
    return float(env_steps[-1]) - float(env_steps[0]), float(wall_time[-1]) - float(wall_time[0])


def steady_sps(env_steps: Sequence[float], wall_time: Sequence[float]) -> float:
    """A run's throughput in env steps per second, as summary.json, compare, the scaling sweep, autotune and
    the speed check all report it (see `steady_span`)."""
    steps, seconds = steady_span(env_steps, wall_time)
    return steps / seconds if seconds > 0 else math.nan


def speedup(sps: float, base_sps: float) -> float:
    """How many times the baseline's steady-state SPS."""
    return sps / base_sps


def efficiency(speedup_: float, workers: int, base_workers: int) -> float:
    """Speed-up per worker added: speed-up / (workers / the baseline's workers), a sequential run counting
    as 1 worker (so against a sequential baseline it is speed-up / workers)."""
    return speedup_ / (max(1, workers) / max(1, base_workers))


def return_at(run: Logged, seconds: float) -> float | None:
    """The mean episodic return logged at the last update that ended by `seconds` of wall time (None: no
    episode had finished by then)."""
    index = int(np.searchsorted(run.metrics["wall_time"], seconds, side="right")) - 1
    if index < 0:
        return None
    value = float(run.metrics["episodic_return_mean"][index])
    return None if math.isnan(value) else value


def logged_by(env_steps: np.ndarray, steps: float) -> int:
    """The index of the row logged last by `steps` env steps in the ascending `env_steps` (-1: none was)."""
    return int(np.searchsorted(env_steps, steps, side="right")) - 1


def return_at_step(run: Logged, steps: float) -> float | None:
    """The mean episodic return logged at the last update that ended by `steps` env steps (None: no episode
    had finished by then, or no update had ended)."""
    index = logged_by(run.metrics["env_steps"], steps)
    if index < 0:
        return None
    value = float(run.metrics["episodic_return_mean"][index])
    return None if math.isnan(value) else value


def first_return(run: Logged) -> float | None:
    """The first mean episodic return the run logged (None: no episode finished)."""
    returns = run.metrics["episodic_return_mean"]
    logged = returns[np.isfinite(returns)]
    return float(logged[0]) if logged.size else None


def first_reaching(run: Logged, threshold: float | None) -> int | None:
    """Index of the first update whose mean return reached `threshold` (its wall_time and env_steps are the
    time and steps to threshold), None if none did."""
    if threshold is None:
        return None
    with np.errstate(invalid="ignore"):
        hits = np.flatnonzero(run.metrics["episodic_return_mean"] >= threshold)
    return int(hits[0]) if hits.size else None


SPEEDUP_DEFINITION = (
    "SPS = steady-state env steps per second (from the end of update 1 to the end of the last update; "
    "start-up and update 1 left out); speed-up = a run's SPS / the baseline's SPS; parallel efficiency = "
    "speed-up / (workers / baseline workers), a sequential run counting as 1 worker"
)


def compute_figures(sps: float | None, compute_limit: dict | None, roofline: dict | None,
                    precision: str) -> dict[str, float | None]:
    """A run's share of its limits: `limit_efficiency` (SPS over the measured compute limit), and the FLOPs one
    env step costs, the GFLOP/s that makes, the matmul peak of its precision and the share of it."""
    flops = roofline["flops_per_env_step"] if roofline else None
    peak = roofline["peak_gflops"][precision] if roofline else None
    achieved = sps * flops / 1e9 if flops and sps else None
    return {"limit_efficiency": sps / compute_limit["limit_sps"] if compute_limit and sps else None,
            "flops_per_env_step": flops, "achieved_gflops": achieved, "peak_gflops": peak,
            "peak_fraction": achieved / peak if achieved and peak else None}


def return_figures(env: EnvConfig, train_return: float | None, test_return: float | None,
                   levels: str | None = "test") -> dict[str, float | None]:
    """The training return, the evaluation's return and both as Procgen normalized scores, and the generalization
    gap (training minus test), when the evaluation played held-out `levels`."""
    both = train_return is not None and test_return is not None and levels == "test"
    return {"normalized_return": normalized_return(env, train_return), "test_return_mean": test_return,
            "test_normalized_return": normalized_return(env, test_return),
            "generalization_gap": train_return - test_return if both else None}
