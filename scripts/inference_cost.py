"""Where the workers' forward passes belong (issue 49): each worker acting for its own envs on its own core, as the
trainer does, or one forward pass for every worker's envs on the learner's device, as a central inference would.

Times, in this process and interleaved over rounds, one step's inference of the config's network:
- `worker`: a worker's `parallel.num_envs_per_worker` observations on one CPU thread, as `EnvRunner` acts (the
  precision's kept casts, sampling the actions);
- `batched`: `--workers` times as many observations on `--device` (`--threads` of them on a CPU), copied there from
  pinned memory and the actions, log-probs and values copied back, as a central inference would have to;
- `round trip`: a small message to another process and back through a pipe, what each step of a worker that waits
  for a central inference would add at the least.
Prints the medians and writes an evidence file (machine, date, commit, command, figures):
`docs/results/<machine>/inference_cost-<config>-<N>-workers.json` unless `--output` says. A measurement: nothing
else should run meanwhile. The observations are random (a forward pass costs what its shapes cost); a
`training.precision` of `auto` is timed as fp32 (`--set training.precision=bf16` for bf16).

    .venv/bin/python scripts/inference_cost.py [--config config/ppo_parallel.yaml] [--workers 16] [--device cuda]
        [--threads N] [--steps 200] [--rounds 3] [--output FILE] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def positive(text: str) -> int:
    """argparse type: a whole number above 0."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number above 0")
    return int(text)


def per_step_ms(step: Callable[[], None], steps: int) -> float:
    """Milliseconds per call of `step`, over `steps` calls after 20 of warm-up."""
    for _ in range(20):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return 1000 * (time.perf_counter() - start) / steps


def echo(conn) -> None:  # noqa: ANN001 (a Connection)
    """The other end of the round trip: sends back what it receives until None."""
    while (message := conn.recv()) is not None:
        conn.send(message)


def round_trip_ms(steps: int) -> float:
    """Milliseconds for a step's worth of message (a step index) to reach another process and come back."""
    ours, theirs = mp.Pipe()
    child = mp.get_context("spawn").Process(target=echo, args=(theirs,), daemon=True)
    child.start()
    try:
        return per_step_ms(lambda: (ours.send(1), ours.recv()), steps)
    finally:
        ours.send(None)
        child.join(10)


def inference_step(model, spaces, precision: str, envs: int, device, rng):  # noqa: ANN001, ANN201
    """One step's acting for `envs` random observations on `device`: from pinned host memory where it is a GPU,
    the network's forward pass in `precision`, the actions sampled, and what the rollout keeps back on the host."""
    import numpy as np
    import torch

    from parallel_ppo.core.distributions import sample
    from parallel_ppo.core.model import autocast

    high = 256 if spaces.obs_dtype == np.uint8 else 1
    host = torch.from_numpy((rng.random((envs, *spaces.obs_shape)) * high).astype(spaces.obs_dtype))
    if device.type == "cuda":
        host = host.pin_memory()
    rngs = [np.random.default_rng(i) for i in range(envs)]

    def step() -> None:
        with torch.no_grad(), autocast(precision, device.type):
            params, values = model(host.to(device, non_blocking=True))
        actions, logprobs = sample(spaces.actions, params.float().cpu(), spaces.actions.noise(rngs))
        values.float().cpu()
    return step


