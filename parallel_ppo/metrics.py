"""Per-update metrics: metrics.csv, TensorBoard events, a console progress line, and psutil sampling."""

from __future__ import annotations

import csv
import math
import os
import sys
import threading
from pathlib import Path
from typing import Any

import psutil

from parallel_ppo.timing import PHASES

METRIC_COLUMNS = [
    "update", "env_steps", "wall_time", "sps",
    "episodic_return_mean", "episodic_length_mean", "episodes",
    "policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac", "explained_variance", "learning_rate",
    *(f"time_{p}" for p in PHASES),
    "cpu_percent", "main_cpu_percent", "workers_cpu_percent", "system_cpu_percent",
    "rss_mb", "pss_mb", "main_rss_mb", "workers_rss_mb", "worker_restarts",
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
    **{key: f"system/{key}" for key in ("cpu_percent", "main_cpu_percent", "workers_cpu_percent",
                                        "system_cpu_percent", "rss_mb", "pss_mb", "main_rss_mb", "workers_rss_mb")},
}
"""metrics.csv column → TensorBoard tag (CleanRL's names where it has them). Per-worker `worker<i>_cpu_percent`
and `worker<i>_rss_mb` go to TensorBoard only, as `system/worker<i>_...`."""


class ResourceSampler:
    """CPU and memory of this process ("main"), each worker it spawned, the whole tree, and the machine.

    CPU percentages use top's unit, 100 = one core busy, averaged since the previous sample. `rss_mb`
    adds up resident sets, so memory shared between processes (the rollout buffer, library code) counts
    once per process; `pss_mb` splits shared pages among their users, so its sum is what the tree really
    occupies. A background thread samples memory between updates so that peaks inside an update count.
    """

    def __init__(self, peak_interval: float = 0.5) -> None:
        self._root = psutil.Process()
        self._procs: dict[int, psutil.Process] = {}
        self._cores = psutil.cpu_count() or 1
        self._lock = threading.Lock()
        self.peaks = {"rss_mb": 0.0, "pss_mb": 0.0, "main_rss_mb": 0.0, "worker_rss_mb": 0.0}
        psutil.cpu_percent(None)
        self.sample()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch_peaks, args=(peak_interval,), daemon=True,
                                        name="peak-memory")
        self._thread.start()

    def _tree(self) -> list[psutil.Process]:
        try:
            return [self._root, *self._root.children(recursive=True)]
        except psutil.Error:
            return [self._root]

    def _role(self, proc: psutil.Process) -> str:
        """"main", "worker<i>" (from the process title a worker sets) or "other"."""
        if proc.pid == self._root.pid:
            return "main"
        try:
            words = " ".join(proc.cmdline()).split()  # setproctitle pads argv with empty strings
        except psutil.Error:
            return "other"
        if len(words) >= 3 and words[:2] == ["parallel_ppo", "worker"] and words[2].isdigit():
            return f"worker{words[2]}"
        return "other"

    def _memory(self, procs: list[psutil.Process]) -> dict[str, float]:
        """MB per role, plus tree totals; updates the peaks."""
        out = {"rss_mb": 0.0, "pss_mb": 0.0, "main_rss_mb": 0.0, "workers_rss_mb": 0.0}
        worker_max = 0.0
        for p in procs:
            try:
                mem = p.memory_full_info()
            except psutil.Error:
                continue
            rss = mem.rss / 2**20
            out["pss_mb"] += getattr(mem, "pss", mem.rss) / 2**20
            role = self._role(p)
            _add_by_role(out, role, "rss_mb", rss)
            if role.startswith("worker"):
                worker_max = max(worker_max, rss)
        with self._lock:
            for key, value in (("rss_mb", out["rss_mb"]), ("pss_mb", out["pss_mb"]),
                               ("main_rss_mb", out["main_rss_mb"]), ("worker_rss_mb", worker_max)):
                self.peaks[key] = max(self.peaks[key], value)
        return out

    def _watch_peaks(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self._memory(self._tree())

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> dict[str, float]:
        """Columns for metrics.csv (tree, main, workers, system) and `worker<i>_*` entries for TensorBoard."""
        out = {"cpu_percent": 0.0, "main_cpu_percent": 0.0, "workers_cpu_percent": 0.0}
        alive = {}
        for p in self._tree():
            known = self._procs.get(p.pid, p)  # cpu_percent measures since the previous call on this object
            try:
                cpu = known.cpu_percent(None)
            except psutil.Error:
                continue
            alive[p.pid] = known
            _add_by_role(out, self._role(known), "cpu_percent", cpu)
        self._procs = alive
        out["system_cpu_percent"] = psutil.cpu_percent(None) * self._cores
        out.update(self._memory(list(alive.values())))
        return out


def _add_by_role(out: dict[str, float], role: str, name: str, value: float) -> None:
    """Add one process's `value` to the tree total `name` and to `main_<name>`, `workers_<name>`, `<role>_<name>`."""
    out[name] += value
    if role == "main":
        out[f"main_{name}"] = value
    elif role.startswith("worker"):
        out[f"workers_{name}"] += value
        out[f"{role}_{name}"] = value


def _fmt_time(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class MetricsLogger:
    """Writes each update's row to metrics.csv and TensorBoard and redraws the progress line."""

    def __init__(self, run_dir: Path, tensorboard: bool, progress: str, budget_seconds: float,
                 total_steps: int, label: str, resume_after: tuple[int, int] | None = None) -> None:
        """`resume_after=(update, env_steps)` continues a run: later rows (logged after its checkpoint) go."""
        self.path = run_dir / "metrics.csv"
        if resume_after is not None and self.path.exists():
            _truncate_after(self.path, resume_after[0])
        new = not self.path.exists() or self.path.stat().st_size == 0
        self._file = open(self.path, "a", newline="")
        self._csv = csv.DictWriter(self._file, fieldnames=METRIC_COLUMNS, extrasaction="ignore")
        if new:
            self._csv.writeheader()
        self._writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = resume_after[1] + 1 if resume_after is not None else None
            self._writer = SummaryWriter(str(run_dir / "logs"), purge_step=purge)
        self._progress = progress == "on" or (progress == "auto" and sys.stdout.isatty())
        self._budget = budget_seconds
        self._total_steps = total_steps
        self._label = label

    def log(self, row: dict[str, Any]) -> None:
        self._csv.writerow({k: _csv_value(row.get(k)) for k in METRIC_COLUMNS})
        self._file.flush()
        if self._writer is not None:
            step = int(row["env_steps"])
            tags = {**TB_TAGS, **{k: f"system/{k}" for k in row if k.startswith("worker") and k[6:7].isdigit()}}
            for key, tag in tags.items():
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


def _truncate_after(path: Path, update: int) -> None:
    """Keep the header and the rows up to `update` (rows past a checkpoint are repeated after a resume)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        return
    col = rows[0].index("update") if "update" in rows[0] else 0
    kept = [rows[0]] + [r for r in rows[1:] if r and r[col].isdigit() and int(r[col]) <= update]
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as f:
        csv.writer(f).writerows(kept)
    os.replace(tmp, path)


def _terminal_width() -> int:
    try:
        return os.get_terminal_size().columns
    except OSError:
        return 120


def _csv_value(value: Any) -> Any:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return "" if value is None else value
