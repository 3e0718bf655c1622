"""bench.py's command line: `roofline` (the network's compute limit), `speed-check` (trainer vs limit),
`envs` (raw env throughput), `scaling` (the worker sweep, with distributed ranks), `layouts` (sequential,
parallel and distributed uses of the same processes), `autotune` (the fastest layout here), `learning`
(return per step and per hour over config variants × seeds: cli/learning.py) and `study` (the many-core study: every
scaling family, a CUDA learner included, into docs/results/: cli/study.py). Those that start trainers check flags
before torch loads."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from parallel_ppo.bench import scaling
from parallel_ppo.bench.speedcheck import SPEED_TARGET
from parallel_ppo.bench.trainer_runs import BenchRunCrashed
from parallel_ppo.cli.common import (
    OneLineParser,
    add_config_flags,
    add_set_flag,
    default_config,
    duration_in,
    fail,
    int_list,
    interrupted,
    positive_int,
    run_args,
    run_budget,
    some_path,
    stop_on_sigterm,
)
from parallel_ppo.cli.learning import add_learning, learning
from parallel_ppo.cli.study import add_study, study
from parallel_ppo.cli.train import trainer_config
from parallel_ppo.core.allocator import retain_freed_memory
from parallel_ppo.core.config import Config
from parallel_ppo.core.config_yaml import given_env
from parallel_ppo.core.configure import build_config
from parallel_ppo.core.files import new_folders, write_json, writing
from parallel_ppo.core.threads import draw_with, thread_plan
from parallel_ppo.envs.batch import env_spaces
from parallel_ppo.errors import ConfigError, ParallelPPOError, WriteFailed
from parallel_ppo.runs import fingerprint
from parallel_ppo.runs.directory import check_output_file, check_writable

ROOT = Path(__file__).resolve().parents[2]


PROCGEN_CONFIGS = {"roofline": "ppo_sequential.yaml", "speed-check": "ppo_sequential.yaml", "envs": "ppo_parallel.yaml",
                   "scaling": "ppo_parallel.yaml", "layouts": "ppo_parallel.yaml", "autotune": "ppo_parallel.yaml",
                   "learning": "ppo_sequential.yaml", "study": "ppo_parallel.yaml"}
"""The default config of each benchmark that takes `--env` (config/, written for Procgen; `default_config`)."""

SPEED_CHECK_DIR = "benchmarks/speed_check_<time>"
"""Where `make bench-speed` writes by default: a new directory per check, so no earlier result is lost."""


def make_parser(prog: str) -> OneLineParser:
    """bench.py's parser: one subcommand per benchmark."""
    p = OneLineParser(prog=prog, description="Benchmarks of the PPO network and trainers on this machine.")
    sub = p.add_subparsers(dest="command", required=True,
                           metavar="{roofline,speed-check,envs,scaling,layouts,autotune,learning,study}")

    for add in (_add_roofline, _add_speed_check, _add_envs, _add_sweeps, add_learning, add_study):
        add(sub)
    return p


def _add_roofline(sub: Any) -> None:
    r = sub.add_parser("roofline", help="measure the bare network's compute limit (no envs)",
                       description="Forward and PPO-train rates of the bare network on random observations, "
                                   "and the compute limit 1 / (1/forward + n_epochs/train) in env steps/s.")
    add_config_flags(r, PROCGEN_CONFIGS["roofline"], ", which decides the observation shape")
    r.add_argument("--num-envs", type=int, metavar="N", help="forward batch (env.num_envs)")
    r.add_argument("--batch-size", type=int, metavar="N", help="PPO minibatch (training.batch_size)")
    add_set_flag(r, "override any config field, e.g. --set training.precision=bf16 (repeatable)")
    r.add_argument("--seconds", type=duration_in("s"), default=20.0, metavar="TIME",
                   help="timed measuring budget, split between forward and train (default 20)")
    r.add_argument("--threads", type=int, metavar="N",
                   help="torch threads (default: every logical CPU the trainer's learner may use, the ceiling of "
                        "parallel.learner_threads: auto)")
    r.add_argument("--output", type=some_path, metavar="FILE.json", help="also write the result as JSON")
    r.add_argument("--run", type=some_path, metavar="DIR",
                   help="also show a finished run's achieved FLOP/s against the peak")


