"""Command line of both timed trainers: flags → config → rollout source → trainer, with one-line errors."""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch
import yaml

from parallel_ppo.core.allocator import retain_freed_memory
from parallel_ppo.core.checkpoint import load_checkpoint, next_resume_count
from parallel_ppo.core.collect import RolloutError
from parallel_ppo.core.config import DEVICES, FLAGS, Config, ConfigError, OneLineParser, build_config, fail
from parallel_ppo.engines.distributed import ALONE, PeerLost, Solo, join, launch_rank, launched_by_torchrun
from parallel_ppo.bench.learner_settings import LearnerChoice
from parallel_ppo.core.model import learner_device
from parallel_ppo.runs.reading import RUN_FILES, seed_dir
from parallel_ppo.core.threads import thread_plan


def make_parser(prog: str, parallel: bool) -> OneLineParser:
    mode = "parallel (coordinator + worker processes)" if parallel else "sequential (one process)"
    p = OneLineParser(prog=prog, description=f"Wall-clock-bounded PPO training, {mode}.")
    p.add_argument("--config", help="YAML config file (sections env, parallel, model, training, run, logging)")
    p.add_argument("--duration", type=float, metavar="HOURS", help="wall-clock budget in hours (run.duration)")
    p.add_argument("--total-steps", type=int, metavar="N", help="also stop after N env steps (run.total_steps)")
    p.add_argument("--output-dir", metavar="DIR", help="run directory (run.output_dir)")
    p.add_argument("--env", metavar="ID", help="Procgen game (starpilot, ...) or gymnasium id (CartPole-v1)")
    p.add_argument("--seed", type=int, metavar="N", help="random seed (run.seed)")
    p.add_argument("--batch-size", type=int, metavar="N", help="SGD minibatch size (training.batch_size)")
    if parallel:
        p.add_argument("--num-workers", type=int, metavar="W", help="worker processes (parallel.num_workers)")
        p.add_argument("--num-envs-per-worker", type=int, metavar="M",
                       help="envs per worker (parallel.num_envs_per_worker)")
    else:
        p.add_argument("--num-envs", type=int, metavar="N", help="number of envs (env.num_envs)")
    p.add_argument("--distributed", action="store_true",
                   help="one rank of a data-parallel run under torchrun (gradients all-reduced; rank 0 writes)")
    p.add_argument("--num-envs-total", type=int, metavar="N",
                   help="--distributed: envs over all ranks, split evenly, and --batch-size then the minibatch of all "
                        "ranks (distributed.num_envs_total; it replaces the envs per rank or per worker of the "
                        "config); without it each rank runs the config's envs and minibatch")
    p.add_argument("--device", choices=DEVICES,
                   help="the learner's device (training.device; default auto: cuda, else mps, else cpu)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override any config field, e.g. --set training.n_steps=64 (repeatable)")
    p.add_argument("--overwrite", action="store_true", help="replace the results of an earlier run in DIR")
    p.add_argument("--resume", metavar="DIR",
                   help="continue the run in DIR from its checkpoint (its config.yaml, then any flags given)")
    p.add_argument("--seeds", metavar="LIST",
                   help="train once per seed (e.g. 1,2,3), one after another, into OUTPUT_DIR/seed_<n>")
    return p


def flag_values(args: argparse.Namespace) -> dict[str, object]:
    """`{section.key: value}` of the trainer flags on the command line (None where not given)."""
    return {key: getattr(args, flag[2:].replace("-", "_"), None) for key, flag in FLAGS.items()}


def check_writable(path: Path) -> None:
    """Refuse a run directory that cannot be created or written, before anything starts: probe its nearest
    existing ancestor with a temporary file (permission bits alone say nothing for root or a read-only mount)."""
    ancestor = path.absolute()
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ConfigError(f"cannot create output directory {path}: {ancestor} is not a directory")
    try:
        with tempfile.TemporaryFile(dir=ancestor):
            pass
    except OSError as e:
        raise ConfigError(f"cannot write output directory {path}: {ancestor}: {e.strerror}") from None


def default_run_dir(mode: str) -> str:
    return f"benchmarks/{mode}_{time.strftime('%Y%m%d-%H%M%S')}"


