#!/usr/bin/env python
"""Keep finished runs as evidence: copy what compare_results reads of each (metrics.csv, summary.json and
config.yaml, tens of kB; no checkpoint, TensorBoard log or video) to DEST/LABEL/<run directory's name>, so that
`compare_results.py --run LABEL=DEST/LABEL` gives the same tables and curves on any clone.

    .venv/bin/python scripts/keep_runs.py docs/results/<machine>/runs/lift_overlap \\
        synchronous=benchmarks/lift_sync overlapped=benchmarks/lift_refresh

A LABEL=DIR names a run directory or a parent of seed runs (as compare_results takes them); each is checked as
compare_results checks it (a run that has not finished is refused) before anything is copied.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from parallel_ppo.errors import ConfigError, RunDataError  # noqa: E402
from parallel_ppo.runs.reading import expand_run_dirs, load_run, parse_run_spec  # noqa: E402

KEPT = ("metrics.csv", "summary.json", "config.yaml")


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0].startswith("-"):
        print(__doc__.strip().splitlines()[0], "\nusage: keep_runs.py DEST LABEL=DIR [LABEL=DIR ...]", file=sys.stderr)
        return 2
    dest = Path(argv[0])
    try:
        plan = []
        for spec in argv[1:]:
            label, dirs = parse_run_spec(spec)
            for path in expand_run_dirs(dirs):
                load_run(label, path)  # refuses what compare_results would refuse, in one line
                plan.append((path, dest / label / path.name))
    except (ConfigError, RunDataError) as error:
        print(f"keep_runs.py: {error}", file=sys.stderr)
        return 2
    for source, target in plan:
        target.mkdir(parents=True, exist_ok=True)
        for name in KEPT:
            shutil.copyfile(source / name, target / name)
        print(f"{source} → {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
