"""`python -m parallel_ppo COMMAND [ARGS]`: the `parallel-ppo` console command, also where it is not installed."""

import sys

from parallel_ppo.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m parallel_ppo"))
