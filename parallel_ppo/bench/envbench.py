"""Raw env throughput, no learning: env steps/s through the bare envs, the sequential collector and the
parallel workers, with random actions and with the policy network's inference."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import torch

from parallel_ppo.core.collect import SequentialCollector
from parallel_ppo.core.config import Config
from parallel_ppo.core.model import network
from parallel_ppo.core.threads import thread_plan
from parallel_ppo.core.timing import PhaseTimer
from parallel_ppo.envs.batch import env_spaces, make_batch_env


def _bare_env_rate(cfg: Config, seconds: float) -> float:
    """Steps/s of the env batch alone, with random actions drawn by numpy."""
    env = make_batch_env(cfg.env, cfg.run.seed, 0, cfg.env.num_envs, thread_plan(cfg, parallel=False).env)
    rng = np.random.default_rng(cfg.run.seed)
    try:
        env.reset()
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            env.step(env.actions.sample_uniform(rng, env.num_envs))
            steps += env.num_envs
        return steps / (time.perf_counter() - start)
    finally:
        env.close()


def _collector_rate(source: Any, cfg: Config, seconds: float) -> dict[str, float]:
    """Steps/s of repeated rollouts from a rollout source (after one warm-up rollout), and where time went."""
    torch.manual_seed(cfg.run.seed)
    model = network(cfg, source.spaces)
    timers = PhaseTimer()
    try:
        source.collect(model, timers)
        timers.pop()
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            source.collect(model, timers)
            steps += int(source.buffer.lengths.sum())  # a cut rollout's steps taken (`parallel.sync_fraction`)
        wall = time.perf_counter() - start
    finally:
        source.close()
    phases = timers.pop()
    return {"steps_per_second": steps / wall, "env_share": (phases["env"] + phases["render"]) / wall,
            "inference_share": phases["inference"] / wall, "sync_share": phases["sync"] / wall}


def bench_envs(cfg: Config, seconds: float) -> list[dict[str, Any]]:
    """Rows of (path, policy, steps/s) for the config's game and parallel layout; the sequential path
    steps the same total number of envs in one process."""
    from parallel_ppo.engines.parallel.coordinator import ParallelCoordinator

    rows: list[dict[str, Any]] = []
    total = cfg.parallel.num_workers * cfg.parallel.num_envs_per_worker
    base = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, num_envs=total))
    rows.append({"path": "bare envs", "policy": "random", "workers": 0, "envs": total,
                 "steps_per_second": _bare_env_rate(base, seconds)})
    for policy in ("random", "network"):
        run_cfg = base if policy == "network" else dataclasses.replace(  # a random policy: nothing to read or predict
            base, model=dataclasses.replace(base.model, kind="random"),
            training=dataclasses.replace(base.training, normalize_obs=False, predict_privileged=0.0))
        sequential = SequentialCollector(run_cfg, env_threads=thread_plan(run_cfg, parallel=False).env)
        rows.append({"path": "sequential", "policy": policy, "workers": 0, "envs": total,
                     **_collector_rate(sequential, run_cfg, seconds)})
        parallel = ParallelCoordinator(run_cfg, env_spaces(run_cfg.env), thread_plan(run_cfg, parallel=True))
        rows.append({"path": "parallel", "policy": policy, "workers": cfg.parallel.num_workers, "envs": total,
                     **_collector_rate(parallel, run_cfg, seconds)})
    return rows


def format_env_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| path | policy | workers | envs | env steps/s | env | inference | sync |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        shares = [f"{100 * r[k]:.0f}%" if k in r else "-" for k in ("env_share", "inference_share", "sync_share")]
        lines.append(f"| {r['path']} | {r['policy']} | {r['workers'] or '-'} | {r['envs']} | "
                     f"{r['steps_per_second']:,.0f} | {' | '.join(shares)} |")
    return "\n".join(lines)
