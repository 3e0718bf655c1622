"""The one training loop, shared by every mode: collect → GAE → update → hooks, bounded by time or steps."""

from __future__ import annotations

import signal
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from parallel_ppo.runs import fingerprint
from parallel_ppo.core.buffer import RolloutBuffer, compute_gae
from parallel_ppo.core.checkpoint import next_resume_count, save_checkpoint
from parallel_ppo.core.collect import CollectResult, RolloutError
from parallel_ppo.core.config import Config, ConfigError
from parallel_ppo.engines.distributed import ALONE, Solo, checksum
from parallel_ppo.core.evaluate import EvalResult, evaluate, normalized_return
from parallel_ppo.core.files import write_json
from parallel_ppo.runs.metrics import MetricsLogger, ResourceSampler
from parallel_ppo.core.model import learner_device, module_device
from parallel_ppo.core.ppo import TrainBatch, build_learner, ppo_update
from parallel_ppo.core.reward_scale import RewardScaler
from parallel_ppo.runs.reading import RunSummary, read_metrics, steady_sps
from parallel_ppo.core.timing import PHASES, PhaseTimer


class RolloutSource(Protocol):
    """Where rollouts come from: the sequential collector or the parallel coordinator."""

    mode: str
    buffer: RolloutBuffer
    obs_shape: tuple[int, ...]
    num_actions: int
    layout: dict[str, int]
    """num_workers, num_envs_per_worker and num_envs, as summary.json records them."""
    restarts: int
    """Worker processes restarted so far (0 for a source without workers)."""

    def collect(self, model: nn.Module, timers: PhaseTimer) -> CollectResult:
        """Fill `buffer` with one rollout of `model`, adding the phases it spent to `timers`."""
        ...

    def close(self) -> None: ...


class StopRequest:
    """SIGINT/SIGTERM handler: the first signal asks the loop to stop at the next boundary, a second interrupts
    (unless `repeat_interrupts` is off: a rank of a distributed run that gets a second signal, e.g. SIGTERM when
    torchrun dies after passing on a Ctrl-C, must still stop with the others at the agreed update; torchrun
    kills ranks that take more than 30 s)."""

    def __init__(self, repeat_interrupts: bool = True) -> None:
        self.signum: int | None = None
        self.repeat_interrupts = repeat_interrupts
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopRequest:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum is not None:
            if self.repeat_interrupts:
                raise KeyboardInterrupt
            return
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


