"""The study's `copies` family (`bench.study`): N independent one-core training runs started at once, sharing nothing
but the machine. Their steps/s summed, against one core alone, is what N busy cores give the one-core job here: a
clock that drops as more cores run, caches and memory bandwidth shared. What the copies make below N times one core
is the machine's loss; the families that cooperate (workers, overlap, ranks) do the same work per process and are
set against it. It is a yardstick, not a bound: a trainer that schedules the same work otherwise can pass it."""

from __future__ import annotations

from typing import Any

import numpy as np

from parallel_ppo.bench.scaling import point_row
from parallel_ppo.errors import RunDataError
from parallel_ppo.runs.reading import Run


def copy_commands(command: list[str], copies: int) -> list[list[str]]:
    """`copies` versions of one run's `command`, copy i writing into `copy_<i>` under the command's `--output-dir`
    and seeded i + 1 (so their episodes, and the resets that cost most, do not fall together; after the command's
    own settings, so a `--set run.seed` of the user's does not make them one)."""
    at = command.index("--output-dir") + 1
    return [[*command[:at], f"{command[at]}/copy_{i}", *command[at + 1:], "--set", f"run.seed={i + 1}"]
            for i in range(copies)]


def total(values: list[float | None]) -> float | None:
    """The sum, None where any is None."""
    return None if any(v is None for v in values) else sum(values)  # type: ignore[arg-type]


def common_span(runs: list[Run], ended: list[float]) -> tuple[float, float]:
    """The copies' summed steps/s over the span in which every one was in its steady state (from the end of its update
    1 to the end of its last), and that span as a share of the mean copy's own: copies start their clocks as their
    imports end, one later than another, and one running on alone at the end would overstate the sum. Each run is
    placed on the study's clock by when its process `ended`, its `wall_seconds` before (its closing, alike in every
    copy, left in). RunDataError where they never ran steady together (a copy of one update, runs too short)."""
    clocks = [(run.metrics["wall_time"] + end - run.summary.wall_seconds, run.metrics["env_steps"])
              for run, end in zip(runs, ended, strict=True)]
    start, stop = max(t[0] for t, _ in clocks), min(t[-1] for t, _ in clocks)
    own = sum(t[-1] - t[0] for t, _ in clocks) / len(clocks)
    if stop <= start or own <= 0:
        raise RunDataError(f"its {len(runs)} copies never ran steady together (each from the end of its update 1 to "
                           "its last): give the study more seconds a point")
    steps = sum(np.interp(stop, t, s) - np.interp(start, t, s) for t, s in clocks)
    return float(steps / (stop - start)), (stop - start) / own


def copies_row(runs: list[Run], ended: list[float]) -> dict[str, Any]:
    """The copies' runs, ended at `ended` (`run_together`), as one row of the study (`point_row`'s keys): their
    steps/s over their common steady span (`common_span`; `copies_span` its share of a copy's own), their envs and
    memory summed, their phase shares and seconds the copies' mean, the fewest updates any made, and each copy's
    own steady steps/s (`copies_sps`, to show their spread)."""
    rows = [point_row(run) for run in runs]

    def mean(key: str) -> dict[str, float]:
        return {p: sum(r[key].get(p, 0.0) for r in rows) / len(rows) for p in rows[0][key]}

    sps, span = common_span(runs, ended)
    return {**rows[0], "steps_per_second": sps, "copies_span": span,
            "updates": min(r["updates"] for r in rows), "envs": sum(r["envs"] for r in rows),
            "peak_rss_mb": total([r["peak_rss_mb"] for r in rows]),
            "peak_pss_mb": total([r["peak_pss_mb"] for r in rows]),
            "phase_fractions": mean("phase_fractions"), "phase_means": mean("phase_means"),
            "run_dir": str(runs[0].path.parent), "copies_sps": [r["steps_per_second"] for r in rows]}