def _add_speed_check(sub: Any) -> None:
    s = sub.add_parser("speed-check", help="sequential trainer SPS as a fraction of the compute limit",
                       description="Measure the compute limit, run train_timed.py briefly with the same "
                                   f"settings, and report steady-state SPS / limit against {SPEED_TARGET}. "
                                   "A measurement: exits 0 whatever the ratio.")
    add_config_flags(s, PROCGEN_CONFIGS["speed-check"])
    s.add_argument("--num-envs", type=int, default=16, metavar="N", help="envs (default 16)")
    s.add_argument("--n-steps", type=int, default=64, metavar="N", help="steps per env (default 64)")
    s.add_argument("--batch-size", type=int, default=256, metavar="N", help="minibatch (default 256)")
    s.add_argument("--n-epochs", type=int, default=3, metavar="N", help="epochs (default 3)")
    add_set_flag(s, "extra config override for both the limit and the trainer (repeatable)")
    s.add_argument("--seconds", type=duration_in("s"), default=20.0, metavar="TIME",
                   help="timed budget of the limit measurement (default 20)")
    s.add_argument("--train-seconds", type=run_budget("s"), default=120.0, metavar="TIME",
                   help="wall-clock budget of the trainer run in seconds (default 120, at most a week)")
    s.add_argument("--output-dir", type=some_path, metavar="DIR",
                   help=f"trainer run and JSON go here (default {SPEED_CHECK_DIR}, a new one each time)")
    s.add_argument("--output", type=some_path, metavar="FILE.json",
                   help="JSON result path (default <output-dir>/speed_check.json)")


def _add_envs(sub: Any) -> None:
    e = sub.add_parser("envs", help="raw env steps/s: bare envs, sequential and parallel paths",
                       description="Env steps/s with no learning, through the bare envs, the sequential "
                                   "collector and the parallel workers, with random actions and with the network.")
    add_config_flags(e, PROCGEN_CONFIGS["envs"])
    e.add_argument("--num-workers", type=int, metavar="W", help="workers of the parallel path")
    e.add_argument("--num-envs-per-worker", type=int, metavar="M", help="envs per worker (total W × M)")
    add_set_flag(e, "config override (repeatable)")
    e.add_argument("--seconds", type=duration_in("s"), default=10.0, metavar="TIME",
                   help="per measurement (default 10)")
    e.add_argument("--output", type=some_path, metavar="FILE.json", help="also write the rows as JSON")


def _add_sweeps(sub: Any) -> None:
    for name, text in (("scaling", "sweep worker counts with short timed training runs"),
                       ("layouts", "compare the sequential, parallel and distributed ways to use P processes on "
                                   "the same envs"),
                       ("autotune", "find the fastest layout for this machine: workers × envs × threads, or "
                                    "distributed ranks")):
        c = sub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        add_config_flags(c, PROCGEN_CONFIGS[name])
        add_set_flag(c, "config override passed to every run (repeatable)")
        seconds = 20 if name == "autotune" else 60
        c.add_argument("--seconds", type=run_budget("s"), default=float(seconds), metavar="TIME",
                       help=f"wall-clock budget of each run (default {seconds}, at most a week)")
        c.add_argument("--output-dir", default=f"benchmarks/{name}", type=some_path, metavar="DIR",
                       help=f"where the runs and results go (default benchmarks/{name})")
        if name == "scaling":
            c.add_argument("--workers", metavar="LIST",
                           help='worker counts, e.g. "1 2 4" (default 1, 2, 4, ... usable physical cores)')
            c.add_argument("--envs-per-worker", default="8", metavar="LIST",
                           help='envs per worker at each worker count, e.g. "4 8 16" (default 8)')
            c.add_argument("--no-sequential", action="store_true", help="skip the sequential reference point")
            c.add_argument("--no-distributed", action="store_true",
                           help="skip the distributed points (as many ranks as workers, for 2 workers or more)")
        elif name == "layouts":
            c.add_argument("--processes", default="2", metavar="LIST",
                           help='process counts, e.g. "1 2 4 8 16" (default 2)')
            c.add_argument("--envs", type=positive_int, default=16, metavar="N",
                           help="envs in total, in every layout (default 16)")


