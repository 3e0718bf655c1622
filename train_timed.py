#!/usr/bin/env python
"""Sequential PPO, bounded by wall-clock time: one process steps every env and runs the update."""

import sys

from parallel_ppo.cli.train import run

if __name__ == "__main__":
    sys.exit(run(sys.argv[1:], parallel=False, prog="train_timed.py"))
