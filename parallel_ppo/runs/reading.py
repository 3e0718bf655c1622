"""Reading runs back: `load_run` (a run directory, checked against its own files, as one `Run`), metrics.csv as
numpy columns, and the run directories a command line names (`LABEL=DIR`, parents of seed runs). Every problem
with the input raises `RunDataError` (or `ConfigError` for a bad argument) with one line naming the file and
the problem."""

from __future__ import annotations

import csv
import io
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from parallel_ppo.core.arguments import label_argument, path_argument
from parallel_ppo.core.config import Config
from parallel_ppo.core.configure import config_from_dict, load_yaml
from parallel_ppo.core.files import path_problem
from parallel_ppo.core.timing import PHASES
from parallel_ppo.errors import ConfigError, RunDataError
from parallel_ppo.runs.figures import steady_sps
from parallel_ppo.runs.summary import FINITE_COLUMNS, READ_COLUMNS, RunSummary, short_repr


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
    def checkpoint(self) -> Path:
        """The run's latest checkpoint (what `parallel_ppo.load_policy` and `--resume` read)."""
        return self.path / "checkpoint.pt"

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

    def per_thousand_steps(self, phase: str) -> float:
        """Seconds of `phase` per 1,000 env steps over the steady updates (update 1 left out; all of a 1-update
        run)."""
        steps, first = self.metrics["env_steps"], 1 if self.updates > 1 else 0
        span = float(steps[-1] - (steps[0] if first else 0))
        return 1000 * float(self.metrics[f"time_{phase}"][first:].sum()) / span

    def steady_mean(self, column: str) -> float | None:
        """The mean of a metrics.csv column (of READ_COLUMNS) over the steady updates (update 1 left out; all of a
        1-update run); None where the run logged none of it (a column newer than the run)."""
        values = self.metrics[column][1 if self.updates > 1 else 0:]
        return float(np.nanmean(values)) if np.isfinite(values).any() else None

    def phase_means(self, skip_first: bool = True) -> dict[str, float]:
        """Mean seconds per update of each `time_*` phase (over the steady updates by default); 0 for a phase the
        run did not log (one newer than the run)."""
        rows = slice(1 if skip_first and self.updates > 1 else 0, None)
        values = {p: self.metrics[f"time_{p}"][rows] for p in PHASES}
        return {p: float(np.nanmean(v)) if np.isfinite(v).any() else 0.0 for p, v in values.items()}


def seed_dir(parent: Path, seed: int) -> Path:
    """Where a multi-seed run keeps the run of `seed`: PARENT/seed_<seed>."""
    return Path(parent) / f"seed_{seed}"


def parse_run_spec(spec: str) -> tuple[str, list[Path]]:
    """Split `LABEL=DIR[,DIR...]` (from `--run`): one run directory, several (seeds), or a parent of them."""
    label, eq, directories = spec.partition("=")
    paths = [d.strip() for d in directories.split(",")]
    if not eq or not label.strip() or not all(paths):
        raise ConfigError(f"--run expects LABEL=DIR or LABEL=DIR1,DIR2,..., got {spec!r}")
    for path in paths:
        if problem := path_problem(path):
            raise ConfigError(f"--run {label.strip()}=...: {problem}")
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
            raise RunDataError(f"{path} is neither a run directory nor a parent of run directories "
                              "(no summary.json, metrics.csv or config.yaml in it or its subdirectories)")
        if empty := sorted((p for p in path.glob("seed_*") if p.is_dir() and not is_run_dir(p)), key=_natural):
            raise RunDataError(f"{path}: {', '.join(p.name for p in empty)} holds none of a run's files (a seed "
                               "that did not start?), so the label would count fewer seeds than it has: remove it, "
                               "or give the run directories one by one")
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
    `LABEL/<directory name>` (`LABEL/<parent>/<directory name>` where two share a name); every run's name must be
    unique across the labels. Fails on the first bad run."""
    named: list[tuple[str, list[str], list[Path]]] = []
    labelled: dict[frozenset[str], str] = {}  # each label's runs (real paths) → the label
    for label, directories in _unique(specs):
        paths = expand_run_dirs([Path(d) for d in directories])
        real = frozenset(map(os.path.realpath, paths))
        if len(real) != len(paths):
            raise ConfigError(f"run label {label!r} lists the same run directory twice")
        if real in labelled:  # compared with itself: every ratio 1
            raise ConfigError(f"run labels {labelled[real]!r} and {label!r} are the same run(s): "
                              f"{', '.join(map(str, paths))}")
        labelled[real] = label
        names = [label] if len(paths) == 1 else [f"{label}/{p.name}" for p in paths]
        if len(set(names)) < len(names):  # seed_1 of two experiments
            names = [f"{label}/{p.parent.name}/{p.name}" for p in paths]
        named.append((label, names, paths))
    seen: dict[str, Path] = {}
    for name, path in ((n, p) for _, names, paths in named for n, p in zip(names, paths, strict=True)):
        if name in seen:
            raise ConfigError(f"{seen[name]} and {path} would both be called {name!r} in the tables: give them "
                              "labels that tell them apart")
        seen[name] = path
    return [RunGroup(label, [load_run(n, p) for n, p in zip(names, paths, strict=True)])
            for label, names, paths in named]


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


def load_run(label: str, path: str | Path) -> Run:
    """Read and cross-check one run directory, shown as `label` in tables and legends."""
    label, path = label_argument(label, "label"), path_argument(path, "path")  # the Python API's `load_run`
    if not path.exists():
        raise RunDataError(f"run directory not found: {path}")
    if not path.is_dir():
        raise RunDataError(f"{path} is not a directory (expected a run directory)")
    for name in ("metrics.csv", "config.yaml"):
        if not (path / name).is_file():
            raise RunDataError(f"{path} has no {name}; is it a run directory?")
    if not (path / "summary.json").is_file():
        raise RunDataError(f"{path} has no summary.json: the run has not finished, or it was killed before "
                          "writing it")
    summary = RunSummary.read(path / "summary.json")
    config = read_config(path / "config.yaml")
    metrics = read_metrics(path / "metrics.csv")
    _check_consistent(path, summary, metrics)
    return Run(label=label, path=path, summary=summary, config=config, metrics=metrics)


def read_config(path: Path) -> Config:
    """config.yaml as a Config; a missing, malformed or unknown one is a RunDataError naming the file."""
    try:
        return config_from_dict(load_yaml(path))
    except ConfigError as e:
        text = str(e).removeprefix("stored config: ")
        raise RunDataError(text if str(path) in text else f"{path}: {text}") from None


def csv_rows(path: Path, name: str, whole_lines: bool = False) -> list[list[str]]:
    """The rows of the CSV file `path` (`name`: what an error calls it); a file that is missing, unreadable, not
    UTF-8, empty, malformed or (with `whole_lines`) cut in the middle of a line raises RunDataError."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError:
        raise RunDataError(f"{name} is corrupt (not UTF-8 text)") from None
    except OSError as e:
        raise RunDataError(f"cannot read {name}: {e.strerror or e}") from None
    if not text.strip():
        raise RunDataError(f"{name} is empty")
    if whole_lines and not text.endswith("\n"):
        raise RunDataError(f"{name} ends in the middle of a line (truncated)")
    try:
        return list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as e:
        raise RunDataError(f"{name} is corrupt ({e})") from None


