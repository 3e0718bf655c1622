#!/usr/bin/env python
"""Parallel PPO, bounded by wall-clock time: worker processes step the envs, the coordinator runs the update."""

import sys

from parallel_ppo.cli.train import run

if __name__ == "__main__":
    sys.exit(run(sys.argv[1:], parallel=True, prog="train_parallel_timed.py"))
