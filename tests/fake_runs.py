"""Run directories written by hand, with known metrics rows and a summary that matches them."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import yaml

from parallel_ppo.core.configure import build_config
from parallel_ppo.runs.metrics import metric_columns

# Three updates of 1,024 env steps: the first takes 9 s (start-up, first touch), the next two 4 s each.
ROWS = [(1, 1024, 9.0, float("nan")), (2, 2048, 13.0, 20.0), (3, 3072, 17.0, 35.0)]
STEADY = 2048 / 8.0  # steps and seconds from the end of update 1 to the end of update 3


def write_run(path: Path, rows: list[tuple[int, int, float, float]] = ROWS, seed: int = 1, **summary_fields: object
              ) -> Path:
    """A run directory with known metrics rows and a summary that matches them (`summary_fields` override it)."""
    path.mkdir(parents=True)
    cfg = build_config(None, {"env.id": "CartPole-v1", "env.num_envs": 8, "run.seed": seed}, ["training.n_steps=128"],
                       False)
    (path / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict()))
    with open(path / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=metric_columns())
        writer.writeheader()
        for update, steps, wall, ret in rows:
            writer.writerow({c: 0.1 for c in metric_columns()} | {
                "update": update, "env_steps": steps, "wall_time": wall, "sps": 1024 / 4,
                "episodic_return_mean": "" if ret != ret else ret, "cpu_percent": 100, "rss_mb": 300})
    summary = {"mode": "sequential", "env_id": "CartPole-v1", "num_workers": 0, "num_envs_per_worker": 8,
               "num_envs": 8, "total_env_steps": rows[-1][1], "wall_seconds": rows[-1][2] + 0.5,
               "episodes": 12, "updates": len(rows), "stop_reason": "total_steps", "precision": "fp32",
               "peak_rss_mb": 300.0, "hardware": {"cpu_model": "x", "logical_cores": 2}, "versions": {},
               "sps": STEADY, "episodic_return_mean": rows[-1][3]} | summary_fields
    (path / "summary.json").write_text(json.dumps(summary))
    return path
