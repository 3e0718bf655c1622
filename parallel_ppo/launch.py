"""Starting a training run, for the command lines and the Python API alike: a `Request` (what to train, before
any check) becomes a `PreparedRun` (a frozen `RunPlan`: config validated and settled, env spaces read once, output
directory claimed, learner settings measured; and its rollout source up) in the order that lets a user error stop it
before any env, worker or file exists; `execute` trains it with the console lines of a run and returns its summary
and exit status."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import psutil

from parallel_ppo.core.allocator import retain_freed_memory
from parallel_ppo.core.checkpoint import JOB_ID, load_checkpoint, next_resume_count
from parallel_ppo.core.config import Config
from parallel_ppo.core.configure import build_config, config_from_dict, resume_mismatch, validate
from parallel_ppo.core.evaluate import check_render, eval_views
from parallel_ppo.core.files import resolved
from parallel_ppo.core.group import Group
from parallel_ppo.core.loop import RolloutSource
from parallel_ppo.core.model import learner_device
from parallel_ppo.core.pause import pause_point
from parallel_ppo.core.threads import ThreadPlan, draw_with, thread_plan
from parallel_ppo.core.train_state import check_checkpoint_fits
from parallel_ppo.engines.distributed import RESTART_COUNT_VAR, RUN_ID_VAR, PeerLost, join, torchrun_world
from parallel_ppo.envs.batch import env_spaces
from parallel_ppo.envs.spaces import EnvSpaces
from parallel_ppo.errors import ConfigError, WriteFailed
from parallel_ppo.request import Request
from parallel_ppo.runs.closing import end_lines, exit_status
from parallel_ppo.runs.directory import (
    check_writable,
    new_run_dir,
    resolve_run_dir,
    resume_state,
    resumed_run_dir,
    run_dir_lock,
    trainer_mismatch,
)
from parallel_ppo.runs.plan import RunPlan
from parallel_ppo.runs.reading import read_config
from parallel_ppo.runs.tracking import WandbTracker, start_tracking
from parallel_ppo.runs.training import train_run
from parallel_ppo.tuning.before_run import Tuning, tune
from parallel_ppo.tuning.learner_settings import LearnerChoice


@dataclass(frozen=True)
class PreparedRun:
    """A run ready to train: its plan, the rollout source with its workers up, the learner's choices (for the start
    lines) and its group."""

    plan: RunPlan
    source: RolloutSource
    tuning: Tuning
    group: Group


def check_network_and_memory(cfg: Config, spaces: EnvSpaces, buffers: int = 1) -> None:
    """Build the network and the augmentation once (refusing settings that do not fit the env), and refuse `buffers`
    rollouts (2 for overlapped workers; n_steps + 1 rows each) that cannot fit in the memory now free, naming sizes."""
    from parallel_ppo.core.augment import random_shift
    from parallel_ppo.core.buffer import RolloutBuffer
    from parallel_ppo.core.model import network

    obs_shape, obs_dtype, actions, _ = spaces
    try:
        network(cfg, spaces)
    except (RuntimeError, MemoryError) as e:  # widths whose weights cannot be allocated
        raise ConfigError(f"cannot build the network: {str(e).strip().splitlines()[-1][:200]}; use smaller widths "
                          "(model.hidden_size, model.mlp_hidden, model.impala_depths)") from None
    random_shift(cfg, spaces)  # the augmentation's keys are the env's image keys
    per_step = RolloutBuffer.bytes_per_step(obs_shape, obs_dtype, actions) + 8  # and the advantages and returns
    need = (cfg.training.n_steps + 1) * cfg.env.num_envs * per_step * buffers  # + 1: `last_obs`, one row an env
    available = psutil.virtual_memory().available
    if need > available:
        raise ConfigError(
            f"the rollout needs {need / 2**30:,.1f} GiB ({cfg.training.n_steps + 1:,} rows × {cfg.env.num_envs:,} "
            f"envs × {per_step:,} bytes{' × 2 buffers' if buffers > 1 else ''}) but {available / 2**30:,.1f} GiB "
            f"of memory is available; use fewer steps (training.n_steps) or envs")


def load_resume(request: Request) -> tuple[str, dict]:
    """Check a resume request against the rest of it; return the run's config file and its validated checkpoint."""
    path = Path(request.resume or "")
    if not path.is_dir():
        raise ConfigError(f"cannot resume: {path} is not a directory")
    if request.config is not None or request.overwrite:
        raise ConfigError("--resume takes the config from the run directory; drop --config/--overwrite")
    output_dir = request.flags.get("run.output_dir")
    if output_dir and resolved(Path(output_dir), "--output-dir") != resolved(path, "--resume"):
        raise ConfigError("--resume continues in its own directory; drop --output-dir")
    state = resume_state(path)
    read_config(path / "config.yaml")  # a corrupt one is the run's data (RunDataError), not the command's settings
    if mismatch := trainer_mismatch(path, state, request.mode, request.parallel):
        raise ConfigError(mismatch)
    return str(path / "config.yaml"), state


