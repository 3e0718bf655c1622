"""The compute limit of PPO on this machine: how fast the bare network runs, with no envs and no trainer.

Each env step costs one forward pass (batched over the envs stepped together) plus `n_epochs` training
samples (forward, loss, backward, clip, Adam on minibatches), so no trainer of the same network can exceed

    limit_sps = 1 / (1 / forward_rate + n_epochs / train_rate)

env steps per second. `measure_compute_limit` measures both rates on random uint8 observations with the
model, optimizer, precision and thread count the trainer would use, so a trainer's SPS can be judged as a
fraction of the limit measured in the same sitting.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import psutil
import torch

from parallel_ppo.config import Config, ConfigError
from parallel_ppo.model import autocast
from parallel_ppo.ppo import TrainBatch, build_learner, minibatch_step

BUSY_CORES = 0.1
"""Other processes' load (in cores) above which a measurement is flagged as taken on a busy machine."""

_POOL = 4
"""Distinct random inputs cycled through, so one batch does not sit in cache between iterations."""


class OtherLoad:
    """Cores kept busy by other processes while a block ran (not this process nor its waited-for children).

    A benchmark on a shared machine is only as good as its quiet: intra-op threads slow down several-fold
    when another busy process shares their cores, so every measurement records this next to its rates.
    """

    cores: float = 0.0

    @staticmethod
    def _busy_seconds() -> float:
        t = psutil.cpu_times()
        idle = t.idle + getattr(t, "iowait", 0.0)
        return sum(t) - idle - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)

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


def _random_obs(rng: torch.Generator, batch: int, obs_shape: tuple[int, ...],
                dtype: np.dtype) -> torch.Tensor:
    if dtype == np.uint8:
        return torch.randint(0, 256, (batch, *obs_shape), dtype=torch.uint8, generator=rng)
    return torch.randn((batch, *obs_shape), generator=rng)


def _timed_loop(step: Callable[[int], None], seconds: float, warmup_iters: int,
                min_iters: int) -> tuple[int, float, float]:
    """Call `step(i)` `warmup_iters` times untimed, then until `seconds` have passed (at least `min_iters`).

    Returns (timed iterations, timed seconds, median seconds per timed iteration).
    """
    for i in range(warmup_iters):
        step(i)
    durations: list[float] = []
    start = time.perf_counter()
    now = start
    i = 0
    while i < min_iters or now - start < seconds:
        t0 = time.perf_counter()
        step(warmup_iters + i)
        now = time.perf_counter()
        durations.append(now - t0)
        i += 1
    return i, now - start, float(np.median(durations))


