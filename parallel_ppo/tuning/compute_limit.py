"""The compute limit of PPO on this machine: how fast the bare network runs, with no envs and no trainer.

Each env step costs one forward pass (batched over the envs stepped together) plus `n_epochs` training
samples (forward, loss, backward, clip, Adam on minibatches), so no trainer of the same network can exceed

    limit_sps = 1 / (1 / forward_rate + n_epochs / train_rate)

env steps per second. `measure_compute_limit` measures both rates on random uint8 observations with the
model, optimizer, precision and thread count the trainer would use, so a trainer's SPS can be judged as a
fraction of the limit measured in the same sitting.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from parallel_ppo.core.config import Config
from parallel_ppo.core.distributions import gaussian_log_prob
from parallel_ppo.core.model import autocast, kept_casts, learner_device
from parallel_ppo.core.ppo import TrainBatch, anchor_pass, anchored, build_learner, minibatch_step, ppo_loss
from parallel_ppo.envs.spaces import EnvSpaces
from parallel_ppo.errors import ConfigError
from parallel_ppo.tuning.other_load import OtherLoad

_POOL = 4
"""Distinct random inputs cycled through, so one batch does not sit in cache between iterations."""

BUSY_BUDGET = 3
"""A measurement on one thread beside other work (`on_one_thread`) takes this many times the run's budget: its
fastest iterations, which decide there, need enough iterations to include some the load left alone."""


def on_one_thread(measured: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`measured()` on one torch thread: how settings measured on several threads beside other work are ranked
    again (the run's compute limit stays the first measurement's). A multi-threaded step stalls whenever one of its
    threads loses its core (its partners spin, waiting), and settings with more steps per minibatch stall more, so
    that ranking is the load's: on our 2-core AMD EPYC beside two spinning processes, two threads ranked fp32 on
    whole minibatches 2.6x chunks of 64 and bf16 0.3-0.4x, where quietly they are 0.96x and 1.4-1.7x. One thread is
    slowed alike whatever it runs, and ranked these settings as two threads do on a quiet machine."""
    with threads_kept():
        torch.set_num_threads(1)
        return measured()


@contextlib.contextmanager
def threads_kept() -> Iterator[None]:
    """torch's thread count as it was before the block, put back after it."""
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def synchronizer(device: torch.device) -> Callable[[], None]:
    """What waits for `device`'s queued work, so that a timing measures the work and not its launch."""
    module = getattr(torch, device.type, None) if device.type in ("cuda", "xpu", "mps") else None
    return module.synchronize if module is not None else (lambda: None)


def _random_obs(rng: torch.Generator, batch: int, spaces: EnvSpaces) -> torch.Tensor:
    """`batch` random observations as the env gives them: uint8 frames, normal vectors, or packed dict rows."""
    if spaces.layout is not None:
        values = {p.key: _random_obs(rng, batch, EnvSpaces(p.shape, np.dtype(np.uint8 if p.image else np.float32),
                                                           spaces.actions)).numpy() for p in spaces.layout.parts}
        return torch.from_numpy(spaces.layout.pack(values))
    if spaces.obs_dtype == np.uint8:
        return torch.randint(0, 256, (batch, *spaces.obs_shape), dtype=torch.uint8, generator=rng)
    return torch.randn((batch, *spaces.obs_shape), generator=rng)


def timed_loop(step: Callable[[int], None], seconds: float, warmup_iters: int, min_iters: int) -> list[float]:
    """Call `step(i)` `warmup_iters` times untimed, then until `seconds` have passed (at least `min_iters`);
    returns the timed iterations' durations in seconds."""
    for i in range(warmup_iters):
        step(i)
    durations: list[float] = []
    start = time.perf_counter()
    while len(durations) < min_iters or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        step(warmup_iters + len(durations))
        durations.append(time.perf_counter() - t0)
    return durations


@dataclass(frozen=True)
class Candidate:
    """A learner setting the measurement can compare: arithmetic precision and forward/backward chunk."""

    precision: str
    microbatch_size: int

    @property
    def label(self) -> str:
        return f"{self.precision}/{self.microbatch_size or 'whole'}"


def fixed_candidate(cfg: Config) -> Candidate:
    """The config's own setting (both fields must be resolved: not `auto`)."""
    t = cfg.training
    if t.precision == "auto" or t.microbatch_size == "auto":
        raise ValueError("resolve training.precision and training.microbatch_size first (learner_settings)")
    return Candidate(t.precision, t.microbatch_size)


