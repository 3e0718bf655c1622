"""Page faults per PPO minibatch step with glibc's default allocator settings and with `retain_freed_memory`
(`parallel_ppo/core/allocator.py`), each in a fresh process, interleaved over rounds. How many pages a step faults
depends on the CPU, glibc and the kernel's huge-page setting (at minibatch 64, default vs retain: 17,000-24,000 vs a
few hundred on a 2-core AMD EPYC, 6,600 vs 410 on one Intel Xeon; on another, five runs of each gave the defaults
0.2-10,003 and retain 0-51), so it is measured here, not asserted by a test; tests/test_resources.py checks only what
the setting does to glibc's thresholds.

    .venv/bin/python scripts/allocator_faults.py [--minibatch 64] [--steps 5] [--rounds 3] [--output FILE]

Prints minor faults and milliseconds per step (the median over rounds) for each mode; writes nothing unless given
--output (a JSON file of the rounds; a Ctrl-C writes nothing). A measurement: exits 0 whatever the counts.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from parallel_ppo.cli.common import (  # noqa: E402
    OneLineParser,
    interrupted,
    last_line,
    some_path,
    stop_on_sigterm,
    write_result,
)
from parallel_ppo.core.files import write_json  # noqa: E402
from parallel_ppo.errors import ConfigError  # noqa: E402
from parallel_ppo.runs.directory import check_output_file  # noqa: E402

MODES = ("default", "retain")


def measure(mode: str, minibatch: int, steps: int) -> tuple[float, float]:
    """Minor page faults and milliseconds per minibatch step in this process, after 3 steps of warm-up."""
    import math
    import resource
    import time

    import torch

    from parallel_ppo.core.allocator import retain_freed_memory
    from parallel_ppo.core.config import Config
    from parallel_ppo.core.model import build_model
    from parallel_ppo.core.ppo import TrainBatch, minibatch_step

    if mode == "retain" and not retain_freed_memory():
        sys.exit("allocator_faults.py: libc is not glibc: nothing to compare")
    torch.manual_seed(0)
    cfg = Config()
    cfg.training.microbatch_size, cfg.training.precision = 32, "fp32"
    model = build_model((64, 64, 3), 15, cfg.model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    n = minibatch
    batch = TrainBatch(torch.randint(0, 256, (n, 64, 64, 3), dtype=torch.uint8), torch.randint(0, 15, (n,)),
                       torch.full((n,), -math.log(15)), torch.zeros(n), torch.randn(n), torch.randn(n))
    for _ in range(3):  # warm-up: the heap grows to its working size
        minibatch_step(model, optimizer, batch, cfg.training)
    faults, start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
    for _ in range(steps):
        minibatch_step(model, optimizer, batch, cfg.training)
    seconds = time.perf_counter() - start
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / steps, 1000 * seconds / steps


def positive(text: str) -> int:
    """An argument that must be a positive integer."""
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return int(text)


def parse_args() -> argparse.Namespace:
    parser = OneLineParser(prog="allocator_faults.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minibatch", type=positive, default=64)
    parser.add_argument("--steps", type=positive, default=5)
    parser.add_argument("--rounds", type=positive, default=3)
    parser.add_argument("--output", type=some_path, help="a JSON file of the rounds (default: write nothing)")
    parser.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)  # a child process: measure one mode
    return parser.parse_args()


def measure_in_child(mode: str, args: argparse.Namespace) -> tuple[float, float]:
    """`measure` of `mode` in a fresh process; RuntimeError with its last line where it failed."""
    child = subprocess.run([sys.executable, __file__, "--one", mode, "--minibatch", str(args.minibatch),
                            "--steps", str(args.steps)], capture_output=True, text=True)
    if child.returncode:
        raise RuntimeError(f"the {mode} measurement failed: {last_line(child.stderr, child.returncode)}")
    faults, ms = map(float, child.stdout.split()[-2:])
    return faults, ms


def main() -> int:
    args = parse_args()
    if args.one:
        print(*measure(args.one, args.minibatch, args.steps))
        return 0
    stop_on_sigterm()
    output = Path(args.output) if args.output else None
    try:  # before any measurement
        if output is not None:
            check_output_file(output, f"--output {output}")
    except ConfigError as e:
        print(f"allocator_faults: error: {e}", file=sys.stderr)
        return 2
    rounds: dict[str, list[list[float]]] = {mode: [] for mode in MODES}
    try:
        for r in range(args.rounds):
            for mode in MODES[:: 1 if r % 2 == 0 else -1]:
                faults, ms = measure_in_child(mode, args)
                rounds[mode].append([faults, ms])
                print(f"round {r + 1}: {mode}: {faults:.0f} faults, {ms:.1f} ms a step", flush=True)
    except RuntimeError as e:
        print(f"allocator_faults: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return interrupted("allocator_faults", "nothing was written")
    for mode, rows in rounds.items():
        print(f"{mode}: {statistics.median(f for f, _ in rows):.0f} faults, "
              f"{statistics.median(ms for _, ms in rows):.1f} ms per step (median of {len(rows)})")
    if output is not None:
        result = {"command": "scripts/allocator_faults.py " + " ".join(sys.argv[1:]), "minibatch": args.minibatch,
                  "steps": args.steps, "rounds": rounds}
        if write_result("allocator_faults", output, lambda path: write_json(path, result)):
            return 1
        print(output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
