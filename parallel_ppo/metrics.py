"""Per-update metrics: metrics.csv, TensorBoard events, a console progress line, and psutil sampling."""

from __future__ import annotations

import csv
import math
import os
import sys
from pathlib import Path
from typing import Any

import psutil

from parallel_ppo.timing import PHASES

METRIC_COLUMNS = [
    "update", "env_steps", "wall_time", "sps",
    "episodic_return_mean", "episodic_length_mean", "episodes",
    "policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac", "explained_variance", "learning_rate",
    *(f"time_{p}" for p in PHASES),
    "cpu_percent", "rss_mb", "worker_restarts",
]
"""metrics.csv columns, in order (one row per update)."""

TB_TAGS = {
    "episodic_return_mean": "charts/episodic_return",
    "episodic_length_mean": "charts/episodic_length",
    "sps": "charts/SPS",
    "learning_rate": "charts/learning_rate",
    "policy_loss": "losses/policy_loss",
    "value_loss": "losses/value_loss",
    "entropy": "losses/entropy",
    "approx_kl": "losses/approx_kl",
    "clipfrac": "losses/clipfrac",
    "explained_variance": "losses/explained_variance",
    **{f"time_{p}": f"time/{p}" for p in PHASES},
    "cpu_percent": "system/cpu_percent",
    "rss_mb": "system/rss_mb",
}
"""metrics.csv column → TensorBoard tag (CleanRL's names where it has them)."""


class ResourceSampler:
    """CPU % (100 = one core busy) and RSS of this process and all its children, since the last sample."""

    def __init__(self) -> None:
        self._root = psutil.Process()
        self._procs: dict[int, psutil.Process] = {}
        self.peak_rss_mb = 0.0
        self.sample()

    def sample(self) -> dict[str, float]:
        procs = [self._root]
        try:
            procs += self._root.children(recursive=True)
        except psutil.Error:
            pass
        cpu = rss = 0.0
        alive = {}
        for p in procs:
            known = self._procs.get(p.pid, p)
            try:
                cpu += known.cpu_percent(None)
                rss += known.memory_info().rss
                alive[p.pid] = known
            except psutil.Error:
                continue
        self._procs = alive
        rss_mb = rss / 2**20
        self.peak_rss_mb = max(self.peak_rss_mb, rss_mb)
        return {"cpu_percent": cpu, "rss_mb": rss_mb}


def _fmt_time(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class MetricsLogger:
    """Writes each update's row to metrics.csv and TensorBoard and redraws the progress line."""

    def __init__(self, run_dir: Path, tensorboard: bool, progress: str, budget_seconds: float,
                 total_steps: int, label: str) -> None:
        self.path = run_dir / "metrics.csv"
        new = not self.path.exists() or self.path.stat().st_size == 0
        self._file = open(self.path, "a", newline="")
        self._csv = csv.DictWriter(self._file, fieldnames=METRIC_COLUMNS, extrasaction="ignore")
        if new:
            self._csv.writeheader()
        self._writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(run_dir / "logs"))
        self._progress = progress == "on" or (progress == "auto" and sys.stdout.isatty())
        self._budget = budget_seconds
        self._total_steps = total_steps
        self._label = label

    def log(self, row: dict[str, Any]) -> None:
        self._csv.writerow({k: _csv_value(row.get(k)) for k in METRIC_COLUMNS})
        self._file.flush()
        if self._writer is not None:
            step = int(row["env_steps"])
            for key, tag in TB_TAGS.items():
                value = row.get(key)
                if value is not None and math.isfinite(value):
                    self._writer.add_scalar(tag, value, step)
        if self._progress:
            self._draw(row)

    def _draw(self, row: dict[str, Any]) -> None:
        elapsed = row["wall_time"]
        ret = row["episodic_return_mean"]
        steps = f"{row['env_steps']:,}" + (f"/{self._total_steps:,}" if self._total_steps else "")
        line = (f"[{self._label}] update {row['update']} | {steps} steps | {row['sps']:.0f} SPS | "
                f"{_fmt_time(elapsed)} elapsed, {_fmt_time(self._budget - elapsed)} left | "
                f"return {'-' if ret is None or math.isnan(ret) else f'{ret:.2f}'}")
        sys.stdout.write("\r" + line[: max(20, _terminal_width() - 1)].ljust(_terminal_width() - 1))
        sys.stdout.flush()

    def close(self) -> None:
        if self._progress:
            sys.stdout.write("\n")
        if self._writer is not None:
            self._writer.close()
        self._file.close()


def _terminal_width() -> int:
    try:
        return os.get_terminal_size().columns
    except OSError:
        return 120


def _csv_value(value: Any) -> Any:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return "" if value is None else value