class NetworkSteps:
    """One timed iteration of the learner's network for `measure_compute_limit`, on a model and inputs built
    as the trainer builds them: `timed_forward` times the forward pass, `train(candidate)` gives the training step."""

    def __init__(self, cfg: Config, spaces: EnvSpaces, forward_batch: int) -> None:
        self.cfg, self.device = cfg, learner_device(cfg)
        with torch.random.fork_rng(devices=[]):  # the trainer's initialization, without touching the caller's RNG
            torch.manual_seed(cfg.run.seed)
            self.model, self.optimizer = build_learner(spaces, cfg, self.device)
        self.model.train()
        rng = torch.Generator().manual_seed(cfg.run.seed)
        self.inputs = [_random_obs(rng, forward_batch, spaces).to(self.device) for _ in range(_POOL)]
        self.batches = [_random_batch(rng, cfg.training.batch_size, spaces, regularized(cfg)).to(self.device)
                        for _ in range(_POOL)]
        self.sync = synchronizer(self.device)

    def timed_forward(self, precision: str, seconds: float, warmup_iters: int, min_iters: int) -> list[float]:
        """`timed_loop` of the forward pass in `precision`, its bf16 weight casts kept from one pass to the next, as
        a rollout keeps them (`kept_casts`)."""
        def step(i: int) -> None:
            with torch.no_grad(), autocast(precision, self.device.type):
                self.model(self.inputs[i % _POOL])
            self.sync()
        with kept_casts(precision, self.device.type):
            return timed_loop(step, seconds, warmup_iters, min_iters)

    def train(self, candidate: Candidate) -> Callable[[int], None]:
        tcfg = dataclasses.replace(self.cfg.training, precision=candidate.precision,
                                   microbatch_size=candidate.microbatch_size)

        def step(i: int) -> None:
            batch = self.batches[i % _POOL]
            if anchors(self.cfg) == "minibatch":  # its pass before each step, as ppo_update runs it
                batch = anchored(self.model, batch, tcfg)
            minibatch_step(self.model, self.optimizer, batch, tcfg)
            self.sync()
        return step


def measure_compute_limit(cfg: Config, spaces: EnvSpaces, seconds: float = 20.0, *, rollout_batch: int | None = None,
                          warmup_iters: int = 3, min_iters: int = 3,
                          candidates: list[Candidate] | None = None, rounds: int = 1) -> dict[str, Any]:
    """Measure the bare network's inference and training rates and the PPO compute limit they imply.

    - forward: `model(obs)` under `torch.no_grad()` and the autocast of the precision, on `rollout_batch`
      observations (default `cfg.env.num_envs`, the envs the sequential trainer steps per forward);
    - train: one PPO minibatch step (`minibatch_step`: forward, loss, backward, grad-norm clip, Adam step) on
      `cfg.training.batch_size` samples.

    `candidates` (default: the config's own setting) are measured in `rounds` interleaved rounds, so that a
    slow spell of the machine does not fall on one of them alone; forward once per precision. Rates are
    batch / median iteration time, and each round's own compute limit is under `round_sps` (for paired
    comparisons). `seconds` is the timed budget, a fifth of it for the forward passes and the rest for training;
    warm-up iterations come on top and are not counted. The model and optimizer are built as the trainer builds
    them (same seed, `build_learner`, on `cfg.training.device`) and run with the torch thread count the caller
    has set. Returns the fastest candidate's figures (a JSON-serializable dict)
    with every candidate's rates under `candidates`.
    """
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
        raise ConfigError(f"measurement seconds must be a positive number, got {seconds!r}")
    forward_batch = cfg.env.num_envs if rollout_batch is None else rollout_batch
    minibatch = cfg.training.batch_size
    if forward_batch <= 0 or minibatch <= 0:
        raise ConfigError(f"batch sizes must be positive, got rollout batch {forward_batch}, minibatch {minibatch}")
    candidates = candidates or [fixed_candidate(cfg)]
    steps = NetworkSteps(cfg, spaces, forward_batch)
    forward, train, load = _time_candidates(steps, candidates, seconds, rounds, warmup_iters, min_iters)
    rates = {c: rate_figures(forward[c.precision], train[c], forward_batch, minibatch, cfg.training.n_epochs)
             for c in candidates}
    best = max(candidates, key=lambda c: rates[c]["limit_sps"])
    return {
        **rates[best], "n_epochs": cfg.training.n_epochs,
        "rollout_batch": forward_batch, "minibatch": minibatch, "precision": best.precision,
        "microbatch_size": best.microbatch_size, "device": str(steps.device), "threads": torch.get_num_threads(),
        "warmup_iters": warmup_iters, "rounds": rounds, "other_load_cores": load.cores,
        "candidates": {c.label: rates[c] for c in candidates},
        "model": type(steps.model).__name__, "parameters": sum(p.numel() for p in steps.model.parameters()),
        "obs_shape": list(spaces.obs_shape), "actions": spaces.actions.to_dict(), "env_id": cfg.env.id,
        "torch": torch.__version__,
    }