def resolve_run_dir(cfg: Config, mode: str, overwrite: bool) -> Path:
    """The run directory (not yet created); refuses to mix with an earlier run's results unless told to."""
    path = Path(cfg.run.output_dir or default_run_dir(mode))
    if path.exists() and not path.is_dir():
        raise ConfigError(f"output directory {path} exists and is not a directory")
    if not overwrite and path.is_dir() and any((path / name).exists() for name in RUN_FILES):
        raise ConfigError(f"{path} already holds a run; pass --overwrite to replace it or choose another --output-dir")
    check_writable(path)
    cfg.run.output_dir = str(path)
    return path


def check_memory(cfg: Config) -> None:
    """Refuse a rollout that cannot fit in the memory available now, naming its sizes."""
    from parallel_ppo.core.buffer import RolloutBuffer
    from parallel_ppo.core.envs import env_spaces

    obs_shape, obs_dtype, _ = env_spaces(cfg.env)
    per_step = RolloutBuffer.bytes_per_step(obs_shape, obs_dtype) + 8  # + the advantages and returns
    need = cfg.rollout_size * per_step
    available = psutil.virtual_memory().available
    if need > available:
        raise ConfigError(
            f"the rollout needs {need / 2**30:,.1f} GiB ({cfg.training.n_steps:,} steps × {cfg.env.num_envs:,} "
            f"envs × {per_step:,} bytes) but {available / 2**30:,.1f} GiB of memory is available; "
            f"use fewer steps (training.n_steps) or envs")


def prepare_run_dir(path: Path, cfg: Config, overwrite: bool) -> None:
    """Create the run directory, clear an earlier run's files if overwriting, and write config.yaml."""
    path.mkdir(parents=True, exist_ok=True)
    if overwrite:
        for name in RUN_FILES:
            target = path / name
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)
    (path / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))


MUST_MATCH_ON_RESUME = ("env", "model")


def load_resume(run_dir: str, mode: str, args: argparse.Namespace) -> tuple[str, dict]:
    """Check `--resume DIR` against the other flags; return its config file and its validated checkpoint."""
    path = Path(run_dir)
    if not path.is_dir():
        raise ConfigError(f"cannot resume: {path} is not a directory")
    if args.config or args.overwrite:
        raise ConfigError("--resume takes the config from the run directory; drop --config/--overwrite")
    if args.output_dir and Path(args.output_dir).resolve() != path.resolve():
        raise ConfigError("--resume continues in its own directory; drop --output-dir")
    state = load_checkpoint(path / "checkpoint.pt")
    if state.get("mode", mode) != mode:
        raise ConfigError(f"cannot resume: {path} holds a {state['mode']} run; use the {state['mode']} trainer")
    return str(path / "config.yaml"), state


def check_resume_config(cfg: Config, state: dict, run_dir: Path) -> None:
    """The checkpoint must come from a run with the same envs and network as the config resumed with."""
    stored = state["config"]
    current = cfg.to_dict()
    for section in MUST_MATCH_ON_RESUME:
        for key, value in current[section].items():
            if stored.get(section, {}).get(key) != value:
                raise ConfigError(f"checkpoint in {run_dir} was made with {section}.{key}="
                                  f"{stored.get(section, {}).get(key)!r}, not {value!r}; it cannot be resumed so")