@dataclass
class TrainState:
    """Everything a resumed run carries on with: the learner, its random streams, counters and episode windows."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    generator: torch.Generator
    """Draws the minibatch permutations."""
    episode_returns: deque[float]
    episode_lengths: deque[int]
    reward_scaler: RewardScaler | None
    """Present when `training.normalize_reward` is on."""
    update: int = 0
    env_steps: int = 0
    episodes: int = 0
    elapsed_before: float = 0.0
    """Wall seconds of the sessions before this one (a resumed run)."""
    resumes: int = 0

    @classmethod
    def new(cls, cfg: Config, obs_shape: tuple[int, ...], num_actions: int, world_size: int = 1) -> TrainState:
        """A fresh learner; the reward scaler follows the envs of all `world_size` ranks."""
        torch.manual_seed(cfg.run.seed)
        model, optimizer = build_learner(obs_shape, num_actions, cfg, learner_device(cfg))
        window = cfg.logging.return_window
        t = cfg.training
        scaler = RewardScaler(cfg.env.num_envs * world_size, t.gamma, t.reward_clip) if t.normalize_reward else None
        return cls(model, optimizer, torch.Generator().manual_seed(cfg.run.seed), deque(maxlen=window),
                   deque(maxlen=window), scaler)

    @classmethod
    def from_checkpoint(cls, cfg: Config, obs_shape: tuple[int, ...], num_actions: int,
                        checkpoint: dict[str, Any], world_size: int = 1) -> TrainState:
        """The state saved by `to_checkpoint`, with one more resume counted."""
        state = cls.new(cfg, obs_shape, num_actions, world_size)
        state.model.load_state_dict(checkpoint["model"])
        state.optimizer.load_state_dict(checkpoint["optimizer"])
        state.generator.set_state(checkpoint["generator"])
        torch.set_rng_state(checkpoint["torch_rng"])
        state.episode_returns.extend(checkpoint["episode_returns"])
        state.episode_lengths.extend(checkpoint["episode_lengths"])
        if state.reward_scaler is not None and checkpoint.get("reward_scaler") is not None:
            state.reward_scaler.load_state_dict(checkpoint["reward_scaler"])
        state.update, state.env_steps = checkpoint["update"], checkpoint["env_steps"]
        state.episodes, state.elapsed_before = checkpoint["episodes"], checkpoint["elapsed"]
        state.resumes = next_resume_count(checkpoint)
        return state

    def to_checkpoint(self, cfg: Config, mode: str, elapsed: float, world_size: int = 1) -> dict[str, Any]:
        """Tensors and plain data only (checkpoints are loaded with weights_only=True). In a distributed run the
        ranks hold the same state (parameters, optimizer, minibatch stream, global counters and episode windows,
        one reward scaler over all envs), so rank 0's checkpoint is the run's."""
        return {
            "world_size": world_size,
            "config": cfg.to_dict(), "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "update": self.update, "env_steps": self.env_steps, "episodes": self.episodes, "elapsed": elapsed,
            "episode_returns": list(self.episode_returns), "episode_lengths": list(self.episode_lengths),
            "generator": self.generator.get_state(), "torch_rng": torch.get_rng_state(),
            "resumes": self.resumes, "mode": mode,
            "reward_scaler": self.reward_scaler.state_dict() if self.reward_scaler is not None else None,
        }

    def record(self, result: CollectResult, steps: int) -> None:
        """Count one finished update and the episodes its rollout completed."""
        self.update += 1
        self.env_steps += steps
        self.episodes += len(result.episode_returns)
        self.episode_returns.extend(result.episode_returns)
        self.episode_lengths.extend(result.episode_lengths)


class Clock:
    """The run's elapsed seconds, counting the sessions before a resume."""

    def __init__(self, elapsed_before: float) -> None:
        self.start = time.monotonic() - elapsed_before
        self.elapsed_before = elapsed_before

    def __call__(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.start


class Hook(Protocol):
    """Periodic work after each update: evaluation, logging, checkpoints. Its time counts as `phase` in the next
    update's row."""

    phase: str

    def after_update(self, state: TrainState, row: dict[str, Any]) -> None: ...


class EvalHook:
    """Every `eval.interval_seconds`, plays the learner's policy on fresh envs of its own (held-out test levels by
    default) and adds `test_return_mean` to that update's row; `final` evaluates once more at the end."""

    phase = "eval"

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.last = time.monotonic()
        self.result: EvalResult | None = None
        self.at_update = -1

    def after_update(self, state: TrainState, row: dict[str, Any]) -> None:
        if time.monotonic() - self.last >= self.cfg.eval.interval_seconds:
            row["test_return_mean"] = self.run(state).mean

    def run(self, state: TrainState) -> EvalResult:
        e = self.cfg.eval
        self.result = evaluate(state.model, self.cfg, e.levels, e.episodes, e.num_envs, e.deterministic,
                               self.cfg.run.seed, stream=state.update)  # a new set of levels each time
        self.at_update, self.last = state.update, time.monotonic()
        return self.result

    def final(self, state: TrainState) -> EvalResult | None:
        """The evaluation of the final policy (run now unless the last update already had one)."""
        return self.result if self.at_update == state.update else self.run(state)


class MetricsHook:
    """Samples CPU and memory into each update's row, then writes it to metrics.csv, TensorBoard and the
    progress line."""

    phase = "log"

    def __init__(self, cfg: Config, run_dir: Path, mode: str, resume_after: tuple[int, int] | None) -> None:
        self.sampler = ResourceSampler()
        self.logger = MetricsLogger(run_dir, cfg.logging.tensorboard, cfg.logging.progress,
                                    cfg.run.duration * 3600, cfg.run.total_steps, mode, resume_after)
        self.cpu_samples: list[float] = []

    def after_update(self, state: TrainState, row: dict[str, Any]) -> None:
        resources = self.sampler.sample()
        self.cpu_samples.append(resources["cpu_percent"])
        self.logger.log({**row, **resources})

    def close(self) -> None:
        self.sampler.close()
        self.logger.close()


class CheckpointHook:
    """Writes checkpoint.pt (atomically) every `run.checkpoint_interval` seconds; `save` writes one now."""

    phase = "log"

    def __init__(self, cfg: Config, path: Path, mode: str, clock: Clock, world_size: int = 1) -> None:
        self.cfg, self.path, self.mode, self.clock, self.world_size = cfg, path, mode, clock, world_size
        self.last = time.monotonic()

    def after_update(self, state: TrainState, row: dict[str, Any]) -> None:
        if time.monotonic() - self.last >= self.cfg.run.checkpoint_interval:
            self.save(state)

    def save(self, state: TrainState) -> None:
        save_checkpoint(self.path, state.to_checkpoint(self.cfg, self.mode, self.clock(), self.world_size))
        self.last = time.monotonic()


@dataclass
class Outcome:
    """How the loop ended, and where this session's time went."""

    stop_reason: str = ""
    error: str | None = None
    signal: str | None = None
    session_seconds: float = 0.0
    phase_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))

    def add_phases(self, phases: dict[str, float]) -> None:
        for name in PHASES:
            self.phase_seconds[name] += phases[name]


