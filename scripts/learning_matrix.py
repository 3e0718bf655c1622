#!/usr/bin/env python
"""Does a config learn on this CPU whatever the seed and float summation order? Train it for seeds × learner
threads × modes and print the final mean returns as a table (and JSON with --output).

    .venv/bin/python scripts/learning_matrix.py --seeds 1 2 3 4 5 --threads 1 2 --modes sequential parallel

Results do not depend on how many runs share the machine (only their speed does), so `--jobs 2` halves the
wall time of a sweep on 2 cores. Every run's config is checked before the first starts; a seed, thread count or mode
given twice runs once. A Ctrl-C stops the runs under way, starts no other and writes nothing.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from parallel_ppo.bench.trainer_runs import end_processes  # noqa: E402
from parallel_ppo.cli.common import (  # noqa: E402
    OneLineParser,
    add_set_flag,
    commands_under,
    interrupted,
    last_line,
    positive_int,
    seed_number,
    some_path,
    stop_on_sigterm,
    write_result,
)
from parallel_ppo.core.configure import build_config  # noqa: E402
from parallel_ppo.core.files import write_text  # noqa: E402
from parallel_ppo.errors import ConfigError, ParallelPPOError  # noqa: E402
from parallel_ppo.runs.directory import check_output_file  # noqa: E402

ENTRY = {"sequential": "train_timed.py", "parallel": "train_parallel_timed.py"}
STARTING = threading.Lock()
"""Held while a run starts: once `STOPPING` is set under it, no run starts (`train_all`)."""
STOPPING = threading.Event()


def train_once(config: str, mode: str, seed: int, threads: int, steps: int, sets: list[str], out: Path) -> dict:
    """One run; returns its summary (or the error it printed)."""
    cmd = [sys.executable, ENTRY[mode], "--config", config, "--seed", str(seed), "--total-steps", str(steps),
           "--output-dir", str(out), "--set", f"parallel.learner_threads={threads}",
           "--set", "logging.tensorboard=false", *itertools.chain.from_iterable(("--set", s) for s in sets)]
    with STARTING:
        if STOPPING.is_set():
            return {"failed": "not started: the matrix was stopped"}
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, stderr = proc.communicate()
    if proc.returncode != 0:
        return {"failed": last_line(stderr, proc.returncode)}
    summary = json.loads((out / "summary.json").read_text())
    print(f"  {mode}, {threads} learner thread(s), seed {seed}: {summary['episodic_return_mean']}", flush=True)
    return summary


def parse_args() -> argparse.Namespace:
    p = OneLineParser(prog="learning_matrix.py", description=__doc__.splitlines()[0])
    p.add_argument("--config", default="config/cartpole.yaml")
    p.add_argument("--seeds", type=seed_number, nargs="+", default=[1, 2, 3, 4, 5])
    p.add_argument("--threads", type=positive_int, nargs="+", default=[1, 2],
                   help="learner threads (parallel.learner_threads)")
    p.add_argument("--modes", nargs="+", choices=sorted(ENTRY), default=["sequential", "parallel"])
    p.add_argument("--total-steps", type=positive_int, default=100_000)
    p.add_argument("--threshold", type=float, default=475.0, help="mean return (last 100 episodes) that passes")
    add_set_flag(p, "config override (repeatable)")
    p.add_argument("--jobs", type=positive_int, default=1, help="runs at a time (results do not depend on it)")
    p.add_argument("--output", type=some_path, metavar="FILE.json", help="also write every result as JSON")
    args = p.parse_args()
    for name in ("seeds", "threads", "modes"):  # a value twice is its cells once (twice, they shared a directory)
        setattr(args, name, list(dict.fromkeys(getattr(args, name))))
    return args


def check(args: argparse.Namespace) -> None:
    """Every run's config as its trainer reads it, and the output: refused before the first run (ConfigError)."""
    if not (ROOT / args.config).is_file():
        raise ConfigError(f"no config {args.config}")
    for mode, threads in itertools.product(args.modes, args.threads):
        build_config(str(ROOT / args.config), {"run.seed": max(args.seeds), "run.total_steps": args.total_steps},
                     [f"parallel.learner_threads={threads}", *args.set], parallel=mode == "parallel")
    if args.output:
        check_output_file(Path(args.output), f"--output {args.output}")


def train_all(args: argparse.Namespace, cells: list[tuple[str, int, int]], tmp: str) -> list[dict]:
    """Every cell's run, `--jobs` at a time. On Ctrl-C (which stops the runs under way too) or SIGTERM the runs not
    started are cancelled, not started one after another before the interrupt is seen, and one that a pool thread
    started while the interrupt stopped the one before is stopped too."""
    pool = ThreadPoolExecutor(args.jobs)
    try:
        futures = [pool.submit(train_once, args.config, mode, seed, threads, args.total_steps, args.set,
                               Path(tmp) / f"{mode}_t{threads}_s{seed}") for mode, threads, seed in cells]
        return [f.result() for f in futures]
    except BaseException:
        with STARTING:
            STOPPING.set()
        end_processes(commands_under())
        raise
    finally:
        pool.shutdown(cancel_futures=True)


def main() -> int:
    args = parse_args()
    try:  # before hours of runs
        check(args)
    except ParallelPPOError as e:
        print(f"learning_matrix.py: error: {e}", file=sys.stderr)
        return 2
    stop_on_sigterm()
    cells = list(itertools.product(args.modes, args.threads, args.seeds))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            results = train_all(args, cells, tmp)
    except KeyboardInterrupt:
        return interrupted("learning_matrix.py", "no result was written")

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
    trained = sorted({r["total_env_steps"] for r in results if "total_env_steps" in r})
    steps = f"{trained[0]:,}" if len(trained) == 1 else f"{trained[0]:,} to {trained[-1]:,}" if trained else ""
    print(f"{passed} of {len(cells)} runs reached a mean return of {args.threshold:g} (last 100 episodes) "
          + (f"within {steps} steps (--total-steps {args.total_steps:,}, in whole rollouts)" if trained else
             "(every run failed: the table says why)"))
    table = [{"mode": m, "learner_threads": t, "seed": s, **r} for (m, t, s), r in zip(cells, results, strict=True)]
    if args.output and write_result("learning_matrix.py", Path(args.output),
                                    lambda path: write_text(path, json.dumps(table, indent=2, default=str))):
        return 1
    return 0 if passed == len(cells) else 1


if __name__ == "__main__":
    sys.exit(main())
