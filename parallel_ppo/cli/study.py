"""bench.py's `study` subcommand: the many-core study (threads, copies, workers, distributed ranks and a CUDA learner
at 1, 2, 4, ... processes) into docs/results/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from parallel_ppo.bench.study import (
    ROOT,
    StudyPlan,
    StudySettings,
    available_cores,
    check_settings,
    plan_study,
    point_command,
    process_counts,
    run_study,
)
from parallel_ppo.bench.study_pages import FAMILIES, chunks, copies_note, cut_note, results_files, study_table
from parallel_ppo.bench.trainer_runs import BenchRunCrashed
from parallel_ppo.cli.common import (
    add_config_flags,
    add_set_flag,
    fail,
    int_list,
    positive_int,
    run_budget,
    some_path,
)
from parallel_ppo.cli.train import trainer_config
from parallel_ppo.core.config_yaml import config_env
from parallel_ppo.errors import ConfigError, ParallelPPOError
from parallel_ppo.runs.directory import check_writable


def add_study(sub: Any) -> None:
    """Register `study` on bench.py's subcommands."""
    text = ("the many-core study: threads, copies (the machine's yardstick), workers (synchronous and overlapped), "
            "distributed ranks and a CUDA learner (synchronous and overlapped) at 1, 2, 4, ... processes, written to "
            "docs/results/<cpu>[-avx512][-bf16][-family<F>-model<M>]-<cores>c[-<gpu>]/"
            "study[-<config>][-<env>][-<sets>][-<drawing>].md")
    c = sub.add_parser("study", help=text, description=text[0].upper() + text[1:] + ". Runs one at a time; a "
                       "point that fails is recorded and the rest go on. Points measured before in the same "
                       "results file (same machine and settings) and not measured now are kept.")
    add_config_flags(c, "ppo_parallel.yaml")
    c.add_argument("--processes", metavar="LIST", help='process counts (default 1, 2, 4, ... usable CPUs)')
    c.add_argument("--families", default=",".join(FAMILIES), metavar="LIST",
                   help=f"which families to run (default {','.join(FAMILIES)}; cuda and cuda_overlap only where "
                        "CUDA is available)")
    c.add_argument("--seconds", type=run_budget("s"), default=30.0, metavar="TIME",
                   help="wall-clock budget of each run (default 30, at most a week)")
    c.add_argument("--n-steps", type=positive_int, default=64, metavar="N",
                   help="steps per env per rollout (default 64)")
    add_set_flag(c, "config override passed to every run (repeatable)")
    c.add_argument("--runs-dir", default="benchmarks/study", type=some_path, metavar="DIR",
                   help="where the run directories go, in a folder named as the results files (default "
                        "benchmarks/study; not for git)")
    c.add_argument("--results-dir", default=str(ROOT / "docs" / "results"), type=some_path, metavar="DIR",
                   help="parent of the results folder (default docs/results)")


def study(args: Any, prog: str) -> int:
    """Run the study as `args` say; returns the exit status (1 when a point failed)."""
    try:
        given = args.families.replace(",", " ").split()
        if not given or set(given) - set(FAMILIES):
            raise ConfigError(f"--families takes {', '.join(FAMILIES)}; got {args.families!r}")
        if twice := next((f for i, f in enumerate(given) if f in given[:i]), None):
            raise ConfigError(f"--families lists {twice} twice, got {args.families!r}")
        families = [f for f in FAMILIES if f in given]  # the order they run in
        counts = sorted(int_list(args.processes, "--processes")) if args.processes is not None else (
            process_counts(available_cores()))
        env = config_env(args.config, args.set, args.env)
        settings = StudySettings(args.config, env, args.seconds, n_steps=args.n_steps,
                                 extra=tuple(a for item in args.set for a in ("--set", item)))
        check_settings(settings)
        for flag, path in (("--runs-dir", args.runs_dir), ("--results-dir", args.results_dir)):
            check_writable(Path(path), f"{flag} {path}")  # before the first point, not after it
        plan = plan_study(families, counts, settings, Path(args.results_dir))
        check_results(plan.stem)
        runs = Path(args.runs_dir) / plan.stem.name  # each study's own: another's runs of the same labels stay
        check_points(plan, runs)
        print(f"{prog}: study of {', '.join(families)} at {counts} processes, {args.seconds:g} s per run, "
              f"one at a time", flush=True)
        if plan.skipped:
            print(f"  {', '.join(plan.skipped)}: skipped (no CUDA device here)", flush=True)
        if plan.dropped:
            print(f"  {results_files(plan.stem)['json']}: dropping {', '.join(plan.dropped)} (their update ran in "
                  f"other chunks than this study's, {chunks(plan.settings.microbatch)})", flush=True)
        if plan.edited:
            print(f"  {results_files(plan.stem)['json']}: dropping {', '.join(plan.edited)} (measured with other "
                  f"values in {args.config} than it holds now)", flush=True)
        rows = run_study(plan, runs)
    except ParallelPPOError as e:
        return fail(prog, e, 2)
    except OSError as e:  # the results folder could not be written
        return fail(prog, e, 1)
    print(study_table(rows))
    for note in (copies_note(rows), cut_note(rows)):
        if note:
            print(note.rstrip())
    files = results_files(plan.stem)
    print(f"wrote {files['md']}, {files['json']}, {files['png']}")
    failed = [r["label"] for r in rows if "error" in r]
    if failed:
        return fail(prog, BenchRunCrashed(f"{len(failed)} of {len(rows)} points failed ({', '.join(failed)}); their "
                                          f"errors are above, and in {files['md']} where no earlier figure was "
                                          "kept"), 1)
    return 0


def check_results(stem: Path) -> None:
    """Refuse (ConfigError) results files that could not be written (their folder a file, or one of them a
    directory), before the first point rather than after it."""
    check_writable(stem.parent, f"the results folder {stem.parent}")
    if taken := next((path for path in results_files(stem).values() if path.is_dir()), None):
        raise ConfigError(f"{taken} is a directory, where the study writes its results; move it away")


def check_points(plan: StudyPlan, runs_dir: Path) -> None:
    """Refuse (ConfigError) a study with a point whose settings the trainer would refuse, before any run."""
    for family, n in plan.points:
        cmd = point_command(family, n, plan.settings, runs_dir / f"{family}_{n}", plan.cores)
        trainer_config(cmd, f"the study's {family} point at {n} processes")
