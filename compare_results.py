#!/usr/bin/env python
"""Compare timed runs side by side: a console table, comparison.png, phase_breakdown.png, a text and a
markdown report, and comparison.json.

    python compare_results.py --sequential benchmarks/sequential_1h --parallel benchmarks/parallel_1h
    python compare_results.py --run w1=benchmarks/w1 --run w2=benchmarks/w2 --run w4=benchmarks/w4
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import NoReturn

from parallel_ppo.config import ConfigError
from parallel_ppo.runs import load_runs, parse_run_spec

PROG = "compare_results.py"


class OneLineParser(argparse.ArgumentParser):
    """parallel_ppo.cli.OneLineParser's behaviour (a bad flag is one line and exit status 2), without
    importing parallel_ppo.cli, which loads torch: input errors are reported in a fraction of a second."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def make_parser() -> OneLineParser:
    p = OneLineParser(prog=PROG, description="Compare timed PPO runs: tables, plots and a report.")
    p.add_argument("--sequential", metavar="DIR", help="the sequential run (label 'sequential')")
    p.add_argument("--parallel", metavar="DIR", help="the parallel run (label 'parallel')")
    p.add_argument("--run", action="append", default=[], metavar="LABEL=DIR",
                   help="any run under a label of your choice (repeatable, e.g. a sweep of worker counts)")
    p.add_argument("--output-dir", default="benchmarks/comparison", metavar="DIR",
                   help="where the report files go (default: benchmarks/comparison)")
    p.add_argument("--baseline", metavar="LABEL",
                   help="run the speed-ups are measured against "
                        "(default: the first sequential run, else the first run)")
    p.add_argument("--threshold", type=float, metavar="RETURN",
                   help="return for 'time to threshold' (default: 80%% of the best final return)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    out_dir = Path(args.output_dir)
    roles = {role: Path(d) for role, d in (("sequential", args.sequential), ("parallel", args.parallel)) if d}
    try:
        specs = [*roles.items(), *(parse_run_spec(s) for s in args.run)]
        if len(specs) < 2:
            raise ConfigError("nothing to compare: give at least two runs (--sequential/--parallel or --run)")
        runs = load_runs(specs)
        # Imported only once the input is known to be good: plotting and the checkpoint helpers load
        # matplotlib and torch, which would make a simple input error slow to report.
        from parallel_ppo import report

        report.check_output_dir(out_dir)
        comparison = report.compare(runs, args.baseline, args.threshold, {role: role for role in roles})
        outputs = report.render_outputs(comparison)
    except ConfigError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    try:
        written = report.write_outputs(outputs, out_dir)
    except OSError as e:
        print(f"{PROG}: error: cannot write the comparison to {out_dir}: {e.strerror or e}", file=sys.stderr)
        return 2

    try:
        sys.stdout.write(report.console_summary(comparison, written))
        sys.stdout.flush()
    except BrokenPipeError:  # piped into `head`, say: the files are written, the rest is not wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
