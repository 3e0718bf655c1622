"""The command lines, thin layers over the package: `parallel-ppo COMMAND` (also `python -m parallel_ppo COMMAND`)
dispatches to the trainers, evaluation, demo and export, comparison and benchmarks; the top-level scripts
(train_timed.py, train_parallel_timed.py, compare_results.py, bench.py) call the same code."""

from __future__ import annotations

import sys
from collections.abc import Callable

PROG = "parallel-ppo"


def _train(parallel: bool) -> Callable[[list[str], str], int]:
    def run(argv: list[str], prog: str) -> int:
        from parallel_ppo.cli.train import run as run_trainer

        return run_trainer(argv, parallel=parallel, prog=prog)

    return run


def _eval(argv: list[str], prog: str) -> int:
    from parallel_ppo.cli.evaluation import eval_main

    return eval_main(argv, prog=prog)


def _demo(argv: list[str], prog: str) -> int:
    from parallel_ppo.cli.evaluation import demo_main

    return demo_main(argv, prog=prog)


def _export(argv: list[str], prog: str) -> int:
    from parallel_ppo.cli.export import export_main

    return export_main(argv, prog=prog)


def _compare(argv: list[str], prog: str) -> int:
    from parallel_ppo.cli.compare import main as compare_main

    return compare_main(argv, prog=prog)


def _bench(argv: list[str], prog: str) -> int:
    from parallel_ppo.cli.bench import main as bench_main

    return bench_main(argv, prog=prog)


COMMANDS: dict[str, tuple[Callable[[list[str], str], int], str]] = {
    "train": (_train(parallel=False), "sequential timed training (train_timed.py)"),
    "train-parallel": (_train(parallel=True),
                       "parallel timed training: coordinator + workers (train_parallel_timed.py)"),
    "eval": (_eval, "a trained policy's return on its training or held-out levels, eval.json"),
    "demo": (_demo, "a video of a trained policy playing"),
    "export": (_export, "a trained policy as one ONNX or TorchScript file for inference elsewhere"),
    "compare": (_compare, "timed runs side by side: table, plots, reports (compare_results.py)"),
    "bench": (_bench, "roofline, speed-check, envs, scaling, layouts, autotune, learning, study (bench.py)"),
}


def usage(prog: str) -> str:
    lines = [f"usage: {prog} {{{','.join(COMMANDS)}}} [ARGS]", "", "commands:"]
    lines += [f"  {name:<15} {text}" for name, (_, text) in COMMANDS.items()]
    lines.append(f"\n`{prog} COMMAND --help` for a command's arguments; `{prog} --version` for the version.")
    return "\n".join(lines)


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """Dispatch to a command; no command or an unknown one is one line and exit status 2."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(usage(prog))
        return 0
    if argv and argv[0] == "--version":
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"{prog} {version('parallel_ppo')}")
        except PackageNotFoundError:  # run from a checkout that pip never installed
            print(f"{prog}: the package is not installed (`make install`), so its version is unknown")
        return 0
    if not argv or argv[0] not in COMMANDS:
        what = f"unknown command {argv[0]!r}" if argv else "no command given"
        print(f"{prog}: error: {what}; one of {', '.join(COMMANDS)} (--help for more)", file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    return COMMANDS[command][0](rest, f"{prog} {command}")