def measure_learner(cfg: Config, team: Solo = ALONE) -> tuple[LearnerChoice, dict | None, dict | None]:
    """Before any env or worker exists: resolve the learner's `auto` settings (precision, microbatch, device) into
    `cfg`, then measure this config's compute limit (the candidates' measurement already holds it when it ran
    now) and the machine's arithmetic roofline; each measurement is skipped when `run.limit_seconds` is 0.

    The ranks of a distributed run measure at once, each on its own minibatch (its share of it when the envs are
    split) and its threads, and all take rank 0's choice; the compute limit and the matmul peaks are rank 0's times
    the ranks."""
    from parallel_ppo.core.envs import env_spaces
    from parallel_ppo.bench.learner_settings import choose, matmul_peaks
    from parallel_ppo.bench.roofline import measure_compute_limit, network_flops

    seconds = cfg.run.limit_seconds
    obs_shape, obs_dtype, num_actions = env_spaces(cfg.env)
    local = dataclasses.replace(cfg, training=team.local_training(cfg))
    choice = team.broadcast(choose(local, obs_shape, obs_dtype, num_actions, seconds))
    choice.apply(cfg)
    if seconds <= 0:
        return choice, None, None
    local.training = team.local_training(cfg)
    limit = choice.limit or measure_compute_limit(local, obs_shape, num_actions, seconds, obs_dtype=obs_dtype)
    peaks = matmul_peaks(local)
    roofline = {**network_flops(local, obs_shape, num_actions), "peak_gflops": peaks}
    if team.distributed:  # each rank measured with its own threads, while the others measured too
        limit = {**limit, "rank_limit_sps": limit["limit_sps"], "limit_sps": limit["limit_sps"] * team.world_size}
        roofline |= {"rank_peak_gflops": peaks,
                     "peak_gflops": {k: v * team.world_size for k, v in peaks.items()}}
    return choice, limit, roofline


@dataclass
class Start:
    """A run ready to train: its config and directory, the rollout source with its workers up, and the rest."""

    cfg: Config
    run_dir: Path
    source: Any
    threads: dict[str, int]
    resume: dict | None
    limit: dict | None
    learner: LearnerChoice
    roofline: dict | None
    team: Solo


def world_size(args: argparse.Namespace) -> int | None:
    """The ranks of a `--distributed` run as torchrun announced them (None when not distributed)."""
    if not args.distributed:
        return None
    if not launched_by_torchrun():
        raise ConfigError("--distributed runs under torchrun, e.g. torchrun --standalone --nproc_per_node 2 "
                          "train_timed.py --distributed ... (see the README's distributed section)")
    return int(os.environ["WORLD_SIZE"])


def start(args: argparse.Namespace, parallel: bool) -> Start:
    """Everything before the first update, checked in the order that lets a user error stop it before any env,
    worker or file exists: config, memory, output directory, then threads, the limit measurement and the source.

    A `--distributed` rank joins the others once its config holds; rank 0 alone checks and owns the output
    directory, and a refusal there stops every rank."""
    mode = "distributed" if args.distributed else "parallel" if parallel else "sequential"
    world = world_size(args)
    flags, config_file, resume = flag_values(args), args.config, None
    if args.resume:
        config_file, resume = load_resume(args.resume, mode, args)
        flags["run.output_dir"] = args.resume
        if resume.get("world_size", 1) != (world or 1):
            raise ConfigError(f"cannot resume: {args.resume} was trained by {resume.get('world_size', 1)} ranks, not "
                              f"{world or 1}; resume it with the same number")
    cfg = build_config(config_file, flags, args.set, parallel, world)
    learner_device(cfg)  # a device asked for by name must exist
    check_memory(cfg)
    if resume is not None:
        check_resume_config(cfg, resume, Path(args.resume))
    team = join(cfg, args.distributed)
    try:
        refusal, run_dir = None, Path(args.resume or ".")
        if resume is None and team.is_main:
            try:
                run_dir = resolve_run_dir(cfg, mode, args.overwrite)
            except ConfigError as e:
                refusal = str(e)
        refusal, run_dir = team.broadcast((refusal, run_dir))
        if refusal is not None:
            raise ConfigError(refusal)
        cfg.run.output_dir = str(run_dir)
        plan = thread_plan(cfg, parallel, team.local_world_size)
        torch.set_num_threads(plan.learner)
        retain_freed_memory()
        learner, limit, roofline = measure_learner(cfg, team)
        resumes = next_resume_count(resume)
        offset = team.rank * cfg.env.num_envs  # a rank's envs continue the previous rank's global indices
        if parallel:
            from parallel_ppo.engines.parallel.coordinator import ParallelCoordinator

            source = ParallelCoordinator(cfg, plan, resumes, offset, team.rank if team.distributed else None)
        else:
            from parallel_ppo.core.collect import SequentialCollector

            source = SequentialCollector(cfg, plan.env, resumes, offset)
    except BaseException:
        team.close(wait=False)
        raise
    return Start(cfg, run_dir, source, plan.describe(), resume, limit, learner, roofline, team)


