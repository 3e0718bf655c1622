#!/usr/bin/env python
"""Compare timed runs side by side: a console table, plots, a text and a markdown report, and JSON."""

import sys

from parallel_ppo.cli.compare import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], prog="compare_results.py"))
