"""A training run's outputs while and after it trains: the hooks that evaluate, log (metrics.csv, TensorBoard,
the progress bar or lines, W&B) and checkpoint after each update, and `train_run`, which trains a `RunPlan`
(`runs.plan`) in the core loop with them and builds summary.json from what the run measured (every figure by
`runs.figures`)."""

from __future__ import annotations

import json
import math
import time
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parallel_ppo.core.checkpoint import ENDED, JOB_ID, LAYOUT, layout_entry, save_checkpoint
from parallel_ppo.core.config import Config
from parallel_ppo.core.evaluate import TEST_RETURN, EvalResult, eval_views, play_episodes
from parallel_ppo.core.files import write_json, write_text, writing
from parallel_ppo.core.group import ALONE, Group
from parallel_ppo.core.loop import Clock, Hook, Outcome, RolloutSource, run_loop
from parallel_ppo.core.metrics import column_of, declared
from parallel_ppo.core.model import parameter_checksum
from parallel_ppo.core.stopping import StopRequest
from parallel_ppo.core.train_state import TrainState, mean_or_nan
from parallel_ppo.envs.batch import eval_levels, make_batch_env
from parallel_ppo.envs.spaces import EnvSpaces
from parallel_ppo.errors import WriteFailed, one_line
from parallel_ppo.runs import fingerprint
from parallel_ppo.runs.figures import compute_figures, return_figures, steady_sps
from parallel_ppo.runs.metrics import MetricsLogger, ResourceSampler, Tracker
from parallel_ppo.runs.plan import RunPlan
from parallel_ppo.runs.progress import make_progress
from parallel_ppo.runs.summary import BUDGETS, ERROR_TRACE, RunSummary, observation_record
from parallel_ppo.runs.video import EVAL_VIDEO_TAG, VIDEO_FPS, add_tensorboard_video, captioned, purge_tensorboard


class EvalHook:
    """Every `eval.interval_seconds`, plays the learner's policy on fresh envs of its own (held-out test levels by
    default) and adds its mean return to that update's row (`TEST_RETURN`), and where `eval.video` asks for one, a
    video of env 0 to TensorBoard (`EVAL_VIDEO_TAG`); `final` evaluates once more at the end."""

    phase = "eval"
    what = "the evaluation"

    def __init__(self, cfg: Config, run_dir: Path, spaces: EnvSpaces,
                 resume_after: tuple[int, int] | None = None) -> None:
        """Builds and closes one eval env first, before the clock starts: loading the env's code and assets (Procgen's
        take ~2 s) then counts as setup in every mode, not as the first evaluation of a process without training
        envs of its own (the parallel coordinator). `resume_after=(update, env_steps)` of the checkpoint a resumed run
        goes on from: the videos logged after it go from TensorBoard, as its scalars do."""
        self.cfg, self.run_dir = cfg, run_dir
        self.views = eval_views(cfg, spaces)
        if resume_after is not None and self.video_dir.exists():  # videos of an earlier session
            purge_tensorboard(self.video_dir, resume_after[1] + 1)
        make_batch_env(eval_levels(cfg.env, cfg.eval.levels), cfg.run.seed, 0, 1, 1).close()
        self.last = time.monotonic()
        self.result: EvalResult | None = None
        self.at_update = -1

    def after_update(self, state: TrainState, row: dict[str, Any]) -> None:
        if time.monotonic() - self.last >= self.cfg.eval.interval_seconds:
            row[TEST_RETURN] = self.run(state).mean

    @property
    def video_dir(self) -> Path:
        """A directory of their own: TensorBoard reads a directory's event files in name order and stops reading each
        once a later one appears, and the run's scalars go on in theirs (one file a video, whole before the next)."""
        return self.run_dir / "logs" / "eval_video"

    def run(self, state: TrainState) -> EvalResult:
        e, frames = self.cfg.eval, []
        sink = captioned(frames, e.video_frames) if self.views is not None else None
        self.result = play_episodes(state.model, self.cfg, e.levels, e.episodes, e.num_envs, e.deterministic,
                                    self.cfg.run.seed, stream=state.update,  # a new set of levels each time
                                    frames=sink, views=self.views)
        if frames:
            add_tensorboard_video(self.video_dir, EVAL_VIDEO_TAG, frames, VIDEO_FPS, state.env_steps)
        self.at_update, self.last = state.update, time.monotonic()
        return self.result

    def final(self, state: TrainState) -> EvalResult | None:
        """The evaluation of the final policy (run now unless the last update already had one)."""
        return self.result if self.at_update == state.update else self.run(state)


