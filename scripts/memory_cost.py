"""Where a run's memory goes, for a config: a worker's baseline, each env, the rollout buffer and the learner's
update, each measured in its own single-threaded process (torch, OpenMP and Mesa's llvmpipe on one thread), and
with `--run` a short parallel run of the config, every process of its tree sampled.

    .venv/bin/python scripts/memory_cost.py --config config/robosuite_lift_camera.yaml [--envs 1 2 4] [--run]
        [--output FILE]

- `python`: a bare interpreter. `torch`: with torch and the trainer's modules imported. `imports`: with the env
  family's modules too (robosuite and MuJoCo, say), no env built: a worker's baseline.
- `envs N`: N envs built as a worker builds them, reset and stepped 20 times (frames drawn). An env's cost is the
  slope of the resident set over N (least squares), the first env's extra (a renderer's driver, loaded once per
  process) what the line leaves above `imports` at N = 0.
- `buffer`: the shared rollout buffer (n_steps × num_envs steps and the observation after each env's last), its
  tensors' sizes summed and its allocation measured.
- `learner P/M` (each candidate of the config's precision P and microbatch M): the spaces read as the trainer reads
  them (which builds one env for a family that does not know them), the network and Adam, a rollout as the update
  takes it, then one `ppo_update`: its peak (the kernel's high-water mark) above the resident set before it.
- `--run`: the parallel trainer on the config for 2 updates, its process tree sampled every half second (resident,
  proportional and unique set of the coordinator, each worker, the forkserver and the resource tracker), and
  summary.json's peaks.

Prints each measurement as it is taken, then the figures as JSON (MB; 1 MB = 2^20 bytes), and writes
`docs/results/<machine>/memory_<config>.json` (or `--output`), an evidence file for the docs (machine, date, commit,
command, figures and tables); a Ctrl-C writes nothing. Memory, not time: other load does not change it much, but the
`--run` is slow on a busy machine.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "LP_NUM_THREADS": "1"}
MB = 2**20


def memory() -> dict[str, float]:
    """This process's resident, unique and proportional set, and its resident high-water mark, in MB."""
    import psutil

    mem = psutil.Process().memory_full_info()
    return {"rss": mem.rss / MB, "uss": mem.uss / MB, "pss": mem.pss / MB, "hwm": high_water_mark()}


def high_water_mark() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:"))


def reset_high_water_mark() -> None:
    """Restart the high-water mark from the resident set now (Linux ≥ 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def load_config(path: str, sets: list[str]):  # noqa: ANN201
    from parallel_ppo.core.configure import build_config

    return build_config(path, {}, sets, parallel=True)


def one(kind: str, arg: str, config: str, sets: list[str]) -> dict[str, float]:
    """One measurement, in this process (a child): its stages' memory."""
    out = {"python": memory()}
    if kind == "python":
        return out
    import numpy as np
    import torch

    torch.set_num_threads(1)
    from parallel_ppo.core.allocator import retain_freed_memory

    retain_freed_memory()  # as every process of the trainer does
    from parallel_ppo.core import model, ppo  # noqa: F401  the trainer's modules, as a worker imports them
    from parallel_ppo.core.buffer import RolloutBuffer
    from parallel_ppo.envs.batch import env_spaces, make_batch_env
    from parallel_ppo.envs.families import family_of

    cfg = load_config(config, sets)
    out["torch"] = memory()
    family = family_of(cfg.env.id)
    if family.needs:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            __import__(family.needs)
    family.maker()  # its module
    out["imports"] = memory()
    if kind == "envs":
        env = make_batch_env(cfg.env, cfg.run.seed, 0, int(arg), 1)
        rng = np.random.default_rng(0)
        space = env.actions
        env.reset()
        for _ in range(20):
            env.step(rng.uniform(-1, 1, (env.num_envs, space.n)).astype(np.float32) if space.continuous
                     else rng.integers(0, space.n, env.num_envs))
        out["envs"] = memory()
        env.close()
    elif kind == "buffer":
        spaces = env_spaces(cfg.env)
        out["spaces"] = memory()
        buffer = RolloutBuffer.allocate(cfg.training.n_steps, cfg.env.num_envs, spaces.obs_shape,
                                        spaces.obs_dtype, spaces.actions, shared=True)
        for field in dataclasses.fields(buffer):  # every page written, as the workers write them
            getattr(buffer, field.name).fill_(1)
        out["buffer"] = memory()
        out["computed"] = {"mb": sum(getattr(buffer, f.name).nbytes for f in dataclasses.fields(buffer)) / MB}
    elif kind == "learner":
        from parallel_ppo.tuning.compute_limit import _random_batch

        precision, chunk = arg.split("/")
        cfg = dataclasses.replace(cfg, training=dataclasses.replace(
            cfg.training, precision=precision, microbatch_size=0 if chunk == "whole" else int(chunk)))
        spaces = env_spaces(cfg.env)
        out["spaces"] = memory()
        torch.manual_seed(cfg.run.seed)
        net, optimizer = ppo.build_learner(spaces, cfg)
        out["model"] = memory()
        rng = torch.Generator().manual_seed(0)
        data = _random_batch(rng, cfg.rollout_size, spaces)
        out["batch"] = memory()
        reset_high_water_mark()
        before = memory()
        ppo.ppo_update(net, optimizer, data, cfg.training, rng)
        out["update"] = {**memory(), "peak_above": high_water_mark() - before["rss"]}
    return out


