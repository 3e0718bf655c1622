#!/usr/bin/env python
"""Keep finished runs as evidence: copy what compare_results reads of each (metrics.csv, summary.json and
config.yaml, tens of kB; no checkpoint, TensorBoard log or video) to DEST/LABEL/<run directory's name>, so that
`compare_results.py --run LABEL=DEST/LABEL` gives the same tables and curves on any clone.

    .venv/bin/python scripts/keep_runs.py docs/results/<machine>/runs/lift_overlap \\
        synchronous=benchmarks/lift_sync overlapped=benchmarks/lift_refresh

A LABEL=DIR names a run directory or a parent of seed runs (as compare_results takes them); each is checked as
compare_results checks it (a run that has not finished is refused), and no two may land in one place nor on a kept
run, before anything is copied. A run's files are copied beside it and renamed into place, so none is half there.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from parallel_ppo.errors import ConfigError, RunDataError, one_line  # noqa: E402
from parallel_ppo.runs.directory import check_writable  # noqa: E402
from parallel_ppo.runs.reading import load_groups, parse_run_spec  # noqa: E402

KEPT = ("metrics.csv", "summary.json", "config.yaml")


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0].startswith("-"):
        print(__doc__.strip().splitlines()[0], "\nusage: keep_runs.py DEST LABEL=DIR [LABEL=DIR ...]", file=sys.stderr)
        return 2
    try:
        plan = kept_runs(Path(argv[0]), argv[1:])
        check_writable(Path(argv[0]), f"DEST {argv[0]}")
    except (ConfigError, RunDataError) as error:
        print(f"keep_runs.py: error: {error}", file=sys.stderr)
        return 2
    for source, target in plan:
        part = target.with_name(f".{target.name}.part")
        try:
            shutil.rmtree(part, ignore_errors=True)
            part.mkdir(parents=True)
            for name in KEPT:
                shutil.copyfile(source / name, part / name)
            part.rename(target)
        except OSError as error:  # a full disk: the runs kept before stay, this one is not half there
            shutil.rmtree(part, ignore_errors=True)
            print(f"keep_runs.py: error: could not keep {source} as {target}: {one_line(error)}", file=sys.stderr)
            return 1
        print(f"{source} → {target}")
    return 0


def kept_runs(dest: Path, specs: list[str]) -> list[tuple[Path, Path]]:
    """(run directory, where it is kept) for each run the specs name, each checked; ConfigError for a label that
    is not one folder's name, or a place taken twice or already."""
    labelled = [parse_run_spec(spec) for spec in specs]
    for label, _ in labelled:
        if Path(label).name != label or label in (".", ".."):
            raise ConfigError(f"a label is one folder's name, not {label!r}")
    plan: dict[Path, Path] = {}
    for group in load_groups(labelled):  # refuses what compare_results would refuse, in one line
        for run in group.runs:
            target = dest / group.label / run.path.resolve().name
            if target in plan or target.exists():
                raise ConfigError(f"{target} is taken ({plan.get(target, 'a kept run')}): give each run its own "
                                  "label or folder name, and keep a run once")
            plan[target] = run.path
    return [(path, target) for target, path in plan.items()]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
