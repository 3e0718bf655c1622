"""The learner settings `auto` picks for a config on this machine, measured afresh (no cache read or written).

    .venv/bin/python scripts/learner_choice.py config/robosuite_lift_camera.yaml [--output choice.json]

Prints the choice and writes, with --output, each candidate's measured compute limit, the
choice and the load of other processes meanwhile: run it on a quiet machine and beside other work (e.g. a test
suite) to see whether load changes the choice.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from parallel_ppo.cli.common import OneLineParser, duration_in, interrupted, some_path, write_result  # noqa: E402
from parallel_ppo.core.configure import build_config  # noqa: E402
from parallel_ppo.core.files import write_json  # noqa: E402
from parallel_ppo.core.threads import thread_plan  # noqa: E402
from parallel_ppo.envs.batch import env_spaces  # noqa: E402
from parallel_ppo.errors import ParallelPPOError  # noqa: E402
from parallel_ppo.runs import fingerprint  # noqa: E402
from parallel_ppo.runs.directory import check_output_file  # noqa: E402
from parallel_ppo.tuning.learner_settings import candidates, choose, pick, preferred  # noqa: E402


def main() -> int:
    parser = OneLineParser(prog="learner_choice", description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=some_path, help="the run's config file (parallel trainer's layout)")
    parser.add_argument("--seconds", type=duration_in("s"), default=None,
                        help="measurement budget: seconds, or a duration such as 2m (default: run.limit_seconds)")
    parser.add_argument("--output", type=some_path, help="write the result as JSON here")
    args = parser.parse_args()
    try:
        cfg = build_config(args.config, {}, [], parallel=True)
        if args.output:
            check_output_file(Path(args.output), f"--output {args.output}")
        spaces = env_spaces(cfg.env)
        torch.set_num_threads(thread_plan(cfg, parallel=True).learner)
        seconds = cfg.run.limit_seconds if args.seconds is None else args.seconds
        with tempfile.TemporaryDirectory() as cache:
            choice = choose(cfg, spaces, seconds, path=Path(cache) / "learner_settings.json")
    except ParallelPPOError as e:
        print(f"learner_choice: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return interrupted("learner_choice", "nothing was written")
    chunk = choice.microbatch_size or "whole"
    ranked = ", ".join(f"{label} {sps:.0f}" for label, sps in sorted(choice.rates.items(), key=lambda kv: -kv[1]))
    print(f"choice {choice.precision}/{chunk} ({choice.source}); compute limit SPS {ranked or '-'}; other processes "
          f"kept {choice.busy_cores or 0.0:.2f} cores busy")
    if args.output:
        measured = (choice.limit or {}).get("candidates", {})
        rounds_rule = None  # what the rounds alone would pick: the rule before the fastest iterations counted
        if measured:
            options = [c for c in candidates(cfg, True, True) if c.label in measured]
            kept = pick(options, {k: r["round_sps"] for k, r in measured.items()}, preferred(cfg, options))
            rounds_rule = kept.label
        result = {"config": args.config, "rounds_rule_pick": rounds_rule, "date": time.strftime("%Y-%m-%d %H:%M"),
                  "threads": torch.get_num_threads(),
                  "choice": choice.to_dict(), "ranking": (choice.limit or {}).get("ranking"), "best_sps": {
                      label: r.get("best_sps") for label, r in measured.items()},
                  "hardware": fingerprint.hardware()}
        return write_result("learner_choice", Path(args.output), lambda path: write_json(path, result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