def child(kind: str, arg: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """One measurement in a single-threaded child process; ParallelPPOError with its last line where it failed (an
    env that cannot be built, a missing extra)."""
    from parallel_ppo.cli.common import last_line
    from parallel_ppo.errors import ParallelPPOError

    command = [sys.executable, __file__, "--one", kind, arg, "--config", args.config,
               *(f"--set={s}" for s in args.set)]
    proc = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **ONE_THREAD})
    if proc.returncode != 0:
        raise ParallelPPOError(f"{kind} {arg}".strip() + f": {last_line(proc.stderr, proc.returncode)}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def role(cmdline: list[str], root: int, pid: int) -> str:
    words = " ".join(cmdline).split()
    if pid == root:
        return "coordinator"
    if words[:2] == ["parallel_ppo", "worker"] and len(words) > 2:
        return f"worker{words[2]}"
    text = " ".join(words)
    return "forkserver" if "forkserver" in text else "resource tracker" if "resource_tracker" in text else "other"


def run(args: argparse.Namespace, cfg) -> dict:  # noqa: ANN001
    """The parallel trainer for 2 updates, its tree sampled; each role's peaks (MB) and summary.json's."""
    from parallel_ppo.cli.common import last_line
    from parallel_ppo.errors import ParallelPPOError

    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, str(ROOT / "train_parallel_timed.py"), "--config", args.config,
                   "--total-steps", str(2 * cfg.rollout_size), "--output-dir", f"{tmp}/run",
                   "--set", "logging.tensorboard=false", "--set", "logging.progress=off",
                   *(x for s in args.set for x in ("--set", s))]
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            peaks, totals = sample(proc)
        except KeyboardInterrupt:  # the trainer had the Ctrl-C too: its folder is removed once it has stopped
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)
            proc.kill()
            proc.wait()
            raise
        if proc.returncode != 0:
            raise ParallelPPOError(f"the run: {last_line(proc.stderr.read(), proc.returncode)}")
        summary = json.loads(Path(f"{tmp}/run/summary.json").read_text())
    keys = ("peak_rss_mb", "peak_pss_mb", "peak_main_rss_mb", "peak_worker_rss_mb")
    return {"roles": peaks, "sampled_peak_rss_mb": totals["rss"], "sampled_peak_pss_mb": totals["pss"],
            "summary": {k: summary[k] for k in keys}, "learner": summary.get("learner")}


def sample(proc: subprocess.Popen) -> tuple[dict, dict[str, float]]:
    """Until `proc` ends, its process tree's memory every half second: each role's peaks and the tree's (MB)."""
    import psutil

    root, peaks, totals = psutil.Process(proc.pid), {}, {"rss": 0.0, "pss": 0.0}
    while proc.poll() is None:
        now = {"rss": 0.0, "pss": 0.0}
        with contextlib.suppress(psutil.Error):
            for p in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    mem, name = p.memory_full_info(), role(p.cmdline(), root.pid, p.pid)
                    entry = peaks.setdefault(name, {"rss": 0.0, "pss": 0.0, "uss": 0.0})
                    for key in entry:
                        entry[key] = max(entry[key], getattr(mem, key) / MB)
                    now["rss"] += mem.rss / MB
                    now["pss"] += mem.pss / MB
        totals = {k: max(totals[k], now[k]) for k in totals}
        time.sleep(0.5)
    return peaks, totals