Rounds = list[list[float]]
"""Iteration times (s), one list per interleaved round."""


def _time_candidates(steps: NetworkSteps, candidates: list[Candidate], seconds: float, rounds: int, warmup_iters: int,
                     min_iters: int) -> tuple[dict[str, Rounds], dict[Candidate, Rounds], OtherLoad]:
    """Each precision's forward and each candidate's training iteration times (s), a list per round, over `rounds`
    interleaved rounds sharing `seconds` (a fifth for the forwards), in reverse order every other round (ABBA: a
    drift of the machine's speed favours no candidate), warm-up in the first round only; with the load of other
    processes meanwhile."""
    precisions = list(dict.fromkeys(c.precision for c in candidates))
    forward: dict[str, Rounds] = {p: [] for p in precisions}
    train: dict[Candidate, Rounds] = {c: [] for c in candidates}
    forward_share = seconds / 5 / (len(precisions) * rounds)
    train_share = seconds * 4 / 5 / (len(candidates) * rounds)
    with OtherLoad() as load:
        for r in range(rounds):
            warm, order = (warmup_iters if r == 0 else 0), (-1 if r % 2 else 1)
            for p in precisions[::order]:
                forward[p].append(steps.timed_forward(p, forward_share, warm, min_iters))
            for c in candidates[::order]:
                train[c].append(timed_loop(steps.train(c), train_share, warm, min_iters))
    return forward, train, load


def for_candidate(result: dict[str, Any], candidate: Candidate) -> dict[str, Any]:
    """A `measure_compute_limit` result told from another of its candidates' point of view."""
    return {**result, **result["candidates"][candidate.label], "precision": candidate.precision,
            "microbatch_size": candidate.microbatch_size}


def rate_figures(forward: Rounds, train: Rounds, forward_batch: int, minibatch: int, n_epochs: int) -> dict[str, Any]:
    """A candidate's rates (batch / median iteration time) and compute limit, from its timed iterations (a list per
    round), with each round's own compute limit under `round_sps` and the limit its fastest iterations imply under
    `best_sps` (other processes' load only ever adds time, so this is what load disturbs least)."""
    def limit(f: list[float], t: list[float]) -> float:
        return limit_sps(forward_batch / float(np.median(f)), minibatch / float(np.median(t)), n_epochs)

    every_f, every_t = sum(forward, []), sum(train, [])
    f_median, t_median = float(np.median(every_f)), float(np.median(every_t))
    return {"forward_rate": forward_batch / f_median, "train_rate": minibatch / t_median,
            "limit_sps": limit(every_f, every_t),
            "round_sps": [limit(f, t) for f, t in zip(forward, train, strict=True)],
            "best_sps": limit_sps(forward_batch / min(every_f), minibatch / min(every_t), n_epochs),
            "forward_ms_median": 1000 * f_median, "train_ms_median": 1000 * t_median, "forward_iters": len(every_f),
            "train_iters": len(every_t), "forward_seconds": sum(every_f), "train_seconds": sum(every_t)}


def extra_passes(cfg: Config) -> dict[str, bool]:
    """The update's work besides PPO's loss, for the learner measurement's cache key: the augmentation's
    regularizer (`regularized`), the anchor of the ratio (`anchors`) and the actor's prediction of the critic's own
    keys (`training.predict_privileged`)."""
    passes = (("augment_regularizer", regularized(cfg)), ("anchor", anchors(cfg) == "minibatch"),
              ("predict_privileged", cfg.training.predict_privileged > 0))
    return {k: True for k, on in passes if on}


