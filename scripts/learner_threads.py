"""What `parallel.learner_threads: auto` picks for configs on this machine, measured now (no cache read or written):
each config's learner settings are resolved as a run resolves them, then its network is timed on 1, 2, 4, ...
threads up to the run's ceiling, and `pick_threads` decides.

    .venv/bin/python scripts/learner_threads.py --config config/robosuite_lift_camera.yaml config/ppo_parallel.yaml \\
        --seconds 10 --output benchmarks/learner_threads.json

Prints a line per config and writes an evidence file (machine, date, commit, command, per config the counts' compute
limits and the choice): every config's env is built first, and one that cannot be, or a Ctrl-C, writes nothing. A
measurement: exits 0 whatever it picks; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from parallel_ppo.bench.study import available_cores  # noqa: E402
from parallel_ppo.cli.common import OneLineParser, duration_in, interrupted, some_path, write_result  # noqa: E402
from parallel_ppo.core.config import Config  # noqa: E402
from parallel_ppo.core.configure import build_config  # noqa: E402
from parallel_ppo.core.files import write_text  # noqa: E402
from parallel_ppo.core.threads import thread_plan  # noqa: E402
from parallel_ppo.envs.batch import env_spaces  # noqa: E402
from parallel_ppo.envs.spaces import EnvSpaces  # noqa: E402
from parallel_ppo.errors import ParallelPPOError  # noqa: E402
from parallel_ppo.runs import fingerprint  # noqa: E402
from parallel_ppo.runs.directory import check_output_file  # noqa: E402
from parallel_ppo.tuning.learner_settings import choose  # noqa: E402
from parallel_ppo.tuning.learner_threads import choose_threads  # noqa: E402


def measure(config: str, cfg: Config, spaces: EnvSpaces, seconds: float, cache: Path) -> dict:
    """One config's learner settings and thread choice, measured into an empty `cache`."""
    ceiling = thread_plan(cfg, parallel=True).learner
    torch.set_num_threads(ceiling)
    learner = choose(cfg, spaces, seconds, path=cache)
    threads = choose_threads(learner.resolve(cfg), spaces, seconds, ceiling, path=cache)
    return {"config": config, "env": cfg.env.id, "model": cfg.model.kind, "learner": learner.describe(),
            "ceiling": ceiling, "threads": threads.threads, "source": threads.source, "rates": threads.rates,
            "busy_cores": threads.busy_cores, "line": threads.describe()}


def prepare(args: argparse.Namespace) -> tuple[list[tuple[Config, EnvSpaces]], Path]:
    """Every config with its env's spaces (each env built once: one that cannot be is refused before any config is
    measured) and the output, checked (ConfigError)."""
    cfgs = [build_config(str(ROOT / config), {}, ["parallel.learner_threads=auto"], True) for config in args.config]
    output = Path(args.output)
    check_output_file(output, f"--output {args.output}")
    return [(cfg, env_spaces(cfg.env)) for cfg in cfgs], output


def main() -> int:
    p = OneLineParser(prog="learner_threads.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=some_path, nargs="+", required=True)
    p.add_argument("--seconds", type=duration_in("s"), default=10.0,
                   help="measurement budget per config and choice: seconds, or a duration such as 1m (default 10)")
    p.add_argument("--output", type=some_path, default="benchmarks/learner_threads.json")
    args = p.parse_args()
    try:
        configs, output = prepare(args)
        rows = []
        for config, (cfg, spaces) in zip(args.config, configs, strict=True):
            with tempfile.TemporaryDirectory() as tmp:
                rows.append(measure(config, cfg, spaces, args.seconds, Path(tmp) / "cache.json"))
            print(f"{config}: {rows[-1]['line']}", flush=True)
    except ParallelPPOError as e:
        print(f"learner_threads.py: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return interrupted("learner_threads.py", "nothing was written")
    evidence = {"machine": f"{fingerprint.describe_cpu()}, {available_cores()} cores",
                "cpu_kind": fingerprint.cpu_kind(), "date": datetime.date.today().isoformat(),
                "commit": fingerprint.source_commit() or "unknown",
                "command": shlex.join(["scripts/learner_threads.py", *sys.argv[1:]]), "configs": rows}
    return write_result("learner_threads.py", output,
                        lambda path: write_text(path, json.dumps(evidence, indent=1) + "\n"))


if __name__ == "__main__":
    sys.exit(main())