def main() -> int:
    import numpy as np
    import torch

    from parallel_ppo.bench.study import available_cores, gpu_name, machine_results_dir
    from parallel_ppo.core.configure import build_config
    from parallel_ppo.core.files import write_text
    from parallel_ppo.core.model import kept_casts, network
    from parallel_ppo.envs.batch import env_spaces
    from parallel_ppo.errors import ParallelPPOError
    from parallel_ppo.runs import fingerprint

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="config/ppo_parallel.yaml")
    parser.add_argument("--workers", type=positive, default=16, help="workers whose envs one batched pass acts for")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="the batched pass's device (default: cuda where there is one, else cpu)")
    parser.add_argument("--threads", type=positive, default=available_cores(),
                        help="torch threads of the batched pass on a CPU (default: every core)")
    parser.add_argument("--steps", type=positive, default=200)
    parser.add_argument("--rounds", type=positive, default=3)
    parser.add_argument("--output", type=Path)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    try:
        cfg = build_config(args.config, {"training.device": "cpu"}, args.set, parallel=True)
        spaces = env_spaces(cfg.env)
        device = torch.device(args.device)
        torch.empty(1, device=device)  # a device this machine lacks fails here
    except ParallelPPOError as e:
        print(f"inference_cost.py: error: {e}", file=sys.stderr)
        return 2
    except (RuntimeError, AssertionError) as e:  # torch's words for a device it cannot use
        print(f"inference_cost.py: error: --device {args.device}: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    precision = "fp32" if cfg.training.precision == "auto" else cfg.training.precision
    envs = cfg.parallel.num_envs_per_worker
    rng = np.random.default_rng(0)
    worker_model = network(cfg, spaces).eval()
    batched_model = network(cfg, spaces).to(device).eval()
    worker = inference_step(worker_model, spaces, precision, envs, torch.device("cpu"), rng)
    batched = inference_step(batched_model, spaces, precision, envs * args.workers, device, rng)
    times: dict[str, list[float]] = {"worker": [], "batched": [], "round_trip": []}
    for r in range(args.rounds):
        for name in list(times)[:: 1 if r % 2 == 0 else -1]:
            if name == "round_trip":
                times[name].append(round_trip_ms(args.steps))
                continue
            torch.set_num_threads(1 if name == "worker" else args.threads)
            with kept_casts(precision, "cpu" if name == "worker" else device.type):
                times[name].append(per_step_ms(worker if name == "worker" else batched, args.steps))
            print(f"round {r + 1}: {name}: {times[name][-1]:.3f} ms a step", flush=True)
    median = {name: statistics.median(t) for name, t in times.items()}
    total = envs * args.workers
    saved = median["worker"] - median["batched"] - median["round_trip"]
    gpu = gpu_name()
    where = f"{gpu}" if device.type == "cuda" else f"{args.threads} CPU thread(s)"
    name = f"inference_cost-{Path(args.config).stem}-{args.workers}-workers.json"
    output = args.output or machine_results_dir(ROOT / "docs" / "results") / name
    evidence = {
        "machine": f"{fingerprint.describe_cpu()}, {available_cores()} cores" + (f", {gpu}" if gpu else ""),
        "cpu_kind": fingerprint.cpu_kind(),
        "date": datetime.date.today().isoformat(), "commit": fingerprint.source_commit() or "unknown",
        "command": "scripts/inference_cost.py " + " ".join(sys.argv[1:]),
        "setting": {"config": args.config, "env": cfg.env.id, "model": cfg.model.kind, "precision": precision,
                    "envs_per_worker": envs, "workers": args.workers, "device": str(device),
                    "threads": args.threads if device.type == "cpu" else None},
        "figures": {"worker_ms": round(median["worker"], 3), "batched_ms": round(median["batched"], 3),
                    "round_trip_ms": round(median["round_trip"], 3),
                    "worker_obs_per_s": round(1000 * envs / median["worker"]),
                    "batched_obs_per_s": round(1000 * total / median["batched"]),
                    "saved_ms_a_worker_step": round(saved, 3)},
        "tables": {"cost": {"columns": ["what", "observations a step", "ms a step (median)", "rounds"],
                            "rows": [["a worker, 1 CPU thread", envs, round(median["worker"], 3),
                                      ", ".join(f"{t:.3f}" for t in times["worker"])],
                                     [f"batched, {where}", total, round(median["batched"], 3),
                                      ", ".join(f"{t:.3f}" for t in times["batched"])],
                                     ["round trip to another process", 0, round(median["round_trip"], 3),
                                      ", ".join(f"{t:.3f}" for t in times["round_trip"])]]}},
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    write_text(output, json.dumps(evidence, indent=1) + "\n")
    print(f"{cfg.env.id} ({cfg.model.kind}, {precision}): a worker's {envs} observations {median['worker']:.3f} ms a "
          f"step on one CPU thread; {args.workers} workers' {total} at once {median['batched']:.3f} ms on {where}; "
          f"a round trip {median['round_trip']:.3f} ms: a central inference would "
          f"{'save' if saved > 0 else 'cost'} each worker {abs(saved):.3f} ms a step, its device free; {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
