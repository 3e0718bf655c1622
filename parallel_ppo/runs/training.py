"""A training run's outputs while and after it trains: the hooks that evaluate, log (metrics.csv, TensorBoard,
the progress bar or lines, W&B) and checkpoint after each update, and `train`, which runs the core loop with them
and builds summary.json from what the run measured (every figure by `runs.figures`)."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parallel_ppo.core.checkpoint import save_checkpoint
from parallel_ppo.core.config import Config
from parallel_ppo.core.envs import eval_levels, make_batch_env
from parallel_ppo.core.evaluate import EvalResult, evaluate
from parallel_ppo.core.files import write_json
from parallel_ppo.core.group import ALONE, Group
from parallel_ppo.core.loop import Clock, Hook, Outcome, RolloutSource, StopRequest, TrainState, mean_or_nan, run_loop
from parallel_ppo.engines.distributed import RUN_ID_VAR, TORCHRUN_ID, checksum
from parallel_ppo.errors import RunDataError
from parallel_ppo.runs import fingerprint
from parallel_ppo.runs.figures import compute_figures, return_figures, steady_sps
from parallel_ppo.runs.metrics import MetricsLogger, ResourceSampler, Tracker
from parallel_ppo.runs.progress import make_progress
from parallel_ppo.runs.reading import read_metrics
from parallel_ppo.runs.summary import RunSummary

BUDGETS = ("duration", "total_steps")
"""Stop reasons that mean the run met its budget."""


class EvalHook:
    """Every `eval.interval_seconds`, plays the learner's policy on fresh envs of its own (held-out test levels by
    default) and adds `test_return_mean` to that update's row; `final` evaluates once more at the end."""

    phase = "eval"

    def __init__(self, cfg: Config) -> None:
        """Builds and closes one eval env first, before the clock starts: loading the env's code and assets (Procgen's
        take ~2 s) then counts as setup in every mode, not as the first evaluation of a process without training
        envs of its own (the parallel coordinator)."""
        self.cfg = cfg
        make_batch_env(eval_levels(cfg.env, cfg.eval.levels), cfg.run.seed, 0, 1, 1).close()
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


SAMPLE_SECONDS = 10.0
"""Least time between two CPU and memory samples. A sample reads /proc/<pid>/smaps_rollup of every process in the
tree, which takes the learner's time: 13 ms sequentially and 33 ms for a coordinator with 2 workers (5 processes)
on 2 cores, and more with every worker. Sampled at every update, it was 10% of a CartPole run."""


class MetricsHook:
    """Samples CPU and memory into each update's row, then writes it to metrics.csv, TensorBoard, the progress
    display and the tracker (W&B) if any."""

    phase = "log"

    def __init__(self, cfg: Config, run_dir: Path, mode: str, resume_after: tuple[int, int] | None,
                 tracker: Tracker | None = None) -> None:
        self.sampler = ResourceSampler()
        self.started = time.monotonic()  # the first sample's CPU is the mean since the sampler's first reading
        progress = make_progress(cfg.logging.progress, mode, cfg.run.duration * 3600, cfg.run.total_steps,
                                 cfg.logging.progress_seconds)
        self.logger = MetricsLogger(run_dir, cfg.logging.tensorboard, progress, resume_after, tracker)
        self.cpu_samples: list[tuple[float, float]] = []
        """(CPU percent, the seconds it is the mean of) per sample."""
        self.resources: dict[str, float] = {}
        self.sampled = -math.inf

    def after_update(self, state: TrainState, row: dict[str, Any]) -> None:
        """Rows of updates less than SAMPLE_SECONDS apart repeat the latest sample (peaks still see every moment)."""
        if time.monotonic() - self.sampled >= SAMPLE_SECONDS:
            self._sample()
        self.logger.log({**row, **self.resources})

    def _sample(self) -> None:
        now = time.monotonic()
        self.resources = self.sampler.sample()
        self.cpu_samples.append((self.resources["cpu_percent"], now - max(self.sampled, self.started)))
        self.sampled = now

    def finish(self) -> None:
        """One more sample when training ends (not logged), so the mean CPU covers the run's last seconds too; none
        if no update finished (the mean then stays None and readers fall back to the rows)."""
        if self.cpu_samples:
            self._sample()

    @property
    def mean_cpu_percent(self) -> float | None:
        """The tree's CPU percent over this session's training: the samples weighted by the seconds each covers."""
        seconds = sum(s for _, s in self.cpu_samples)
        return sum(c * s for c, s in self.cpu_samples) / seconds if seconds > 0 else None

    def close(self) -> None:
        self.sampler.close()
        self.logger.close()