def measure_compute_limit(cfg: Config, obs_shape: tuple[int, ...], num_actions: int, seconds: float = 20.0, *,
                          rollout_batch: int | None = None, obs_dtype: np.dtype | None = None,
                          warmup_iters: int = 3, min_iters: int = 3) -> dict[str, Any]:
    """Measure the bare network's inference and training rates and the PPO compute limit they imply.

    - forward: `model(obs)` under `torch.no_grad()` and the configured autocast, on `rollout_batch`
      observations (default `cfg.env.num_envs`, the envs the sequential trainer steps per forward);
    - train: one PPO minibatch step (`minibatch_step`: forward, loss, backward, grad-norm clip, Adam step) on
      `cfg.training.batch_size` samples.

    `seconds` is the timed budget, split evenly between the two; warm-up iterations come on top and
    are not counted. The model and optimizer are built as the trainer builds them (same seed,
    `build_learner`) and run with the torch thread count the caller has set. Returns a JSON-serializable dict.
    """
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
        raise ConfigError(f"measurement seconds must be a positive number, got {seconds!r}")
    forward_batch = cfg.env.num_envs if rollout_batch is None else rollout_batch
    minibatch = cfg.training.batch_size
    if forward_batch <= 0 or minibatch <= 0:
        raise ConfigError(f"batch sizes must be positive, got rollout batch {forward_batch}, "
                          f"minibatch {minibatch}")
    obs_shape = tuple(int(d) for d in obs_shape)
    if obs_dtype is None:
        obs_dtype = np.dtype(np.uint8) if len(obs_shape) == 3 else np.dtype(np.float32)
    tcfg = cfg.training

    with torch.random.fork_rng(devices=[]):  # the trainer's initialization, without touching the caller's RNG
        torch.manual_seed(cfg.run.seed)
        model, optimizer = build_learner(obs_shape, num_actions, cfg)
    rng = torch.Generator().manual_seed(cfg.run.seed)

    forward_inputs = [_random_obs(rng, forward_batch, obs_shape, obs_dtype) for _ in range(_POOL)]

    def forward_step(i: int) -> None:
        with torch.no_grad(), autocast(tcfg.precision):
            model(forward_inputs[i % _POOL])

    train_batches = [_random_batch(rng, minibatch, obs_shape, obs_dtype, num_actions) for _ in range(_POOL)]

    def train_step(i: int) -> None:
        minibatch_step(model, optimizer, train_batches[i % _POOL], tcfg)

    model.train()
    with OtherLoad() as load:
        f_iters, f_secs, f_median = _timed_loop(forward_step, seconds / 2, warmup_iters, min_iters)
        t_iters, t_secs, t_median = _timed_loop(train_step, seconds / 2, warmup_iters, min_iters)

    forward_rate = f_iters * forward_batch / f_secs
    train_rate = t_iters * minibatch / t_secs
    return {
        "forward_rate": forward_rate, "train_rate": train_rate,
        "limit_sps": limit_sps(forward_rate, train_rate, tcfg.n_epochs), "n_epochs": tcfg.n_epochs,
        "rollout_batch": forward_batch, "minibatch": minibatch, "precision": tcfg.precision,
        "threads": torch.get_num_threads(), "forward_seconds": f_secs, "train_seconds": t_secs,
        "forward_iters": f_iters, "train_iters": t_iters, "forward_ms_median": 1000 * f_median,
        "train_ms_median": 1000 * t_median, "warmup_iters": warmup_iters, "other_load_cores": load.cores,
        "model": type(model).__name__, "parameters": sum(p.numel() for p in model.parameters()),
        "obs_shape": list(obs_shape), "num_actions": int(num_actions), "env_id": cfg.env.id,
        "torch": torch.__version__,
    }


def _random_batch(rng: torch.Generator, size: int, obs_shape: tuple[int, ...], obs_dtype: np.dtype,
                  num_actions: int) -> TrainBatch:
    """A minibatch of random frames, actions and targets, shaped like the trainer's."""
    values = torch.randn(size, generator=rng)
    return TrainBatch(obs=_random_obs(rng, size, obs_shape, obs_dtype),
                      actions=torch.randint(0, num_actions, (size,), generator=rng),
                      logprobs=torch.full((size,), -math.log(num_actions)), values=values,
                      advantages=torch.randn(size, generator=rng),
                      returns=values + 0.1 * torch.randn(size, generator=rng))


def limit_sps(forward_rate: float, train_rate: float, n_epochs: int) -> float:
    """Env steps per second when every step costs one inference sample plus `n_epochs` training samples."""
    return 1.0 / (1.0 / forward_rate + n_epochs / train_rate)


def format_table(result: dict[str, Any]) -> str:
    """A small aligned table of a `measure_compute_limit` result."""
    rows = [
        ("network", f"{result['model']} ({result['parameters']:,} parameters), "
                    f"obs {tuple(result['obs_shape'])}"),
        ("precision / threads", f"{result['precision']} / {result['threads']}"),
        ("forward rate", f"{result['forward_rate']:,.0f} samples/s at batch {result['rollout_batch']} "
                         f"({result['forward_iters']} iters in {result['forward_seconds']:.1f} s, "
                         f"median {result['forward_ms_median']:.1f} ms)"),
        ("train rate", f"{result['train_rate']:,.0f} samples/s at minibatch {result['minibatch']} "
                       f"({result['train_iters']} iters in {result['train_seconds']:.1f} s, "
                       f"median {result['train_ms_median']:.1f} ms)"),
        ("compute limit", f"{result['limit_sps']:,.0f} env steps/s with {result['n_epochs']} epochs "
                          "= 1 / (1/forward + epochs/train)"),
    ]
    if result["other_load_cores"] > BUSY_CORES:
        rows.append(("WARNING", f"other processes kept {result['other_load_cores']:.2f} cores busy; "
                                "these rates understate a quiet machine"))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)