def read_metrics(path: Path) -> dict[str, np.ndarray]:
    """Parse metrics.csv into float columns, rejecting truncated, corrupt or out-of-order files."""
    rows = csv_rows(path, str(path), whole_lines=True)
    header, body = rows[0], [r for r in rows[1:] if r]
    missing = [c for c in FINITE_COLUMNS + ("episodic_return_mean",) if c not in header]
    if missing:
        raise RunDataError(f"{path} lacks the column(s) {', '.join(missing)}; "
                          "is it a parallel_ppo metrics file?")
    if not body:
        raise RunDataError(f"{path} has a header but no rows (the run logged no update)")
    wanted = {name: header.index(name) for name in header}
    columns = {name: np.empty(len(body)) for name in wanted}
    for i, row in enumerate(body):
        line = i + 2
        if len(row) != len(header):
            raise RunDataError(f"{path} line {line} has {len(row)} fields, expected {len(header)} "
                              "(truncated or corrupt)")
        for name, j in wanted.items():
            columns[name][i] = _cell(path, line, name, row[j], strict=name in READ_COLUMNS)
    for name in FINITE_COLUMNS:
        bad = np.flatnonzero(~np.isfinite(columns[name]))
        if bad.size:
            raise RunDataError(f"{path} line {bad[0] + 2}: column {name} is empty or not finite")
    bad = np.flatnonzero((columns["sps"] <= 0) | (columns["wall_time"] < 0) | (columns["env_steps"] <= 0))
    if bad.size:
        raise RunDataError(f"{path} line {bad[0] + 2}: sps, wall_time or env_steps is out of range (corrupt)")
    for name, strict in (("env_steps", True), ("wall_time", False)):
        step = np.diff(columns[name])
        bad = np.flatnonzero(step <= 0 if strict else step < 0)
        if bad.size:
            raise RunDataError(f"{path} line {bad[0] + 3}: {name} goes backwards "
                              "(corrupt, or rows of two runs)")
    for name in READ_COLUMNS:
        columns.setdefault(name, np.full(len(body), np.nan))
    return columns


def _cell(path: Path, line: int, column: str, text: str, strict: bool = True) -> float:
    """A metrics.csv cell as a number (NaN when empty); text that is not one is refused in a column the readers use
    (`strict`), and NaN in another."""
    if not text.strip():
        return math.nan
    try:
        return float(text)
    except ValueError:
        if not strict:
            return math.nan
        raise RunDataError(f"{path} line {line}: column {column} holds {short_repr(text)}, not a number") from None


def _check_consistent(path: Path, summary: RunSummary, metrics: dict[str, np.ndarray]) -> None:
    rows = len(metrics["update"])
    if rows != summary.updates or int(metrics["env_steps"][-1]) != summary.total_env_steps:
        raise RunDataError(
            f"{path}: metrics.csv has {rows} rows up to {int(metrics['env_steps'][-1]):,} env steps but "
            f"summary.json reports {summary.updates} updates and {summary.total_env_steps:,} steps "
            "(truncated metrics.csv, or files from different runs)"
        )
