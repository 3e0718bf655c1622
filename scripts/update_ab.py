"""The same PPO update after a sequential rollout and after a parallel one, alternated update by update in one
process (issue 24: is the parallel trainer's update slower, and is it the rollout's memory or what ran before it?).

One learner, two rollout sources over the same config: the sequential collector (envs in this process, the rollout
in private memory) and the parallel coordinator (2 workers by default, the rollout in shared memory). Updates take
turns in ABBA order, so a slow spell of the machine, which lasts minutes on shared 2-core machines and swamps a
comparison of two runs, falls on both alike. The learner is on the CPU unless --set says otherwise. Prints each
update's seconds, the medians' ratio and the paired ratio: the median over blocks of 4 consecutive updates (2 of
each) of the block's parallel seconds over its sequential seconds, which a spell longer than a block (~20 s)
leaves alone, where it moves the medians of a machine that switches between a fast and a slow state. A
measurement: exits 0 whatever the ratio.

    .venv/bin/python scripts/update_ab.py [--updates 40] [--config config/ppo_parallel.yaml] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def parse_args() -> argparse.Namespace:
    from parallel_ppo.cli.common import OneLineParser, add_set_flag, positive_int

    p = OneLineParser(prog="update_ab.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--updates", type=positive_int, default=40, help="in all, a multiple of 4: half after each source "
                   "(and 2 warm-up updates more)")
    p.add_argument("--config", default=str(ROOT / "config" / "ppo_parallel.yaml"))
    add_set_flag(p, "config override (repeatable)")
    return p.parse_args()


def prepare(args: argparse.Namespace) -> tuple[Any, Any]:
    """The config and its env's spaces (the env built once: one that cannot be is refused before any update),
    checked (ConfigError)."""
    from parallel_ppo.core.configure import build_config
    from parallel_ppo.envs.batch import env_spaces
    from parallel_ppo.errors import ConfigError

    if args.updates % 4:
        raise ConfigError("--updates must be a positive multiple of 4")
    cfg = build_config(args.config, {"training.device": "cpu"}, args.set, parallel=True)
    if cfg.parallel.sync_fraction < 1:
        raise ConfigError("the two sources' updates must be of one size: parallel.sync_fraction must be 1")
    return cfg, env_spaces(cfg.env)


def alternate(cfg: Any, spaces: Any, plan: Any, updates: int) -> tuple[dict[str, list[float]], list[dict]]:
    """`updates` + 2 updates, after each source's rollout in ABBA order: each source's seconds an update (the
    first of each left out: it warms the caches and the allocator), and each block's of 4 consecutive updates."""
    from parallel_ppo.core.collect import SequentialCollector
    from parallel_ppo.core.loop import rollout_batch
    from parallel_ppo.core.model import module_device
    from parallel_ppo.core.ppo import ppo_update
    from parallel_ppo.core.threads import thread_plan
    from parallel_ppo.core.timing import PhaseTimer
    from parallel_ppo.core.train_state import TrainState
    from parallel_ppo.engines.parallel.coordinator import ParallelCoordinator

    seconds: dict[str, list[float]] = {"sequential": [], "parallel": []}
    blocks: list[dict[str, float]] = []  # each: seconds per source over 4 consecutive updates, 2 after each
    with contextlib.ExitStack() as stack:
        sources = [SequentialCollector(cfg, thread_plan(cfg, parallel=False).env)]
        stack.callback(sources[0].close)
        sources.append(ParallelCoordinator(cfg, spaces, plan))
        stack.callback(sources[1].close)
        state = TrainState.new(cfg, sources[1].spaces)
        for i in range(updates + 2):
            source = sources[(i + i // 2) % 2]  # A B B A A B B A ...
            source.collect(state.model, PhaseTimer())
            data = rollout_batch(source.buffer, cfg).to(module_device(state.model))
            start = time.perf_counter()
            ppo_update(state.model, state.optimizer, data, cfg.training, state.generator)
            took = time.perf_counter() - start
            if i >= 2:
                seconds[source.mode].append(took)
                if (i - 2) % 4 == 0:
                    blocks.append({"sequential": 0.0, "parallel": 0.0})
                blocks[-1][source.mode] += took
            print(f"update {i + 1} after the {source.mode} rollout: {took:.3f} s", flush=True)
    return seconds, blocks


def main() -> int:
    import torch

    from parallel_ppo.cli.common import interrupted
    from parallel_ppo.core.allocator import retain_freed_memory
    from parallel_ppo.core.threads import thread_plan
    from parallel_ppo.errors import ParallelPPOError
    from parallel_ppo.tuning.learner_settings import choose

    args = parse_args()
    try:
        cfg, spaces = prepare(args)
        plan = thread_plan(cfg, parallel=True)
        torch.set_num_threads(plan.learner)  # the plan's ceiling (not `auto`'s measured count), then the allocator
        retain_freed_memory()
        choice = choose(cfg, spaces, 10.0)
        cfg = choice.resolve(cfg)
        print(f"learner {choice.describe()}, {plan.learner} threads; {cfg.parallel.num_workers} workers × "
              f"{cfg.parallel.num_envs_per_worker} envs against {cfg.env.num_envs} envs in this process", flush=True)
        seconds, blocks = alternate(cfg, spaces, plan, args.updates)
    except ParallelPPOError as e:
        print(f"update_ab.py: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return interrupted("update_ab.py", "no ratio for the updates timed above")
    seq, par = (statistics.median(seconds[m]) for m in ("sequential", "parallel"))
    print(f"median update: after sequential {seq:.3f} s, after parallel {par:.3f} s, ratio {par / seq:.4f} "
          f"({len(seconds['parallel'])} updates each)")
    paired = [b["parallel"] / b["sequential"] for b in blocks]
    print(f"paired ratio: median {statistics.median(paired):.4f} over {len(paired)} ABBA blocks "
          f"(from {min(paired):.4f} to {max(paired):.4f})")
    return 0


if __name__ == "__main__":  # workers start by forkserver, which imports this module again
    sys.exit(main())