class CheckpointHook:
    """Writes checkpoint.pt (atomically) every `run.checkpoint_interval` seconds, and after an update in which the
    pre-emption signal asked for one (`stop.checkpoint_asked`); `save` writes one now."""

    phase = "log"

    def __init__(self, cfg: Config, path: Path, mode: str, clock: Clock, stop: StopRequest,
                 world_size: int = 1) -> None:
        self.cfg, self.path, self.mode, self.clock, self.world_size = cfg, path, mode, clock, world_size
        self.stop = stop
        self.last = time.monotonic()

    def after_update(self, state: TrainState, row: dict[str, Any]) -> None:
        if self.stop.checkpoint_asked or time.monotonic() - self.last >= self.cfg.run.checkpoint_interval:
            self.stop.checkpoint_asked = False
            self.save(state)

    def save(self, state: TrainState) -> None:
        save_checkpoint(self.path, {**state.to_checkpoint(self.cfg, self.mode, self.clock(), self.world_size),
                                    TORCHRUN_ID: os.environ.get(RUN_ID_VAR)})  # whose restarts may resume it
        self.last = time.monotonic()


@dataclass(frozen=True)
class RunSetup:
    """What a run settled before its first update, measured once and passed on unchanged (recorded in
    summary.json): its threads, how the learner's precision, microbatch and device were chosen, the compute
    limit (`bench.roofline.measure_compute_limit`) and the roofline (the network's FLOPs, the matmul peaks)."""

    threads: dict[str, int]
    learner: dict | None = None
    compute_limit: dict | None = None
    roofline: dict | None = None


@dataclass
class _Writers:
    """Rank 0's hooks (None on the other ranks of a distributed run)."""

    metrics: MetricsHook | None = None
    checkpoints: CheckpointHook | None = None
    evals: EvalHook | None = None

    def hooks(self) -> list[Hook]:
        return [h for h in (self.evals, self.metrics, self.checkpoints) if h is not None]

    def training_ended(self) -> None:
        """The last CPU sample, taken before the final checkpoint and evaluation."""
        if self.metrics is not None:
            self.metrics.finish()

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()


def train(cfg: Config, source: RolloutSource, run_dir: Path, setup: RunSetup, resume: dict | None = None,
          group: Group = ALONE, tracker: Tracker | None = None) -> dict:
    """Train until the duration or step budget is spent (or a signal arrives); returns summary.json's content.

    `resume` is a loaded checkpoint: model, optimizer, counters, RNG states, episode window and elapsed
    time carry on from it, and metrics rows logged after it are dropped so the CSV stays continuous.

    In a distributed run (`group`), every rank starts from rank 0's parameters and trains in step with the others;
    only rank 0 writes (metrics, TensorBoard, checkpoints, evaluation, summary.json with every rank's layout and
    parameter checksum, and each update's row to `tracker`), the others return only how the run ended. A lost rank
    raises `distributed.PeerLost` (the last checkpoint stays as it was).
    """
    run_dir, world = Path(run_dir), group.world_size
    mode = "distributed" if group.distributed else source.mode
    stop = StopRequest(not group.distributed, cfg.run.preempt_signal, cfg.run.on_preempt)
    writers, final_eval, ranks = _Writers(), None, None
    with stop:  # from the first step to the last file: a signal then only asks to stop
        try:
            state = (TrainState.new(cfg, source.obs_shape, source.actions, world) if resume is None else
                     TrainState.from_checkpoint(cfg, source.obs_shape, source.actions, resume, world))
            evals = EvalHook(cfg) if group.is_main and cfg.eval.interval_seconds > 0 else None  # loads its env
            group.broadcast_parameters(state.model)  # the other ranks wait here for that, before their clocks too
            clock = Clock(state.elapsed_before)
            if group.is_main:
                metrics = MetricsHook(cfg, run_dir, mode, (state.update, state.env_steps) if resume else None, tracker)
                writers = _Writers(metrics, CheckpointHook(cfg, run_dir / "checkpoint.pt", mode, clock, stop, world),
                                   evals)
            outcome = run_loop(cfg, source, state, writers.hooks(), stop, clock, group)
            writers.training_ended()
            done_before = resume is not None and state.update == resume["update"] and outcome.stop_reason in BUDGETS
            if not done_before:  # a finished run resumed (a requeued job) keeps its files as they are
                if writers.checkpoints is not None:  # the first file: a rank lost now cannot cost the finished updates
                    writers.checkpoints.save(state)
                ranks = group.gather({"rank": group.rank, "host": group.host, **source.layout,
                                      "source": source.mode, "threads": setup.threads,
                                      "checksum": checksum(state.model),
                                      "phase_seconds": outcome.phase_seconds}) if group.distributed else None
                if writers.evals is not None and outcome.stop_reason in BUDGETS:
                    final_eval = writers.evals.final(state)  # after the clock stopped: not in wall time or SPS
        finally:
            writers.close()
            source.close()
        if writers.metrics is None:  # not rank 0: how the run ended is all it reports
            return {"stop_reason": outcome.stop_reason, "signal": outcome.signal, "error": outcome.error}
        if done_before and (stored := read_summary(run_dir)) is not None:
            return stored
        summary = summarize(cfg, source, state, outcome, writers.metrics, setup, run_dir, final_eval,
                            ranks).to_dict()
        write_json(run_dir / "summary.json", summary)
    return summary