def breakdown(cfg, ran: dict, imports: float, first_extra: float, per_env: float, buffer: dict,  # noqa: ANN001
              learners: dict) -> dict:
    """The run's peak RSS rebuilt from the parts measured alone (MB): a table of them, their sum, the peak."""
    workers, per_worker = cfg.parallel.num_workers, cfg.parallel.num_envs_per_worker
    chosen = ran["learner"] or {}
    label = f"{chosen.get('precision')}/{chosen.get('microbatch_size') or 'whole'}"
    learner = learners.get(label) or next(iter(learners.values()))
    roles = ran["roles"]
    parts = [
        [f"workers' baseline (python, torch, the env's modules), × {workers}", workers * imports],
        [f"workers' first env's extra, × {workers}", workers * first_extra],
        [f"envs, {workers * per_worker} × {per_env:.1f}", workers * per_worker * per_env],
        ["coordinator's baseline", imports],
        ["coordinator: the env it builds to read the spaces, closed", learner["spaces"]["rss"] - imports],
        [f"coordinator: network, Adam, the rollout as a batch, the update's peak ({label})",
         learner["batch"]["rss"] - learner["spaces"]["rss"] + learner["update"]["peak_above"]],
        ["rollout buffer (shared memory)", buffer["computed"]["mb"]],
        ["forkserver and resource tracker", sum(roles.get(k, {}).get("rss", 0.0)
                                                 for k in ("forkserver", "resource tracker"))],
    ]
    rows = [[name, round(mb, 1)] for name, mb in parts]
    rows += [["sum", round(sum(mb for _, mb in parts), 1)],
             ["the run's peak RSS", round(ran["summary"]["peak_rss_mb"], 1)]]
    return {"columns": ["part", "MB"], "rows": rows}


def slope(points: dict[int, float]) -> tuple[float, float]:
    """Least-squares slope and intercept of y over n."""
    ns, ys = list(points), list(points.values())
    n_mean, y_mean = statistics.fmean(ns), statistics.fmean(ys)
    s = sum((n - n_mean) * (y - y_mean) for n, y in zip(ns, ys, strict=True)) / sum((n - n_mean) ** 2 for n in ns)
    return s, y_mean - s * n_mean


def measure_all(args: argparse.Namespace, cfg) -> tuple[dict, dict, dict | None]:  # noqa: ANN001
    """Every measurement, each printed as it is taken: the evidence file's figures and tables, and the run's (with
    --run). ParallelPPOError where a child or the run failed."""
    from parallel_ppo.tuning.learner_settings import candidates, cpu_has_native_bf16

    r = lambda x: round(x, 1)  # noqa: E731
    base = child("python", "", args)
    print(f"python {r(base['python']['rss'])} MB", flush=True)
    envs = {n: child("envs", str(n), args) for n in dict.fromkeys(args.envs)}
    imports = statistics.median(m["imports"]["rss"] for m in envs.values())
    torch_rss = statistics.median(m["torch"]["rss"] for m in envs.values())
    per_env, at_zero = slope({n: m["envs"]["rss"] for n, m in envs.items()})
    for n, m in envs.items():
        print(f"{n} envs: {r(m['envs']['rss'])} MB (imports {r(m['imports']['rss'])})", flush=True)
    buffer = child("buffer", "", args)
    learners = {c.label: child("learner", c.label, args) for c in candidates(cfg, cpu_has_native_bf16())}
    for label, m in learners.items():
        print(f"learner {label}: update peak {r(m['update']['peak_above'])} MB above {r(m['batch']['rss'])}",
              flush=True)
    ran = run(args, cfg) if args.run else None
    figures = {
        "python_mb": r(base["python"]["rss"]), "torch_mb": r(torch_rss), "worker_baseline_mb": r(imports),
        "per_env_mb": r(per_env), "first_env_extra_mb": r(at_zero - imports),
        "envs_rss_mb": [r(m["envs"]["rss"]) for m in envs.values()],
        "buffer_computed_mb": r(buffer["computed"]["mb"]),
        "buffer_measured_mb": r(buffer["buffer"]["rss"] - buffer["spaces"]["rss"]),
        "spaces_probe_mb": r(buffer["spaces"]["rss"] - buffer["imports"]["rss"]),
        **{f"update_peak_mb_{label.replace('/', '_')}": r(m["update"]["peak_above"]) for label, m in learners.items()},
    }
    tables = {
        "envs": {"columns": ["envs", "RSS MB", "imports RSS MB"],
                 "rows": [[n, r(m["envs"]["rss"]), r(m["imports"]["rss"])]
                          for n, m in envs.items()]},
        "learner": {"columns": ["precision/microbatch", "after spaces MB", "model+Adam MB", "rollout batch MB",
                                "update peak above MB", "after update MB"],
                    "rows": [[label, r(m["spaces"]["rss"]), r(m["model"]["rss"] - m["spaces"]["rss"]),
                              r(m["batch"]["rss"] - m["model"]["rss"]), r(m["update"]["peak_above"]),
                              r(m["update"]["rss"])] for label, m in learners.items()]},
    }
    if ran is not None:
        figures.update({k: r(v) for k, v in ran["summary"].items()})
        figures["sampled_peak_rss_mb"] = r(ran["sampled_peak_rss_mb"])
        figures["sampled_peak_pss_mb"] = r(ran["sampled_peak_pss_mb"])
        tables["run"] = {"columns": ["process", "peak RSS MB", "peak PSS MB", "peak USS MB"],
                         "rows": [[name, r(v["rss"]), r(v["pss"]), r(v["uss"])]
                                  for name, v in sorted(ran["roles"].items()) if v["rss"] > 0]}  # not a zombie
        tables["breakdown"] = breakdown(cfg, ran, imports, at_zero - imports, per_env, buffer, learners)
        figures["breakdown_sum_mb"] = tables["breakdown"]["rows"][-2][-1]
        print(f"run: {ran}", flush=True)
    return figures, tables, ran


