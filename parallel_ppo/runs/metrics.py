"""Per-update metrics: metrics.csv, TensorBoard events, the progress display (`runs.progress`), an experiment
tracker such as W&B (`runs.tracking`), and psutil sampling."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import psutil

from parallel_ppo.core.episodes import info_metric
from parallel_ppo.core.evaluate import EVAL_METRICS
from parallel_ppo.core.files import write_text, writing
from parallel_ppo.core.loop import LOOP_METRICS
from parallel_ppo.core.metrics import by_column, by_tag, column_of, csv_columns, metric
from parallel_ppo.core.ppo import UPDATE_METRICS
from parallel_ppo.core.timing import PHASE_METRICS
from parallel_ppo.runs.progress import Progress

SYSTEM_METRICS = tuple(metric(f"system/{name}", doc) for name, doc in (
    ("cpu_percent", "CPU of the run's processes, 100 = one core busy, averaged since the previous sample"),
    ("main_cpu_percent", "CPU of the learner's process"),
    ("workers_cpu_percent", "CPU of the worker processes together"),
    ("system_cpu_percent", "CPU of the whole machine"),
    ("rss_mb", "summed resident sets of the run's processes (shared memory counted once per process)"),
    ("pss_mb", "summed proportional set sizes (shared pages split among the processes)"),
    ("main_rss_mb", "resident set of the learner's process"),
    ("workers_rss_mb", "summed resident sets of the workers"),
)) + (metric("system/worker*_cpu_percent", "CPU of worker <i>", column=None),
      metric("system/worker*_rss_mb", "resident set of worker <i>", column=None))
"""The `system/` metrics `ResourceSampler` computes."""

RUN_METRICS = (*LOOP_METRICS, *UPDATE_METRICS, *PHASE_METRICS.values(), *EVAL_METRICS, *SYSTEM_METRICS)
"""The metrics of a run's rows, asked for by name from the modules that declare them where they are computed."""


def metric_columns(episode_info: Sequence[str] = ()) -> list[str]:
    """metrics.csv's columns: those of RUN_METRICS, and of any other declared metric (`core.metrics.csv_columns`),
    then one per final-info entry the run logs (`logging.episode_info`: `episode_<key>`)."""
    return csv_columns(RUN_METRICS) + [column_of(info_metric(key)) for key in episode_info]


class Tracker(Protocol):
    """An experiment tracker that receives each update's metrics under their tags (`runs.tracking.WandbTracker`)."""

    def log(self, tags: dict[str, float], step: int) -> None: ...


def truncate_metrics(path: Path, update: int, columns: list[str]) -> list[tuple[int, float]]:
    """Keep metrics.csv's rows up to `update` (a resumed run repeats the rows after its checkpoint), under the
    current columns (a run resumed by a newer version gains its columns, empty in the old rows); rewritten
    atomically. Returns the kept rows' (env_steps, wall_time). `columns`: the current ones."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    kept = [r for r in rows if (r.get("update") or "").isdigit() and int(r["update"]) <= update]
    out = io.StringIO(newline="")
    writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore", restval="")
    writer.writeheader()
    writer.writerows(kept)
    write_text(path, out.getvalue())
    return [point for r in kept if (point := _steps_and_time(r)) is not None]


def earlier_columns(path: Path, columns: list[str]) -> list[str]:
    """The final-info columns (`episode_<key>`) of an earlier session's metrics.csv that `columns` lacks (an entry
    of `logging.episode_info` it logged and this one does not): kept, so that a resume loses none of its values."""
    prefix = column_of(info_metric("key"))[:-len("key")]
    with open(path, newline="") as f:
        header = next(csv.reader(f), [])
    return [c for c in header if c.startswith(prefix) and c not in columns]


def _steps_and_time(row: dict[str, Any]) -> tuple[int, float] | None:
    """A metrics.csv row's (env_steps, wall_time), or None for a row that lacks them (a damaged line)."""
    try:
        return int(row["env_steps"]), float(row["wall_time"])
    except (KeyError, TypeError, ValueError):
        return None


