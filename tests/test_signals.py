"""A scheduler's stop (scancel, systemd, `kill -TERM -PGID`): SIGTERM to every process of a run, in each mode, while
it collects a rollout or while it updates, ends it at one update boundary with its checkpoint and summary and exit
143 and leaves nothing behind; `--resume` continues it (tried on the distributed run, which resumes only with as
many ranks; tests/test_reliability.py and test_continuous.py resume the other modes).
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
from conftest import toy_envs_environ
from sessions import assert_nothing_left, sessions_of, shm_entries, start, torchrun, wait_for

from parallel_ppo.core.checkpoint import load_checkpoint
from parallel_ppo.core.pause import PAUSE_ENV_VAR, release_file

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
CARTPOLE = ["--config", "config/cartpole.yaml", "--set", "logging.progress=off", "--set", "run.limit_seconds=0",
            "--set", "logging.tensorboard=false", "--set", "training.n_epochs=2"]
TRAINERS = {"sequential": [sys.executable, "train_timed.py"],
            "parallel": [sys.executable, "train_parallel_timed.py", "--num-workers", "2", "--num-envs-per-worker", "4",
                         "--set", "env.num_envs=8"],
            "distributed": [*torchrun("train_timed.py"), "--num-envs-total", "8"]}
STEPS = 32 * 8
"""Env steps an update: 8 envs × 32 steps in every mode."""


def rows(out: Path) -> list[dict[str, str]]:
    if not (out / "metrics.csv").exists():
        return []
    with open(out / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("point", ["rollout", "update"])
@pytest.mark.parametrize("mode", ["sequential", "parallel", "distributed"])
def test_sigterm_to_every_process_stops_at_one_boundary_and_resume_continues(tmp_path, mode, point):
    out, paused = tmp_path / "run", tmp_path / "paused"
    shm_before = shm_entries()
    env = {**os.environ, PAUSE_ENV_VAR: f"{point}:3:{paused}"}  # hold the run halfway through rollout 3 / update 3
    proc = start([*TRAINERS[mode], *CARTPOLE, "--total-steps", "100000", "--output-dir", str(out)], cwd=ROOT, env=env)
    wait_for(paused, proc)
    sids = sessions_of(proc.pid) if mode == "distributed" else [proc.pid]
    for sid in sids:  # what scancel does: every process of the job, workers and ranks included
        os.killpg(sid, signal.SIGTERM)
    # the signal landed in the hold; held on past the coordinator's next look at it (twice a second), parallel
    # workers see the abandon where they are held
    time.sleep(1.0)
    release_file(paused).touch()
    _, err = proc.communicate(timeout=120)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stop_reason"] == "signal" and summary["signal"] == "SIGTERM", err
    assert "restarting" not in err, err
    if mode == "distributed":  # torchrun itself answers SIGTERM with its SignalException's traceback and status 1
        assert err.count("Traceback") <= 1 and ("Traceback" not in err or "SignalException" in err), err
    else:
        assert "Traceback" not in err and proc.returncode == 128 + signal.SIGTERM, err
    done = 2 if point == "rollout" else 3  # an interrupted rollout is abandoned; an interrupted update finishes
    assert summary["updates"] == len(rows(out)) == load_checkpoint(out / "checkpoint.pt")["update"] == done, err
    for sid in sids:
        assert_nothing_left(sid, shm_before)

    if point == "rollout" or mode != "distributed":  # resuming is the same in every mode but for the ranks' count
        return
    resumed = start([*TRAINERS[mode], "--resume", str(out), "--total-steps", str((done + 2) * STEPS)], cwd=ROOT)
    _, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumes"] == 1 and summary["stop_reason"] == "total_steps"
    assert [int(r["update"]) for r in rows(out)] == list(range(1, done + 3)), "updates continue without a gap"
    assert [int(r["env_steps"]) for r in rows(out)] == [STEPS * u for u in range(1, done + 3)]
    if mode == "distributed":  # as torchrun --nproc_per_node 1 would set them
        one_rank = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
        refused = start([sys.executable, "train_timed.py", "--distributed", "--resume", str(out)], cwd=ROOT,
                        env=one_rank)
        _, err = refused.communicate(timeout=120)
        assert refused.returncode == 2 and err.strip().endswith("was trained by 2 ranks, not 1; resume it with the "
                                                                "same number"), err

def test_the_preemption_signal_can_write_a_checkpoint_and_train_on(tmp_path):
    """`run.on_preempt: checkpoint`: SIGUSR1 to every process (Slurm's --signal=USR1@90) writes a checkpoint after
    the current update, and the run, workers and forkserver included, trains on; Ctrl-C to the group then stops
    it with no worker restarted."""
    out = tmp_path / "run"
    proc = start([*TRAINERS["parallel"], *CARTPOLE, "--total-steps", "1000000", "--output-dir", str(out),
                  "--set", "run.on_preempt=checkpoint", "--set", "run.checkpoint_interval=100000"], cwd=ROOT)
    deadline = time.monotonic() + 120
    while len(rows(out)) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1]
        time.sleep(0.05)
    assert not (out / "checkpoint.pt").exists()
    os.killpg(proc.pid, signal.SIGUSR1)
    wait_for(out / "checkpoint.pt", proc, timeout=30)
    saved = load_checkpoint(out / "checkpoint.pt")["update"]
    while len(rows(out)) < saved + 3:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1]
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # then Ctrl-C in its terminal: the whole group again
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGINT and "restarting" not in err, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["worker_restarts"] == 0 and summary["signal"] == "SIGINT"


def test_sigterm_to_the_trainer_while_its_workers_start_stops_them_in_one_line(tmp_path):
    """SIGTERM to the coordinator alone (`kill PID`) while its workers build their envs (a minute each, as a
    simulator loading its assets): one line, status 143, nothing left. It died silently (no handler yet), and its
    workers built on for the minute."""
    flag, shm_before = tmp_path / "building", shm_entries()
    proc = start([*TRAINERS["parallel"][:2], "--config", "config/cartpole.yaml", "--env", "toy_envs:SlowStartReach-v0",
                  "--num-envs", "2", "--batch-size", "64", "--set", "run.limit_seconds=0", "--output-dir",
                  str(tmp_path / "run")], cwd=ROOT, env={**toy_envs_environ(), "SLOW_START_FLAG": str(flag)})
    wait_for(flag, proc)  # a worker builds its envs
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=50)  # a safety net: the workers' envs take 60 s
    assert (proc.returncode, err) == (128 + signal.SIGTERM, "train_parallel_timed.py: terminated before the first "
                                                            "update; nothing was trained\n")
    assert_nothing_left(proc.pid, shm_before)


def test_sigterm_while_a_worker_restarts_stops_the_run_without_waiting_for_the_restart(tmp_path):
    """A worker dies mid-run and its restart builds envs for a minute; SIGTERM to the coordinator then stops the run
    at once, as ever (checkpoint, summary, 143), the new worker too. It waited for the restart before looking at the
    signal: past a scheduler's grace (Slurm's KillWait, 30 s), the run was killed with no final checkpoint."""
    building, crashed, shm_before = tmp_path / "building", tmp_path / "crashed", shm_entries()
    out = tmp_path / "run"
    proc = start([*TRAINERS["parallel"][:2], *CARTPOLE, "--env", "toy_envs:CrashThenSlowStartReach-v0", "--num-envs",
                  "2", "--batch-size", "64", "--total-steps", "1000000", "--output-dir", str(out)], cwd=ROOT,
                 env={**toy_envs_environ(), "SLOW_START_FLAG": str(building), "SLOW_START_AFTER": str(crashed)})
    wait_for(building, proc)  # the restarted worker builds its envs
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=50)  # a safety net: the restart takes 60 s
    assert proc.returncode == 128 + signal.SIGTERM and re.search(r"worker \d died \(exited with status 139\)", err), err
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["stop_reason"], summary["signal"]) == ("signal", "SIGTERM") and (out / "checkpoint.pt").exists()
    assert_nothing_left(proc.pid, shm_before)


def test_a_worker_hung_in_its_env_step_ends_soon_after_its_coordinator_is_killed(tmp_path):
    """SIGKILL to the coordinator (the OOM killer) while a worker's env step hangs: the worker ends within
    ORPHAN_GRACE, and with it the forkserver and the resource tracker. It lived on for good, holding the shared
    memory: under the forkserver no parent-death signal comes, and the check between steps never ran."""
    hung, shm_before = tmp_path / "hung", shm_entries()
    proc = start([*TRAINERS["parallel"][:2], *CARTPOLE, "--env", "toy_envs:HangingReach-v0", "--num-envs", "2",
                  "--batch-size", "64", "--total-steps", "1000000", "--set", "parallel.worker_timeout=600",
                  "--output-dir", str(tmp_path / "run")], cwd=ROOT,
                 env={**toy_envs_environ(), "HANGING_REACH_FLAG": str(hung)})
    wait_for(hung, proc)  # a worker's step hangs (an hour)
    proc.kill()
    proc.communicate(timeout=30)
    assert_nothing_left(proc.pid, shm_before, grace=30)  # a safety net: ORPHAN_GRACE is 5 s
