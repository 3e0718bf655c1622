"""End to end: PPO on CartPole reaches a high mean return within 100k env steps."""

from __future__ import annotations

import json


def test_cartpole_learns(tmp_path, train_timed):
    """The acceptance command reaches a mean return of at least 450 over the last 100 episodes (max 500)."""
    out = tmp_path / "run"
    proc = train_timed("--config", "config/cartpole.yaml", "--total-steps", "100000", "--seed", "1",
                       "--output-dir", str(out), timeout=900)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stop_reason"] == "total_steps"
    assert summary["total_env_steps"] >= 100_000
    assert summary["episodes"] >= 100
    assert summary["episodic_return_mean"] >= 450, summary["episodic_return_mean"]
