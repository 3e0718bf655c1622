"""The one training loop, shared by every mode: collect → GAE → update → hooks, bounded by time or steps."""

from __future__ import annotations

import signal
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from parallel_ppo.core.augment import random_shift, update_generator
from parallel_ppo.core.buffer import RolloutBuffer, compute_gae, not_finite_error
from parallel_ppo.core.collect import CollectResult, RolloutError, StopCheck
from parallel_ppo.core.config import Config
from parallel_ppo.core.episodes import not_numbers_error
from parallel_ppo.core.group import ALONE, AgreedRollout, Group, agree_rollout
from parallel_ppo.core.metrics import metric
from parallel_ppo.core.model import module_device
from parallel_ppo.core.pause import pause_point
from parallel_ppo.core.ppo import TrainBatch, ppo_update, revalue_lagged
from parallel_ppo.core.reward_scale import RewardScaler
from parallel_ppo.core.stopping import StopRequest
from parallel_ppo.core.timing import PHASE_METRICS, PHASES, PhaseTimer
from parallel_ppo.core.train_state import SUCCESS_RATE, TrainState, mean_or_nan
from parallel_ppo.envs.spaces import EnvSpaces
from parallel_ppo.errors import one_line

UPDATE = metric("progress/update", "updates finished", tensorboard=False)
ENV_STEPS = metric("progress/env_steps", "env steps collected (all ranks); TensorBoard's step", tensorboard=False)
WALL_TIME = metric("progress/wall_time", "the run's elapsed seconds at the end of the update", tensorboard=False)
SPS = metric("charts/SPS", "the update's own env steps per second, logging and checkpoints included", column="sps")
EPISODIC_RETURN = metric("charts/episodic_return", "mean return of the last logging.return_window episodes",
                         column="episodic_return_mean")
EPISODIC_LENGTH = metric("charts/episodic_length", "mean length of the last logging.return_window episodes",
                         column="episodic_length_mean")
EPISODES = metric("progress/episodes", "episodes finished", tensorboard=False)
REWARD_PER_STEP = metric("charts/reward_per_step", "mean raw reward per env step of the update's rollout (all envs): "
                         "progress to see before the first episodes end")
LEARNING_RATE = metric("charts/learning_rate", "the update's learning rate")
WORKER_RESTARTS = metric("system/worker_restarts", "worker processes restarted so far", tensorboard=False)
LEARNER_THREADS = metric("system/learner_threads", "the learner's torch threads as its update ended: more than its "
                         "own where an overlapped learner took the cores of workers waiting for it "
                         "(parallel.idle_learner_threads)")
POLICY_LAG = metric("charts/policy_lag", "updates by which the parameters that collected the update's rollout trail "
                    "those it updates: 0 on-policy, 1 with parallel.overlap (after the first update; 0 with "
                    "policy_lag 0)", summary=True)
LAGGED_SHARE = metric("charts/lagged_share", "share of the update's env steps taken with older parameters than those "
                      "it updates: 0 on-policy; with parallel.overlap, those taken during the update before (and with "
                      "parallel.early_start, while the last workers ended the rollout before; at most "
                      "parallel.max_lagged_share of a worker's; all of them without parallel.refresh_params)",
                      summary=True)
LEARNED_SHARE = metric("charts/learned_share", "share of the rollout's env steps taken that the update learned from: 1 "
                       "but where parallel.drop_lagged left out the lagged ones", summary=True)
ROLLOUT_CUT = metric("charts/rollout_cut", "share of the rollout's env steps not taken because parallel.sync_fraction "
                     "or distributed.sync_fraction cut the slowest rollouts short (0 without)", summary=True)
LOOP_METRICS = (UPDATE, ENV_STEPS, WALL_TIME, SPS, EPISODIC_RETURN, EPISODIC_LENGTH, EPISODES, REWARD_PER_STEP,
                SUCCESS_RATE, LEARNING_RATE, WORKER_RESTARTS, LEARNER_THREADS, POLICY_LAG, LAGGED_SHARE, LEARNED_SHARE,
                ROLLOUT_CUT)
"""The loop's metrics (declared above, by the loop that computes them; the success rate by the train state's episode
windows), as the writers ask for them."""


