"""How long make targets take on this machine, one at a time, written as an evidence file for the docs.

    .venv/bin/python scripts/time_targets.py smoke test-fast docs roofline [--output FILE]

Runs `make TARGET` for each target in turn (nothing else should run meanwhile), prints each wall time, and writes
`docs/results/<machine>/make_targets.json` (the folder `make study` names for this machine; rows of other targets
timed before are kept, each with its own call, date and commit): the machine, date,
commit and command, each target's seconds under `figures`, and a table), then regenerates the docs' tables
from their evidence files (`docs_evidence.py --write`). Every target is checked first (`make -n`): one the Makefile
lacks is refused (exit 2) before any runs. A target that fails is reported and leaves its figure and row as they
were (the time of its last pass, if any); the rest go on, and the exit status is 1. A Ctrl-C writes nothing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from parallel_ppo.bench.study import available_cores, machine_results_dir  # noqa: E402
from parallel_ppo.cli.common import (  # noqa: E402
    OneLineParser,
    interrupted,
    last_line,
    some_path,
    stop_on_sigterm,
    write_result,
)
from parallel_ppo.core.files import read_evidence, write_text  # noqa: E402
from parallel_ppo.runs import fingerprint  # noqa: E402
from parallel_ppo.runs.directory import check_output_file  # noqa: E402


def time_target(target: str, cwd: Path = ROOT) -> tuple[float, int]:
    """Wall seconds and exit status of `make TARGET` in `cwd` (its output goes to this script's)."""
    start = time.perf_counter()
    status = subprocess.run(["make", "--no-print-directory", target], cwd=cwd).returncode
    return time.perf_counter() - start, status


def check_target(target: str, cwd: Path) -> None:
    """Refuse a target the Makefile in `cwd` cannot make (a typo would be timed as a failure of 0 s): `make -n`, which
    prints the target's commands without running them."""
    proc = subprocess.run(["make", "-n", "--no-print-directory", target], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ValueError(f"make {target}: {last_line(proc.stderr, proc.returncode)}")


def write_docs() -> None:
    """Regenerate the docs' tables from their evidence files."""
    subprocess.run([sys.executable, str(ROOT / "scripts" / "docs_evidence.py"), "--write"], cwd=ROOT)


def parse_args() -> argparse.Namespace:
    parser = OneLineParser(prog="time_targets", description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="+")
    parser.add_argument("--cwd", type=Path, default=ROOT,
                        help="the checkout to run make in (a fresh clone, whose `make install` can be timed too)")
    parser.add_argument("--output", type=some_path,
                        help="the evidence file (default: docs/results/<machine>/make_targets.json)")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    stop_on_sigterm()
    machine = f"{fingerprint.describe_cpu()}, {available_cores()} cores"
    output = Path(args.output) if args.output else machine_results_dir(ROOT / "docs" / "results") / "make_targets.json"
    try:  # checked before any target runs
        check_output_file(output, f"the evidence file {output}")
        if not (args.cwd / "Makefile").is_file():
            raise ValueError(f"--cwd {args.cwd}: no Makefile there")
        old = read_evidence(output) if output.is_file() else {}
        if old.get("machine", machine) != machine:
            raise ValueError(f"{output} holds another machine's times ({old['machine']}); name another --output")
        for target in dict.fromkeys(args.targets):
            check_target(target, args.cwd)
    except (ValueError, OSError) as e:  # ConfigError is a ValueError
        print(f"time_targets: error: {e}", file=sys.stderr)
        return 2
    figures = dict(old.get("figures", {}))
    rows = {r[0]: r for r in old.get("tables", {}).get("times", {}).get("rows", [])}
    fresh = " (fresh clone)" if args.cwd.resolve() != ROOT else ""
    failed, today, commit = [], datetime.date.today().isoformat(), fingerprint.source_commit(args.cwd) or "unknown"
    call = "scripts/time_targets.py " + " ".join(sys.argv[1:])
    try:
        for target in args.targets:
            seconds, status = time_target(target, args.cwd)
            print(f"make {target}: {seconds:.0f} s" + (f" (failed, exit {status})" if status else ""), flush=True)
            if status:  # its figure and row stay those of the last time it passed
                failed.append(target)
                continue
            figures[target.replace("-", "_") + ("_fresh_clone" if fresh else "")] = round(seconds)
            rows[f"make {target}{fresh}"] = [f"make {target}{fresh}", round(seconds), "passed", today, commit, call]
    except KeyboardInterrupt:
        return interrupted("time_targets", "nothing was written")
    if len(failed) == len(args.targets):
        print(f"time_targets: every target failed; {output} was left as it was", file=sys.stderr)
        return 1
    evidence = {
        "machine": machine, "cpu_kind": fingerprint.cpu_kind(), "date": today, "commit": commit,
        "command": "scripts/time_targets.py TARGET...; each row names the call, date and commit that timed it",
        "figures": figures,
        "tables": {"times": {"columns": ["target", "seconds", "result", "date", "commit", "command"],
                             "rows": list(rows.values())}},
    }
    if write_result("time_targets.py", output, lambda path: write_text(path, json.dumps(evidence, indent=1) + "\n")):
        return 1
    print(f"written to {output}" + (f"; failed, not recorded: {', '.join(failed)}" if failed else ""))
    write_docs()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