def envs(args: Any, prog: str) -> int:
    from parallel_ppo.bench.envbench import bench_envs, format_env_table
    from parallel_ppo.tuning.learner_settings import resolve

    flags = {"env.id": args.env, "parallel.num_workers": args.num_workers,
             "parallel.num_envs_per_worker": args.num_envs_per_worker}
    try:
        cfg = build_config(args.config, flags, args.set, parallel=True)
        _check_output(args.output)
        _set_threads(cfg, None, parallel=True)
        draw_with(thread_plan(cfg, parallel=False).draw)  # this process draws as the sequential trainer does
        cfg, choice = resolve(cfg, cfg.run.limit_seconds)
        print(f"{prog}: network {choice.describe()}", flush=True)
        print(f"{prog}: {cfg.env.id}, {cfg.env.num_envs} envs, {args.seconds:g} s per measurement ...", flush=True)
        rows = bench_envs(cfg, args.seconds)
    except ParallelPPOError as e:
        return fail(prog, e, 2)
    print(format_env_table(rows))
    if args.output:
        _write_json(args.output, {"rows": rows, "hardware": fingerprint.hardware()})
        print(f"wrote {args.output}")
    return 0


def sweep(args: Any, prog: str) -> int:
    """`scaling`, `layouts` or `autotune`; the runs of the first two are checked before the first one starts."""
    out = Path(args.output_dir)
    try:
        extra = run_args(args)
        check_writable(out, f"--output-dir {out}")
        if args.command == "autotune":
            return _autotune(args, out, extra, prog)
        points, plan = _sweep_points(args)
        for p in points:
            trainer_config(p.command(out, args.seconds, args.config, extra), f"benchmark run {p.label}")
        print(f"{prog}: {plan}, {args.seconds:g} s each", flush=True)
        rows = scaling.run_points(points, out, args.seconds, args.config, extra)
        with writing(out):
            if args.command == "scaling":
                scaling.write_scaling(rows, out, f"Scaling: {rows[0]['label']} and {len(rows) - 1} more runs")
            else:
                scaling.write_layouts(rows, out)
        print(scaling.scaling_table(rows) if args.command == "scaling" else scaling.layouts_table(rows))
        written = [str(out / f"{args.command}.{ext}") for ext in ("json", "md", "png")]
        print(f"wrote {', '.join(written)}")
    except ParallelPPOError as e:
        return fail(prog, e, 2)
    except BenchRunCrashed as e:
        return fail(prog, e, 1)
    return 0


def _sweep_points(args: Any) -> tuple[list[scaling.Point], str]:
    """The runs of `scaling` or `layouts` and what they are, in words."""
    if args.command == "layouts":
        processes = int_list(args.processes, "--processes")
        return scaling.layout_points(processes, args.envs), f"layouts of {args.envs} envs over {processes} processes"
    workers = int_list(args.workers, "--workers") if args.workers is not None else scaling.default_worker_counts()
    per_worker = int_list(args.envs_per_worker, "--envs-per-worker")
    points = scaling.sweep_points(workers, per_worker, not args.no_sequential, not args.no_distributed)
    return points, f"scaling sweep, workers {workers} × envs/worker {per_worker}"


def _autotune(args: Any, out: Path, extra: list[str], prog: str) -> int:
    """Autotune's runs (a layout the trainer refuses is skipped) and the fastest of them."""
    print(f"{prog}: autotune, {args.seconds:g} s per layout", flush=True)
    with writing(out):
        result = scaling.autotune(out, args.seconds, args.config, extra)
    print(scaling.scaling_table(result["points"]))
    best = result["best"]
    if best["ranks"]:
        layout = f"distributed, {best['ranks']} ranks × {best['envs_per_worker']} envs"
    elif best["workers"]:
        layout = (f"{best['workers']} workers × {best['envs_per_worker']} envs, {best['worker_threads']} "
                  "thread(s) per worker")
    else:
        layout = f"sequential, {best['envs_per_worker']} envs"
    print(f"fastest here: {layout} at {best['steps_per_second']:,.0f} env steps/s")
    print(f"use it: {result['command']}")
    return 0


def _write_json(path: str | Path, data: dict[str, Any]) -> None:
    """`data` as JSON at `path`, its folder made where missing; WriteFailed naming it where the disk does not take
    it (the folder then removed)."""
    with writing(Path(path)), new_folders(Path(path).parent):
        write_json(Path(path), data)


def _check_output(path: str | None, name: str = "--output") -> None:
    """The result file `path` (given as `name`) can be written: checked before the measurement, not after it."""
    if path is None:
        return
    check_output_file(Path(path), f"{name} {Path(path)}")


def _set_threads(cfg: Config, threads: int | None, parallel: bool = False) -> None:
    if threads is not None and threads <= 0:
        raise ConfigError(f"--threads must be positive, got {threads}")
    import torch

    torch.set_num_threads(threads or thread_plan(cfg, parallel).learner)


