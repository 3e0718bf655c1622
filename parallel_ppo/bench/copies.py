"""The study's `copies` family (`bench.study`): N independent one-core training runs started at once, sharing nothing
but the machine. Their steps/s summed, against one core alone, is what N busy cores give the one-core job here: a
clock that drops as more cores run, caches and memory bandwidth shared. The families that cooperate (workers,
overlap, ranks) do the same work per process, so what they make below it is the trainer's own loss, and what the
copies make below N times one core is the machine's."""

from __future__ import annotations

from typing import Any

from parallel_ppo.bench.scaling import point_row
from parallel_ppo.runs.reading import Run


def copy_commands(command: list[str], copies: int) -> list[list[str]]:
    """`copies` versions of one run's `command`, copy i writing into `copy_<i>` under the command's `--output-dir`
    and seeded i + 1 (so their episodes, and the resets that cost most, do not fall together)."""
    at = command.index("--output-dir") + 1
    return [[*command[:at], f"{command[at]}/copy_{i}", *command[at + 1:], "--seed", str(i + 1)] for i in range(copies)]


def total(values: list[float | None]) -> float | None:
    """The sum, None where any is None."""
    return None if any(v is None for v in values) else sum(values)  # type: ignore[arg-type]


def copies_row(runs: list[Run]) -> dict[str, Any]:
    """The copies' runs as one row of the study (`point_row`'s keys): their steady steps/s, envs and memory summed,
    their phase shares and seconds the copies' mean, the fewest updates any made, and each copy's steps/s
    (`copies_sps`, to show their spread)."""
    rows = [point_row(run) for run in runs]

    def mean(key: str) -> dict[str, float]:
        return {p: sum(r[key].get(p, 0.0) for r in rows) / len(rows) for p in rows[0][key]}

    return {**rows[0], "steps_per_second": sum(r["steps_per_second"] for r in rows),
            "updates": min(r["updates"] for r in rows), "envs": sum(r["envs"] for r in rows),
            "peak_rss_mb": total([r["peak_rss_mb"] for r in rows]),
            "peak_pss_mb": total([r["peak_pss_mb"] for r in rows]),
            "phase_fractions": mean("phase_fractions"), "phase_means": mean("phase_means"),
            "run_dir": str(runs[0].path.parent), "copies_sps": [r["steps_per_second"] for r in rows]}