class ResourceSampler:
    """CPU and memory of this process ("main"), each worker it spawned, the whole tree, and the machine.

    CPU percentages use top's unit, 100 = one core busy, averaged since the previous sample. `rss_mb`
    adds up resident sets, so memory shared between processes (the rollout buffer, library code) counts
    once per process; `pss_mb` splits shared pages among their users, so its sum is what the tree really
    occupies. Peaks inside an update come from the kernel's high-water mark of each process (VmHWM,
    reset at every sample), so no polling thread competes with the learner for cores: a thread reading
    /proc/<pid>/smaps every half second slowed the update by about 7% on 2 cores.
    """

    def __init__(self) -> None:
        self._root = psutil.Process()
        self._procs: dict[int, psutil.Process] = {}
        self._cores = psutil.cpu_count() or 1
        self.peaks = {"rss_mb": 0.0, "pss_mb": 0.0, "main_rss_mb": 0.0, "worker_rss_mb": 0.0}
        psutil.cpu_percent(None)
        for p in self._tree():  # peaks count from here, not from start-up or the compute-limit measurement
            _reset_peak_rss(p.pid)
        self.sample()

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
        """MB per role and tree totals now; updates the peaks since the previous call.

        The tree's peak PSS is taken as its PSS now plus, for every process, how far its resident set
        rose above the current one since the previous call. That treats the excess as private memory
        at a common moment, so it bounds the true peak from above (the update's activations, the
        transient that matters, are private to the learner).
        """
        out = {"rss_mb": 0.0, "pss_mb": 0.0, "main_rss_mb": 0.0, "workers_rss_mb": 0.0}
        peak_rss = peak_excess = peak_main = peak_worker = 0.0
        for p in procs:
            try:
                mem = p.memory_full_info()
            except psutil.Error:
                continue
            rss = mem.rss / 2**20
            peak = max(rss, _peak_rss_mb(p.pid) or 0.0)
            _reset_peak_rss(p.pid)
            out["pss_mb"] += getattr(mem, "pss", mem.rss) / 2**20
            role = self._role(p)
            _add_by_role(out, role, "rss_mb", rss)
            peak_rss += peak
            peak_excess += peak - rss
            if role == "main":
                peak_main = peak
            elif role.startswith("worker"):
                peak_worker = max(peak_worker, peak)
        for key, value in (("rss_mb", peak_rss), ("pss_mb", out["pss_mb"] + peak_excess),
                           ("main_rss_mb", peak_main), ("worker_rss_mb", peak_worker)):
            self.peaks[key] = max(self.peaks[key], value)
        return out

    def close(self) -> None:
        """Take a last sample, so that memory used since the last logged update counts in the peaks."""
        self._memory(self._tree())

    def sample(self) -> dict[str, float]:
        """The `system/` metrics now: tree, main, workers, machine, and `system/worker<i>_*` (TensorBoard only)."""
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
        return {f"system/{name}": value for name, value in out.items()}


def _peak_rss_mb(pid: int) -> float | None:
    """The kernel's resident-set high-water mark of `pid` in MB (VmHWM), or None where /proc lacks it."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _reset_peak_rss(pid: int) -> None:
    """Restart `pid`'s high-water mark from its current resident set (Linux ≥ 4.0); a no-op elsewhere."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _add_by_role(out: dict[str, float], role: str, name: str, value: float) -> None:
    """Add one process's `value` to the tree total `name` and to `main_<name>`, `workers_<name>`, `<role>_<name>`."""
    out[name] += value
    if role == "main":
        out[f"main_{name}"] = value
    elif role.startswith("worker"):
        out[f"workers_{name}"] += value
        out[f"{role}_{name}"] = value


class MetricsLogger:
    """Writes each update's row to metrics.csv and TensorBoard, shows it on `progress` and sends it to `tracker`;
    the row's keys are declared metrics (`core.metrics`), and an undeclared one is refused, naming it."""

    def __init__(self, run_dir: Path, tensorboard: bool, progress: Progress | None,
                 resume_after: tuple[int, int] | None = None, tracker: Tracker | None = None,
                 episode_info: Sequence[str] = ()) -> None:
        """`resume_after=(update, env_steps)` continues a run: later rows (logged after its checkpoint) go.
        `episode_info`: the final-info entries the run logs (`logging.episode_info`), a column each."""
        self.path = run_dir / "metrics.csv"
        self._columns = metric_columns(episode_info)
        self.logged: list[tuple[int, float]] = []
        """(env_steps, wall_time) of every row in metrics.csv, the earlier sessions' too, as written."""
        if resume_after is not None and self.path.exists():
            self._columns += earlier_columns(self.path, self._columns)
            self.logged = truncate_metrics(self.path, resume_after[0], self._columns)
        new = not self.path.exists() or self.path.stat().st_size == 0
        self._file = open(self.path, "a", newline="")
        self._csv = csv.DictWriter(self._file, fieldnames=self._columns)
        if new:
            self._csv.writeheader()
        self._writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = resume_after[1] + 1 if resume_after is not None else None
            self._writer = SummaryWriter(str(run_dir / "logs"), purge_step=purge)
        self._progress, self._tracker = progress, tracker
        self.last: dict[str, Any] = {}
        """The last row logged, by key."""

    def log(self, row: dict[str, Any]) -> None:
        columns = by_column(row)
        if late := sorted(set(columns) - set(self._columns)):
            raise KeyError(f"metrics {late} were declared after metrics.csv was opened (list them in the "
                           "declaring module's metrics, which runs.metrics.RUN_METRICS asks for)")
        tags = {tag: value for tag, value in by_tag(row).items() if value is not None and math.isfinite(value)}
        self._csv.writerow({name: _csv_value(columns.get(name)) for name in self._columns})
        self._file.flush()
        step = int(columns["env_steps"])
        if self._writer is not None:
            for tag, value in tags.items():
                self._writer.add_scalar(tag, value, step)
        if self._tracker is not None:
            self._tracker.log(tags, step)
        if self._progress is not None:
            self._progress.update(columns)
        self.logged.append((step, float(_csv_value(float(columns["wall_time"])))))  # as readers of the file see it
        self.last = row

    def close(self) -> None:
        """The progress, TensorBoard and metrics.csv, whose last rows a full disk may not take (WriteFailed)."""
        try:
            if self._progress is not None:
                self._progress.close()
            if self._writer is not None:
                with writing(self.path.parent / "logs"):  # its events a full disk did not take
                    self._writer.close()
        finally:
            with writing(self.path):
                self._file.close()


def _csv_value(value: Any) -> Any:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return "" if value is None else value
