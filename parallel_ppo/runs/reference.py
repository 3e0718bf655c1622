"""A reference curve (`--reference LABEL=CSV`): a published learning curve, e.g. a paper's mean training return per
env step over its seeds, read from a CSV to be drawn and tabled beside the runs. It is no run of this tool: it has
no wall time and no speed, only returns at env steps.

The CSV has a header row, the columns `env_steps` and `episodic_return_mean`, and optionally `return_low` and
`return_high` (both or neither: a band, such as the seeds' range); other columns are ignored. Every problem raises
`ConfigError` (the flag) or `RunDataError` (the file) with one line naming the file."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from parallel_ppo.core.files import path_problem
from parallel_ppo.errors import ConfigError, RunDataError
from parallel_ppo.runs.figures import logged_by
from parallel_ppo.runs.reading import RunGroup, csv_rows
from parallel_ppo.runs.summary import short_repr

REQUIRED = ("env_steps", "episodic_return_mean")
BAND = ("return_low", "return_high")


@dataclass(frozen=True)
class Reference:
    """A reference curve: its label, its file, and its rows as arrays (`low` and `high`: its band, or None)."""

    label: str
    path: Path
    env_steps: np.ndarray
    returns: np.ndarray
    low: np.ndarray | None = None
    high: np.ndarray | None = None


@dataclass(frozen=True)
class Row:
    """One row of a reference curve."""

    env_steps: float
    episodic_return_mean: float
    low: float | None
    high: float | None


def parse_reference_spec(spec: str) -> tuple[str, Path]:
    """Split `LABEL=CSV` (from `--reference`)."""
    label, eq, path = spec.partition("=")
    if not eq or not label.strip() or not path.strip():
        raise ConfigError(f"--reference expects LABEL=CSV, got {spec!r}")
    if problem := path_problem(path.strip()):
        raise ConfigError(f"--reference {label.strip()}=...: {problem}")
    return label.strip(), Path(path.strip())


def load_references(specs: Sequence[tuple[str, Path]], groups: Sequence[RunGroup]) -> list[Reference]:
    """Read every `(label, CSV)`; a label must differ from every other reference's and from the labels of `groups`
    and of their runs."""
    run_labels = {name for g in groups for name in (g.label, *(r.label for r in g.runs))}
    seen: dict[str, Path] = {}
    for label, path in specs:
        if label in run_labels:
            raise ConfigError(f"--reference {label}={path}: {label!r} is already a run's label; labels must be unique")
        if label in seen:
            raise ConfigError(f"--reference {label}={path}: {label!r} is already the label of {seen[label]}; labels "
                              "must be unique")
        seen[label] = path
    return [load_reference(label, path) for label, path in specs]


def load_reference(label: str, path: Path) -> Reference:
    """Read and check one reference CSV."""
    header, body = _rows(path)
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise RunDataError(f"reference curve {path} lacks the column(s) {', '.join(missing)} (it needs "
                           f"{' and '.join(REQUIRED)}; {' and '.join(BAND)} are optional)")
    band = [c for c in BAND if c in header]
    if len(band) == 1:
        raise RunDataError(f"reference curve {path} has {band[0]} alone: give both {' and '.join(BAND)} (a band) "
                           "or neither")
    if not body:
        raise RunDataError(f"reference curve {path} has a header but no rows")
    columns = {name: np.array([_cell(path, line, name, row[header.index(name)]) for line, row in body])
               for name in (*REQUIRED, *band)}
    lines = [line for line, _ in body]
    steps = columns["env_steps"]
    bad = np.flatnonzero(np.diff(steps) <= 0)
    if bad.size:
        raise RunDataError(f"reference curve {path} line {lines[bad[0] + 1]}: env_steps {steps[bad[0] + 1]:,.0f} is "
                           f"not above the row before ({steps[bad[0]]:,.0f}); env_steps must increase")
    if band:
        bad = np.flatnonzero(columns["return_low"] > columns["return_high"])
        if bad.size:
            raise RunDataError(f"reference curve {path} line {lines[bad[0]]}: return_low is above return_high")
    return Reference(label, path, steps, columns["episodic_return_mean"], columns.get("return_low"),
                     columns.get("return_high"))


def _rows(path: Path) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """The CSV's header (stripped names) and its non-blank rows with their line numbers, each as long as the
    header."""
    rows = csv_rows(path, f"reference curve {path}")
    header = [name.strip() for name in rows[0]]
    body = [(line, row) for line, row in enumerate(rows[1:], start=2) if any(cell.strip() for cell in row)]
    for line, row in body:
        if len(row) != len(header):
            raise RunDataError(f"reference curve {path} line {line} has {len(row)} fields, expected {len(header)}")
    return header, body


def _cell(path: Path, line: int, column: str, text: str) -> float:
    """A cell as a finite number."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise RunDataError(f"reference curve {path} line {line}: column {column} holds {short_repr(text)}, not a "
                           "finite number")
    return value


def row_at(reference: Reference, env_steps: float) -> Row | None:
    """The row logged last by `env_steps` (`figures.logged_by`, the rule `return_at_step` applies to a run), or None
    where the curve does not span them (it starts after them, or ends before)."""
    if not reference.env_steps[0] <= env_steps <= reference.env_steps[-1]:
        return None
    i = logged_by(reference.env_steps, env_steps)
    band = (None, None) if reference.low is None or reference.high is None else (
        float(reference.low[i]), float(reference.high[i]))
    return Row(float(reference.env_steps[i]), float(reference.returns[i]), *band)
