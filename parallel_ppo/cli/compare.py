"""compare_results.py / `python -m parallel_ppo compare`: timed runs side by side, as a console table,
comparison.png, phase_breakdown.png, a text and a markdown report, and comparison.json.

    python compare_results.py --sequential benchmarks/sequential_1h --parallel benchmarks/parallel_1h
    python compare_results.py --run w1=benchmarks/w1 --run w2=benchmarks/w2 --run w4=benchmarks/w4
    python compare_results.py --run fp32=runs/fp32 --run bf16=runs/bf16/seed_1,runs/bf16/seed_2   (seeds)
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

from parallel_ppo.core.config import ConfigError, OneLineParser, fail
from parallel_ppo.runs.reading import is_run_dir, load_groups, parse_run_spec


def make_parser(prog: str) -> OneLineParser:
    p = OneLineParser(prog=prog, description=(
        "Compare timed PPO runs side by side. Prints the table and writes comparison.png, phase_breakdown.png, "
        "comparison_report.txt, comparison.md and comparison.json to --output-dir."))
    p.add_argument("--sequential", metavar="DIR", help="the sequential run (label 'sequential')")
    p.add_argument("--parallel", metavar="DIR", help="the parallel run (label 'parallel')")
    p.add_argument("--run", action="append", default=[], metavar="LABEL=DIR[,DIR...]",
                   help="runs under a label of your choice (repeatable, e.g. a sweep of worker counts); several "
                        "directories, or a parent of run directories, make one label over seeds")
    p.add_argument("--at-steps", type=float, metavar="N",
                   help="env steps at which returns are compared across seeds (default: the shortest run's)")
    p.add_argument("--output-dir", default="benchmarks/comparison", metavar="DIR",
                   help="where the report files go (default: benchmarks/comparison)")
    p.add_argument("--baseline", metavar="LABEL",
                   help="run the speed-ups are measured against "
                        "(default: the first sequential run, else the first run)")
    p.add_argument("--threshold", type=float, metavar="RETURN",
                   help="return for 'time to threshold' (default: 80%% of the best final return)")
    return p


def check_arguments(specs: list[tuple[str, list[Path]]], baseline: str | None, out_dir: Path) -> None:
    """What can be refused before any run is read: too few runs, an unknown baseline, an output path
    that cannot be a directory."""
    labels = [label for label, _ in specs]
    if len(specs) < 2 and not any(len(dirs) > 1 or (dirs[0].is_dir() and not is_run_dir(dirs[0]))
                                  for _, dirs in specs):
        raise ConfigError("nothing to compare: give at least two runs (--sequential/--parallel or --run)")
    if baseline is not None and baseline not in labels:
        raise ConfigError(f"--baseline {baseline!r} is not one of the runs ({', '.join(labels)})")
    existing = next((p for p in (out_dir, *out_dir.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise ConfigError(f"output directory {out_dir}: {existing} exists and is not a directory")


def main(argv: list[str] | None = None, prog: str = "compare_results.py") -> int:
    """Read the runs, print the table and write the report files; returns the exit status."""
    args = make_parser(prog).parse_args(argv)
    out_dir = Path(args.output_dir)
    roles = {role: [Path(d)] for role, d in (("sequential", args.sequential), ("parallel", args.parallel)) if d}
    try:
        specs = [*roles.items(), *(parse_run_spec(s) for s in args.run)]
        check_arguments(specs, args.baseline, out_dir)
        if args.at_steps is not None and not (math.isfinite(args.at_steps) and args.at_steps > 0):
            raise ConfigError(f"--at-steps must be a positive number of env steps, got {args.at_steps}")
        groups = load_groups(specs)
        # Imported only once the input is known to be good: plotting and the checkpoint helpers load
        # matplotlib and torch, which would make a simple input error slow to report.
        from parallel_ppo.runs import report

        comparison = report.compare(groups, args.baseline, args.threshold, {role: role for role in roles},
                                    args.at_steps)
        outputs = report.render_outputs(comparison)
    except ConfigError as e:
        return fail(prog, e, 2)
    try:
        written = report.write_outputs(outputs, out_dir)
    except OSError as e:
        print(f"{prog}: error: cannot write the comparison to {out_dir}: {e.strerror or e}", file=sys.stderr)
        return 2

    try:
        sys.stdout.write(report.console_summary(comparison, written))
        sys.stdout.flush()
    except BrokenPipeError:  # piped into `head`, say: the files are written, the rest is not wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0

