"""Where the workers' forward passes belong (issue 49): each worker acting for its own envs on its own core, as the
trainer does, or one forward pass for every worker's envs on the learner's device, as a central inference would.

Times, in this process and interleaved over rounds, one step's inference of the config's network:
- `worker`: a worker's `parallel.num_envs_per_worker` observations on one CPU thread, as `EnvRunner` acts (the
  precision's kept casts, sampling the actions);
- `batched`: `--workers` times as many observations on `--device` (`--threads` of them on a CPU), copied there from
  pinned memory and the actions, log-probs and values copied back, as a central inference would have to;
- `round trip`: a step index sent to another process and back through a pipe: what each step of a worker that waits
  for a central inference would add at the least (a real one would move the observations too).
The figure to read is `batched_over_workers`: the batched pass's observations a second against the workers' own on
the cores they would have (one each, at most the machine's), above 1 where a central inference would act faster.
`saved_ms_a_worker_step` (a worker's step less the batched pass and the round trip) is given only where every
worker has a core of its own. Prints the medians and writes an evidence file (machine, date, commit, command,
figures): `<results-dir>/<machine>/inference_cost-<config>-<env>[-<sets>]-<N>-workers-<device>.json` (docs/results
by default; a CPU's device part is `cpu-<threads>-threads`) unless `--output` says. A measurement: nothing else
should run meanwhile. The observations are random (a forward pass costs what its shapes cost), a dict's keys
packed as the env's are; a `training.precision` of `auto` is timed as fp32 (`--set training.precision=bf16`).

    .venv/bin/python scripts/inference_cost.py [--env starpilot] [--config FILE] [--workers 16] [--device cuda]
        [--threads N] [--steps 200] [--rounds 3] [--results-dir DIR | --output FILE] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import multiprocessing as mp
import statistics
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

Step = Callable[[], None]


def whole_number(most: int) -> Callable[[str], int]:
    """argparse type: a whole number from 1 to `most`."""
    def parse(text: str) -> int:
        if not text.isdigit() or not 1 <= int(text) <= most:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from 1 to {most}")
        return int(text)
    return parse


def per_step_ms(step: Step, steps: int) -> float:
    """Milliseconds per call of `step`, over `steps` calls after 20 of warm-up."""
    for _ in range(20):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return 1000 * (time.perf_counter() - start) / steps


def echo(conn: Connection) -> None:
    """The other end of the round trip: sends back what it receives until None (a Ctrl-C is the parent's to say)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while (message := conn.recv()) is not None:
        conn.send(message)


def round_trip_ms(steps: int) -> float:
    """Milliseconds for a step index to reach another process and come back."""
    ours, theirs = mp.Pipe()
    child = mp.get_context("spawn").Process(target=echo, args=(theirs,), daemon=True)
    child.start()
    try:
        ours.send(0)
        if not ours.poll(60):  # a child that could not start would leave the loop waiting for ever
            raise RuntimeError("the round trip's other process did not answer in 60 s")
        ours.recv()
        return per_step_ms(lambda: (ours.send(1), ours.recv()), steps)
    finally:
        with contextlib.suppress(OSError):  # a child gone already (Ctrl-C) takes no end: the error is not this
            ours.send(None)
        child.join(10)


def random_observations(spaces: Any, envs: int, rng: Any) -> Any:
    """`envs` random observations of `spaces`: uint8 pixels, floats in [0, 1); a dict's keys packed by its layout."""
    import numpy as np

    if spaces.layout is None:
        high = 256 if spaces.obs_dtype == np.uint8 else 1
        return (rng.random((envs, *spaces.obs_shape)) * high).astype(spaces.obs_dtype)
    return spaces.layout.pack({p.key: rng.random((envs, *p.shape)) * (256 if p.image else 1)
                               for p in spaces.layout.parts})


def inference_step(model: Any, spaces: Any, precision: str, envs: int, device: Any, rng: Any) -> Step:
    """One step's acting for `envs` random observations on `device`: from pinned host memory where it is a GPU,
    the network's forward pass in `precision`, the actions sampled, and what the rollout keeps back on the host."""
    import numpy as np
    import torch

    from parallel_ppo.core.distributions import sample
    from parallel_ppo.core.model import autocast

    host = torch.from_numpy(random_observations(spaces, envs, rng))
    if device.type == "cuda":
        host = host.pin_memory()
    rngs = [np.random.default_rng(i) for i in range(envs)]

    def step() -> None:
        with torch.no_grad(), autocast(precision, device.type):
            params, values = model(host.to(device, non_blocking=True))
        sample(spaces.actions, params.float().cpu(), spaces.actions.noise(rngs))
        values.float().cpu()
    return step


def parse_args() -> argparse.Namespace:
    import torch

    from parallel_ppo.bench.study import available_cores
    from parallel_ppo.cli.common import OneLineParser
    from parallel_ppo.envs.config import MAX_THREADS

    p = OneLineParser(prog="inference_cost.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--env", help="the env (default: the config's own)")
    p.add_argument("--config", help="default: the env family's shipped config, as bench.py takes it")
    p.add_argument("--workers", type=whole_number(4096), default=16, help="workers one batched pass acts for")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="the batched pass's device (default: cuda where there is one, else cpu)")
    p.add_argument("--threads", type=whole_number(MAX_THREADS), default=available_cores(),
                   help="torch threads of the batched pass on a CPU (default: every core)")
    p.add_argument("--steps", type=whole_number(10**6), default=200)
    p.add_argument("--rounds", type=whole_number(1000), default=3)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--results-dir", type=Path, default=ROOT / "docs" / "results",
                       help="the machine's folder goes in it (default docs/results)")
    where.add_argument("--output", type=Path, help="the evidence file (default: named for the settings, in the folder)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    return p.parse_args()


def measure(args: argparse.Namespace, cfg: Any, spaces: Any, models: tuple[Any, Any], device: Any,
            precision: str) -> dict[str, list[float]]:
    """Each round's milliseconds a step of the worker's pass (`models[0]`, on the CPU), the batched one
    (`models[1]`, on `device`) and the round trip, in ABBA order."""
    import numpy as np
    import torch

    from parallel_ppo.core.model import kept_casts

    rng, envs, cpu = np.random.default_rng(0), cfg.parallel.num_envs_per_worker, torch.device("cpu")
    steps = {"worker": (inference_step(models[0], spaces, precision, envs, cpu, rng), cpu, 1),
             "batched": (inference_step(models[1], spaces, precision, envs * args.workers, device, rng), device,
                         args.threads)}
    times: dict[str, list[float]] = {"worker": [], "batched": [], "round_trip": []}
    for r in range(args.rounds):
        for name in list(times)[:: 1 if r % 2 == 0 else -1]:
            if name == "round_trip":
                times[name].append(round_trip_ms(args.steps))
                continue
            step, on, threads = steps[name]
            torch.set_num_threads(threads)
            with kept_casts(precision, on.type):
                times[name].append(per_step_ms(step, args.steps))
            print(f"round {r + 1}: {name}: {times[name][-1]:.3f} ms a step", flush=True)
    return times


def evidence(args: argparse.Namespace, cfg: Any, device: Any, precision: str,
             times: dict[str, list[float]]) -> dict[str, Any]:
    """The evidence file's content: the setting, the medians and what they make, a table of every round."""
    from parallel_ppo.bench.study import available_cores, gpu_name
    from parallel_ppo.runs import fingerprint

    median = {name: statistics.median(t) for name, t in times.items()}
    envs, cores, gpu = cfg.parallel.num_envs_per_worker, available_cores(), gpu_name()
    total, own_cores = envs * args.workers, min(args.workers, cores)
    worker_rate, batched_rate = 1000 * envs / median["worker"], 1000 * total / median["batched"]
    saved = median["worker"] - median["batched"] - median["round_trip"] if args.workers <= cores else None
    where = f"{gpu}" if device.type == "cuda" else f"{args.threads} CPU thread(s)"
    rows = [["a worker, 1 CPU thread", envs, "worker"], [f"batched, {where}", total, "batched"],
            ["round trip to another process", 0, "round_trip"]]
    return {
        "machine": f"{fingerprint.describe_cpu()}, {cores} cores" + (f", {gpu}" if gpu else ""),
        "cpu_kind": fingerprint.cpu_kind(),
        "date": datetime.date.today().isoformat(), "commit": fingerprint.source_commit() or "unknown",
        "command": "scripts/inference_cost.py " + " ".join(sys.argv[1:]),
        "setting": {"config": args.config, "env": cfg.env.id, "model": cfg.model.kind, "precision": precision,
                    "envs_per_worker": envs, "workers": args.workers, "cores": cores, "device": str(device),
                    "threads": args.threads if device.type == "cpu" else None, "batched_on": where},
        "figures": {"worker_ms": round(median["worker"], 3), "batched_ms": round(median["batched"], 3),
                    "round_trip_ms": round(median["round_trip"], 3), "worker_obs_per_s": round(worker_rate),
                    "batched_obs_per_s": round(batched_rate),
                    "batched_over_workers": round(batched_rate / (own_cores * worker_rate), 2),
                    "saved_ms_a_worker_step": None if saved is None else round(saved, 3)},
        "tables": {"cost": {"columns": ["what", "observations a step", "ms a step (median)", "rounds"],
                            "rows": [[what, n, round(median[name], 3), ", ".join(f"{t:.3f}" for t in times[name])]
                                     for what, n, name in rows]}},
    }


def prepare(args: argparse.Namespace) -> tuple[Any, Any, Any, tuple[Any, Any], Path]:
    """The config, spaces, batched device, the two models (a worker's on the CPU, the batched one on the device) and
    the evidence file's path: every check before measuring (ConfigError)."""
    from parallel_ppo.bench.study import machine_results_dir, set_slug, slug
    from parallel_ppo.cli.common import default_config
    from parallel_ppo.core.configure import build_config
    from parallel_ppo.core.model import network, resolve_device
    from parallel_ppo.envs.batch import env_spaces
    from parallel_ppo.runs.directory import check_output_file

    config = args.config or default_config(args.env, "ppo_parallel.yaml")
    cfg = build_config(config, {"training.device": "cpu", **({"env.id": args.env} if args.env else {})}, args.set,
                       parallel=True)
    device = resolve_device(args.device)
    on = f"{device.type}-{args.threads}-threads" if device.type == "cpu" else device.type
    what = [Path(config).stem, slug(cfg.env.id), *map(set_slug, args.set), str(args.workers)]
    output = args.output or machine_results_dir(args.results_dir) / f"inference_cost-{'-'.join(what)}-workers-{on}.json"
    check_output_file(output, f"the evidence file {output}")
    spaces = env_spaces(cfg.env)
    models = (network(cfg, spaces).eval(), network(cfg, spaces).to(device).eval())
    args.config = str(Path(config).resolve().relative_to(ROOT)) if Path(config).resolve().is_relative_to(ROOT) \
        else config
    return cfg, spaces, device, models, output


def main() -> int:
    from parallel_ppo.cli.common import interrupted, write_result
    from parallel_ppo.core.files import write_text
    from parallel_ppo.errors import ParallelPPOError

    args = parse_args()
    try:  # every check before measuring
        cfg, spaces, device, models, output = prepare(args)
        precision = "fp32" if cfg.training.precision == "auto" else cfg.training.precision
        data = evidence(args, cfg, device, precision, measure(args, cfg, spaces, models, device, precision))
    except ParallelPPOError as e:
        print(f"inference_cost.py: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return interrupted("inference_cost.py", "nothing was written")
    f = data["figures"]
    print(f"{cfg.env.id} ({cfg.model.kind}, {precision}): a worker's {cfg.parallel.num_envs_per_worker} observations "
          f"{f['worker_ms']:.3f} ms a step on one CPU thread; {args.workers} workers' at once {f['batched_ms']:.3f} "
          f"ms on {data['setting']['batched_on']}; a round trip {f['round_trip_ms']:.3f} ms; the batched "
          f"pass acts on {f['batched_over_workers']:.2f} times the observations a second of the workers' own")
    if write_result("inference_cost.py", output, lambda path: write_text(path, json.dumps(data, indent=1) + "\n")):
        return 1
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