def rollout_batch(buf: RolloutBuffer, cfg: Config, scaler: RewardScaler | None = None,
                  team: Solo = ALONE) -> TrainBatch:
    """GAE over the filled buffer (rewards normalized by `scaler` if given, plus any time-limit bootstrap),
    flattened to one row per env step. The scaler sees every rank's rewards, so it normalizes as one process
    stepping all the envs would."""
    rewards = buf.rewards
    if scaler is not None:
        rewards = team.own_columns(scaler(team.gather_columns(buf.rewards), team.gather_columns(buf.dones)))
    advantages, returns = compute_gae(rewards + buf.bootstrap, buf.values, buf.dones, buf.last_values,
                                      cfg.training.gamma, cfg.training.gae_lambda)
    return TrainBatch(buf.obs.flatten(0, 1), buf.actions.flatten(), buf.logprobs.flatten(), buf.values.flatten(),
                      advantages.flatten(), returns.flatten())


def stop_reason(cfg: Config, state: TrainState, stop: StopRequest, elapsed: float) -> str:
    """Why the run stops after this update ("" = it goes on)."""
    if stop.signum is not None:
        return "signal"
    if cfg.run.total_steps and state.env_steps >= cfg.run.total_steps:
        return "total_steps"
    if elapsed >= cfg.run.duration * 3600:
        return "duration"
    return ""


@dataclass
class Shared:
    """What the ranks agree on after a rollout (alone: the rollout as it is)."""

    result: CollectResult
    """Every rank's episodes, in rank order."""
    error: str | None
    """Any rank's error (named by its rank in a team)."""
    signum: int | None
    """A signal any rank received."""
    started: float
    """Rank 0's elapsed seconds when the rollout began: the clock an annealed learning rate follows, so that
    every rank steps with the same rate."""


def share_rollout(team: Solo, result: CollectResult, error: str | None, signum: int | None,
                  started: float) -> Shared:
    """One exchange after every rollout: episodes, errors, signals and rank 0's clock."""
    reports = team.gather((error, signum, started, result.episode_returns, result.episode_lengths))
    errors = [e if team.world_size == 1 else f"rank {rank}: {e}" for rank, (e, *_) in enumerate(reports) if e]
    merged = CollectResult([r for report in reports for r in report[3]], [n for report in reports for n in report[4]],
                           result.time_env, result.time_inference)
    return Shared(merged, "; ".join(errors) or None, max((r[1] for r in reports if r[1]), default=None), reports[0][2])