def check_resume_config(cfg: Config, state: dict, run_dir: Path) -> None:
    """The checkpoint must come from a run with the same envs and network as the config resumed with (fields added
    since it was made count with their defaults; the fields that must match are those marked `resume`)."""
    mismatch = resume_mismatch(config_from_dict(state["config"]), cfg)
    if mismatch:
        raise ConfigError(f"checkpoint in {run_dir} was made with {mismatch}; it cannot be resumed so")


def restart_of(request: Request, cfg: Config) -> Request | None:
    """A restart continues where the run left off: with `resume_if_exists`, or in a group torchrun restarted, a
    run directory with a checkpoint is resumed (the request to resume it, counted as a restart; None: start as
    asked). torchrun's restart resumes only a checkpoint of its own job (TORCHELASTIC_RUN_ID), never an earlier run
    that happened to be in the directory. A directory without a checkpoint starts as any new run would (refused if
    it holds a run, unless --overwrite)."""
    torchrun_restart = request.distributed and int(os.environ.get(RESTART_COUNT_VAR, "0") or 0) > 0
    if not (request.resume_if_exists or torchrun_restart):
        return None
    output_dir = cfg.run.output_dir
    if not output_dir:
        if request.resume_if_exists:
            raise ConfigError("--resume-if-exists needs --output-dir: the directory to continue the run in")
        return None
    checkpoint = Path(output_dir) / "checkpoint.pt"
    if not checkpoint.is_file():
        return None
    if not request.resume_if_exists and load_checkpoint(checkpoint).get(JOB_ID) != os.environ.get(RUN_ID_VAR):
        return None
    return dataclasses.replace(request, config=None, overwrite=False, resume=output_dir)


def validated_config(request: Request) -> tuple[Config, dict | None, Request, bool]:
    """The request's config, built and validated once (a restart's second build is the resumed run's own config),
    the checkpoint it resumes, the request as it goes on (a restart: the resume of its run directory) and whether
    it is a restart. It builds no env and sets nothing in this process (`checked_spaces` goes on from here)."""
    world = torchrun_world(request.distributed)
    restarted = False
    if request.resume is None:
        cfg = build_config(request.config, request.flags, list(request.sets), request.parallel, world)
        resumed = restart_of(request, cfg)
        restarted, request = resumed is not None, resumed or request
    resume = None
    if request.resume is not None:
        config_file, resume = load_resume(request)
        if resume.get("world_size", 1) != (world or 1):
            raise ConfigError(f"cannot resume: {request.resume} was trained by {resume.get('world_size', 1)} ranks, "
                              f"not {world or 1}; resume it with the same number")
        cfg = build_config(config_file, {**request.flags, "run.output_dir": request.resume}, list(request.sets),
                           request.parallel, world)
    learner_device(cfg)  # a device asked for by name must exist
    return cfg, resume, request, restarted


def checked_spaces(cfg: Config, resume: dict | None, request: Request,
                   restarted: bool) -> tuple[EnvSpaces, dict | None]:
    """After `validated_config`: the env's spaces (read once: a gymnasium env is built for them), the network and
    rollout checked against them, and the checkpoint resumed checked against the config (a restart counted)."""
    spaces = env_spaces(cfg.env)
    check_network_and_memory(cfg, spaces, cfg.parallel.rollout_buffers if request.parallel else 1)
    eval_views(cfg, spaces)  # eval.video's views must be the env's
    if resume is not None:  # before any file is written: a checkpoint that does not fit changes nothing
        check_resume_config(cfg, resume, Path(request.resume or ""))
        check_checkpoint_fits(cfg, spaces, resume, Path(request.resume or "") / "checkpoint.pt")
        resume = {**resume, "restarts": resume.get("restarts", 0) + restarted}
    return spaces, resume