class RolloutSource(Protocol):
    """Where rollouts come from: the sequential collector or the parallel coordinator."""

    mode: str
    buffer: RolloutBuffer
    spaces: EnvSpaces
    """The env's observation and action spaces (and a dict observation's layout)."""
    layout: dict[str, int]
    """num_workers, num_envs_per_worker and num_envs, as summary.json records them."""
    restarts: int
    """Worker processes restarted so far (0 for a source without workers)."""
    pace: Any
    """Which worker each rollout waited for (`engines.parallel.pace.WorkerPace`; None for a source without workers)."""
    policy_lag: int
    """Updates by which the parameters behind the rollout `collect` returned last trail the model it was given."""
    lagged_share: float
    """Of that rollout's env steps, the share taken with older parameters than the model it was given."""
    lagged: torch.Tensor | None
    """(T, N) bool: those steps (None: none)."""

    def collect(self, model: nn.Module, timers: PhaseTimer, stopping: StopCheck) -> CollectResult:
        """Point `buffer` at one rollout, collected by `model` (or, `policy_lag` updates behind, by the model of an
        earlier call), adding the phases it spent to `timers`; once `stopping()` is true, the rollout may end early
        (the loop then stops without using it)."""
        ...

    def during_update(self) -> None:
        """Called before each minibatch step of the update (an overlapped coordinator lends the learner the cores of
        workers that have collected the rollout in flight)."""
        ...

    def abandon_rollout(self) -> None:
        """End a rollout still in flight (the loop stopped before asking for it)."""
        ...

    def close(self) -> None: ...


def learning_rate(cfg: Config, env_steps: int, elapsed: float) -> float:
    """The configured rate, linearly annealed to 0 if enabled: over `anneal_steps` or `total_steps` when set (a
    schedule independent of the machine's speed), else over the duration."""
    lr = cfg.training.learning_rate
    if not cfg.training.anneal_lr:
        return lr
    if cfg.training.anneal_steps or cfg.run.total_steps:
        progress = env_steps / (cfg.training.anneal_steps or cfg.run.total_steps)
    else:
        progress = elapsed / (cfg.run.duration * 3600)
    return lr * max(0.0, 1.0 - progress)


class Clock:
    """The run's elapsed seconds, counting the sessions before a resume."""

    def __init__(self, elapsed_before: float) -> None:
        self.start = time.monotonic() - elapsed_before
        self.elapsed_before = elapsed_before

    def __call__(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.start


class Hook(Protocol):
    """Periodic work after each update: evaluation, logging, checkpoints. Its time counts as `phase` in the next
    update's row; an error it raises ends the run as a rollout's does, once every hook has had the row."""

    phase: str
    what: str
    """What it does, as its error names it ("the evaluation")."""

    def after_update(self, state: TrainState, row: dict[str, Any]) -> None: ...


@dataclass
class Outcome:
    """How the loop ended, and where this session's time went."""

    stop_reason: str = ""
    error: str | None = None
    trace: str | None = None
    """The traceback beneath `error`, where this process caught one (an env's, a worker's, a hook's)."""
    signal: str | None = None
    session_seconds: float = 0.0
    policy_lag: int = 0
    """The largest of this session's updates' policy lags."""
    phase_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))

    def add_phases(self, phases: dict[str, float]) -> None:
        for name in PHASES:
            self.phase_seconds[name] += phases[name]