def anchors(cfg: Config) -> str:
    """`ppo.anchor_pass` of `cfg`'s update, its workers' lag read from the config (`parallel.lag`)."""
    decoupled = bool(cfg.parallel.lag and cfg.parallel.decoupled_clip)
    return anchor_pass(cfg.training, bool(cfg.training.augment_shift), decoupled)


def regularized(cfg: Config) -> bool:
    """Whether the update runs the augmentation's regularizer (another forward and backward pass a minibatch)."""
    return bool(cfg.training.augment_shift and cfg.training.augment_regularizer)


def _random_batch(rng: torch.Generator, size: int, spaces: EnvSpaces, shifted: bool = False) -> TrainBatch:
    """A minibatch of random frames, actions and targets, shaped like the trainer's; with `shifted`, other frames
    for the augmentation's regularizer too (`training.augment_regularizer`), whose pass the step then runs."""
    values = torch.randn(size, generator=rng)
    space = spaces.actions
    if space.continuous:
        taken = torch.randn((size, space.n), generator=rng)
        logprobs = gaussian_log_prob(torch.zeros(size, 2 * space.n), taken)[0]  # under N(0, 1)
    else:
        taken = torch.randint(0, space.n, (size,), generator=rng)
        logprobs = torch.full((size,), -math.log(space.n))
    return TrainBatch(obs=_random_obs(rng, size, spaces), actions=taken, logprobs=logprobs,
                      values=values,
                      advantages=torch.randn(size, generator=rng),
                      returns=values + 0.1 * torch.randn(size, generator=rng),
                      shifted=_random_obs(rng, size, spaces) if shifted else None)


def limit_sps(forward_rate: float, train_rate: float, n_epochs: int) -> float:
    """Env steps per second when every step costs one inference sample plus `n_epochs` training samples."""
    return 1.0 / (1.0 / forward_rate + n_epochs / train_rate)


PEAK_SIZE = 2048
"""Largest square matmul size for the arithmetic peak (2048³: 17 GFLOP per product, within 3% of 4096³ on our
CPUs)."""


def matmul_peak(dtype: torch.dtype, seconds: float = 1.0, device: torch.device | str = "cpu") -> float:
    """GFLOP/s of a square matrix product in `dtype` with the current threads: the arithmetic peak that a network's
    achieved FLOP/s is judged against. The size doubles from 256 up to PEAK_SIZE while a product stays short, so a
    dtype this CPU has no fast path for (bf16 without AVX-512: ~1 GFLOP/s, 13 s a 2048² product) still takes
    about `seconds`."""
    sync = synchronizer(torch.device(device))
    n = 256
    while True:
        a, b = torch.randn(n, n, dtype=dtype, device=device), torch.randn(n, n, dtype=dtype, device=device)
        torch.mm(a, b)  # warm-up
        sync()
        start = time.perf_counter()
        torch.mm(a, b)
        sync()
        if n >= PEAK_SIZE or 8 * (time.perf_counter() - start) > seconds / 3:  # the next size costs 8×
            break
        n *= 2

    def step(i: int) -> None:
        torch.mm(a, b)
        sync()
    return 2 * n**3 / float(np.median(timed_loop(step, seconds, 0, 3))) / 1e9


def network_flops(cfg: Config, spaces: EnvSpaces) -> dict[str, float]:
    """FLOPs of the network per sample, counted by torch's FlopCounterMode (matrix products and convolutions):
    `forward_flops` to act, `train_flops` for the PPO loss's forward and backward, and `flops_per_env_step`
    = forward + n_epochs × train, the work one collected env step costs the trainer."""
    from torch.utils.flop_counter import FlopCounterMode

    batch = 4
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.run.seed)
        model, _ = build_learner(spaces, cfg)
    rng = torch.Generator().manual_seed(0)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(_random_obs(rng, batch, spaces))
    forward = counter.get_total_flops() / batch
    fp32 = dataclasses.replace(cfg.training, precision="fp32")
    with FlopCounterMode(display=False) as counter:
        loss, _ = ppo_loss(model, _random_batch(rng, batch, spaces, regularized(cfg)), fp32)
        loss.backward()
    train = counter.get_total_flops() / batch + (forward if anchors(cfg) == "minibatch" else 0)  # its anchor's
    return {"forward_flops": forward, "train_flops": train,  # the anchor once a rollout: one more forward a step
            "flops_per_env_step": forward * (2 if anchors(cfg) == "rollout" else 1) + cfg.training.n_epochs * train}