SAMPLE_SECONDS = 10.0
"""Least time between two CPU and memory samples. A sample reads /proc/<pid>/smaps_rollup of every process in the
tree: 13 ms sequentially and 33 ms for a coordinator with 2 workers (5 processes) on 2 cores, about 10 ms more for
every robosuite worker (0.16 s with 16 of them on an idle 2-core machine, seconds while they step). Sampled at every
update, it was 10% of a CartPole run; it now runs on a thread of its own (`MetricsHook`)."""


class MetricsHook:
    """Samples CPU and memory into each update's row, then writes it to metrics.csv, TensorBoard, the progress
    display and the tracker (W&B) if any.

    A sample is due SAMPLE_SECONDS after the last; it is taken on a thread of its own, so the learner goes on to its
    next update instead of waiting for /proc (and, in a synchronous run, its workers with it). A row has the latest
    sample finished: the first row waits for its own, so every row has one."""

    phase = "log"
    what = "logging the metrics"

    def __init__(self, cfg: Config, run_dir: Path, mode: str, resume_after: tuple[int, int] | None,
                 tracker: Tracker | None = None) -> None:
        self.sampler = ResourceSampler()
        self.started = time.monotonic()  # the first sample's CPU is the mean since the sampler's first reading
        progress = make_progress(cfg.logging.progress, mode, cfg.run.duration * 3600, cfg.run.total_steps,
                                 cfg.logging.progress_seconds)
        self.logger = MetricsLogger(run_dir, cfg.logging.tensorboard, progress, resume_after, tracker,
                                    cfg.logging.episode_info)
        self.cpu_samples: list[tuple[float, float]] = []
        """(CPU percent, the seconds it is the mean of) per sample."""
        self.resources: dict[str, float] = {}
        self.sampled = -math.inf
        """When the latest sample was asked for."""
        self._covers = 0.0  # the seconds the sample in flight is the mean of
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="parallel_ppo-sampler")
        self._pending: Future[dict[str, float]] | None = None

    def after_update(self, state: TrainState, row: dict[str, Any]) -> None:
        """Rows of updates less than SAMPLE_SECONDS apart repeat the latest sample; the run's peaks (summary.json)
        cover those updates too: each sample, and the last at close, reads every process's high-water mark since the
        one before."""
        self._take(wait=False)
        if self._pending is None and time.monotonic() - self.sampled >= SAMPLE_SECONDS:
            self._ask()
            self._take(wait=not self.resources)
        self.logger.log({**row, **self.resources})

    def _ask(self) -> None:
        """Start a sample on the sampler's thread; its CPU is the mean since the last one was asked for."""
        now = time.monotonic()
        self._covers, self.sampled = now - max(self.sampled, self.started), now
        self._pending = self._thread.submit(self.sampler.sample)

    def _take(self, wait: bool) -> None:
        """The sample asked for, once it is taken (`wait`: as soon as it is); an error in it is raised here."""
        if self._pending is None or not (wait or self._pending.done()):
            return
        future, self._pending = self._pending, None  # taken, even if it failed
        self.resources = future.result()
        self.cpu_samples.append((self.resources["system/cpu_percent"], self._covers))

    def finish(self) -> None:
        """One more sample when training ends (not logged), so the mean CPU covers the run's last seconds too; none
        if no update finished (the mean then stays None and readers fall back to the rows), and none where sampling
        fails (the mean then covers the samples before: a measurement lost, not the run's files)."""
        try:
            self._take(wait=True)
            if self.cpu_samples:
                self._ask()
                self._take(wait=True)
        except Exception:  # the samples before stand
            pass

    @property
    def mean_cpu_percent(self) -> float | None:
        """The tree's CPU percent over this session's training: the samples weighted by the seconds each covers."""
        seconds = sum(s for _, s in self.cpu_samples)
        return sum(c * s for c, s in self.cpu_samples) / seconds if seconds > 0 else None

    def close(self) -> None:
        self._thread.shutdown(wait=True)  # a sample still running ends first: the sampler is not shared
        self.sampler.close()
        self.logger.close()


