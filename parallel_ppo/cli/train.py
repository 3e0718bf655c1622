"""Command line of both timed trainers: flags → a `request.Request` → the run, with one-line errors; and the config a
benchmark's trainer command would build (`trainer_config`), checked before any of its runs starts."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import NoReturn

from parallel_ppo.cli.common import (
    OneLineParser,
    Terminated,
    add_set_flag,
    duration_in,
    fail,
    int_list,
    interrupted,
    refuse_seeded_sets,
    some_path,
    step_count,
    terminated_as_interrupt,
)
from parallel_ppo.cli.flags import FLAGS
from parallel_ppo.core.config import Config
from parallel_ppo.core.config_yaml import dump_yaml
from parallel_ppo.core.configure import build_config
from parallel_ppo.errors import ConfigError, ParallelPPOError
from parallel_ppo.request import Request, check_launch, check_new_run, speaks
from parallel_ppo.runs.directory import default_run_dir, resolve_run_dir
from parallel_ppo.runs.progress import progress_to_stdout
from parallel_ppo.runs.reading import seed_dir


def make_parser(prog: str, parallel: bool) -> OneLineParser:
    mode = "parallel (coordinator + worker processes)" if parallel else "sequential (one process)"
    p = OneLineParser(prog=prog, description=f"Wall-clock-bounded PPO training, {mode}. A flag's default is the "
                      "config file's value, else the built-in one shown; --print-config shows what a command "
                      "resolves to.")
    p.add_argument("--config", type=some_path,
                   help="YAML config file (sections env, parallel, model, training, run, logging, eval, distributed, "
                        "tracking)")
    p.add_argument("--duration", type=duration_in("h"), metavar="TIME",
                   help="wall-clock budget: 90m, 1.5h, 3600s; a bare number is hours (run.duration; "
                        f"{builtin('run.duration')} h)")
    p.add_argument("--total-steps", type=step_count, metavar="N",
                   help="also stop after N env steps, 1e6 for a million "
                        f"(run.total_steps; {builtin('run.total_steps')}, no limit)")
    p.add_argument("--output-dir", type=some_path, metavar="DIR", help="run directory (run.output_dir; built-in: "
                                                       "benchmarks/<mode>_<time>)")
    p.add_argument("--env", metavar="ID", help="Procgen game (starpilot, ...), gymnasium id (CartPole-v1) or "
                                               f"module:EnvId (env.id; {builtin('env.id')})")
    p.add_argument("--seed", type=int, metavar="N", help=f"random seed (run.seed; {builtin('run.seed')})")
    p.add_argument("--batch-size", type=int, metavar="N",
                   help=f"SGD minibatch size (training.batch_size; {builtin('training.batch_size')})")
    add_layout_flags(p, parallel)
    p.add_argument("--device", metavar="DEVICE",
                   help="the learner's device: cpu, cuda, cuda:1, xpu, mps, privateuseone:0 (DirectML) "
                        "(training.device; default auto: cuda, else xpu, mps, DirectML, cpu)")
    add_set_flag(p, "override any config field, e.g. --set training.n_steps=64 (repeatable)")
    p.add_argument("--overwrite", action="store_true", help="replace the results of an earlier run in DIR")
    p.add_argument("--resume", type=some_path, metavar="DIR",
                   help="continue the run in DIR from its checkpoint (its config.yaml, then any flags given)")
    p.add_argument("--resume-if-exists", action="store_true",
                   help="continue the run in --output-dir if it has a checkpoint, else start it there: the same "
                        "command serves a requeued job (under torchrun, a restarted group does this by itself)")
    p.add_argument("--seeds", metavar="LIST",
                   help="train once per seed (e.g. 1,2,3), one after another, into OUTPUT_DIR/seed_<n>; with "
                        "--resume-if-exists, each seed with a checkpoint goes on from it")
    p.add_argument("--print-config", action="store_true",
                   help="print the config this command resolves to (YAML, as config.yaml) and exit; `auto` values "
                        "are chosen by measurement when a run starts")
    return add_tracking_flags(p)


def add_layout_flags(p: OneLineParser, parallel: bool) -> None:
    """Envs, workers and ranks."""
    if parallel:
        p.add_argument("--num-workers", type=int, metavar="W",
                       help=f"worker processes (parallel.num_workers; {builtin('parallel.num_workers')})")
        p.add_argument("--num-envs-per-worker", type=int, metavar="M",
                       help="envs per worker (parallel.num_envs_per_worker; "
                            f"{builtin('parallel.num_envs_per_worker')})")
        p.add_argument("--num-envs", type=int, metavar="N",
                       help="envs in all, split evenly over the workers (env.num_envs = workers × envs per worker)")
    else:
        p.add_argument("--num-envs", type=int, metavar="N",
                       help=f"number of envs (env.num_envs; {builtin('env.num_envs')})")
    p.add_argument("--distributed", action="store_true",
                   help="one rank of a data-parallel run under torchrun (gradients all-reduced; rank 0 writes)")
    p.add_argument("--num-envs-total", type=int, metavar="N",
                   help="--distributed: envs over all ranks, split evenly, and --batch-size then the minibatch of all "
                        "ranks (distributed.num_envs_total; it replaces the envs per rank or per worker of the "
                        "config); without it each rank runs the config's envs and minibatch")


def add_tracking_flags(p: OneLineParser) -> OneLineParser:
    """The Weights & Biases flags (config section `tracking`)."""
    p.add_argument("--track", action="store_true", default=None,
                   help="track the run in Weights & Biases (tracking.wandb; needs pip install 'parallel_ppo[wandb]'; "
                        "with WANDB_MODE=offline nothing goes over the network and W&B's files stay in "
                        "OUTPUT_DIR/wandb, a folder each session)")
    p.add_argument("--wandb-project", metavar="NAME",
                   help=f"W&B project (tracking.project; {builtin('tracking.project')})")
    p.add_argument("--wandb-entity", metavar="NAME", help="W&B team or user (tracking.entity; default: yours)")
    p.add_argument("--wandb-group", metavar="NAME",
                   help="W&B group, e.g. one per experiment or set of seeds (tracking.group)")
    p.add_argument("--wandb-tags", metavar="A,B", help="W&B tags, comma-separated (tracking.tags)")
    return p


def builtin(key: str) -> str:
    """`built-in: VALUE`, the default of config field `section.key` when no config file sets it."""
    section, _, name = key.partition(".")
    return f"built-in: {getattr(getattr(Config(), section), name)}"


def request_of(args: argparse.Namespace, parallel: bool) -> Request:
    """What the parsed command line asks to train."""
    flags = {key: getattr(args, flag[2:].replace("-", "_"), None) for key, flag in FLAGS.items()}
    return Request(args.config, flags, tuple(args.set), parallel=parallel, distributed=args.distributed,
                   overwrite=args.overwrite, resume=args.resume, resume_if_exists=args.resume_if_exists)


def refused(prog: str, error: Exception, request: Request) -> int:
    """Exit status 2 for a refused request, its one line said by the process that speaks for it (`request.speaks`:
    under torchrun, rank 0 alone)."""
    return fail(prog, error, 2, flags=True) if speaks(request) else 2


def run(argv: list[str] | None, parallel: bool, prog: str) -> int:
    """Parse, validate, build the rollout source, train (once, or once per seed); returns the exit status."""
    args = make_parser(prog, parallel).parse_args(argv)
    if args.print_config:
        return print_config(request_of(args, parallel), args.seeds, prog)
    with progress_to_stdout(prog):  # the progress lines of a run whose stdout is not a terminal
        if args.seeds is not None:
            return run_seeds(args, parallel, prog)
        return run_one(request_of(args, parallel), prog)


def print_config(request: Request, seeds: str | None, prog: str) -> int:
    """`--print-config`: the config the run would train with, as YAML on stdout, checked as a run checks it (a
    resumed run's own config under the flags, its checkpoint's match, the ranks under torchrun, a new run's
    directory)."""
    try:
        from parallel_ppo.core.evaluate import check_render  # torch: a Ctrl-C while it loads is one line too
        from parallel_ppo.launch import checked_spaces, validated_config
        from parallel_ppo.tuning.learner_settings import check_precision

        check_launch(request)
        if seeds is not None:
            raise ConfigError("--print-config shows one run's config: give --seed N instead of --seeds")
        checked = validated_config(request)
        spaces, _ = checked_spaces(*checked)
        cfg, _, going_on, _ = checked
        if going_on.resume is None:  # a new run: its directory too (a make target checks a run under torchrun so)
            resolve_run_dir(cfg, going_on.mode, going_on.overwrite)
        check_render(cfg, spaces)  # as rank 0 draws it before a run
        check_precision(cfg)  # as the learner's settings check it before a run
    except ParallelPPOError as e:
        return refused(prog, e, request)
    except KeyboardInterrupt:
        return interrupted(prog, "no config was printed")
    if speaks(request):  # rank 0's alone under torchrun
        print(dump_yaml(cfg.to_dict()), end="")
    return 0


def seed_runs(args: argparse.Namespace, parallel: bool) -> list[Request]:
    """`--seeds`: one request per seed, each checked (config and run directory) before any trains; with
    `--resume-if-exists`, a seed whose directory has a checkpoint goes on from it (one that ended, at once), its
    checkpoint checked when its turn comes."""
    if args.distributed:
        raise ConfigError("--seeds trains seeds one after another in one process; under torchrun launch one "
                          "--distributed run per seed")
    if args.seed is not None or args.resume:
        raise ConfigError("--seeds runs several seeds; drop --seed and --resume (resume one seed's directory "
                          "on its own, or all with --resume-if-exists)")
    if args.resume_if_exists and not args.output_dir:
        raise ConfigError("--seeds with --resume-if-exists needs --output-dir: the directory whose seed_<n> runs "
                          "go on")
    seeds = int_list(args.seeds, "--seeds", least=0)
    refuse_seeded_sets(args.set, "--seeds")
    parent = Path(args.output_dir or default_run_dir("parallel" if parallel else "sequential"))
    base, out = request_of(args, parallel), []
    for seed in seeds:
        flags = {**base.flags, "run.seed": seed, "run.output_dir": str(seed_dir(parent, seed))}
        one = Request(base.config, flags, base.sets, parallel=parallel, overwrite=base.overwrite,
                      resume_if_exists=base.resume_if_exists)
        check_new_run(one)
        out.append(one)
    return out


def run_seeds(args: argparse.Namespace, parallel: bool, prog: str) -> int:
    """Train each seed in turn; stop at the first that does not end normally."""
    try:
        runs = seed_runs(args, parallel)
    except ParallelPPOError as e:
        return refused(prog, e, request_of(args, parallel))
    except KeyboardInterrupt:  # while the seeds' runs are checked
        return not_trained(prog)
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
    others); returns its exit status. The training modules load torch: a new run's settings and run directory are
    checked before they are imported, so a refusal is quick."""
    try:
        check_new_run(request)
        from parallel_ppo.launch import execute, prepare  # torch, after the quick checks
    except ParallelPPOError as e:
        return refused(prog, e, request)
    except KeyboardInterrupt:
        return not_trained(prog)
    from parallel_ppo.core.collect import RolloutError  # loaded with launch
    from parallel_ppo.engines.distributed import PeerLost

    try:  # SIGTERM while the workers start (their envs may take minutes) stops them as Ctrl-C does, not silently
        with terminated_as_interrupt():
            prepared = prepare(request, (lambda line: print(f"{prog}: {line}", flush=True)) if speaks(request) else
                               None)
    except ParallelPPOError as e:
        return refused(prog, e, request)
    except (RolloutError, PeerLost) as e:
        return fail(prog, e, 1, flags=True)
    except KeyboardInterrupt:
        return not_trained(prog)
    try:
        return execute(prepared, prog)[1]
    except ParallelPPOError as e:  # W&B that could not start (nothing written)
        return refused(prog, e, request)