def run_loop(cfg: Config, source: RolloutSource, state: TrainState, hooks: list[Hook], stop: StopRequest,
             clock: Clock, team: Solo = ALONE) -> Outcome:
    """Update until a stop reason holds: collect, GAE, PPO update, then each hook with the update's row.

    In a distributed run every decision is the team's: an error or signal after any rank's rollout, and the
    stop reason after each update, so all ranks stop at the same update. The time spent waiting on the other
    ranks is `sync`, the update's all-reduces `allreduce` (not `update`)."""
    outcome, timers = Outcome(), PhaseTimer()
    device = module_device(state.model)
    training = team.local_training(cfg)
    steps = cfg.rollout_size * team.world_size
    last_row = time.monotonic()
    while not outcome.stop_reason:
        started, error = clock(), None
        try:
            result = source.collect(state.model, timers)
        except RolloutError as e:
            result, error = CollectResult([], [], 0.0, 0.0), str(e)
        with timers.phase("sync"):
            shared = share_rollout(team, result, error, stop.signum, started)
        if shared.error is not None:
            outcome.stop_reason, outcome.error = "error", shared.error
            outcome.signal = signal.Signals(shared.signum).name if shared.signum else None
            break
        if shared.signum is not None:  # abandon this rollout rather than spend an update on it
            outcome.stop_reason, outcome.signal = "signal", signal.Signals(shared.signum).name
            break
        lr = learning_rate(cfg, state.env_steps, shared.started)
        for group in state.optimizer.param_groups:
            group["lr"] = lr
        with timers.phase("gae"):
            data = rollout_batch(source.buffer, cfg, state.reward_scaler, team).to(device)
        with timers.phase("update"):
            stats = ppo_update(state.model, state.optimizer, data, training, state.generator, team.gradients)
        allreduce = team.pop_seconds()
        timers.add("update", -allreduce)
        timers.add("allreduce", allreduce)
        state.record(shared.result, steps)
        now = time.monotonic()
        phases = timers.pop()
        outcome.add_phases(phases)
        row = {"update": state.update, "env_steps": state.env_steps, "wall_time": clock(now),
               "sps": steps / max(now - last_row, 1e-9),  # logging and checkpoints included
               "episodic_return_mean": _mean(state.episode_returns),
               "episodic_length_mean": _mean(state.episode_lengths), "episodes": state.episodes,
               "learning_rate": lr, **stats, **{f"time_{name}": seconds for name, seconds in phases.items()},
               "worker_restarts": source.restarts}
        for hook in hooks:  # counted in the next row: this row's clock stopped at `now`
            with timers.phase(hook.phase):
                hook.after_update(state, row)
        last_row = now
        with timers.phase("sync"):
            outcome.stop_reason, signum = team.agree_stop(stop_reason(cfg, state, stop, clock(now)), stop.signum)
        if signum is not None:
            outcome.signal = signal.Signals(signum).name
    outcome.session_seconds = clock() - clock.elapsed_before
    outcome.add_phases(timers.pop())
    return outcome


def train(cfg: Config, source: RolloutSource, run_dir: Path, threads: dict[str, int],
          resume: dict | None = None, compute_limit: dict | None = None, learner: dict | None = None,
          roofline: dict | None = None, team: Solo = ALONE) -> dict:
    """Train until the duration or step budget is spent (or a signal arrives); returns summary.json's content.

    `resume` is a loaded checkpoint: model, optimizer, counters, RNG states, episode window and elapsed
    time carry on from it, and metrics rows logged after it are dropped so the CSV stays continuous.
    `compute_limit` (from `roofline.measure_compute_limit`) is recorded with the run's efficiency against it,
    `learner` (how precision, microbatch and device were chosen) as is, and `roofline` (the network's FLOPs
    and the matmul peaks) with the FLOP/s the run achieved.

    In a distributed run (`team`), every rank starts from rank 0's parameters and trains in step with the
    others; only rank 0 writes (metrics, TensorBoard, checkpoints, evaluation, summary.json with every rank's
    layout and parameter checksum), and the other ranks return only how the run ended. A lost rank raises
    `distributed.PeerLost` (the last checkpoint stays as it was).
    """
    run_dir = Path(run_dir)
    world = team.world_size
    if resume is None:
        state = TrainState.new(cfg, source.obs_shape, source.num_actions, world)
    else:
        state = TrainState.from_checkpoint(cfg, source.obs_shape, source.num_actions, resume, world)
    team.broadcast_parameters(state.model)
    clock = Clock(state.elapsed_before)
    mode = "distributed" if team.distributed else source.mode
    metrics = checkpoints = evals = None
    if team.is_main:
        metrics = MetricsHook(cfg, run_dir, mode, (state.update, state.env_steps) if resume is not None else None)
        checkpoints = CheckpointHook(cfg, run_dir / "checkpoint.pt", mode, clock, world)
        evals = EvalHook(cfg) if cfg.eval.interval_seconds > 0 else None
    final_eval = None
    try:
        with StopRequest(repeat_interrupts=not team.distributed) as stop:
            hooks = [hook for hook in (evals, metrics, checkpoints) if hook is not None]
            outcome = run_loop(cfg, source, state, hooks, stop, clock, team)
            if checkpoints is not None:  # first: a rank lost now cannot cost the finished updates
                checkpoints.save(state)
            ranks = team.gather({"rank": team.rank, "host": team.host, **source.layout,
                                 "source": source.mode, "threads": threads, "checksum": checksum(state.model),
                                 "phase_seconds": outcome.phase_seconds}) if team.distributed else None
            if evals is not None and outcome.stop_reason in ("duration", "total_steps"):
                final_eval = evals.final(state)  # after the clock stopped: not in wall time or SPS
    finally:
        if metrics is not None:
            metrics.close()
        source.close()
    if metrics is None:  # not rank 0: how the run ended is all it reports
        return {"stop_reason": outcome.stop_reason, "signal": outcome.signal, "error": outcome.error}
    summary = summarize(cfg, source, state, outcome, metrics, threads, compute_limit, run_dir, final_eval, learner,
                        roofline, ranks).to_dict()
    write_json(run_dir / "summary.json", summary)
    return summary


