"""The whole comparison of run directories, below compare_results.py's flags: check the arguments, read the runs,
compare them, write the report files and print the console summary. The learning benchmark calls it too.

Plotting loads matplotlib, so it is imported only once the input is known to be good: a simple input error
is reported fast.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from parallel_ppo.errors import ConfigError, ParallelPPOError, WriteFailed
from parallel_ppo.runs.directory import check_writable
from parallel_ppo.runs.reading import is_run_dir, load_groups
from parallel_ppo.runs.reference import load_references


def check_arguments(specs: list[tuple[str, list[Path]]], baseline: str | None, out_dir: Path) -> None:
    """What can be refused before any run is read: too few runs (said as the one run given not found, where so), an
    unknown baseline, an output directory that cannot be created or written."""
    labels = [label for label, _ in specs]
    if len(specs) < 2 and not any(len(dirs) > 1 or (dirs[0].is_dir() and not is_run_dir(dirs[0]))
                                  for _, dirs in specs):
        missing = next((d for _, dirs in specs for d in dirs if not d.exists()), None)  # what to fix first
        raise ConfigError(f"run directory not found: {missing}" if missing else
                          "nothing to compare: give at least two runs (--sequential/--parallel or --run)")
    if baseline is not None and baseline.rpartition("/")[0] not in labels and baseline not in labels:
        raise ConfigError(f"--baseline {baseline!r} is not one of the runs ({', '.join(labels)})")
    check_writable(out_dir)


def make_report(specs: list[tuple[str, list[Path]]], out_dir: Path, prog: str, baseline: str | None = None,
                threshold: float | None = None, declared_modes: Mapping[str, str] | None = None,
                at_steps: float | None = None, references: Sequence[tuple[str, Path]] = ()) -> int:
    """Compare the runs of `specs` (label, directories), beside the reference curves of `references` (label, CSV),
    write every report file to `out_dir` (all or none) and print the console summary; returns the exit status: 0; 2
    after a one-line `PROG: error: ...` on stderr for bad input, 1 for a report the disk did not take. The other
    arguments are as `numbers.compare`'s."""
    try:
        check_arguments(specs, baseline, out_dir)
        groups = load_groups(specs)
        curves = load_references(references, groups)
        from parallel_ppo.runs.report.numbers import compare
        from parallel_ppo.runs.report.plots import render_outputs, write_outputs
        from parallel_ppo.runs.report.text import console_summary

        comparison = compare(groups, baseline, threshold, declared_modes, at_steps, curves)
        outputs = render_outputs(comparison)
    except ParallelPPOError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    try:
        written = write_outputs(outputs, out_dir)  # all or none
    except (ParallelPPOError, WriteFailed) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, ParallelPPOError) else 1
    try:
        sys.stdout.write(console_summary(comparison, written))
        sys.stdout.flush()
    except BrokenPipeError:  # piped into `head`, say: the files are written, the rest is not wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
