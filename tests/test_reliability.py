"""Multi-hour-run hazards: killed workers, repeated deaths, Ctrl-C then --resume, corrupt checkpoints."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest
from sessions import assert_nothing_left, session_pids, shm_entries, start, wait_for

from parallel_ppo.core.pause import PAUSE_ENV_VAR, release_file

pytestmark = pytest.mark.slow  # every test here trains or starts trainers

ROOT = Path(__file__).resolve().parents[1]


class Run:
    """A trainer subprocess in its own session, so that every process it spawns can be found."""

    def __init__(self, tmp_path: Path, script: str, args: list[str], out: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.out = out or tmp_path / "run"
        self.shm_before = shm_entries()
        cmd = [sys.executable, script, "--set", "logging.tensorboard=false", *args]
        if "--resume" not in args:
            cmd += ["--output-dir", str(self.out)]
        self.proc = start(cmd, cwd=ROOT, env={**os.environ, **(env or {})})

    def rows(self) -> list[dict[str, str]]:
        path = self.out / "metrics.csv"
        if not path.exists():
            return []
        with open(path, newline="") as f:
            return list(csv.DictReader(f))

    def wait_rows(self, n: int, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while len(self.rows()) < n:
            assert self.proc.poll() is None, self.proc.communicate()[1]
            assert time.monotonic() < deadline, "the run made no progress"
            time.sleep(0.1)

    def worker(self, index: int, not_pid: int | None = None, timeout: float = 60) -> psutil.Process:
        """The live worker process for slot `index` (a different one from `not_pid`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                try:
                    title = " ".join(child.cmdline())
                except psutil.Error:
                    continue
                if title.startswith(f"parallel_ppo worker {index} ") and child.pid != not_pid:
                    return child
            time.sleep(0.1)
        raise AssertionError(f"worker {index} not found")

    def finish(self, timeout: float = 300) -> tuple[int, str]:
        _, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, err

    def summary(self) -> dict:
        return json.loads((self.out / "summary.json").read_text())

    def assert_nothing_left(self) -> None:
        assert_nothing_left(self.proc.pid, self.shm_before)

    def pids(self) -> list[int]:
        return session_pids(self.proc.pid)


PARALLEL = "train_parallel_timed.py"
# The runs here measure no compute limit (`run.limit_seconds` 0): none is asked of them.
SLEEPING_OVERLAPPED = ["--config", "config/sim_lift.yaml", "--num-workers", "2", "--num-envs-per-worker", "2",
                      "--set", "env.options=[step_ms=5]", "--set", "training.n_steps=256", "--set",
                      "training.batch_size=256", "--set", "training.n_epochs=1", "--set", "parallel.overlap=true",
                      "--set", "run.limit_seconds=0"]
CARTPOLE = ["--config", "config/cartpole.yaml", "--num-workers", "2", "--num-envs-per-worker", "4",
            "--set", "training.n_steps=256", "--set", "training.n_epochs=2", "--set", "run.limit_seconds=0"]


def kill_worker_1_and_finish(run: Run, held: Path | None = None) -> dict:
    """Kill worker 1 (then end the hold that wrote its pid to `held`); the run restarts it and finishes its budget:
    its summary."""
    run.worker(1).kill()
    if held is not None:
        release_file(held).touch()
    code, err = run.finish()
    assert code == 0, err
    assert "worker 1 died (killed by SIGKILL); restarting" in err
    summary = run.summary()
    assert summary["stop_reason"] == "total_steps" and summary["worker_restarts"] == 1
    return summary


def test_killed_worker_is_restarted_and_run_finishes(tmp_path):
    """Worker 1 killed while the coordinator is held in update 3 (so the run cannot end first) is restarted for
    rollout 4, the last."""
    held = tmp_path / "held"
    run = Run(tmp_path, PARALLEL, [*CARTPOLE, "--total-steps", "8192"], env={PAUSE_ENV_VAR: f"update:3:{held}"})
    wait_for(held, run.proc, timeout=180)
    summary = kill_worker_1_and_finish(run, held)
    assert summary["total_env_steps"] == 8192 and len(run.rows()) == 4
    steps = [int(r["env_steps"]) for r in run.rows()]
    assert steps == sorted(steps) and steps[1] - steps[0] == 256 * 8, "every update is a full rollout"
    run.assert_nothing_left()


@pytest.mark.parametrize("capped", [False, True], ids=["uncapped", "capped"])
def test_worker_killed_during_an_overlapped_update_is_restarted_and_nothing_is_lost(tmp_path, capped):
    """The coordinator is held in update 2 while the workers collect rollout 3 (sleeping envs: 2 × 256 steps of
    `5 ms` each; `capped`: they wait for the update's parameters after 25 of them, `parallel.max_lagged_share`); a
    worker killed then (the hold ends after the kill) is replaced when the coordinator next waits, and re-collects
    its slice: every update is a full rollout, one update behind, and none lags past the cap."""
    held = tmp_path / "held"
    cap = ["--set", "parallel.max_lagged_share=0.1"] if capped else []
    run = Run(tmp_path, PARALLEL, [*SLEEPING_OVERLAPPED, *cap, "--total-steps", "3072"],
              env={PAUSE_ENV_VAR: f"update:2:{held}"})
    wait_for(held, run.proc, timeout=180)
    summary = kill_worker_1_and_finish(run, held)
    assert summary["total_env_steps"] == 3072 and summary["policy_lag"] == 1
    pace = summary["worker_pace"]  # the rollout whose worker was killed counts too: both slices came whole
    assert pace["rollouts"] == sum(pace["slowest"]) == 3 and len(pace["busy_seconds"]) == 2
    rows = run.rows()
    assert [int(r["env_steps"]) for r in rows] == [1024, 2048, 3072], "every update is a full rollout"
    assert [int(r["policy_lag"]) for r in rows] == [0, 1, 1]
    if capped:
        assert all(float(r["lagged_share"]) <= 25 / 256 + 1e-6 for r in rows), [r["lagged_share"] for r in rows]
    run.assert_nothing_left()


def test_slot_out_of_restarts_stops_with_checkpoint(tmp_path):
    run = Run(tmp_path, PARALLEL, [*CARTPOLE, "--total-steps", "10000000", "--set", "parallel.max_worker_restarts=1"])
    run.wait_rows(1)
    first = run.worker(1)
    first.kill()
    run.worker(1, not_pid=first.pid).kill()
    code, err = run.finish()
    assert code == 1
    # the second kill may land while the replacement is still starting: either way it is a death
    assert re.search(r"worker 1 died[a-z ]*\(killed by SIGKILL\); it was restarted 1 times already", err), err
    assert "Traceback" not in err
    summary = run.summary()
    assert summary["stop_reason"] == "error" and summary["worker_restarts"] == 1
    assert (run.out / "checkpoint.pt").is_file()
    run.assert_nothing_left()


def test_a_finished_run_resumes_to_no_update_and_a_truncated_checkpoint_is_refused(tmp_path):
    run = Run(tmp_path, "train_timed.py", ["--config", "config/cartpole.yaml", "--total-steps", "512",
                                           "--set", "run.limit_seconds=0"])
    code, err = run.finish()
    assert code == 0, err
    finished, rows = (run.out / "summary.json").read_text(), run.rows()
    again = Run(tmp_path, "train_timed.py", ["--resume", str(run.out)], out=run.out)  # as a requeued job would
    code, err = again.finish()
    assert code == 0, err
    assert again.rows() == rows, "a finished run trained on"
    assert (run.out / "summary.json").read_text() == finished, "a finished run's summary was rewritten"
    ckpt = run.out / "checkpoint.pt"
    ckpt.write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 2])
    before = {p.name: p.stat().st_mtime_ns for p in run.out.iterdir()}
    again = Run(tmp_path, "train_timed.py", ["--resume", str(run.out)], out=run.out)
    code, err = again.finish()
    assert code == 2
    assert err.strip().count("\n") == 0 and "checkpoint" in err and "corrupt" in err, err
    assert {p.name: p.stat().st_mtime_ns for p in run.out.iterdir()} == before, "a refused resume wrote files"
    again.assert_nothing_left()