def summarize(cfg: Config, source: RolloutSource, state: TrainState, outcome: Outcome, metrics: MetricsHook,
              threads: dict[str, int], compute_limit: dict | None, run_dir: Path,
              final_eval: EvalResult | None = None, learner: dict | None = None,
              roofline: dict | None = None, ranks: list[dict] | None = None) -> RunSummary:
    """summary.json's content, its throughput read back from metrics.csv as every reader computes it.

    A distributed run (`ranks`: each rank's layout, threads, checksum and phase seconds) counts the envs and
    workers of all ranks, and its phases are rank 0's."""
    wall = outcome.session_seconds
    try:
        rows = read_metrics(run_dir / "metrics.csv")
        sps = steady_sps(rows["env_steps"], rows["wall_time"])
    except ConfigError:  # no update finished
        sps = None
    peaks = metrics.sampler.peaks
    train_return = _mean(state.episode_returns) if state.episode_returns else None
    test_return = final_eval.mean if final_eval is not None else None
    flops = roofline["flops_per_env_step"] if roofline else None
    peak = roofline["peak_gflops"][cfg.training.precision] if roofline else None
    achieved = sps * flops / 1e9 if flops and sps else None
    layout = dict(source.layout)
    if ranks is not None:
        layout["num_workers"] *= len(ranks)
        layout["num_envs"] *= len(ranks)
    return RunSummary(
        mode="distributed" if ranks else source.mode, env_id=cfg.env.id, **layout, total_env_steps=state.env_steps,
        wall_seconds=wall + state.elapsed_before, episodes=state.episodes, updates=state.update,
        stop_reason=outcome.stop_reason, precision=cfg.training.precision, peak_rss_mb=peaks["rss_mb"],
        hardware=fingerprint.hardware(), versions=fingerprint.versions(), sps=sps,
        overall_sps=state.env_steps / (wall + state.elapsed_before) if wall > 0 else None,
        episodic_return_mean=_mean(state.episode_returns) if state.episode_returns else None,
        episodic_length_mean=_mean(state.episode_lengths) if state.episode_lengths else None,
        error=outcome.error, signal=outcome.signal, threads=threads, peak_pss_mb=peaks["pss_mb"],
        peak_main_rss_mb=peaks["main_rss_mb"], peak_worker_rss_mb=peaks["worker_rss_mb"],
        mean_cpu_percent=float(np.mean(metrics.cpu_samples)) if metrics.cpu_samples else None,
        compute_limit=compute_limit,
        limit_efficiency=sps / compute_limit["limit_sps"] if compute_limit and sps else None,
        phase_seconds=outcome.phase_seconds,
        phase_fractions={k: v / wall for k, v in outcome.phase_seconds.items()} if wall > 0 else {},
        worker_restarts=source.restarts, resumes=state.resumes, seed=cfg.run.seed,
        normalized_return=normalized_return(cfg.env, train_return), test_return_mean=test_return,
        test_normalized_return=normalized_return(cfg.env, test_return),
        generalization_gap=train_return - test_return if train_return is not None and test_return is not None else None,
        eval_levels=cfg.eval.levels if final_eval is not None else None, learner=learner, roofline=roofline,
        flops_per_env_step=flops, achieved_gflops=achieved, peak_gflops=peak,
        peak_fraction=achieved / peak if achieved and peak else None,
        world_size=len(ranks) if ranks else 1,
        distributed={"source": source.mode, "num_envs_per_rank": source.layout["num_envs"],
                     "timeout_seconds": cfg.distributed.timeout_seconds, "ranks": ranks} if ranks else None,
    )