def read_summary(run_dir: Path) -> dict | None:
    """The run's summary.json, or None if it cannot be read."""
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None


def summarize(cfg: Config, source: RolloutSource, state: TrainState, outcome: Outcome, metrics: MetricsHook,
              setup: RunSetup, run_dir: Path, final_eval: EvalResult | None = None,
              ranks: list[dict] | None = None) -> RunSummary:
    """summary.json's content, its throughput read back from metrics.csv as every reader computes it.

    A distributed run (`ranks`: each rank's layout, threads, checksum and phase seconds) counts the envs and
    workers of all ranks, and its phases are rank 0's."""
    wall, total = outcome.session_seconds, outcome.session_seconds + state.elapsed_before
    try:
        rows = read_metrics(run_dir / "metrics.csv")
        sps = steady_sps(rows["env_steps"], rows["wall_time"])
    except RunDataError:  # no update finished
        sps = None
    peaks = metrics.sampler.peaks
    train_return = mean_or_nan(state.episode_returns) if state.episode_returns else None
    layout = dict(source.layout)
    if ranks is not None:
        layout["num_workers"] *= len(ranks)
        layout["num_envs"] *= len(ranks)
    return RunSummary(
        mode="distributed" if ranks else source.mode, env_id=cfg.env.id, **layout, total_env_steps=state.env_steps,
        wall_seconds=total, episodes=state.episodes, updates=state.update, stop_reason=outcome.stop_reason,
        precision=cfg.training.precision, peak_rss_mb=peaks["rss_mb"], hardware=fingerprint.hardware(),
        versions=fingerprint.versions(), sps=sps, overall_sps=state.env_steps / total if wall > 0 else None,
        episodic_return_mean=train_return,
        episodic_length_mean=mean_or_nan(state.episode_lengths) if state.episode_lengths else None,
        error=outcome.error, signal=outcome.signal, threads=setup.threads, peak_pss_mb=peaks["pss_mb"],
        peak_main_rss_mb=peaks["main_rss_mb"], peak_worker_rss_mb=peaks["worker_rss_mb"],
        mean_cpu_percent=metrics.mean_cpu_percent,
        compute_limit=setup.compute_limit, phase_seconds=outcome.phase_seconds,
        phase_fractions={k: v / wall for k, v in outcome.phase_seconds.items()} if wall > 0 else {},
        worker_restarts=source.restarts, resumes=state.resumes, restarts=state.restarts, seed=cfg.run.seed,
        learner=setup.learner,
        roofline=setup.roofline, world_size=len(ranks) if ranks else 1,
        **return_figures(cfg.env, train_return, final_eval.mean if final_eval is not None else None,
                         final_eval.levels if final_eval is not None else None),
        eval_levels=final_eval.levels if final_eval is not None else None,
        **compute_figures(sps, setup.compute_limit, setup.roofline, cfg.training.precision),
        distributed={"source": source.mode, "num_envs_per_rank": source.layout["num_envs"],
                     "timeout_seconds": cfg.distributed.timeout_seconds, "ranks": ranks} if ranks else None,
    )
