"""The one training loop, shared by both modes: collect → GAE → update → log → checkpoint, bounded by time."""

from __future__ import annotations

import math
import signal
import time
from collections import deque
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from torch import nn

from parallel_ppo import fingerprint
from parallel_ppo.buffer import RolloutBuffer, compute_gae
from parallel_ppo.checkpoint import save_checkpoint, write_json
from parallel_ppo.collect import CollectResult, RolloutError
from parallel_ppo.config import Config
from parallel_ppo.metrics import MetricsLogger, ResourceSampler
from parallel_ppo.model import build_model
from parallel_ppo.ppo import TrainBatch, ppo_update
from parallel_ppo.timing import PHASES, PhaseTimer


class RolloutSource(Protocol):
    """Where rollouts come from: the sequential collector or the parallel coordinator."""

    mode: str
    buffer: RolloutBuffer
    obs_shape: tuple[int, ...]
    num_actions: int
    layout: dict[str, int]

    def collect(self, model: nn.Module, timers: PhaseTimer) -> CollectResult:
        """Fill `buffer` with one rollout of `model`, adding the phases it spent to `timers`."""
        ...

    def close(self) -> None: ...


class StopRequest:
    """SIGINT/SIGTERM handler: the first signal asks the loop to stop at the next boundary, a second interrupts."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopRequest:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def learning_rate(cfg: Config, env_steps: int, elapsed: float) -> float:
    """The configured rate, linearly annealed to 0 if enabled: over `total_steps` when set, else over the duration.

    Annealing by steps when there is a step budget keeps the schedule independent of the machine's speed.
    """
    lr = cfg.training.learning_rate
    if not cfg.training.anneal_lr:
        return lr
    if cfg.run.total_steps:
        progress = env_steps / cfg.run.total_steps
    else:
        progress = elapsed / (cfg.run.duration * 3600)
    return lr * max(0.0, 1.0 - progress)


def _mean(values: deque) -> float:
    return float(np.mean(values)) if values else float("nan")


def train(cfg: Config, source: RolloutSource, run_dir: Path, threads: dict[str, int],
          resume: dict | None = None, compute_limit: dict | None = None) -> dict:
    """Train until the duration or step budget is spent (or a signal arrives); returns summary.json's content.

    `resume` is a loaded checkpoint: model, optimizer, counters, RNG states, episode window and elapsed
    time carry on from it, and metrics rows logged after it are dropped so the CSV stays continuous.
    `compute_limit` (from `roofline.measure_compute_limit`) is recorded with the run's efficiency against it.
    """
    run_dir = Path(run_dir)
    torch.manual_seed(cfg.run.seed)
    model = build_model(source.obs_shape, source.num_actions, cfg.model)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.training.learning_rate, eps=1e-5)
    generator = torch.Generator().manual_seed(cfg.run.seed)
    ep_returns: deque[float] = deque(maxlen=cfg.logging.return_window)
    ep_lengths: deque[int] = deque(maxlen=cfg.logging.return_window)
    update = env_steps = episodes = 0
    elapsed_before = 0.0
    if resume is not None:
        model.load_state_dict(resume["model"])
        optimizer.load_state_dict(resume["optimizer"])
        generator.set_state(resume["generator"])
        torch.set_rng_state(resume["torch_rng"])
        ep_returns.extend(resume["episode_returns"])
        ep_lengths.extend(resume["episode_lengths"])
        update, env_steps, episodes = resume["update"], resume["env_steps"], resume["episodes"]
        elapsed_before = resume["elapsed"]
    timers = PhaseTimer()
    phase_totals = dict.fromkeys(PHASES, 0.0)
    sampler = ResourceSampler()
    budget = cfg.run.duration * 3600
    logger = MetricsLogger(run_dir, cfg.logging.tensorboard, cfg.logging.progress, budget, cfg.run.total_steps,
                           source.mode, resume_after=(update, env_steps) if resume is not None else None)
    stop_reason = error = ""
    start = time.monotonic() - elapsed_before
    last_checkpoint = last_row = time.monotonic()
    cpu_samples: list[float] = []

    def checkpoint() -> None:
        save_checkpoint(run_dir / "checkpoint.pt", {
            "config": cfg.to_dict(), "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "update": update, "env_steps": env_steps, "episodes": episodes, "elapsed": time.monotonic() - start,
            "episode_returns": list(ep_returns), "episode_lengths": list(ep_lengths),
            "generator": generator.get_state(), "torch_rng": torch.get_rng_state(),
            "resumes": resumes, "mode": source.mode,
        })

    resumes = (resume.get("resumes", 0) + 1) if resume is not None else 0

    try:
        with StopRequest() as stop:
            while not stop_reason:
                update_start = time.monotonic()
                lr = learning_rate(cfg, env_steps, update_start - start)
                for group in optimizer.param_groups:
                    group["lr"] = lr

                try:
                    result = source.collect(model, timers)
                except RolloutError as e:
                    stop_reason, error = "error", str(e)
                    break
                if stop.signum is not None:  # abandon this rollout rather than spend an update on it
                    stop_reason = "signal"
                    break

                with timers.phase("gae"):
                    buf = source.buffer
                    advantages, returns = compute_gae(buf.rewards, buf.values, buf.dones, buf.last_values,
                                                      cfg.training.gamma, cfg.training.gae_lambda)
                    data = TrainBatch(buf.obs.flatten(0, 1), buf.actions.flatten(), buf.logprobs.flatten(),
                                      buf.values.flatten(), advantages.flatten(), returns.flatten())

                with timers.phase("update"):
                    stats = ppo_update(model, optimizer, data, cfg.training, generator)

                update += 1
                env_steps += cfg.rollout_size
                episodes += len(result.episode_returns)
                ep_returns.extend(result.episode_returns)
                ep_lengths.extend(result.episode_lengths)
                now = time.monotonic()
                elapsed = now - start
                phases = timers.pop()
                for name in PHASES:
                    phase_totals[name] += phases[name]
                with timers.phase("log"):  # counted in the next row: this row's clock stopped at `now`
                    resources = sampler.sample()
                    cpu_samples.append(resources["cpu_percent"])
                    logger.log({
                        "update": update, "env_steps": env_steps, "wall_time": elapsed,
                        "sps": cfg.rollout_size / max(now - last_row, 1e-9),  # logging and checkpoints included
                        "episodic_return_mean": _mean(ep_returns), "episodic_length_mean": _mean(ep_lengths),
                        "episodes": episodes, "learning_rate": lr, **stats,
                        **{f"time_{name}": seconds for name, seconds in phases.items()},
                        **resources, "worker_restarts": getattr(source, "restarts", 0),
                    })
                    if now - last_checkpoint >= cfg.run.checkpoint_interval:
                        checkpoint()
                        last_checkpoint = now

                last_row = now
                if stop.signum is not None:
                    stop_reason = "signal"
                elif cfg.run.total_steps and env_steps >= cfg.run.total_steps:
                    stop_reason = "total_steps"
                elif elapsed >= budget:
                    stop_reason = "duration"
            wall = time.monotonic() - start - elapsed_before
            checkpoint()
    finally:
        sampler.close()
        logger.close()
        source.close()

    leftover = timers.pop()
    for name in PHASES:
        phase_totals[name] += leftover[name]
    summary = {
        "mode": source.mode,
        "env_id": cfg.env.id,
        **source.layout,
        "total_env_steps": env_steps,
        "wall_seconds": wall + elapsed_before,
        "sps": env_steps / (wall + elapsed_before) if wall > 0 else 0.0,
        "episodic_return_mean": _mean(ep_returns) if ep_returns else None,
        "episodic_length_mean": _mean(ep_lengths) if ep_lengths else None,
        "episodes": episodes,
        "updates": update,
        "stop_reason": stop_reason,
        "error": error or None,
        "signal": signal.Signals(stop.signum).name if stop.signum else None,
        "precision": cfg.training.precision,
        "threads": threads,
        "peak_rss_mb": sampler.peaks["rss_mb"],
        "peak_pss_mb": sampler.peaks["pss_mb"],
        "peak_main_rss_mb": sampler.peaks["main_rss_mb"],
        "peak_worker_rss_mb": sampler.peaks["worker_rss_mb"],
        "mean_cpu_percent": float(np.mean(cpu_samples)) if cpu_samples else None,
        "compute_limit": compute_limit,
        "limit_efficiency": (env_steps / (wall + elapsed_before)) / compute_limit["limit_sps"]
        if compute_limit and wall > 0 else None,
        "phase_seconds": phase_totals,
        "phase_fractions": {k: v / wall for k, v in phase_totals.items()} if wall > 0 else {},
        "worker_restarts": getattr(source, "restarts", 0),
        "resumes": resumes,
        "seed": cfg.run.seed,
        "hardware": fingerprint.hardware(),
        "versions": fingerprint.versions(),
    }
    summary = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in summary.items()}
    write_json(run_dir / "summary.json", summary)
    return summary