def parse_args() -> argparse.Namespace:
    from parallel_ppo.cli.common import OneLineParser, add_set_flag, some_path

    parser = OneLineParser(prog="memory_cost.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    add_set_flag(parser, "config overrides")
    parser.add_argument("--envs", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--run", action="store_true", help="also a 2-update parallel run, its processes sampled")
    parser.add_argument("--output", type=some_path)
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # a child: one measurement, printed as JSON
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    if args.one:
        print(json.dumps(one(*args.one, args.config, args.set)))
        return 0
    from parallel_ppo.bench.study import available_cores, machine_results_dir
    from parallel_ppo.cli.common import interrupted, stop_on_sigterm, write_result

    stop_on_sigterm()
    from parallel_ppo.core.files import write_text
    from parallel_ppo.errors import ConfigError, ParallelPPOError
    from parallel_ppo.runs import fingerprint
    from parallel_ppo.runs.directory import check_output_file

    name = f"memory_{Path(args.config).stem}.json"
    output = Path(args.output) if args.output else machine_results_dir(ROOT / "docs" / "results") / name
    try:  # checked before any measurement
        cfg = load_config(args.config, args.set)
        if len(set(args.envs)) < 2 or min(args.envs) < 1:
            raise ConfigError(f"--envs takes two or more different positive counts (a slope), got {args.envs}")
        check_output_file(output, f"the evidence file {output}")
        figures, tables, ran = measure_all(args, cfg)
    except ParallelPPOError as e:
        print(f"memory_cost.py: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return interrupted("memory_cost.py", "nothing was written")
    evidence = {
        "machine": f"{fingerprint.describe_cpu()}, {available_cores()} cores",
        "cpu_kind": fingerprint.cpu_kind(),
        "date": datetime.date.today().isoformat(), "commit": fingerprint.source_commit() or "unknown",
        "command": "scripts/memory_cost.py " + " ".join(sys.argv[1:]),
        "config": {"env": cfg.env.id, "num_envs": cfg.env.num_envs, "workers": cfg.parallel.num_workers,
                   "n_steps": cfg.training.n_steps, "batch_size": cfg.training.batch_size},
        "figures": figures, "tables": tables,
        **({"run_learner": ran["learner"]} if ran else {}),
    }
    if write_result("memory_cost.py", output, lambda path: write_text(path, json.dumps(evidence, indent=1) + "\n")):
        return 1
    print(json.dumps(figures), output, sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
