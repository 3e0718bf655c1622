#!/usr/bin/env python
"""Benchmarks: `roofline` (the bare network's compute limit), `speed-check` (sequential trainer vs it)."""

import sys

from parallel_ppo.cli.bench import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], prog="bench.py"))