def run(argv: list[str] | None, parallel: bool, prog: str) -> int:
    """Parse, validate, build the rollout source, train (once, or once per seed); returns the exit status."""
    args = make_parser(prog, parallel).parse_args(argv)
    if args.seeds is not None:
        return run_seeds(args, parallel, prog)
    return run_one(args, parallel, prog)


def seed_runs(args: argparse.Namespace, parallel: bool) -> list[argparse.Namespace]:
    """`--seeds`: one set of arguments per seed, each checked (config and run directory) before any trains."""
    if args.distributed:
        raise ConfigError("--seeds trains seeds one after another in one process; under torchrun launch one "
                          "--distributed run per seed")
    if args.seed is not None or args.resume:
        raise ConfigError("--seeds runs several seeds; drop --seed and --resume (resume one seed's directory "
                          "on its own)")
    try:
        seeds = [int(v) for v in args.seeds.replace(",", " ").split()]
    except ValueError:
        raise ConfigError(f"--seeds expects whole numbers such as 1,2,3, got {args.seeds!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds expects distinct whole numbers such as 1,2,3, got {args.seeds!r}")
    parent = Path(args.output_dir or default_run_dir("parallel" if parallel else "sequential"))
    out = []
    for seed in seeds:
        one = argparse.Namespace(**{**vars(args), "seeds": None, "seed": seed,
                                    "output_dir": str(seed_dir(parent, seed))})
        resolve_run_dir(build_config(one.config, flag_values(one), one.set, parallel), "", one.overwrite)
        out.append(one)
    return out


def run_seeds(args: argparse.Namespace, parallel: bool, prog: str) -> int:
    """Train each seed in turn; stop at the first that does not end normally."""
    try:
        runs = seed_runs(args, parallel)
    except ConfigError as e:
        return fail(prog, e, 2)
    for i, one in enumerate(runs, 1):
        print(f"{prog}: seed {one.seed} ({i} of {len(runs)}) → {one.output_dir}", flush=True)
        status = run_one(one, parallel, prog)
        if status != 0:
            print(f"{prog}: stopped after seed {one.seed} (exit status {status}); later seeds were not run",
                  file=sys.stderr)
            return status
    parent = Path(runs[0].output_dir).parent
    print(f"{prog}: {len(runs)} seeds in {parent}; compare with: python compare_results.py --run LABEL={parent} "
          "--run OTHER=DIR", flush=True)
    return 0


def run_one(args: argparse.Namespace, parallel: bool, prog: str) -> int:
    """One training run from parsed arguments (one rank's, under `--distributed`: only rank 0 speaks and writes,
    unless a rank loses the others)."""
    quiet = args.distributed and launch_rank() != 0
    try:
        s = start(args, parallel)
    except ConfigError as e:
        return 2 if quiet else fail(prog, e, 2)
    except (RolloutError, PeerLost) as e:
        return fail(prog, e, 1)
    from parallel_ppo.core.loop import train

    try:
        if s.team.is_main:
            status = train_main(s, args, prog)
        else:
            status = exit_status(train(s.cfg, s.source, s.run_dir, s.threads, s.resume, s.limit,
                                       s.learner.to_dict(), s.roofline, s.team))
    except PeerLost as e:
        print(f"{prog}: error: {e}; stopping (the last checkpoint in {s.run_dir} is intact)", file=sys.stderr,
              flush=True)
        s.team.close(wait=False)
        return 1
    except BaseException:
        s.team.close(wait=False)
        raise
    s.team.close()
    return status


