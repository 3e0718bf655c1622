#!/usr/bin/env python
"""Does a config learn on this CPU whatever the seed and float summation order? Train it for seeds × learner
threads × modes and print the final mean returns as a table (and JSON with --output).

    .venv/bin/python scripts/learning_matrix.py --seeds 1 2 3 4 5 --threads 1 2 --modes sequential parallel

Results do not depend on how many runs share the machine (only their speed does), so `--jobs 2` halves the
wall time of a sweep on 2 cores.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from parallel_ppo.core.files import write_text  # noqa: E402

ENTRY = {"sequential": "train_timed.py", "parallel": "train_parallel_timed.py"}


def train_once(config: str, mode: str, seed: int, threads: int, steps: int, sets: list[str], out: Path) -> dict:
    """One run; returns its summary (or the error it printed)."""
    cmd = [sys.executable, ENTRY[mode], "--config", config, "--seed", str(seed), "--total-steps", str(steps),
           "--output-dir", str(out), "--set", f"parallel.learner_threads={threads}",
           "--set", "logging.tensorboard=false", *itertools.chain.from_iterable(("--set", s) for s in sets)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"failed": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    summary = json.loads((out / "summary.json").read_text())
    print(f"  {mode}, {threads} learner thread(s), seed {seed}: {summary['episodic_return_mean']}", flush=True)
    return summary


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="config/cartpole.yaml")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="learner threads (parallel.learner_threads)")
    p.add_argument("--modes", nargs="+", choices=sorted(ENTRY), default=["sequential", "parallel"])
    p.add_argument("--total-steps", type=int, default=100_000)
    p.add_argument("--threshold", type=float, default=475.0, help="mean return (last 100 episodes) that passes")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (results do not depend on it)")
    p.add_argument("--output", metavar="FILE.json", help="also write every result as JSON")
    args = p.parse_args()
    output = Path(args.output) if args.output else None
    wrong = [f"--{name.replace('_', '-')} must be at least 1" for name in ("jobs", "total_steps")
             if getattr(args, name) < 1] + ["--threads must be at least 1"] * (min(args.threads) < 1)
    wrong += [f"no config {args.config}"] * (not (ROOT / args.config).is_file())
    wrong += [f"--output {args.output}: not a file in a folder that exists"] * bool(
        output and (output.is_dir() or not output.resolve().parent.is_dir()))
    if wrong:  # before hours of runs
        print(f"learning_matrix.py: error: {wrong[0]}", file=sys.stderr)
        return 2

    cells = list(itertools.product(args.modes, args.threads, args.seeds))
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(train_once, args.config, mode, seed, threads, args.total_steps, args.set,
                               Path(tmp) / f"{mode}_t{threads}_s{seed}") for mode, threads, seed in cells]
        results = [f.result() for f in futures]

    table: dict[tuple[str, int], dict[int, str]] = {}
    passed = 0
    for (mode, threads, seed), summary in zip(cells, results, strict=True):
        ret = summary.get("episodic_return_mean")
        ok = ret is not None and ret >= args.threshold
        passed += ok
        table.setdefault((mode, threads), {})[seed] = summary["failed"] if "failed" in summary else f"{ret:.1f}"
    print(f"| mode | learner threads | {' | '.join(f'seed {s}' for s in args.seeds)} |")
    print(f"|---|---:|{'---:|' * len(args.seeds)}")
    for (mode, threads), row in table.items():
        print(f"| {mode} | {threads} | {' | '.join(row[s] for s in args.seeds)} |")
    print(f"{passed} of {len(cells)} runs reached a mean return of {args.threshold:g} (last 100 episodes) "
          f"within {args.total_steps:,} steps")
    if output:
        write_text(output, json.dumps(
            [{"mode": m, "learner_threads": t, "seed": s, **r} for (m, t, s), r in zip(cells, results, strict=True)],
            indent=2, default=str))
    return 0 if passed == len(cells) else 1


if __name__ == "__main__":
    sys.exit(main())