def not_trained(prog: str) -> int:
    """Ctrl-C (or SIGTERM while the workers start) before a run's own handler is set (its checks, torch's import,
    its set-up): one line, status 130 (143)."""
    if isinstance(sys.exc_info()[1], Terminated):
        print(f"{prog}: terminated before the first update; nothing was trained", file=sys.stderr)
        return 128 + signal.SIGTERM
    print(f"\n{prog}: interrupted before the first update; nothing was trained", file=sys.stderr)
    return 128 + signal.SIGINT


def trainer_config(cmd: list[str], name: str) -> Config:
    """The config the trainer of benchmark run `name` builds from its command (`bench.trainer_runs.trainer_command` and
    flags), read by the trainer's own parser and built as it builds it (its precision checked on its device), nothing
    run: a ConfigError naming the run where the trainer would refuse it. What only a start tells (the env itself) is
    not checked."""

    def refuse(message: str) -> NoReturn:
        raise ConfigError(message)

    start = cmd.index("parallel_ppo") + 1  # [..., "-m", "parallel_ppo", "train" | "train-parallel", flags...]
    parallel = cmd[start] == "train-parallel"
    ranks = int(cmd[cmd.index("--nproc_per_node") + 1]) if "--nproc_per_node" in cmd else None
    parser = make_parser(cmd[start], parallel)
    parser.error = refuse  # a ConfigError, not an exit
    try:
        request = request_of(parser.parse_args(cmd[start + 1:]), parallel)
        cfg = build_config(request.config, request.flags, list(request.sets), parallel, ranks)
        from parallel_ppo.tuning.learner_settings import check_precision  # torch: after the config's own checks

        check_precision(cfg)  # as the learner's settings check it before the run
        return cfg
    except ConfigError as e:
        raise ConfigError(f"{name} would be refused by the trainer: {e}") from None