def _measure(cfg: Config, seconds: float) -> tuple[Config, dict[str, Any]]:
    """The compute limit of every setting the config leaves `auto`: the config with the one a trainer would keep
    (`pick`), and the result, which carries the physical roofline (network FLOPs, matmul peaks) beside it."""
    from parallel_ppo.tuning.compute_limit import network_flops
    from parallel_ppo.tuning.learner_settings import matmul_peaks, measure_candidates

    spaces = env_spaces(cfg.env)
    result = measure_candidates(cfg, spaces, seconds)
    cfg = dataclasses.replace(cfg, training=dataclasses.replace(
        cfg.training, precision=result["precision"], microbatch_size=result["microbatch_size"]))
    return cfg, {**result, **network_flops(cfg, spaces), "peak_gflops": matmul_peaks(cfg)}


def roofline(args: Any, prog: str) -> int:
    from parallel_ppo.bench.roofline import format_table, run_roofline_line

    flags = {"env.id": args.env, "env.num_envs": args.num_envs, "training.batch_size": args.batch_size}
    try:
        cfg = build_config(args.config, flags, args.set, parallel=False)
        _set_threads(cfg, args.threads)
        _check_output(args.output)
        if args.run:
            run_roofline_line(args.run)  # a bad run directory is refused before the measurement
        cfg, result = _measure(cfg, args.seconds)
    except ParallelPPOError as e:
        return fail(prog, e, 2)
    result["hardware"] = fingerprint.hardware()
    print(format_table(result))
    if args.run:
        print(run_roofline_line(args.run))
    if args.output:
        _write_json(args.output, result)
        print(f"wrote {args.output}")
    return 0


def speed_check(args: Any, prog: str) -> int:
    from parallel_ppo.bench.roofline import format_table
    from parallel_ppo.bench.speedcheck import (
        format_speed_check,
        run_trainer,
        speed_result,
        trainer_args,
        trainer_figures,
    )

    sets = [f"training.n_steps={args.n_steps}", f"training.n_epochs={args.n_epochs}", *args.set]
    flags = {"env.id": args.env, "env.num_envs": args.num_envs, "training.batch_size": args.batch_size}
    out_dir = Path(args.output_dir or SPEED_CHECK_DIR.replace("<time>", time.strftime("%Y%m%d-%H%M%S")))
    json_path = Path(args.output) if args.output else out_dir / "speed_check.json"
    try:
        cfg = build_config(args.config, flags, sets, parallel=False)
        _set_threads(cfg, None)
        check_writable(out_dir, f"--output-dir {out_dir}")
        _check_output(str(json_path), "--output" if args.output else "the result file")
        print(f"{prog}: measuring the compute limit for {args.seconds:g} s ...", flush=True)
        cfg, limit = _measure(cfg, args.seconds)
    except ParallelPPOError as e:
        return fail(prog, e, 2)
    print(format_table(limit), flush=True)
    sets += [f"training.precision={limit['precision']}", f"training.microbatch_size={limit['microbatch_size']}",
             f"parallel.learner_threads={limit['threads']}"]  # the trainer on the threads its limit was measured on
    run_dir = out_dir / "train"
    print(f"{prog}: running the sequential trainer for {args.train_seconds:g} s → {run_dir}", flush=True)
    try:
        load = run_trainer(trainer_args(cfg, args.config, sets, args.train_seconds, run_dir))
        trainer = trainer_figures(run_dir)
    except (BenchRunCrashed, ParallelPPOError) as e:
        return fail(prog, e, 1)
    result = speed_result(cfg, limit, trainer, load, run_dir, {"limit": args.seconds, "train": args.train_seconds})
    _write_json(json_path, result)
    print(f"\n{prog}: {format_speed_check(result)}")
    print(f"wrote {json_path}")
    print(result["verdict"])
    return 0


def main(argv: list[str] | None = None, prog: str = "bench.py") -> int:
    args = make_parser(prog).parse_args(argv)
    if args.command in PROCGEN_CONFIGS and args.config is None:
        args.config = default_config(given_env(args.env, args.set), PROCGEN_CONFIGS[args.command])
    retain_freed_memory()  # as the trainer does, so rates measured here are the trainer's
    stop_on_sigterm()
    commands = {"roofline": roofline, "speed-check": speed_check, "envs": envs, "scaling": sweep,
                "layouts": sweep, "autotune": sweep, "learning": learning, "study": study}
    try:
        return commands[args.command](args, prog)
    except WriteFailed as e:  # a result file the disk did not take
        return fail(prog, e, 1)
    except KeyboardInterrupt:  # its runs are stopped by then, each with what it had written
        return interrupted(prog, "what it wrote before stays")
