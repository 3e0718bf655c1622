"""The speed check: the sequential trainer's steady-state SPS against the compute limit measured in the same
sitting (`make bench-speed`). A measurement, not a test: it reports whatever ratio it finds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from parallel_ppo.bench.trainer_runs import BenchRunCrashed, trainer_command
from parallel_ppo.core.config import Config
from parallel_ppo.runs import fingerprint
from parallel_ppo.runs.figures import steady_span
from parallel_ppo.runs.reading import load_run
from parallel_ppo.tuning.other_load import BUSY_CORES, OtherLoad

SPEED_TARGET = 0.85
"""The goal: the sequential trainer's steady-state SPS is at least this fraction of the compute limit."""


def trainer_figures(run_dir: Path) -> dict[str, Any]:
    """A finished trainer run as the speed check reports it: its steady-state SPS (`runs.figures.steady_sps`, the
    figure its summary.json holds) and the mean seconds per steady update of each phase."""
    run = load_run("trainer", run_dir)
    steps, seconds = steady_span(run.metrics["env_steps"], run.metrics["wall_time"])
    updates = max(1, run.updates - 1)
    return {"sps": run.steady_sps, "steps": steps, "seconds": seconds, "updates": updates,
            "first_update_seconds": float(run.metrics["wall_time"][0]), "update_seconds": seconds / updates,
            "phase_seconds_per_update": run.phase_means(), "own_limit_sps": (run.summary.compute_limit or {}).get(
                "limit_sps")}


def run_trainer(cmd: list[str]) -> float:
    """Run the trainer to its end (a Ctrl-C reaches it too: wait for it to stop at its update boundary; one that
    stopped without a run, KeyboardInterrupt); returns the mean cores other processes kept busy meanwhile."""
    interrupted: KeyboardInterrupt | None = None  # Ctrl-C, or SIGTERM (`cli.common.Terminated`)
    with OtherLoad() as load:
        proc = subprocess.Popen(cmd)
        try:
            returncode = proc.wait()
        except KeyboardInterrupt as stop:
            print("speed check: interrupted; waiting for the trainer to stop", file=sys.stderr, flush=True)
            interrupted, returncode = stop, proc.wait()
    if returncode != 0:
        if interrupted:  # stopped before its first update: no run to measure, and no crash
            raise interrupted
        raise BenchRunCrashed(f"the trainer exited with status {returncode}")
    return load.cores


def trainer_args(cfg: Config, config_file: str, sets: list[str], train_seconds: float, run_dir: Path) -> list[str]:
    """The sequential trainer with the checked settings, for `train_seconds`."""
    cmd = [*trainer_command(0), "--config", config_file, "--env", cfg.env.id, "--num-envs", str(cfg.env.num_envs),
           "--batch-size", str(cfg.training.batch_size), "--duration", repr(train_seconds / 3600),
           "--output-dir", str(run_dir), "--overwrite", "--set", "eval.interval_seconds=0"]
    for item in sets:
        cmd += ["--set", item]
    return cmd


def speed_result(cfg: Config, limit: dict[str, Any], trainer: dict[str, Any], trainer_load: float,
                 run_dir: Path, seconds: dict[str, float]) -> dict[str, Any]:
    """speed_check.json: the ratio, its verdict, and the per-update times against the ideal ones."""
    ratio = trainer["sps"] / limit["limit_sps"]
    rollout = cfg.rollout_size
    ideal = {"inference": rollout / limit["forward_rate"],
             "update": cfg.training.n_epochs * rollout / limit["train_rate"]}
    return {
        "verdict": "PASS" if ratio >= SPEED_TARGET else "BELOW", "ratio": ratio, "target": SPEED_TARGET,
        "trainer_sps": trainer["sps"], "limit_sps": limit["limit_sps"],
        "other_load_cores": {"limit": limit["other_load_cores"], "trainer": trainer_load},
        "forward_rate": limit["forward_rate"], "train_rate": limit["train_rate"],
        "settings": {"env": cfg.env.id, "num_envs": cfg.env.num_envs, "n_steps": cfg.training.n_steps,
                     "batch_size": cfg.training.batch_size, "n_epochs": cfg.training.n_epochs,
                     "precision": cfg.training.precision, "threads": limit["threads"],
                     "limit_seconds": seconds["limit"], "train_seconds": seconds["train"]},
        "limit": limit, "trainer": trainer, "trainer_own_limit_sps": trainer["own_limit_sps"],
        "ideal_seconds_per_update": {**ideal, "total": rollout / limit["limit_sps"]},
        "run_dir": str(run_dir), "hardware": fingerprint.hardware(), "versions": fingerprint.versions(),
    }


def format_speed_check(result: dict[str, Any]) -> str:
    """The console report of `speed_result`."""
    limit, trainer, ideal = result["limit"], result["trainer"], result["ideal_seconds_per_update"]
    st, phases, own = result["settings"], trainer["phase_seconds_per_update"], result["trainer_own_limit_sps"]
    rows = [
        ("forward rate", f"{limit['forward_rate']:,.0f} samples/s (batch {limit['rollout_batch']})"),
        ("train rate", f"{limit['train_rate']:,.0f} samples/s (minibatch {limit['minibatch']})"),
        ("compute limit", f"{limit['limit_sps']:,.1f} env steps/s"
                          + (f" (the trainer's own pre-run measurement: {own:,.1f})" if own else "")),
        ("trainer SPS", f"{trainer['sps']:,.1f} env steps/s (steady state: {trainer['updates']} updates, "
                        f"{trainer['steps']:,.0f} steps in {trainer['seconds']:.1f} s; update 1 excluded)"),
        ("ratio", f"{result['ratio']:.3f} (target {SPEED_TARGET}) → {result['verdict']}"),
        ("per update", f"{trainer['update_seconds']:.2f} s vs ideal {ideal['total']:.2f} s: "
                       f"inference {phases['inference']:.2f} (ideal {ideal['inference']:.2f}), "
                       f"env {phases['env']:.2f}, render {phases['render']:.2f}, "
                       f"update {phases['update']:.2f} (ideal {ideal['update']:.2f}), "
                       f"gae {phases['gae']:.2f}, log {phases['log']:.2f}"),
    ]
    loads = result["other_load_cores"]
    if max(loads.values()) > BUSY_CORES:
        rows.append(("WARNING", f"other processes kept up to {max(loads.values()):.2f} cores busy (limit "
                                f"{loads['limit']:.2f}, trainer {loads['trainer']:.2f}); rerun"))
    width = max(len(name) for name, _ in rows)
    head = (f"{st['env']}, {st['num_envs']} envs × {st['n_steps']} steps, minibatch {st['batch_size']}, "
            f"{st['n_epochs']} epochs, {st['precision']}, {st['threads']} threads")
    return "\n".join([head, *(f"{name:<{width}}  {value}" for name, value in rows)])
