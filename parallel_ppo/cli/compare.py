"""compare_results.py / `python -m parallel_ppo compare`: timed runs side by side, as a console table,
comparison.png, phase_breakdown.png, a text and a markdown report, and comparison.json.

    python compare_results.py --sequential benchmarks/sequential_1h --parallel benchmarks/parallel_1h
    python compare_results.py --run w1=benchmarks/w1 --run w2=benchmarks/w2 --run w4=benchmarks/w4
    python compare_results.py --run fp32=runs/fp32 --run bf16=runs/bf16/seed_1,runs/bf16/seed_2   (seeds)
    python compare_results.py --run a=runs/a --run b=runs/b --reference sac=curves/robosuite_sac_lift.csv
"""

from __future__ import annotations

from pathlib import Path

from parallel_ppo.cli.common import OneLineParser, fail, interrupted, some_path
from parallel_ppo.errors import ParallelPPOError
from parallel_ppo.runs.reading import parse_run_spec
from parallel_ppo.runs.reference import parse_reference_spec
from parallel_ppo.runs.report.make import make_report
from parallel_ppo.runs.report.numbers import THRESHOLD_SHARE


def make_parser(prog: str) -> OneLineParser:
    p = OneLineParser(prog=prog, description=(
        "Compare timed PPO runs side by side. Prints the table and writes comparison.png, phase_breakdown.png, "
        "comparison_report.txt, comparison.md and comparison.json to --output-dir."))
    p.add_argument("--sequential", type=some_path, metavar="DIR", help="the sequential run (label 'sequential')")
    p.add_argument("--parallel", type=some_path, metavar="DIR", help="the parallel run (label 'parallel')")
    p.add_argument("--run", action="append", default=[], metavar="LABEL=DIR[,DIR...]",
                   help="runs under a label of your choice (repeatable, e.g. a sweep of worker counts); several "
                        "directories, or a parent of run directories, make one label over seeds")
    p.add_argument("--reference", action="append", default=[], metavar="LABEL=CSV",
                   help="a published learning curve drawn and tabled beside the runs (repeatable): a CSV with "
                        "env_steps and episodic_return_mean columns, optionally return_low and return_high (a band); "
                        "compared by return at equal env steps only, never as a run")
    p.add_argument("--at-steps", type=float, metavar="N",
                   help="env steps at which returns are compared across seeds and against --reference curves (at "
                        "most, and by default, the shortest run's)")
    p.add_argument("--output-dir", default="benchmarks/comparison", type=some_path, metavar="DIR",
                   help="where the report files go (default: benchmarks/comparison)")
    p.add_argument("--baseline", metavar="LABEL",
                   help="run the speed-ups are measured against: a label (one over seeds means its first run) or "
                        "LABEL/<run directory> for one of its seeds, as the tables name it (default: the first "
                        "sequential run, else the first run)")
    p.add_argument("--threshold", type=float, metavar="RETURN",
                   help=f"return for 'time to threshold' (default: {THRESHOLD_SHARE * 100:.0f}%% of the way from the "
                        "highest first logged return to the best final return)")
    return p


def main(argv: list[str] | None = None, prog: str = "compare_results.py") -> int:
    """Read the runs, print the table and write the report files; returns the exit status."""
    args = make_parser(prog).parse_args(argv)
    roles = {role: [Path(d)] for role, d in (("sequential", args.sequential), ("parallel", args.parallel)) if d}
    try:
        specs = [*roles.items(), *(parse_run_spec(s) for s in args.run)]
        references = [parse_reference_spec(s) for s in args.reference]
    except ParallelPPOError as e:
        return fail(prog, e, 2)
    try:
        return make_report(specs, Path(args.output_dir), prog, args.baseline, args.threshold,
                           {role: role for role in roles}, args.at_steps, references)
    except KeyboardInterrupt:  # the report files are written all at once, at the end
        return interrupted(prog, "the report was not written")