def claim_run_dir(cfg: Config, spaces: EnvSpaces, request: Request, group: Group) -> Path:
    """The run directory, and the render of eval.video drawn once (`check_render`): rank 0 alone, which writes and
    evaluates, checks them, and a refusal there stops every rank."""
    refusal, run_dir = None, Path(request.resume or ".")
    if group.is_main:
        try:
            if request.resume is None:
                run_dir = resolve_run_dir(cfg, request.mode, request.overwrite)
            else:  # config.yaml is written again, then the run's files
                check_writable(run_dir, f"run directory {run_dir}")
            check_render(cfg, spaces)
        except ConfigError as e:
            refusal = str(e)
    refusal, run_dir = group.broadcast((refusal, run_dir))
    if refusal is not None:
        raise ConfigError(refusal)
    return run_dir


def prepare(request: Request, say: Callable[[str], None] | None = None) -> PreparedRun:
    """Everything before the first update, checked in the order that lets a user error stop it before any env,
    worker or file exists: config and output directory, spaces, memory, then threads, the measurements and the
    source. A distributed rank joins the others once its config holds (its rank 0 checks the directory then).
    `say`: told what takes a while before the run starts (the measurements)."""
    cfg, resume, request, restarted = validated_config(request)
    if request.resume is None and not request.distributed:  # a taken directory, the usual slip, before any env
        run_dir = resolve_run_dir(cfg, request.mode, request.overwrite)
        cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, output_dir=str(run_dir)))
    # The run's envs start here: this process's drawing threads (LP_NUM_THREADS, read by Mesa once per process)
    # precede its first frame, the spaces' probe; a parallel run's workers set their own
    if not request.parallel:
        draw_with(thread_plan(cfg, False, int(os.environ["LOCAL_WORLD_SIZE"]) if request.distributed else 1).draw)
    spaces, resume = checked_spaces(cfg, resume, request, restarted)
    group = join(cfg, request.distributed)
    pause_point("start", group.rank)
    try:
        run_dir = claim_run_dir(cfg, spaces, request, group)
        planned = thread_plan(cfg, request.parallel, group.local_world_size)
        retain_freed_memory()
        tuning = tune(cfg, spaces, planned.learner, group, planned.idle_learner, say)  # sets the learner's threads
        threads = tuning.resolve(planned)
        plan = RunPlan(settled(cfg, run_dir, tuning.learner, group.world_size), spaces, run_dir, request.mode,
                       threads.describe(), learner=tuning.record(), compute_limit=tuning.compute_limit,
                       roofline=tuning.roofline, resume=resume, overwrite=request.overwrite)
        source = start_source(plan, threads, request.parallel, group)
    except BaseException:
        group.close(wait=False)
        raise
    return PreparedRun(plan, source, tuning, group)


def settled(cfg: Config, run_dir: Path, learner: LearnerChoice, world_size: int) -> Config:
    """The config the run trains with, made once from the validated one (which stays as it is): the run directory,
    and the learner's chosen settings in place of `auto` (workers, config.yaml and checkpoints carry them; not its
    threads, chosen again on the machine a resumed run finds); validated again after this, its last change."""
    run_cfg = dataclasses.replace(learner.resolve(cfg), run=dataclasses.replace(cfg.run, output_dir=str(run_dir)))
    validate(run_cfg, world_size)
    return run_cfg


def start_source(plan: RunPlan, threads: ThreadPlan, parallel: bool, group: Group) -> RolloutSource:
    """The rollout source of this process: the parallel coordinator with its workers, or the sequential collector;
    a distributed rank's envs continue the global env indices after the ranks before it."""
    resumes, offset = next_resume_count(plan.resume), group.rank * plan.cfg.env.num_envs
    if parallel:
        from parallel_ppo.engines.parallel.coordinator import ParallelCoordinator

        rank = group.rank if group.distributed else None
        return ParallelCoordinator(plan.cfg, plan.spaces, threads, resumes, offset, rank)
    from parallel_ppo.core.collect import SequentialCollector

    return SequentialCollector(plan.cfg, threads.env, resumes, offset, group.rollout_cut(plan.cfg))


def execute(run: PreparedRun, prog: str | None, interrupt: bool = False) -> tuple[dict, int]:
    """Train a prepared run to its end and leave its group; returns its summary (a distributed rank other than 0:
    how the run ended) and exit status. `prog` names the console lines (None: silent but for errors).
    `interrupt`: a second Ctrl-C raises KeyboardInterrupt (the Python API) instead of ending with status 130."""
    try:
        if run.group.is_main:
            summary = train_main(run, prog, interrupt)
        else:
            summary = train_run(run.plan, run.source, run.group)
    except (PeerLost, WriteFailed) as e:  # a rank lost, a full disk at the end: one line
        error = f"{e}; stopping ({kept_checkpoint(run)})"
        print(f"{prog or 'parallel_ppo'}: error: {error}", file=sys.stderr, flush=True)
        run.group.close(wait=False)
        return {"stop_reason": "error", "error": error}, 1
    except BaseException:
        run.group.close(wait=False)
        raise
    run.group.close()
    return summary, exit_status(summary)