class CheckpointHook:
    """Writes checkpoint.pt (atomically) every `run.checkpoint_interval` seconds, and after an update in which the
    pre-emption signal asked for one (`stop.checkpoint_asked`); `save` writes one now, recording the job that
    wrote it (`group.job_id`: whose restarts may resume it)."""

    phase = "log"
    what = "writing the checkpoint"

    def __init__(self, plan: RunPlan, clock: Clock, stop: StopRequest, group: Group) -> None:
        self.cfg = plan.cfg
        self.path = plan.run_dir / "checkpoint.pt"
        self.mode = plan.mode
        self.clock = clock
        self.stop = stop
        self.world_size = group.world_size
        self.job_id = group.job_id
        self.layout = layout_entry(plan.spaces.layout)
        self.last = time.monotonic()

    def after_update(self, state: TrainState, row: dict[str, Any]) -> None:
        if self.stop.checkpoint_asked or time.monotonic() - self.last >= self.cfg.run.checkpoint_interval:
            self.stop.checkpoint_asked = False
            self.save(state)

    def save(self, state: TrainState, ended: str | None = None) -> None:
        """`ended`: the session's stop reason, for its last checkpoint."""
        checkpoint = state.to_checkpoint(self.cfg, self.mode, self.clock(), self.world_size)
        save_checkpoint(self.path, {**checkpoint, JOB_ID: self.job_id, LAYOUT: self.layout, ENDED: ended})
        self.last = time.monotonic()

    def save_last(self, state: TrainState, ended: str) -> None:
        """The session's last checkpoint, recording how it ended; WriteFailed where the disk does not take it."""
        with writing(self.path):
            self.save(state, ended)


@dataclass
class MainRankHooks:
    """What rank 0 alone does after each update: evaluate, log, checkpoint (all None on the other ranks)."""

    metrics: MetricsHook | None = None
    checkpoints: CheckpointHook | None = None
    evals: EvalHook | None = None

    def hooks(self) -> list[Hook]:
        return [h for h in (self.evals, self.metrics, self.checkpoints) if h is not None]

    def training_ended(self) -> None:
        """The last CPU sample, taken after the final checkpoint (a sample that fails cannot cost it) and before the
        final evaluation."""
        if self.metrics is not None:
            self.metrics.finish()

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()


def train_run(plan: RunPlan, source: RolloutSource, group: Group = ALONE, tracker: Tracker | None = None) -> dict:
    """Train until the duration or step budget is spent (or a signal arrives); returns summary.json's content.

    A resumed run (`plan.resume`) carries on with the checkpoint's model, optimizer, counters, RNG states, episode
    window and elapsed time, and metrics rows logged after it are dropped so the CSV stays continuous; one that had
    finished (`finished_summary`) and trains nothing more returns its summary.json, its files left as they are.

    In a distributed run (`group`), every rank starts from rank 0's parameters and trains in step with the others;
    only rank 0 writes (metrics, TensorBoard, checkpoints, evaluation, summary.json with every rank's layout and
    parameter checksum, and each update's metrics to `tracker`), the others return only how the run ended. A lost
    rank raises `distributed.PeerLost` (the last checkpoint stays as it was).
    """
    cfg, resume = plan.cfg, plan.resume
    stop = StopRequest(not group.distributed, cfg.run.preempt_signal, cfg.run.on_preempt)
    main_hooks, final_eval, ranks = MainRankHooks(), None, None
    with stop:  # from the first step to the last file: a signal then only asks to stop
        try:
            state = (TrainState.new(cfg, source.spaces, group.world_size) if resume is None else
                     TrainState.from_checkpoint(cfg, source.spaces, resume, group.world_size))
            resume_after = (state.update, state.env_steps) if resume else None
            evals = (EvalHook(cfg, plan.run_dir, source.spaces, resume_after)  # loads its env
                     if group.is_main and cfg.eval.interval_seconds > 0 else None)
            group.broadcast_parameters(state.model)  # the other ranks wait here for that, before their clocks too
            clock = Clock(state.elapsed_before)
            if group.is_main:
                metrics = MetricsHook(cfg, plan.run_dir, plan.mode, resume_after, tracker)
                main_hooks = MainRankHooks(metrics, CheckpointHook(plan, clock, stop, group), evals)
            outcome = run_loop(cfg, source, state, main_hooks.hooks(), stop, clock, group)
            source.abandon_rollout()  # an overlapped one in flight: its workers stop before the final evaluation
            finished = finished_summary(plan, state, outcome, group)
            if finished is None:  # a finished run resumed (a requeued job) keeps its files as they are
                if main_hooks.checkpoints is not None:  # the first file: a rank lost now cannot cost the updates
                    main_hooks.checkpoints.save_last(state, outcome.stop_reason)
                main_hooks.training_ended()
                ranks = gather_ranks(plan, source, state, outcome, group) if group.distributed else None
                if main_hooks.evals is not None and outcome.stop_reason in BUDGETS:
                    final_eval = final_evaluation(main_hooks, state, outcome)  # after the clock stopped
        except BaseException:
            close_run(main_hooks, source, quiet=True)  # the error on its way out is the one to say
            raise
        close_run(main_hooks, source)
        if main_hooks.metrics is None:  # not rank 0: how the run ended is all it reports
            return {"stop_reason": outcome.stop_reason, "signal": outcome.signal, "error": outcome.error}
        if finished is not None:
            return finished
        summary = summarize(plan, source, state, outcome, main_hooks.metrics, final_eval, ranks).to_dict()
        with writing(plan.run_dir / "summary.json"):
            write_json(plan.run_dir / "summary.json", summary)
        keep_trace(plan.run_dir, outcome.trace if outcome.error else None)
    return summary