def learned_rows(taken: torch.Tensor | None, source: RolloutSource,
                 drop_lagged: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The flat indices of the rollout's steps `taken` (`RolloutBuffer.taken`; None: every step) and of those the
    update learns from: the same, less the lagged ones with `drop_lagged` where they are at most half of them."""
    lagged, learned = source.lagged, taken
    if drop_lagged and lagged is not None and source.lagged_share <= 0.5:
        learned = ~lagged if taken is None else taken & ~lagged
    taken_rows = None if taken is None else taken.flatten().nonzero().squeeze(1)
    return taken_rows, taken_rows if learned is taken else learned.flatten().nonzero().squeeze(1)


def rollout_batch(buf: RolloutBuffer, cfg: Config, scaler: RewardScaler | None = None, group: Group = ALONE,
                  everyone: torch.Tensor | None = None) -> TrainBatch:
    """GAE over the filled buffer (rewards by their sign if `training.sign_rewards`, normalized by `scaler` if
    given, plus any time-limit bootstrap), flattened to one row per env step (the steps a cut rollout did not take,
    `RolloutBuffer.taken`, get advantage 0 and are not to be learned from). The scaler sees every rank's rewards and
    the steps they took (`everyone`: `AgreedRollout.taken`), so it normalizes as one process stepping all the envs
    would."""
    taken = buf.taken()
    rewards = buf.rewards.sign() if cfg.training.sign_rewards else buf.rewards
    if scaler is not None:
        rewards = group.own_columns(scaler(group.gather_columns(rewards), group.gather_columns(buf.dones),
                                           taken if group.world_size == 1 else everyone))
    advantages, returns = compute_gae(rewards + buf.bootstrap, buf.values, buf.dones, buf.last_values,
                                      cfg.training.gamma, cfg.training.gae_lambda, taken)
    return TrainBatch(buf.obs.flatten(0, 1), buf.actions.flatten(0, 1), buf.logprobs.flatten(), buf.values.flatten(),
                      advantages.flatten(), returns.flatten())


def stop_reason(cfg: Config, state: TrainState, stop: StopRequest, elapsed: float) -> str:
    """Why the run stops after this update ("" = it goes on). A run's first update is taken whatever its set-up
    took, which may outlast a short duration; a resumed run that met its budget before stops at once."""
    if stop.signum is not None:
        return "signal"
    if cfg.run.total_steps and state.env_steps >= cfg.run.total_steps:
        return "total_steps"
    budget = cfg.run.duration * 3600
    if elapsed >= budget and (state.update > 0 or state.elapsed_before >= budget):
        return "duration"
    return ""


def run_loop(cfg: Config, source: RolloutSource, state: TrainState, hooks: list[Hook], stop: StopRequest,
             clock: Clock, group: Group = ALONE) -> Outcome:
    """Update until a stop reason holds: collect, GAE, PPO update, then each hook with the update's row.

    In a distributed run every decision is the group's: an error or signal after any rank's rollout, and the
    stop reason after each update, so all ranks stop at the same update. The time spent waiting on the other
    ranks is `sync`, the update's all-reduces `allreduce` (not `update`)."""
    outcome, timers = Outcome(), PhaseTimer()
    last_row = now = time.monotonic()
    timers.add("log", max(0.0, clock(now) - clock.elapsed_before))  # the hooks' set-up since the clock started
    hook_error: tuple[str, str] | None = None  # a hook's error and its traceback
    while True:
        with timers.phase("sync"):  # before the first update too: a resumed run may have met its budget already
            reason = "error" if hook_error else stop_reason(cfg, state, stop, clock(now))
            outcome.stop_reason, signum = group.agree_stop(reason, stop.signum)
        if outcome.stop_reason:
            outcome.signal = signal.Signals(signum).name if signum else None
            if outcome.stop_reason == "error":  # only rank 0 has hooks
                outcome.error, outcome.trace = hook_error or (
                    "rank 0 stopped on an error after an update (its summary.json names it)", None)
            break
        started, error = clock(), None
        try:
            result = source.collect(state.model, timers, stop.requested)
        except RolloutError as e:
            result, error, outcome.trace = CollectResult([], [], 0.0, 0.0), str(e), e.trace
        else:
            error = not_finite_error(source.buffer, cfg.env.id, source.spaces.layout)
        with timers.phase("sync"):
            agreed = agree_rollout(group, result, source.buffer.lengths, error, stop.signum, started,
                                   cfg.env.num_envs)
        # every rank alike: the result has every rank's episodes
        error = agreed.error or not_numbers_error(agreed.result.not_numbers, cfg.env.id)
        if error is not None or agreed.signum is not None:  # a signal abandons the rollout, not its update
            outcome.stop_reason, outcome.error = "error" if error is not None else "signal", error
            outcome.signal = signal.Signals(agreed.signum).name if agreed.signum else None
            break
        steps_before = state.env_steps
        row = update(cfg, source, state, agreed, timers, group)
        outcome.policy_lag = max(outcome.policy_lag, source.policy_lag)
        now = time.monotonic()
        phases = timers.pop()
        outcome.add_phases(phases)
        row |= {WALL_TIME: clock(now), SPS: (state.env_steps - steps_before) / max(now - last_row, 1e-9),  # logs too
                **{PHASE_METRICS[name]: seconds for name, seconds in phases.items()}}
        hook_error = after_update(hooks, state, row, timers)  # counted in the next row: its clock stopped at `now`
        last_row = now
    outcome.session_seconds = clock() - clock.elapsed_before
    outcome.add_phases(timers.pop())
    return outcome


def after_update(hooks: list[Hook], state: TrainState, row: dict[str, Any],
                 timers: PhaseTimer) -> tuple[str, str] | None:
    """Each hook's work on the update's row, timed as its phase; the first error one raised, as one line, and its
    traceback (the hooks after it still run: the row is logged, the checkpoint written), which the loop stops on
    before the next rollout, so the run's last checkpoint and summary.json are written as after a worker's error."""
    error = None
    for hook in hooks:
        with timers.phase(hook.phase):
            try:
                hook.after_update(state, row)
            except Exception as e:  # any failure of its own work: an eval env that crashes, a full disk
                error = error or (f"{hook.what} after update {state.update} failed: {one_line(e)}",
                                  traceback.format_exc())
    return error


def update(cfg: Config, source: RolloutSource, state: TrainState, agreed: AgreedRollout, timers: PhaseTimer,
           group: Group) -> dict[str, Any]:
    """GAE and the PPO update on the rollout in `source.buffer`, counted into `state`; returns the update's row
    (its learning statistics and counters; the loop adds its clock and phases)."""
    lr = learning_rate(cfg, state.env_steps, agreed.started)
    for param_group in state.optimizer.param_groups:
        param_group["lr"] = lr
    taken_rows, rows = learned_rows(source.buffer.taken(), source, cfg.parallel.drop_lagged)
    everyone = agreed.taken(cfg.training.n_steps)
    with timers.phase("gae"):  # lagged steps dropped need no fresh values: they lead each env's rollout
        if cfg.parallel.fresh_values and source.lagged is not None and rows is taken_rows:
            revalue_lagged(state.model, source.buffer, source.lagged, group.local_training(cfg))
        if state.reward_scaler is not None:
            state.reward_scaler.start_episodes(agreed.result.fresh_envs)
        data = rollout_batch(source.buffer, cfg, state.reward_scaler, group, everyone).to(module_device(state.model))
    with timers.phase("update"):
        pause_point("update", state.update + 1)
        augment, draws = random_shift(cfg, source.spaces), None
        if augment is not None:  # every rank draws every env's shifts and takes its own: those of one process
            steps, envs = source.buffer.rewards.shape
            draws = group.own_columns(augment.draw(steps, envs * group.world_size, cfg.training.n_epochs,
                                                   update_generator(cfg.run.seed, state.update))).flatten(0, 1)
        decoupled = cfg.parallel.decoupled_clip and source.policy_lag > 0 and rows is taken_rows  # none dropped
        stats = ppo_update(state.model, state.optimizer, data, group.local_training(cfg), state.generator,
                           group.gradients, augment, draws, rows, decoupled, source.during_update)
        if state.obs_normalizer is not None:  # after the update that learned with the statistics it collected with
            # (overlapped: the rollout in flight was collected with the statistics before these)
            values = group.gather_columns(state.obs_normalizer.values(source.buffer.obs))
            state.obs_normalizer.update(values if everyone is None else values[everyone], state.model)
    allreduce = group.pop_seconds()
    timers.add("update", -allreduce)
    timers.add("allreduce", allreduce)
    steps = agreed.steps  # every rank's, which may differ (`distributed.sync_fraction`)
    learned = steps if rows is taken_rows else len(rows) * group.world_size  # drop_lagged: not with ranks
    state.record(agreed.result, steps)
    return {UPDATE: state.update, ENV_STEPS: state.env_steps, EPISODIC_RETURN: mean_or_nan(state.episode_returns),
            EPISODIC_LENGTH: mean_or_nan(state.episode_lengths), EPISODES: state.episodes, LEARNING_RATE: lr,
            REWARD_PER_STEP: agreed.result.reward_sum / steps, **state.episode_info.row(),
            **stats, WORKER_RESTARTS: source.restarts, LEARNER_THREADS: torch.get_num_threads(),
            POLICY_LAG: source.policy_lag, LAGGED_SHARE: source.lagged_share,
            LEARNED_SHARE: learned / steps, ROLLOUT_CUT: 1 - steps / (cfg.rollout_size * group.world_size)}