def kept_checkpoint(run: PreparedRun) -> str:
    """What a run stopped by a lost rank, a full disk or a second Ctrl-C leaves to resume from: rank 0's checkpoint
    (another host's, for the other ranks)."""
    run_dir = run.plan.run_dir
    if not run.group.is_main:
        return f"rank 0's last checkpoint in {run_dir}, if it wrote one, is intact"
    return (f"the last checkpoint in {run_dir} is intact" if (run_dir / "checkpoint.pt").is_file()
            else f"no checkpoint was written in {run_dir}")


def say(prog: str | None, text: str) -> None:
    """A console line of the run (nothing when `prog` is None)."""
    if prog is not None:
        print(f"{prog}: {text}", flush=True)


def train_main(run: PreparedRun, prog: str | None, interrupt: bool = False) -> dict:
    """Train with the console lines and output files of a run (a distributed run's rank 0)."""
    plan, lock = run.plan, ExitStack()
    try:  # a start that fails leaves the directory as it was (an overwritten run's files go only once it started)
        lock.enter_context(run_dir_lock(plan.run_dir))  # held to the run's end
        with (new_run_dir(plan.run_dir, plan.cfg, plan.overwrite) if plan.resume is None
              else resumed_run_dir(plan.run_dir, plan.cfg, plan.resume)):
            say_start(run, prog)
            tracker = start_tracking(plan.cfg, plan.run_dir, run.source.mode, plan.resume is not None,
                                     run.group.distributed)
    except BaseException:
        lock.close()
        run.source.close()  # the workers are up: `train_run` would close them, but it never started
        raise
    with lock:
        return train_tracked(run, tracker, prog, interrupt)


def train_tracked(run: PreparedRun, tracker: WandbTracker | None, prog: str | None, interrupt: bool) -> dict:
    """`train_main`'s training, once the run has started."""
    plan = run.plan
    summary: dict = {"stop_reason": "error"}  # what the tracker is told if training raises
    try:
        summary = train_run(plan, run.source, run.group, tracker)
    except KeyboardInterrupt:  # a second Ctrl-C: stop now; a checkpoint written before is whole (atomic writes)
        summary = {"stop_reason": "signal", "signal": "SIGINT"}
        if interrupt:
            raise
        print(f"\n{prog or 'parallel_ppo'}: interrupted; {kept_checkpoint(run)}", file=sys.stderr)
        return summary
    finally:
        if tracker is not None:
            tracker.finish(summary)
    for line in end_lines(plan.cfg, plan.run_dir, summary):
        if line.startswith(("warning:", "error:")):
            print(f"{prog or 'parallel_ppo'}: {line}", file=sys.stderr, flush=True)
        else:
            say(prog, line)
    return summary


def say_start(run: PreparedRun, prog: str | None) -> None:
    """The start lines (config.yaml is written by `runs.directory.new_run_dir` or `resumed_run_dir`)."""
    plan = run.plan
    if plan.resume is not None:
        resume = plan.resume
        say(prog, f"resuming {plan.run_dir} at update {resume['update']}, {resume['env_steps']:,} steps, "
                  f"{resume['elapsed']:.0f} s elapsed")
    say(prog, start_line(run))
    if watchdog := getattr(run.source, "describe_watchdog", None):  # worker processes: when one counts as hung
        say(prog, watchdog())
    for line in run.tuning.start_lines():
        say(prog, line)


def start_line(run: PreparedRun) -> str:
    """What runs where: the layout, threads and run directory (for a distributed run, every rank's share)."""
    cfg, run_dir = run.plan.cfg, run.plan.run_dir
    source, group = run.source, run.group
    threads = ", ".join(f"{k} {v}" for k, v in run.plan.threads.items())
    if not group.distributed:
        envs = source.layout["num_envs"]
        return f"{source.mode} run on {cfg.env.id} with {envs} envs ({threads} threads) → {run_dir}"
    n, world = source.layout["num_envs"], group.world_size
    rank_batch = group.local_training(cfg).batch_size
    rule = "split over the ranks" if cfg.distributed.num_envs_total else "per rank, as given"
    return (f"distributed run on {cfg.env.id}: {world} ranks × {n} envs = {world * n} envs (rank r steps envs {n}r "
            f"to {n}r+{n - 1}), each rank a {source.mode} source with {threads} threads; minibatch {world} × "
            f"{rank_batch} = {world * rank_batch} ({rule}) → {run_dir}")