def keep_trace(run_dir: Path, trace: str | None) -> None:
    """The traceback beneath the error the session stopped on, in error.txt (its one line is summary.json's `error`),
    where the process that writes caught one; an earlier session's is removed otherwise. Best effort: a disk that
    does not take it costs the traceback, not the run's files."""
    with suppress(OSError):
        (run_dir / ERROR_TRACE).unlink(missing_ok=True)  # where this session's cannot be written, none
        if trace is not None:
            write_text(run_dir / ERROR_TRACE, trace)


def close_run(hooks: MainRankHooks, source: RolloutSource, quiet: bool = False) -> None:
    """The hooks' files, then the rollout source's workers, closed even where the files raise. `quiet` (an error on
    its way out, which it would hide): a file the disk did not take (WriteFailed) is not said."""
    try:
        hooks.close()
    except WriteFailed:
        if not quiet:
            raise
    finally:
        source.close()


def final_evaluation(hooks: MainRankHooks, state: TrainState, outcome: Outcome) -> EvalResult | None:
    """The final policy's evaluation (rank 0's, after the ranks' last exchange); one that fails (an eval env that
    raises) ends the run as an error after an update does: its checkpoint says so, and `--resume` finishes it."""
    assert hooks.evals is not None
    try:
        return hooks.evals.final(state)
    except Exception as e:  # any failure of the eval env's
        outcome.stop_reason, outcome.error = "error", f"the final evaluation failed: {one_line(e)}"
        outcome.trace = traceback.format_exc()
        if hooks.checkpoints is not None:
            hooks.checkpoints.save_last(state, outcome.stop_reason)
        return None


def gather_ranks(plan: RunPlan, source: RolloutSource, state: TrainState, outcome: Outcome,
                 group: Group) -> list[dict]:
    """Every rank's host, layout, threads, parameter checksum and phase seconds, on rank 0 (with the long timeout:
    the others wait here while rank 0 writes its last checkpoint)."""
    return group.gather({"rank": group.rank, "host": group.host, **source.layout, "source": source.mode,
                         "threads": plan.threads, "checksum": parameter_checksum(state.model),
                         "phase_seconds": outcome.phase_seconds}, patient=True)