def train_main(s: Start, args: argparse.Namespace, prog: str) -> int:
    """Train with the console lines and output files of a run (a distributed run's rank 0)."""
    from parallel_ppo.core.loop import train

    if s.resume is None:
        prepare_run_dir(s.run_dir, s.cfg, args.overwrite)
    else:
        (s.run_dir / "config.yaml").write_text(yaml.safe_dump(s.cfg.to_dict(), sort_keys=False))
        print(f"{prog}: resuming {s.run_dir} at update {s.resume['update']}, {s.resume['env_steps']:,} steps, "
              f"{s.resume['elapsed']:.0f} s elapsed", flush=True)
    threads = ", ".join(f"{k} {v}" for k, v in s.threads.items())
    if s.team.distributed:
        n = s.source.layout["num_envs"]
        world, rank_batch = s.team.world_size, s.team.local_training(s.cfg).batch_size
        rule = "split over the ranks" if s.cfg.distributed.num_envs_total else "per rank, as given"
        print(f"{prog}: distributed run on {s.cfg.env.id}: {world} ranks × {n} envs = {world * n} envs (rank r "
              f"steps envs {n}r to {n}r+{n - 1}), each rank a {s.source.mode} source with {threads} threads; "
              f"minibatch {world} × {rank_batch} = {world * rank_batch} ({rule}) → {s.run_dir}", flush=True)
    else:
        print(f"{prog}: {s.source.mode} run on {s.cfg.env.id} with {s.source.layout['num_envs']} envs "
              f"({threads} threads) → {s.run_dir}", flush=True)
    print(f"{prog}: learner {s.learner.describe()}", flush=True)
    try:
        summary = train(s.cfg, s.source, s.run_dir, s.threads, s.resume, s.limit, s.learner.to_dict(), s.roofline,
                        s.team)
    except KeyboardInterrupt:  # a second Ctrl-C: stop now; the last checkpoint was written atomically
        print(f"\n{prog}: interrupted; the last checkpoint in {s.run_dir} is intact", file=sys.stderr)
        return 128 + signal.SIGINT
    return report_end(prog, s.cfg, s.run_dir, summary)


def report_end(prog: str, cfg: Config, run_dir: Path, summary: dict[str, Any]) -> int:
    """The closing lines of a run; returns its exit status (1 after an error, 128 + N after signal N)."""
    ret, sps = summary["episodic_return_mean"], summary["sps"]
    window = min(summary["episodes"], cfg.logging.return_window)
    print(f"{prog}: {summary['stop_reason']} after {summary['total_env_steps']:,} steps in "
          f"{summary['wall_seconds']:.0f} s ({'n/a' if sps is None else f'{sps:.0f}'} SPS); mean return "
          f"{'n/a' if ret is None else f'{ret:.2f}'} over the last {window} episodes", flush=True)
    if summary["normalized_return"] is not None:
        print(f"{prog}: normalized return {summary['normalized_return']:.3f} (Procgen easy-mode constants)", flush=True)
    if summary["test_return_mean"] is not None:
        norm = summary["test_normalized_return"]
        print(f"{prog}: evaluation on {summary['eval_levels']} levels: mean return {summary['test_return_mean']:.2f}"
              + ("" if norm is None else f" (normalized {norm:.3f})")
              + ("" if summary["generalization_gap"] is None else
                 f"; generalization gap {summary['generalization_gap']:.2f}"), flush=True)
    if summary["limit_efficiency"] is not None:
        print(f"{prog}: {100 * summary['limit_efficiency']:.0f}% of this machine's compute limit "
              f"({summary['compute_limit']['limit_sps']:.0f} SPS, measured before the run)", flush=True)
    if summary["achieved_gflops"] is not None:
        print(f"{prog}: {summary['achieved_gflops']:.0f} GFLOP/s achieved ({summary['flops_per_env_step'] / 1e9:.2f} "
              f"GFLOP per env step), {100 * summary['peak_fraction']:.0f}% of the {summary['precision']} matmul peak "
              f"({summary['peak_gflops']:.0f} GFLOP/s)", flush=True)
    checksums = {r["checksum"] for r in (summary["distributed"] or {}).get("ranks", [])}
    if len(checksums) > 1:
        print(f"{prog}: warning: the ranks ended with different parameters (checksums {', '.join(sorted(checksums))} "
              "in summary.json); please report it with the ranks' hosts", file=sys.stderr)
    if summary["stop_reason"] == "error":
        print(f"{prog}: error: {summary['error']} (checkpoint and summary written to {run_dir})", file=sys.stderr)
    return exit_status(summary)


def exit_status(summary: dict[str, Any]) -> int:
    """1 after an error, 128 + N after signal N, else 0."""
    if summary["stop_reason"] == "error":
        return 1
    if summary["stop_reason"] == "signal":
        return 128 + signal.Signals[summary["signal"]].value
    return 0
