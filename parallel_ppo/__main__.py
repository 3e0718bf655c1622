"""`python -m parallel_ppo COMMAND [ARGS]`: every entry point of the package, also where no checkout is at hand.

Commands: train (sequential), train-parallel, eval, demo, compare, bench; `COMMAND --help` for each. The top-level
scripts (train_timed.py, train_parallel_timed.py, compare_results.py, bench.py) call the same code.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


def _train(parallel: bool) -> Callable[[list[str], str], int]:
    def run(argv: list[str], prog: str) -> int:
        from parallel_ppo.cli.train import run as run_trainer

        return run_trainer(argv, parallel=parallel, prog=prog)

    return run


def _compare(argv: list[str], prog: str) -> int:
    from parallel_ppo.cli.compare import main

    return main(argv, prog=prog)


def _eval(argv: list[str], prog: str) -> int:
    from parallel_ppo.cli.evaluation import eval_main

    return eval_main(argv, prog=prog)


def _demo(argv: list[str], prog: str) -> int:
    from parallel_ppo.cli.evaluation import demo_main

    return demo_main(argv, prog=prog)


def _bench(argv: list[str], prog: str) -> int:
    from parallel_ppo.cli.bench import main

    return main(argv, prog=prog)


COMMANDS: dict[str, Callable[[list[str], str], int]] = {
    "train": _train(parallel=False), "train-parallel": _train(parallel=True), "eval": _eval, "demo": _demo,
    "compare": _compare, "bench": _bench,
}
USAGE = f"usage: python -m parallel_ppo {{{','.join(COMMANDS)}}} [ARGS] (COMMAND --help for its arguments)"


def main(argv: list[str] | None = None) -> int:
    """Dispatch to a command; an unknown one is one line and exit status 2."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"parallel_ppo: error: unknown command {command!r}; {USAGE}", file=sys.stderr)
        return 2
    return COMMANDS[command](rest, f"python -m parallel_ppo {command}")


if __name__ == "__main__":
    sys.exit(main())
