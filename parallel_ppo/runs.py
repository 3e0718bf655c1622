"""Load a finished run directory (summary.json, config.yaml, metrics.csv) into a typed, validated `Run`.

Every problem with the input (missing directory or file, truncated or corrupt CSV, a summary that does
not match its metrics) raises `ConfigError` with one line naming the file and the problem.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from parallel_ppo.config import Config, ConfigError, config_from_dict, load_yaml
from parallel_ppo.metrics import METRIC_COLUMNS

MAIN_PHASES = ("env", "inference", "sync", "gae", "update")
"""Phases the comparison breaks wall time into; the rest (publish, log, checkpoint, untimed) is 'other'."""

FINITE_COLUMNS = ("update", "env_steps", "wall_time", "sps", *(f"time_{p}" for p in MAIN_PHASES),
                  "cpu_percent", "rss_mb")
"""metrics.csv columns that must be present and hold a finite number in every row."""

SUMMARY_FIELDS: dict[str, type | tuple[type, ...]] = {
    "mode": str, "env_id": str, "num_workers": int, "num_envs_per_worker": int, "num_envs": int,
    "total_env_steps": int, "wall_seconds": (int, float), "episodes": int, "updates": int,
    "stop_reason": str, "precision": str, "peak_rss_mb": (int, float), "hardware": dict, "versions": dict,
}
"""summary.json fields the comparison needs, with their types (episodic_return_mean may be null)."""


@dataclass(frozen=True)
class Run:
    """One timed run: the summary's headline fields, the resolved config, and metrics.csv as numpy columns."""

    label: str
    """Name shown in tables and legends (e.g. `sequential`, or LABEL from `--run LABEL=DIR`)."""
    path: Path
    mode: str
    """`sequential` or `parallel` (from summary.json)."""
    env_id: str
    num_workers: int
    """Worker processes; 0 for a sequential run."""
    num_envs_per_worker: int
    num_envs: int
    total_env_steps: int
    wall_seconds: float
    episodes: int
    """Episodes finished during the run (0 = none: the return columns are all NaN)."""
    final_return: float | None
    """Mean return of the last `logging.return_window` (default 100) episodes, None if no episode finished."""
    stop_reason: str
    precision: str
    peak_rss_mb: float
    """Peak of the summed resident sets of the run's processes (shared memory counted once per process)."""
    peak_pss_mb: float | None
    """Peak proportional set size (shared pages split among processes); None in runs that predate it."""
    mean_cpu_percent: float
    """Mean CPU use of the run's processes, 100 = one core busy."""
    threads: dict[str, Any]
    hardware: dict[str, Any]
    versions: dict[str, Any]
    summary: dict[str, Any]
    """summary.json as written by the trainer."""
    config: Config
    """config.yaml, parsed and type-checked."""
    metrics: dict[str, np.ndarray]
    """metrics.csv column → float64 array, one entry per update (NaN where a cell is empty)."""

    @property
    def workers(self) -> int:
        """Workers counted for parallel efficiency: a sequential run counts as 1."""
        return max(1, self.num_workers)

    @property
    def layout(self) -> str:
        """`W×M` for a parallel run, `1×N` for a sequential one."""
        return f"{self.workers}×{self.num_envs_per_worker if self.num_workers else self.num_envs}"

    @property
    def updates(self) -> int:
        return len(self.metrics["update"])


def parse_run_spec(spec: str) -> tuple[str, Path]:
    """Split `LABEL=DIR` (from `--run`)."""
    label, eq, directory = spec.partition("=")
    if not eq or not label.strip() or not directory.strip():
        raise ConfigError(f"--run expects LABEL=DIR, got {spec!r}")
    return label.strip(), Path(directory.strip())


def load_runs(specs: Sequence[tuple[str, str | Path]]) -> list[Run]:
    """Load every `(label, directory)`; labels must be unique. Fails on the first bad run."""
    seen: dict[str, Path] = {}
    for label, directory in specs:
        if label in seen:
            raise ConfigError(f"run label {label!r} is given twice ({seen[label]} and {directory}); "
                              "labels must be unique")
        seen[label] = Path(directory)
    return [load_run(label, Path(directory)) for label, directory in specs]


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
    summary = _read_summary(path / "summary.json")
    config = _read_config(path / "config.yaml")
    metrics = read_metrics(path / "metrics.csv")
    _check_consistent(path, summary, metrics)

    final = summary.get("episodic_return_mean")
    if summary["episodes"] == 0 or final is None:
        final = None
    cpu = _optional_number(summary.get("mean_cpu_percent"))
    if cpu is None:
        cpu = float(np.mean(metrics["cpu_percent"]))
    return Run(
        label=label, path=path, mode=summary["mode"], env_id=summary["env_id"],
        num_workers=summary["num_workers"], num_envs_per_worker=summary["num_envs_per_worker"],
        num_envs=summary["num_envs"], total_env_steps=summary["total_env_steps"],
        wall_seconds=float(summary["wall_seconds"]), episodes=summary["episodes"],
        final_return=None if final is None else float(final), stop_reason=summary["stop_reason"],
        precision=summary["precision"], peak_rss_mb=float(summary["peak_rss_mb"]),
        peak_pss_mb=_optional_number(summary.get("peak_pss_mb")), mean_cpu_percent=cpu,
        threads=dict(summary.get("threads") or {}), hardware=summary["hardware"],
        versions=summary["versions"], summary=summary, config=config, metrics=metrics,
    )


def _optional_number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def _read_summary(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        raise ConfigError(f"{path} is not valid JSON (corrupt or truncated)") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a run summary (expected a JSON object)")
    for key, kind in SUMMARY_FIELDS.items():
        if key not in data:
            raise ConfigError(f"{path} lacks the field {key!r}; is it a parallel_ppo run summary?")
        value = data[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ConfigError(f"{path}: field {key!r} has an unexpected value {_short(value)}")
    ret = data.get("episodic_return_mean")
    if ret is not None and _optional_number(ret) is None:
        raise ConfigError(f"{path}: field 'episodic_return_mean' has an unexpected value {_short(ret)}")
    if data["mode"] not in ("sequential", "parallel"):
        raise ConfigError(f"{path}: mode must be sequential or parallel, got {data['mode']!r}")
    if data["wall_seconds"] <= 0 or data["updates"] <= 0:
        raise ConfigError(f"{path} describes a run that never finished an update")
    return data


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


def _check_consistent(path: Path, summary: dict[str, Any], metrics: dict[str, np.ndarray]) -> None:
    rows = len(metrics["update"])
    if rows != summary["updates"] or int(metrics["env_steps"][-1]) != summary["total_env_steps"]:
        raise ConfigError(
            f"{path}: metrics.csv has {rows} rows up to {int(metrics['env_steps'][-1]):,} env steps but "
            f"summary.json reports {summary['updates']} updates and {summary['total_env_steps']:,} steps "
            "(truncated metrics.csv, or files from different runs)"
        )