def test_killed_coordinator_leaves_nothing_and_resumes(tmp_path):
    """SIGKILL of the coordinator itself, held in update 2 while its workers wait, before the first step of rollout 3,
    for the update's parameters (`parallel.max_lagged_share` under one step), which will never come. Their
    forkserver lives as long as they do, so no parent-death signal reaches them: they see the coordinator gone and
    exit, the forkserver after them; no /dev/shm entry remains, and --resume continues from the last checkpoint.
    (Steps of 1 ms: no timing matters here.)"""
    held = tmp_path / "held"
    run = Run(tmp_path, PARALLEL, [*SLEEPING_OVERLAPPED, "--set", "env.options=[step_ms=1]",
                                   "--set", "parallel.max_lagged_share=0.001",
                                   "--total-steps", "3072", "--set", "run.checkpoint_interval=0.01"],
              env={PAUSE_ENV_VAR: f"update:2:{held}"})
    wait_for(held, run.proc, timeout=180)
    assert (run.out / "checkpoint.pt").is_file()  # a checkpoint after every update: update 1's
    assert len(run.pids()) >= 4  # coordinator, forkserver, two workers (and the resource tracker)
    run.proc.kill()
    assert run.proc.wait(timeout=60) == -signal.SIGKILL  # not `finish`: a worker left alive holds its output open
    run.assert_nothing_left()
    run.finish()

    resumed = Run(tmp_path, PARALLEL, ["--resume", str(run.out)], out=run.out)
    code, err = resumed.finish()
    assert code == 0, err
    assert [int(r["update"]) for r in resumed.rows()] == [1, 2, 3]
    resumed.assert_nothing_left()
