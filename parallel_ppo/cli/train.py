"""Command line of both timed trainers: flags → a `launch.Request` → the run, with one-line errors."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from parallel_ppo.cli.common import OneLineParser, fail
from parallel_ppo.core.collect import RolloutError
from parallel_ppo.core.configure import DEVICES, FLAGS, build_config
from parallel_ppo.engines.distributed import PeerLost, launch_rank
from parallel_ppo.errors import ConfigError, ParallelPPOError
from parallel_ppo.launch import Request, execute, prepare
from parallel_ppo.runs.directory import default_run_dir, resolve_run_dir
from parallel_ppo.runs.reading import seed_dir


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
    p.add_argument("--resume-if-exists", action="store_true",
                   help="continue the run in --output-dir if it has a checkpoint, else start it there: the same "
                        "command serves a requeued job (under torchrun, a restarted group does this by itself)")
    p.add_argument("--seeds", metavar="LIST",
                   help="train once per seed (e.g. 1,2,3), one after another, into OUTPUT_DIR/seed_<n>")
    return p


def request_of(args: argparse.Namespace, parallel: bool) -> Request:
    """What the parsed command line asks to train."""
    flags = {key: getattr(args, flag[2:].replace("-", "_"), None) for key, flag in FLAGS.items()}
    return Request(args.config, flags, tuple(args.set), parallel, args.distributed, args.overwrite, args.resume,
                   args.resume_if_exists)


def run(argv: list[str] | None, parallel: bool, prog: str) -> int:
    """Parse, validate, build the rollout source, train (once, or once per seed); returns the exit status."""
    args = make_parser(prog, parallel).parse_args(argv)
    if args.seeds is not None:
        return run_seeds(args, parallel, prog)
    return run_one(request_of(args, parallel), prog)


def seed_runs(args: argparse.Namespace, parallel: bool) -> list[Request]:
    """`--seeds`: one request per seed, each checked (config and run directory) before any trains."""
    if args.distributed:
        raise ConfigError("--seeds trains seeds one after another in one process; under torchrun launch one "
                          "--distributed run per seed")
    if args.seed is not None or args.resume or args.resume_if_exists:
        raise ConfigError("--seeds runs several seeds; drop --seed and --resume (resume one seed's directory "
                          "on its own)")
    try:
        seeds = [int(v) for v in args.seeds.replace(",", " ").split()]
    except ValueError:
        raise ConfigError(f"--seeds expects whole numbers such as 1,2,3, got {args.seeds!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds expects distinct whole numbers such as 1,2,3, got {args.seeds!r}")
    parent = Path(args.output_dir or default_run_dir("parallel" if parallel else "sequential"))
    base, out = request_of(args, parallel), []
    for seed in seeds:
        one = Request(base.config, {**base.flags, "run.seed": seed, "run.output_dir": str(seed_dir(parent, seed))},
                      base.sets, parallel, overwrite=base.overwrite)
        resolve_run_dir(build_config(one.config, one.flags, list(one.sets), parallel), "", one.overwrite)
        out.append(one)
    return out


def run_seeds(args: argparse.Namespace, parallel: bool, prog: str) -> int:
    """Train each seed in turn; stop at the first that does not end normally."""
    try:
        runs = seed_runs(args, parallel)
    except ParallelPPOError as e:
        return fail(prog, e, 2)
    for i, one in enumerate(runs, 1):
        print(f"{prog}: seed {one.flags['run.seed']} ({i} of {len(runs)}) → {one.flags['run.output_dir']}",
              flush=True)
        status = run_one(one, prog)
        if status != 0:
            print(f"{prog}: stopped after seed {one.flags['run.seed']} (exit status {status}); later seeds were not "
                  "run", file=sys.stderr)
            return status
    parent = Path(runs[0].flags["run.output_dir"]).parent
    print(f"{prog}: {len(runs)} seeds in {parent}; compare with: python compare_results.py --run LABEL={parent} "
          "--run OTHER=DIR", flush=True)
    return 0


def run_one(request: Request, prog: str) -> int:
    """One training run (one rank's, under `--distributed`: only rank 0 speaks and writes, unless a rank loses the
    others); returns its exit status."""
    quiet = request.distributed and launch_rank() != 0
    try:
        prepared = prepare(request)
    except ParallelPPOError as e:
        return 2 if quiet else fail(prog, e, 2)
    except (RolloutError, PeerLost) as e:
        return fail(prog, e, 1)
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted before the first update; nothing was trained", file=sys.stderr)
        return 128 + signal.SIGINT
    return execute(prepared, prog)[1]
