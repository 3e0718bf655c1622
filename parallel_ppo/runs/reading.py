"""The run directory: its files and columns, the typed summary, the one reader, and every figure derived from runs.

A run directory holds config.yaml, metrics.csv (one row per update), logs/ (TensorBoard), checkpoint.pt and
summary.json. The trainer writes them; everything that reads them back (compare_results.py, the scaling
sweep, autotune, the speed check) goes through `load_run`, and every figure a report shows (steady-state
SPS, speed-up, efficiency, return at a wall time, time to a threshold) is defined here, once. Every problem
with the input raises `ConfigError` with one line naming the file and the problem.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import re
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from parallel_ppo.core.config import Config, ConfigError, config_from_dict, load_yaml
from parallel_ppo.core.timing import PHASES

RUN_FILES = ("metrics.csv", "summary.json", "checkpoint.pt", "config.yaml", "logs")
"""What a run directory holds (`--overwrite` replaces exactly these)."""

METRIC_COLUMNS = [
    "update", "env_steps", "wall_time", "sps",
    "episodic_return_mean", "episodic_length_mean", "episodes", "test_return_mean",
    "policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac", "explained_variance", "learning_rate",
    *(f"time_{p}" for p in PHASES),
    "cpu_percent", "main_cpu_percent", "workers_cpu_percent", "system_cpu_percent",
    "rss_mb", "pss_mb", "main_rss_mb", "workers_rss_mb", "worker_restarts",
]
"""metrics.csv columns, in order (one row per update). `wall_time` is the run's elapsed seconds at the end
of the update; `sps` is that update's own rate, logging and checkpoints included; `test_return_mean` is the
mean return of the evaluation run after that update (empty where none ran)."""

MAIN_PHASES = ("env", "inference", "sync", "gae", "update")
"""Phases the comparison breaks wall time into; the rest (publish, log, checkpoint, untimed) is 'other'."""

FINITE_COLUMNS = ("update", "env_steps", "wall_time", "sps", *(f"time_{p}" for p in MAIN_PHASES),
                  "cpu_percent", "rss_mb")
"""metrics.csv columns that must be present and hold a finite number in every row."""


@dataclass(frozen=True)
class RunSummary:
    """summary.json: built once by the trainer at the end of a run, read back by `load_run`.

    Fields without a default must be present; those with one may be missing in runs that predate them.
    """

    mode: str
    """`sequential`, `parallel` or `distributed`."""
    env_id: str
    num_workers: int
    """Worker processes; 0 for a sequential run."""
    num_envs_per_worker: int
    num_envs: int
    total_env_steps: int
    wall_seconds: float
    """Elapsed seconds of the run (over all sessions, when resumed), start-up included."""
    episodes: int
    """Episodes finished during the run (0 = none: the returns are None)."""
    updates: int
    stop_reason: str
    """duration, total_steps, signal or error."""
    precision: str
    peak_rss_mb: float
    """Peak of the summed resident sets of the run's processes (shared memory counted once per process)."""
    hardware: dict
    versions: dict
    sps: float | None = None
    """Steady-state env steps per second (`steady_sps`): the run's throughput, as every report shows it."""
    overall_sps: float | None = None
    """total_env_steps / wall_seconds: start-up, the compute-limit measurement and update 1 included."""
    episodic_return_mean: float | None = None
    """Mean return of the last `logging.return_window` (default 100) episodes."""
    episodic_length_mean: float | None = None
    error: str | None = None
    signal: str | None = None
    threads: dict = dataclasses.field(default_factory=dict)
    peak_pss_mb: float | None = None
    """Peak proportional set size (shared pages split among processes): an upper bound, see metrics.py."""
    peak_main_rss_mb: float | None = None
    peak_worker_rss_mb: float | None = None
    mean_cpu_percent: float | None = None
    """Mean CPU use of the run's processes, 100 = one core busy."""
    compute_limit: dict | None = None
    limit_efficiency: float | None = None
    """sps / compute_limit.limit_sps."""
    phase_seconds: dict = dataclasses.field(default_factory=dict)
    phase_fractions: dict = dataclasses.field(default_factory=dict)
    worker_restarts: int = 0
    resumes: int = 0
    seed: int | None = None
    normalized_return: float | None = None
    """episodic_return_mean as Procgen's normalized score (easy mode constants; None for other envs)."""
    test_return_mean: float | None = None
    """Mean return of the last evaluation (`eval` config): on held-out test levels unless eval.levels is train."""
    test_normalized_return: float | None = None
    generalization_gap: float | None = None
    """episodic_return_mean − test_return_mean."""
    eval_levels: str | None = None
    learner: dict | None = None
    """How precision, microbatch and device were decided (`learner_settings.LearnerChoice.to_dict`)."""
    roofline: dict | None = None
    """The network's FLOPs per sample and env step, and this machine's fp32 and bf16 matmul peaks (GFLOP/s)."""
    flops_per_env_step: float | None = None
    """FLOPs one collected env step costs: one forward to act, n_epochs × forward+backward to learn."""
    achieved_gflops: float | None = None
    """sps × flops_per_env_step / 1e9."""
    peak_gflops: float | None = None
    """The matmul peak of the run's precision on the learner's threads: the physical limit."""
    peak_fraction: float | None = None
    """achieved_gflops / peak_gflops."""
    world_size: int = 1
    """Ranks of a distributed run (1 otherwise)."""
    distributed: dict | None = None
    """A distributed run's ranks: the rollout source each runs, its envs, and per rank its host, layout, threads,
    parameter checksum and phase seconds (mode distributed only)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, with non-finite floats as None."""
        return {k: None if isinstance(v, float) and not math.isfinite(v) else v
                for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def read(cls, path: Path) -> RunSummary:
        """Parse and type-check summary.json; unknown fields are ignored."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):
            raise ConfigError(f"{path} is not valid JSON (corrupt or truncated)") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path} is not a run summary (expected a JSON object)")
        hints = typing.get_type_hints(cls)
        values = {}
        for f in dataclasses.fields(cls):
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            if f.name not in data:
                if required:
                    raise ConfigError(f"{path} lacks the field {f.name!r}; is it a parallel_ppo run summary?")
                continue
            if not _has_type(data[f.name], hints[f.name]):
                raise ConfigError(f"{path}: field {f.name!r} has an unexpected value {_short(data[f.name])}")
            values[f.name] = data[f.name]
        summary = cls(**values)
        if summary.mode not in ("sequential", "parallel", "distributed"):
            raise ConfigError(f"{path}: mode must be sequential, parallel or distributed, got {summary.mode!r}")
        if summary.wall_seconds <= 0 or summary.updates <= 0:
            raise ConfigError(f"{path} describes a run that never finished an update")
        return summary


def _has_type(value: Any, hint: Any) -> bool:
    """`value` fits a field hint (int, float, str, dict, or one of them or None); floats must be finite."""
    if isinstance(hint, types.UnionType):
        return any(_has_type(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if isinstance(value, bool):
        return hint is bool
    if hint is float:
        return isinstance(value, (int, float)) and math.isfinite(value)
    return isinstance(value, hint)


# ------------------------------------------------------------------------------------------------ figures
def steady_span(env_steps: Sequence[float], wall_time: Sequence[float]) -> tuple[float, float]:
    """The env steps and seconds that steady-state SPS divides: from the end of update 1 to the end of the
    last update, so start-up, the compute-limit measurement and update 1's first-touch costs are left out
    (logging and checkpoints in between are in). A run of one update has no steady state: its span is then
    that update, from the run's start."""
    if len(env_steps) == 1:
        return float(env_steps[0]), float(wall_time[0])
    return float(env_steps[-1]) - float(env_steps[0]), float(wall_time[-1]) - float(wall_time[0])


def steady_sps(env_steps: Sequence[float], wall_time: Sequence[float]) -> float:
    """A run's throughput in env steps per second, as summary.json, compare, the scaling sweep, autotune and
    the speed check all report it (see `steady_span`)."""
    steps, seconds = steady_span(env_steps, wall_time)
    return steps / seconds if seconds > 0 else math.nan


def speedup(sps: float, base_sps: float) -> float:
    """How many times the baseline's steady-state SPS."""
    return sps / base_sps


def efficiency(speedup_: float, workers: int, base_workers: int) -> float:
    """Speed-up per worker added: speed-up / (workers / the baseline's workers), a sequential run counting
    as 1 worker (so against a sequential baseline it is speed-up / workers)."""
    return speedup_ / (max(1, workers) / max(1, base_workers))


def return_at(run: Run, seconds: float) -> float | None:
    """The mean episodic return logged at the last update that ended by `seconds` of wall time (None: no
    episode had finished by then)."""
    index = int(np.searchsorted(run.metrics["wall_time"], seconds, side="right")) - 1
    if index < 0:
        return None
    value = float(run.metrics["episodic_return_mean"][index])
    return None if math.isnan(value) else value


def return_at_step(run: Run, steps: float) -> float | None:
    """The mean episodic return logged at the last update that ended by `steps` env steps (None: no episode
    had finished by then, or no update had ended)."""
    index = int(np.searchsorted(run.metrics["env_steps"], steps, side="right")) - 1
    if index < 0:
        return None
    value = float(run.metrics["episodic_return_mean"][index])
    return None if math.isnan(value) else value


def first_reaching(run: Run, threshold: float | None) -> int | None:
    """Index of the first update whose mean return reached `threshold` (its wall_time and env_steps are the
    time and steps to threshold), None if none did."""
    if threshold is None:
        return None
    with np.errstate(invalid="ignore"):
        hits = np.flatnonzero(run.metrics["episodic_return_mean"] >= threshold)
    return int(hits[0]) if hits.size else None


SPEEDUP_DEFINITION = (
    "SPS = steady-state env steps per second (from the end of update 1 to the end of the last update; "
    "start-up and update 1 left out); speed-up = a run's SPS / the baseline's SPS; parallel efficiency = "
    "speed-up / (workers / baseline workers), a sequential run counting as 1 worker"
)


def truncate_metrics(path: Path, update: int) -> None:
    """Keep metrics.csv's rows up to `update` (a resumed run repeats the rows after its checkpoint), under the
    current METRIC_COLUMNS header: a run resumed by a newer version gains its columns, empty in the old rows."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    kept = [r for r in rows if (r.get("update") or "").isdigit() and int(r["update"]) <= update]
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=METRIC_COLUMNS, extrasaction="ignore", restval="")
        writer.writeheader()
        writer.writerows(kept)
    os.replace(tmp, path)


@dataclass(frozen=True)
class Run:
    """One finished run: its label, summary, resolved config, and metrics.csv as numpy columns."""

    label: str
    """Name shown in tables and legends (e.g. `sequential`, or LABEL from `--run LABEL=DIR`)."""
    path: Path
    summary: RunSummary
    config: Config
    """config.yaml, parsed and type-checked."""
    metrics: dict[str, np.ndarray]
    """metrics.csv column → float64 array, one entry per update (NaN where a cell is empty)."""

    @property
    def ranks(self) -> int:
        """Ranks of a distributed run, 1 otherwise."""
        return max(1, self.summary.world_size)

    @property
    def rank_workers(self) -> int:
        """Worker processes of each rank (of the one process when not distributed); 0 for a sequential source."""
        return self.summary.num_workers // self.ranks

    @property
    def envs_per_process(self) -> int:
        """Envs each worker steps, or each sequential source (the one process, or a rank) when there are none."""
        s = self.summary
        return s.num_envs_per_worker if self.rank_workers else s.num_envs // self.ranks

    @property
    def workers(self) -> int:
        """Processes counted for parallel efficiency: a sequential run counts as 1, a distributed one each rank
        (or each rank's workers)."""
        return self.ranks * max(1, self.rank_workers)

    @property
    def layout(self) -> str:
        """`W×M` for a parallel run, `1×N` for a sequential one; `R ranks × W×M` or `R ranks × N envs` for a
        distributed one whose ranks run a parallel or a sequential source."""
        one = f"{max(1, self.rank_workers)}×{self.envs_per_process}"
        if self.ranks == 1:
            return one
        return f"{self.ranks} ranks × " + (one if self.rank_workers else f"{self.envs_per_process} envs")

    @property
    def updates(self) -> int:
        return len(self.metrics["update"])

    @property
    def steady_sps(self) -> float:
        return steady_sps(self.metrics["env_steps"], self.metrics["wall_time"])

    @property
    def final_return(self) -> float | None:
        """Mean return of the last `logging.return_window` episodes, None if no episode finished."""
        s = self.summary
        return None if s.episodes == 0 or s.episodic_return_mean is None else float(s.episodic_return_mean)

    @property
    def mean_cpu_percent(self) -> float:
        cpu = self.summary.mean_cpu_percent
        return float(np.mean(self.metrics["cpu_percent"])) if cpu is None else float(cpu)

    def phase_means(self, skip_first: bool = True) -> dict[str, float]:
        """Mean seconds per update of each `time_*` phase (over the steady updates by default)."""
        rows = slice(1 if skip_first and self.updates > 1 else 0, None)
        return {p: float(np.nanmean(self.metrics[f"time_{p}"][rows])) for p in PHASES}


def seed_dir(parent: Path, seed: int) -> Path:
    """Where a multi-seed run keeps the run of `seed`: PARENT/seed_<seed>."""
    return Path(parent) / f"seed_{seed}"


def parse_run_spec(spec: str) -> tuple[str, list[Path]]:
    """Split `LABEL=DIR[,DIR...]` (from `--run`): one run directory, several (seeds), or a parent of them."""
    label, eq, directories = spec.partition("=")
    paths = [d.strip() for d in directories.split(",")]
    if not eq or not label.strip() or not all(paths):
        raise ConfigError(f"--run expects LABEL=DIR or LABEL=DIR1,DIR2,..., got {spec!r}")
    return label.strip(), [Path(p) for p in paths]


def is_run_dir(path: Path) -> bool:
    """Holds any of a run's own files (a parent of seed runs holds none)."""
    return any((path / name).exists() for name in ("summary.json", "metrics.csv", "config.yaml"))


def expand_run_dirs(paths: Sequence[Path]) -> list[Path]:
    """Run directories as given; a directory that is not one stands for the run directories inside it
    (a multi-seed parent, PARENT/seed_<n>), in name order."""
    out: list[Path] = []
    for path in paths:
        if not path.is_dir() or is_run_dir(path):
            out.append(path)  # load_run says what is wrong with it, if anything
            continue
        inside = sorted((p for p in path.iterdir() if p.is_dir() and is_run_dir(p)), key=_natural)
        if not inside:
            raise ConfigError(f"{path} is neither a run directory nor a parent of run directories "
                              "(no summary.json, metrics.csv or config.yaml in it or its subdirectories)")
        out += inside
    return out


def _natural(path: Path) -> tuple:
    """seed_2 before seed_10."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name))


@dataclass(frozen=True)
class RunGroup:
    """The runs under one label: one run, or the same config over several seeds."""

    label: str
    runs: list[Run]


def load_groups(specs: Sequence[tuple[str, Sequence[str | Path]]]) -> list[RunGroup]:
    """Load every `(label, directories)`; labels must be unique. A label with several runs names each
    `LABEL/<directory name>`. Fails on the first bad run."""
    groups = []
    for label, directories in _unique(specs):
        paths = expand_run_dirs([Path(d) for d in directories])
        if len(set(map(os.path.realpath, paths))) != len(paths):
            raise ConfigError(f"run label {label!r} lists the same run directory twice")
        names = [label] if len(paths) == 1 else [f"{label}/{p.name}" for p in paths]
        groups.append(RunGroup(label, [load_run(name, p) for name, p in zip(names, paths, strict=True)]))
    return groups


def load_runs(specs: Sequence[tuple[str, str | Path]]) -> list[Run]:
    """Load every `(label, run directory)`; labels must be unique."""
    return [load_run(label, Path(d)) for label, d in _unique(specs)]


def _unique(specs: Sequence[tuple[str, Any]]) -> Sequence[tuple[str, Any]]:
    seen: dict[str, Any] = {}
    for label, where in specs:
        if label in seen:
            raise ConfigError(f"run label {label!r} is given twice ({_where(seen[label])} and {_where(where)}); "
                              "labels must be unique")
        seen[label] = where
    return specs


def _where(dirs: Any) -> str:
    return ", ".join(map(str, dirs)) if isinstance(dirs, (list, tuple)) else str(dirs)


def load_run(label: str, path: Path) -> Run:
    """Read and cross-check one run directory."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"run directory not found: {path}")
    if not path.is_dir():
        raise ConfigError(f"{path} is not a directory (expected a run directory)")
    for name in ("metrics.csv", "config.yaml"):
        if not (path / name).is_file():
            raise ConfigError(f"{path} has no {name}; is it a run directory?")
    if not (path / "summary.json").is_file():
        raise ConfigError(f"{path} has no summary.json: the run has not finished, or it was killed before "
                          "writing it")
    summary = RunSummary.read(path / "summary.json")
    config = _read_config(path / "config.yaml")
    metrics = read_metrics(path / "metrics.csv")
    _check_consistent(path, summary, metrics)
    return Run(label=label, path=path, summary=summary, config=config, metrics=metrics)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def _read_config(path: Path) -> Config:
    data = load_yaml(path)
    try:
        return config_from_dict(data)
    except ConfigError as e:
        raise ConfigError(f"{path}: {str(e).removeprefix('stored config: ')}") from None


def read_metrics(path: Path) -> dict[str, np.ndarray]:
    """Parse metrics.csv into float columns, rejecting truncated, corrupt or out-of-order files."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is corrupt (not UTF-8 text)") from None
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from None
    if not text.strip():
        raise ConfigError(f"{path} is empty")
    if not text.endswith("\n"):
        raise ConfigError(f"{path} ends in the middle of a line (truncated)")
    try:
        rows = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as e:
        raise ConfigError(f"{path} is corrupt ({e})") from None
    header, body = rows[0], [r for r in rows[1:] if r]
    missing = [c for c in FINITE_COLUMNS + ("episodic_return_mean",) if c not in header]
    if missing:
        raise ConfigError(f"{path} lacks the column(s) {', '.join(missing)}; "
                          "is it a parallel_ppo metrics file?")
    if not body:
        raise ConfigError(f"{path} has a header but no rows (the run logged no update)")
    wanted = {name: header.index(name) for name in METRIC_COLUMNS if name in header}
    columns = {name: np.empty(len(body)) for name in wanted}
    for i, row in enumerate(body):
        line = i + 2
        if len(row) != len(header):
            raise ConfigError(f"{path} line {line} has {len(row)} fields, expected {len(header)} "
                              "(truncated or corrupt)")
        for name, j in wanted.items():
            columns[name][i] = _cell(path, line, name, row[j])
    for name in FINITE_COLUMNS:
        bad = np.flatnonzero(~np.isfinite(columns[name]))
        if bad.size:
            raise ConfigError(f"{path} line {bad[0] + 2}: column {name} is empty or not finite")
    bad = np.flatnonzero((columns["sps"] <= 0) | (columns["wall_time"] < 0) | (columns["env_steps"] <= 0))
    if bad.size:
        raise ConfigError(f"{path} line {bad[0] + 2}: sps, wall_time or env_steps is out of range (corrupt)")
    for name, strict in (("env_steps", True), ("wall_time", False)):
        step = np.diff(columns[name])
        bad = np.flatnonzero(step <= 0 if strict else step < 0)
        if bad.size:
            raise ConfigError(f"{path} line {bad[0] + 3}: {name} goes backwards "
                              "(corrupt, or rows of two runs)")
    for name in METRIC_COLUMNS:
        columns.setdefault(name, np.full(len(body), np.nan))
    return columns


def _cell(path: Path, line: int, column: str, text: str) -> float:
    if not text.strip():
        return math.nan
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{path} line {line}: column {column} holds {_short(text)}, not a number") from None


def _check_consistent(path: Path, summary: RunSummary, metrics: dict[str, np.ndarray]) -> None:
    rows = len(metrics["update"])
    if rows != summary.updates or int(metrics["env_steps"][-1]) != summary.total_env_steps:
        raise ConfigError(
            f"{path}: metrics.csv has {rows} rows up to {int(metrics['env_steps'][-1]):,} env steps but "
            f"summary.json reports {summary.updates} updates and {summary.total_env_steps:,} steps "
            "(truncated metrics.csv, or files from different runs)"
        )
