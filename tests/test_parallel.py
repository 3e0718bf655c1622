"""The parallel trainer: it reproduces the sequential one exactly, learns, and leaves nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from sessions import assert_nothing_left, shm_entries, start

from parallel_ppo.collect import SequentialCollector
from parallel_ppo.config import build_config
from parallel_ppo.parallel.coordinator import ParallelCoordinator
from parallel_ppo.trainer import train

ROOT = Path(__file__).resolve().parents[1]
BUFFER_FIELDS = ("obs", "actions", "rewards", "dones", "logprobs", "values", "last_values")


def _config(parallel: bool, workers: int, out: Path):
    flags = {"env.id": "CartPole-v1", "run.seed": 3, "run.output_dir": str(out), "run.total_steps": 1}
    sets = ["training.n_steps=32", "training.batch_size=32", "training.n_epochs=2", "logging.tensorboard=false",
            "env.num_envs=4", f"parallel.num_workers={workers}", f"parallel.num_envs_per_worker={4 // workers}"]
    return build_config("config/cartpole.yaml", flags, sets, parallel)


def _one_update(tmp_path: Path, workers: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Train for exactly one update; return the rollout buffer's contents and the final parameters."""
    out = tmp_path / f"w{workers}"
    out.mkdir()
    cfg = _config(workers > 0, max(workers, 1), out)
    source = ParallelCoordinator(cfg) if workers else SequentialCollector(cfg, env_threads=1)
    summary = train(cfg, source, out, threads={})
    assert summary["updates"] == 1
    buffer = {name: getattr(source.buffer, name).clone() for name in BUFFER_FIELDS}
    params = torch.load(out / "checkpoint.pt", weights_only=False)["model"]
    return buffer, params


def test_parallel_update_equals_sequential(tmp_path, monkeypatch):
    """Same seed, same 4 envs: 1 and 2 workers produce the sequential rollout and parameters."""
    monkeypatch.chdir(ROOT)
    seq_buffer, seq_params = _one_update(tmp_path, 0)
    assert seq_buffer["dones"].sum() > 0, "the rollout should cross at least one episode end"
    for workers in (1, 2):
        buffer, params = _one_update(tmp_path, workers)
        for name in ("obs", "actions", "rewards", "dones"):
            assert torch.equal(buffer[name], seq_buffer[name]), f"{workers} worker(s): {name} differs"
        for name in ("logprobs", "values", "last_values"):
            torch.testing.assert_close(buffer[name], seq_buffer[name], rtol=1e-5, atol=1e-5)
        assert params.keys() == seq_params.keys()
        for key in params:
            torch.testing.assert_close(params[key], seq_params[key], rtol=1e-4, atol=1e-5)


def _launch(tmp_path: Path, extra: list[str], env_extra: dict[str, str] | None = None):
    out = tmp_path / "run"
    cmd = [sys.executable, "train_parallel_timed.py", "--config", "config/cartpole.yaml", "--output-dir", str(out),
           "--set", "logging.tensorboard=false", *extra]
    proc = start(cmd, cwd=ROOT, env={**os.environ, **(env_extra or {})})
    return proc, out


def test_normal_run_leaves_nothing_behind(tmp_path):
    shm_before = shm_entries()
    proc, out = _launch(tmp_path, ["--total-steps", "2048", "--num-workers", "2"])
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mode"] == "parallel" and summary["num_workers"] == 2 and summary["num_envs_per_worker"] == 4
    assert summary["num_envs"] == 8 and summary["stop_reason"] == "total_steps"
    assert_nothing_left(proc.pid, shm_before)


def test_worker_exception_stops_cleanly(tmp_path):
    shm_before = shm_entries()
    proc, out = _launch(tmp_path, ["--total-steps", "100000"], {"PARALLEL_PPO_INJECT_FAULT": "1:3"})
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1
    assert "worker 1 failed: RuntimeError: fault injected" in err
    assert "Traceback" not in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stop_reason"] == "error" and summary["updates"] == 2
    assert (out / "checkpoint.pt").is_file()
    assert_nothing_left(proc.pid, shm_before)


def test_sigint_stops_cleanly(tmp_path):
    shm_before = shm_entries()
    proc, out = _launch(tmp_path, ["--total-steps", "10000000"])
    metrics = out / "metrics.csv"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 3):
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[1]
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole process group
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGINT, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stop_reason"] == "signal" and summary["signal"] == "SIGINT"
    assert (out / "checkpoint.pt").is_file()
    assert_nothing_left(proc.pid, shm_before)


@pytest.mark.parametrize("seed", [1])
def test_parallel_cartpole_learns(tmp_path, seed):
    out = tmp_path / "learn"
    proc = subprocess.run(
        [sys.executable, "train_parallel_timed.py", "--config", "config/cartpole.yaml", "--num-workers", "2",
         "--num-envs-per-worker", "4", "--total-steps", "100000", "--seed", str(seed), "--output-dir", str(out),
         "--set", "logging.tensorboard=false"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["total_env_steps"] >= 100000 - 256
    assert summary["episodic_return_mean"] >= 450
