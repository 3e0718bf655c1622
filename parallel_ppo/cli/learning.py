"""bench.py's `learning` subcommand: config variants × seeds, one training run at a time, compared across seeds
(`bench.learning` runs them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from parallel_ppo.bench.trainer_runs import BenchRunCrashed
from parallel_ppo.cli.common import (
    add_config_flags,
    add_set_flag,
    fail,
    int_list,
    refuse_seeded_sets,
    run_args,
    run_budget,
    some_path,
)
from parallel_ppo.cli.train import trainer_config
from parallel_ppo.core.config_yaml import config_env
from parallel_ppo.errors import ConfigError, ParallelPPOError
from parallel_ppo.runs.directory import check_writable


def add_learning(sub: Any) -> None:
    """bench.py's `learning` subcommand and its flags."""
    from parallel_ppo.bench.learning import DEFAULT_VARIANTS

    text = "train config variants × seeds, one run at a time, and compare their learning across seeds"
    c = sub.add_parser("learning", help=text, description=text[0].upper() + text[1:] + ". Runs that finished "
                       "before (summary.json present) are kept, so the same command finishes an interrupted one; "
                       "one of the other trainer or another env is refused.")
    add_config_flags(c, "ppo_sequential.yaml")
    c.add_argument("--minutes", type=run_budget("m"), default=10.0, metavar="TIME",
                   help="per run (default 10, at most a week; a bare number is minutes, 90s or 1.5h work too)")
    c.add_argument("--seeds", default="1,2,3", metavar="LIST", help="seeds (default 1,2,3)")
    c.add_argument("--variant", action="append", default=[], metavar="LABEL:KEY=VALUE,...",
                   help="a variant (repeatable; keys as for --set, e.g. fp32:training.precision=fp32); "
                        "default: " + ", ".join(f"{v.label}:{','.join(v.sets)}" for v in DEFAULT_VARIANTS))
    add_set_flag(c, "config override passed to every run (repeatable)")
    c.add_argument("--parallel", action="store_true",
                   help="train with the parallel trainer and the config's workers (the same learning per step, "
                        "faster where stepping envs is much of the work); default: the sequential trainer")
    c.add_argument("--output-dir", type=some_path, metavar="DIR",
                   help="default benchmarks/learning_<env>, a / in the id a - (an earlier version's folder with the / "
                        "is kept where only it exists)")


def default_folder(env: str) -> Path:
    """The learning benchmark's folder for `env`: benchmarks/learning_<env>, a `/` in the id a dash; where only the
    folder an earlier version wrote for such an id exists (benchmarks/learning_robosuite/Lift), that one, so that its
    runs are kept and resumed."""
    out, before = Path(f"benchmarks/learning_{env.replace('/', '-')}"), Path(f"benchmarks/learning_{env}")
    return before if before != out and before.is_dir() and not out.exists() else out


def learning(args: Any, prog: str) -> int:
    """Run the learning benchmark as `args` say; returns the exit status (1 when a run crashed)."""
    from parallel_ppo.bench import learning as runs

    try:
        seeds = int_list(args.seeds, "--seeds", least=0)  # as the trainers take
        variants = [runs.parse_variant(v) for v in args.variant] or list(runs.DEFAULT_VARIANTS)
        labels = [v.label for v in variants]
        if len(set(labels)) != len(labels):
            raise ConfigError(f"two variants have the same label ({', '.join(labels)})")
        refuse_seeded_sets([*args.set, *(item for v in variants for item in v.sets)], "the learning benchmark")
        extra = run_args(args, args.parallel)
        env = config_env(args.config, args.set, args.env)
        out = Path(args.output_dir) if args.output_dir else default_folder(env)
        env_ids = {}
        for v, seed in runs.plan(variants, seeds):  # every run is checked before the first one starts
            cmd = runs.run_command(v, seed, out, args.config, args.minutes, extra, args.parallel)
            env_ids[v.label] = trainer_config(cmd, f"benchmark run {v.label} seed {seed}").env.id
        check_writable(out, f"--output-dir {out}")
        mode = "parallel" if args.parallel else "sequential"
        runs.check_kept_runs(out, env_ids, mode, seeds)
        print(f"{prog}: {env}, {len(variants)} variants × {len(seeds)} seeds × {args.minutes:g} min, one at a "
              f"time, {mode} trainer → {out}", flush=True)
        return runs.main_learning(out, variants, seeds, args.config, args.minutes, extra, prog, args.parallel)
    except ParallelPPOError as e:
        return fail(prog, e, 2)
    except BenchRunCrashed as e:
        return fail(prog, e, 1)