def finished_summary(plan: RunPlan, state: TrainState, outcome: Outcome, group: Group) -> dict | None:
    """The summary.json of a resumed run that had finished and trained no further: one resumed at its budget, its
    checkpoint from a session that did not end on an error or a signal, and its summary.json written for that
    checkpoint (its updates and env steps). None where the run finishes now: a new run, one that trained, or a
    summary.json missing, unreadable or an earlier session's (a session killed before it wrote its own). What the
    ranks agree on decides first; rank 0 then reads the file and every rank takes its answer (a broadcast), so that
    all decide alike whether to finish the run."""
    resume = plan.resume
    if not (resume is not None and state.update == resume["update"] and outcome.stop_reason in BUDGETS
            and resume.get(ENDED) in (None, *BUDGETS)):
        return None
    stored = None
    if group.is_main:
        with suppress(OSError, ValueError):
            stored = json.loads((plan.run_dir / "summary.json").read_text())
        counts = (stored.get("updates"), stored.get("total_env_steps")) if isinstance(stored, dict) else None
        stored = stored if counts == (resume["update"], resume["env_steps"]) else None
    return group.broadcast(stored)


def final_metrics(row: dict[str, Any]) -> dict[str, float]:
    """The finite values of the metrics declared for the summary, in the last update's row, by column."""
    return {column_of(key) or key: value for key, value in row.items()
            if declared(key).summary and value is not None and math.isfinite(value)}


def summarize(plan: RunPlan, source: RolloutSource, state: TrainState, outcome: Outcome, metrics: MetricsHook,
              final_eval: EvalResult | None = None, ranks: list[dict] | None = None) -> RunSummary:
    """summary.json's content, its throughput from the rows logged, as every reader of metrics.csv computes it.

    A distributed run (`ranks`: each rank's layout, threads, checksum and phase seconds) counts the envs and
    workers of all ranks, and its phases are rank 0's."""
    cfg, logged = plan.cfg, metrics.logger.logged
    wall, total = outcome.session_seconds, outcome.session_seconds + state.elapsed_before
    sps = steady_sps([steps for steps, _ in logged], [seconds for _, seconds in logged]) if logged else None
    peaks = metrics.sampler.peaks
    train_return = mean_or_nan(state.episode_returns) if state.episode_returns else None
    layout = dict(source.layout)
    if ranks is not None:
        layout["num_workers"] *= len(ranks)
        layout["num_envs"] *= len(ranks)
    evaluated = {"test": final_eval.mean, "levels": final_eval.levels} if final_eval is not None else {}
    return RunSummary(
        mode=plan.mode, env_id=cfg.env.id, **layout, total_env_steps=state.env_steps,
        wall_seconds=total, episodes=state.episodes, updates=state.update, stop_reason=outcome.stop_reason,
        precision=cfg.training.precision, peak_rss_mb=peaks["rss_mb"], hardware=fingerprint.hardware(),
        versions=fingerprint.versions(), sps=sps, overall_sps=state.env_steps / total if wall > 0 else None,
        episodic_return_mean=train_return,
        episodic_length_mean=mean_or_nan(state.episode_lengths) if state.episode_lengths else None,
        error=outcome.error, signal=outcome.signal, threads=plan.threads, peak_pss_mb=peaks["pss_mb"],
        peak_main_rss_mb=peaks["main_rss_mb"], peak_worker_rss_mb=peaks["worker_rss_mb"],
        mean_cpu_percent=metrics.mean_cpu_percent,
        compute_limit=plan.compute_limit, phase_seconds=outcome.phase_seconds,
        phase_fractions={k: v / wall for k, v in outcome.phase_seconds.items()} if wall > 0 else {},
        worker_restarts=source.restarts, worker_pace=source.pace and source.pace.record(),
        policy_lag=outcome.policy_lag, resumes=state.resumes, restarts=state.restarts, seed=cfg.run.seed,
        learner=plan.learner, roofline=plan.roofline, world_size=len(ranks) if ranks else 1,
        **return_figures(cfg.env, train_return, evaluated.get("test"), evaluated.get("levels")),
        eval_levels=evaluated.get("levels"),
        **compute_figures(sps, plan.compute_limit, plan.roofline, cfg.training.precision),
        final_metrics=final_metrics(metrics.logger.last),
        distributed={"source": source.mode, "num_envs_per_rank": source.layout["num_envs"],
                     "timeout_seconds": cfg.distributed.timeout_seconds, "ranks": ranks} if ranks else None,
        observation=observation_record(plan.spaces),
    )
