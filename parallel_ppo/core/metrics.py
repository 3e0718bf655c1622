"""Metrics declared where their values are computed: each producer declares its keys (`metric`) next to the code that
computes them, lists them by name (`core.loop.LOOP_METRICS`, `core.ppo.UPDATE_METRICS`, ...) and puts values in an
update's row under those keys; the writers (`runs.metrics.RUN_METRICS`) ask for those lists by name, not for a module
to be imported for what its import declares, and derive the metrics.csv column, the TensorBoard tag and W&B key, and
summary.json's `final_metrics` from the declaration.

A key is `namespace/name`: the TensorBoard tag and W&B key as they are (CleanRL's `charts/`, `losses/`), and the
metrics.csv column `name` (`time/env` → `time_env`), or the column given where the file's older name differs
(`charts/SPS` → `sps`). A key nobody declared is refused by the writers (`declared`), naming it."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Metric:
    """One declared metric."""

    key: str
    """`namespace/name`; a `*` stands for a number (`system/worker*_cpu_percent`, one per worker), `{name}` for a name
    of letters, digits and `_` (`episode/{name}`, one per final-info entry a run logs)."""
    doc: str
    column: str | None
    """Its metrics.csv column (None: TensorBoard and W&B only); a `{name}` in it is the key's (`episode_{name}`)."""
    tensorboard: bool
    """Whether TensorBoard and W&B get it (the counters are their step axis instead)."""
    summary: bool
    """Whether summary.json's `final_metrics` holds its value in the last update's row."""
    declared_at: tuple[str, int] = ("", 0)
    """The module and line of its declaration: within a namespace, metrics.csv's columns follow them (so the order
    is the same whatever order the modules were imported in)."""


REGISTRY: dict[str, Metric] = {}
"""Every declared metric by key (`ordered` gives metrics.csv's order)."""


def metric(key: str, doc: str, *, column: str | None = "", tensorboard: bool = True, summary: bool = False) -> str:
    """Declare the metric `key` (see the module's docstring) where its value is computed; returns the key to put
    the value under. `column`: its metrics.csv column when not the key's name ("" = derived, None = none)."""
    namespace, _, name = key.partition("/")
    if not namespace or not name:
        raise ValueError(f"metric key {key!r} must be namespace/name")
    if column == "":
        column = f"time_{name}" if namespace == "time" else name
    caller = sys._getframe(1)
    declared_metric = Metric(key, doc, column, tensorboard, summary, (caller.f_globals["__name__"], caller.f_lineno))
    if key in REGISTRY:
        if REGISTRY[key] != declared_metric:
            raise ValueError(f"metric {key!r} is declared twice")
        return key
    if column is not None and any(m.column == column for m in REGISTRY.values()):
        raise ValueError(f"metric {key!r}: metrics.csv already has a column {column!r}; name another")
    REGISTRY[key] = declared_metric
    return key


NAME = r"\w+"
"""What a pattern's `{name}` stands for: letters, digits and `_`."""


def _pattern(key: str) -> str | None:
    """The regular expression of a pattern key (`*`, `{name}`), None for a plain key."""
    if "*" not in key and "{name}" not in key:
        return None
    return re.escape(key).replace(r"\*", r"\d+").replace(r"\{name\}", f"(?P<name>{NAME})")


def declared(key: str) -> Metric:
    """The declaration of `key` (a pattern's for a numbered or named key); KeyError naming an undeclared one."""
    found = REGISTRY.get(key)
    if found is not None:
        return found
    for pattern, m in REGISTRY.items():
        if (regex := _pattern(pattern)) and re.fullmatch(regex, key):
            return m
    raise KeyError(f"metric {key!r} was never declared (declare it with core.metrics.metric where it is computed)")


def column_of(key: str) -> str | None:
    """The metrics.csv column of the declared metric `key` (None: none), a named key's name put in its pattern's."""
    m = declared(key)
    if m.column is None or "{name}" not in m.column:
        return m.column
    return m.column.replace("{name}", re.fullmatch(_pattern(m.key) or "", key)["name"])


NAMESPACES = ("progress", "charts", "losses", "time", "system")
"""metrics.csv's column order: by namespace (others last), then by where each is declared (`Metric.declared_at`)."""


def csv_columns(asked: Iterable[str]) -> list[str]:
    """metrics.csv's columns, in `ordered`'s order: those of the metrics `asked` for (KeyError naming one that was
    never declared) and of any other declared before the file opens (one added in a line where it is computed)."""
    for key in asked:
        declared(key)
    return [m.column for m in ordered() if m.column is not None and _pattern(m.key) is None]


def ordered() -> list[Metric]:
    """Every declared metric, by namespace (NAMESPACES, then the others by name) and declaration place."""
    def rank(m: Metric) -> tuple[int, str, str, int]:
        namespace = m.key.partition("/")[0]
        position = NAMESPACES.index(namespace) if namespace in NAMESPACES else len(NAMESPACES)
        return position, namespace, *m.declared_at

    return sorted(REGISTRY.values(), key=rank)


def by_column(row: dict[str, Any]) -> dict[str, Any]:
    """An update's row under its metrics.csv column names (what the progress display and metrics.csv read)."""
    return {column: value for key, value in row.items() if (column := column_of(key)) is not None}


def by_tag(row: dict[str, Any]) -> dict[str, Any]:
    """An update's row under its TensorBoard tags (= keys), for the metrics that go to TensorBoard and W&B."""
    return {key: value for key, value in row.items() if declared(key).tensorboard}


def markdown_table() -> str:
    """Every declared metric as the table of docs/run-directory.md (its key, column, summary entry and meaning)."""
    rows = ["| key (TensorBoard, W&B) | metrics.csv | summary.json | meaning |", "|---|---|---|---|"]
    for m in ordered():
        key = f"`{m.key}`" + ("" if m.tensorboard else " (not in TensorBoard)")
        column = f"`{m.column}`" if m.column else "none"
        rows.append(f"| {key} | {column} | {'`final_metrics`' if m.summary else ''} | {m.doc} |")
    return "\n".join(rows) + "\n"
