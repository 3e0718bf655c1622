"""bench.py's `study` subcommand: the many-core study (threads, workers, distributed ranks and a CUDA learner at
1, 2, 4, ... processes) into docs/results/; and what every benchmark that runs the trainer checks before its first
run: a run's budget (`run_budget`) and the settings of each run as the trainer reads them (`trainer_config`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from parallel_ppo.bench.scaling import BenchRunCrashed
from parallel_ppo.bench.study import (
    ROOT,
    StudySettings,
    available_cores,
    check_settings,
    family_points,
    gpu_name,
    point_command,
    process_counts,
    run_study,
)
from parallel_ppo.bench.study_pages import FAMILIES, GPU_FAMILIES, results_files, study_table
from parallel_ppo.cli.common import add_config_flag, duration_in, fail, int_list, positive_int, setting_item
from parallel_ppo.core.config import Config
from parallel_ppo.core.configure import build_config
from parallel_ppo.core.units import SECONDS_PER
from parallel_ppo.errors import ConfigError, ParallelPPOError

LONGEST_RUN_DAYS = 7
"""The longest budget of one benchmark run, a week: the trainer takes up to a year, but a study stops a run as hung
after 3 × its budget + 2 min, a wait Python's poll() must hold in milliseconds (below 2**31 ms, about 24.8 days)."""


def run_budget(unit: str) -> Callable[[str], float]:
    """argparse type of a benchmark run's budget: a positive duration (`duration_in(unit)`) of at most a week."""
    duration = duration_in(unit)

    def budget(text: str) -> float:
        value = duration(text)
        if value * SECONDS_PER[unit] > LONGEST_RUN_DAYS * SECONDS_PER["d"]:
            raise argparse.ArgumentTypeError(f"a benchmark run takes at most {LONGEST_RUN_DAYS}d, got {text!r}")
        return value

    return budget


def trainer_config(cmd: list[str], name: str) -> Config:
    """The config the trainer of benchmark run `name` builds from its command (`bench.scaling.trainer_command` and
    flags), read by the trainer's own parser and built as it builds it (its precision checked on its device), nothing
    run: a ConfigError naming the run where the trainer would refuse it. What only a start tells (the env itself) is
    not checked."""
    from parallel_ppo.cli.train import make_parser, request_of
    from parallel_ppo.tuning.learner_settings import check_precision

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
        check_precision(cfg)  # as the learner's settings check it before the run
        return cfg
    except ConfigError as e:
        raise ConfigError(f"{name} would be refused by the trainer: {e}") from None


def add_study(sub: Any) -> None:
    """Register `study` on bench.py's subcommands."""
    text = ("the many-core study: threads, workers (synchronous and overlapped), distributed ranks and a CUDA learner "
            "(synchronous and overlapped) at 1, 2, 4, ... processes, written to "
            "docs/results/<cpu>[-avx512][-bf16]-<cores>c[-<gpu>]/study[-<config>][-<env>][-<sets>][-<drawing>].md")
    c = sub.add_parser("study", help=text, description=text[0].upper() + text[1:] + ". Runs one at a time; a "
                       "point that fails is recorded and the rest go on. Points measured before in the same "
                       "results file (same machine and settings) and not measured now are kept.")
    add_config_flag(c, "ppo_parallel.yaml")
    c.add_argument("--env", default="starpilot", metavar="ID", help="Procgen game or gymnasium id (starpilot)")
    c.add_argument("--processes", metavar="LIST", help='process counts (default 1, 2, 4, ... usable CPUs)')
    c.add_argument("--families", default=",".join(FAMILIES), metavar="LIST",
                   help=f"which families to run (default {','.join(FAMILIES)}; cuda and cuda_overlap only where "
                        "CUDA is available)")
    c.add_argument("--seconds", type=run_budget("s"), default=30.0, metavar="TIME",
                   help="wall-clock budget of each run (default 30, at most a week)")
    c.add_argument("--n-steps", type=positive_int, default=64, metavar="N", help="steps per env per rollout (64)")
    c.add_argument("--set", action="append", default=[], type=setting_item, metavar="KEY=VALUE",
                   help="config override passed to every run (repeatable)")
    c.add_argument("--runs-dir", default="benchmarks/study", metavar="DIR",
                   help="where the run directories go (default benchmarks/study; not for git)")
    c.add_argument("--results-dir", default=str(ROOT / "docs" / "results"), metavar="DIR",
                   help="parent of the results folder (default docs/results)")


def study(args: Any, prog: str) -> int:
    """Run the study as `args` say; returns the exit status (1 when a point failed)."""
    try:
        families = args.families.replace(",", " ").split()
        if not families or set(families) - set(FAMILIES):
            raise ConfigError(f"--families takes {', '.join(FAMILIES)}; got {args.families!r}")
        counts = sorted(set(int_list(args.processes, "--processes"))) if args.processes is not None else (
            process_counts(available_cores()))
        settings = StudySettings(args.config, args.env, args.seconds, n_steps=args.n_steps,
                                 extra=tuple(a for item in args.set for a in ("--set", item)))
        check_settings(settings)
        check_points(families, counts, settings, Path(args.runs_dir))
        for path in (Path(args.runs_dir), Path(args.results_dir)):
            if path.exists() and not path.is_dir():
                raise ConfigError(f"{path} exists and is not a directory")
        print(f"{prog}: study of {', '.join(families)} at {counts} processes, {args.seconds:g} s per run, "
              f"one at a time", flush=True)
        stem, rows = run_study([f for f in FAMILIES if f in families], counts, settings, Path(args.runs_dir),
                               Path(args.results_dir))
    except ParallelPPOError as e:
        return fail(prog, e, 2)
    except OSError as e:  # the results folder could not be written
        return fail(prog, e, 1)
    print(study_table(rows))
    files = results_files(stem)
    print(f"wrote {files['md']}, {files['json']}, {files['png']}")
    failed = [r["label"] for r in rows if "error" in r]
    if failed:
        return fail(prog, BenchRunCrashed(f"{len(failed)} of {len(rows)} points failed ({', '.join(failed)}); their "
                                          f"errors are in {files['md']}"), 1)
    return 0


def check_points(families: list[str], counts: list[int], settings: StudySettings, runs_dir: Path) -> None:
    """Refuse (ConfigError) a study with a point whose settings the trainer would refuse, before any run; the GPU
    families only where CUDA runs them (elsewhere the study skips them)."""
    cores = available_cores()
    runnable = families if gpu_name() else [f for f in families if f not in GPU_FAMILIES]
    for family, n in family_points(runnable, counts, cores):
        cmd = point_command(family, n, settings, runs_dir / f"{family}_{n}", cores)
        trainer_config(cmd, f"the study's {family} point at {n} processes")
