#!/usr/bin/env python
"""Benchmarks of the network and trainers on this machine: roofline, speed-check, envs, scaling, layouts, autotune,
learning, study (`python bench.py --help`; docs/benchmarking.md)."""

import sys

from parallel_ppo.cli.bench import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], prog="bench.py"))
