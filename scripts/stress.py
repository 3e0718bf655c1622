#!/usr/bin/env python
"""Stress the parallel trainer (not part of CI): repeatedly SIGKILL a worker mid-run, and SIGINT the
coordinator then resume, checking each time for hangs, leftover processes, /dev/shm leaks and a valid resume.

    .venv/bin/python scripts/stress.py --rounds 20 --env starpilot

Prints each round's result and the tally; exit 1 when a round failed. A Ctrl-C stops the trainer under way (each runs
in a session of its own, out of the terminal's reach) and ends the rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from sessions import assert_nothing_left, shm_entries  # noqa: E402  (found by session: titles hide environ tags)

from parallel_ppo.cli.common import OneLineParser, interrupted, positive_int, stop_on_sigterm  # noqa: E402

SMALL = ["--set", "training.n_steps=32", "--batch-size", "256", "--set", "logging.tensorboard=false",
         "--set", "run.limit_seconds=0", "--set", "run.checkpoint_interval=1"]


LAUNCHED: list[subprocess.Popen] = []
"""The trainers started (`launch`), stopped by `stop_launched` after each round."""


def launch(args: list[str]) -> subprocess.Popen:
    """The parallel trainer as the leader of a new session (session id = its pid)."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "train_parallel_timed.py"), *args], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    LAUNCHED.append(proc)
    return proc


def stop_launched() -> None:
    """Stop every trainer still running, session and all: a round that failed, or a Ctrl-C, which reaches no
    trainer (each leads a session of its own). SIGINT first, so that it removes its shared memory; SIGKILL after
    60 s."""
    for proc in LAUNCHED:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
    for proc in LAUNCHED:
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    LAUNCHED.clear()


def rows(out: Path) -> list[dict[str, str]]:
    try:
        with open(out / "metrics.csv", newline="") as f:
            return list(csv.DictReader(f))
    except OSError:
        return []


def wait_rows(proc: subprocess.Popen, out: Path, n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(rows(out)) < n:
        if proc.poll() is not None:
            raise RuntimeError(f"trainer exited early: {proc.stderr.read().strip().splitlines()[-1:]}")
        if time.monotonic() > deadline:
            raise RuntimeError("no progress (hang?)")
        time.sleep(0.1)


def finish(proc: subprocess.Popen, timeout: float) -> int:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise RuntimeError("trainer did not stop (hang)") from None
    return proc.returncode


def check_clean(sid: int, shm_before: set[str]) -> None:
    try:
        assert_nothing_left(sid, shm_before)
    except AssertionError as e:
        raise RuntimeError(str(e)) from None


def worker_kill_round(base: list[str], work: Path, rng: random.Random) -> None:
    out, before = work / f"kill_{uuid.uuid4().hex[:6]}", shm_entries()
    proc = launch([*base, "--total-steps", "100000000", "--duration", "0.05", "--output-dir", str(out)])
    wait_rows(proc, out, 1, 300)
    time.sleep(rng.uniform(0.0, 2.0))  # land anywhere in the rollout/update cycle
    workers = [c for c in psutil.Process(proc.pid).children(recursive=True)
               if " ".join(c.cmdline()).startswith("parallel_ppo worker")]
    rng.choice(workers).kill()
    n = len(rows(out))
    wait_rows(proc, out, n + 2, 300)  # it recovered and kept training
    os.killpg(proc.pid, signal.SIGINT)
    code = finish(proc, 120)
    summary = json.loads((out / "summary.json").read_text())
    if code != 128 + signal.SIGINT or summary["worker_restarts"] < 1:
        raise RuntimeError(f"exit {code}, restarts {summary['worker_restarts']}")
    check_clean(proc.pid, before)


def sigint_resume_round(base: list[str], work: Path, rng: random.Random) -> None:
    out, before = work / f"int_{uuid.uuid4().hex[:6]}", shm_entries()
    proc = launch([*base, "--total-steps", "100000000", "--output-dir", str(out)])
    wait_rows(proc, out, 2, 300)
    time.sleep(rng.uniform(0.0, 2.0))
    os.killpg(proc.pid, signal.SIGINT)
    if finish(proc, 120) != 128 + signal.SIGINT:
        raise RuntimeError("SIGINT did not end the run with status 130")
    check_clean(proc.pid, before)
    stopped = json.loads((out / "summary.json").read_text())["total_env_steps"]
    proc = launch(["--resume", str(out), "--total-steps", str(stopped + 1)])
    if finish(proc, 300) != 0:
        raise RuntimeError(f"resume failed: {proc.stderr.read().strip().splitlines()[-1:]}")
    updates = [int(r["update"]) for r in rows(out)]
    steps = [int(r["env_steps"]) for r in rows(out)]
    if updates != list(range(1, len(updates) + 1)) or steps != sorted(set(steps)):
        raise RuntimeError("metrics.csv is not continuous after resume")
    check_clean(proc.pid, before)


def run_rounds(args: argparse.Namespace, base: list[str], work: Path, results: dict[str, int]) -> None:
    """`--rounds` rounds of each kind, each printed; the rounds passed of each kind into `results`."""
    rng = random.Random(args.seed)
    for name, fn in (("worker SIGKILL", worker_kill_round), ("coordinator SIGINT + resume", sigint_resume_round)):
        results[name] = 0
        for i in range(args.rounds):
            start = time.monotonic()
            try:
                fn(base, work, rng)
                results[name] += 1
                status = "ok"
            except RuntimeError as e:
                status = f"FAILED: {e}"
            finally:
                stop_launched()
            print(f"{name} {i + 1}/{args.rounds}: {status} ({time.monotonic() - start:.0f} s)", flush=True)


def main() -> int:
    p = OneLineParser(prog="stress.py", description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=positive_int, default=20, help="rounds of each kind (default 20)")
    p.add_argument("--env", default="starpilot")
    p.add_argument("--seed", type=int, default=0, help="seed of the random kill timing")
    args = p.parse_args()
    stop_on_sigterm()
    base = ["--env", args.env, "--num-workers", "2", "--num-envs-per-worker", "8", *SMALL]
    results: dict[str, int] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="ppo-stress-") as tmp:
            run_rounds(args, base, Path(tmp), results)
    except KeyboardInterrupt:
        done = ", ".join(f"{name} {ok}" for name, ok in results.items())
        return interrupted("stress.py", f"its trainer stopped; rounds passed before: {done}" if done
                           else "no round had started")
    for name, ok in results.items():
        print(f"{name}: {ok}/{args.rounds} passed")
    return 0 if all(ok == args.rounds for ok in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
