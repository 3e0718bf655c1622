"""Learning compared across seeds: interquartile mean, bootstrap confidence intervals, mean curves with bands,
and a verdict that names a difference only where the intervals do not overlap (Agarwal et al. 2021, rliable).

Pure numbers on loaded runs (no plotting): `report` draws and renders what this computes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from parallel_ppo.runs.figures import return_at, return_at_step
from parallel_ppo.runs.reading import Run, RunGroup

LEVEL = 0.95
RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
"""The bootstrap's random stream is fixed so that a report is reproducible."""


def iqm(values: Sequence[float]) -> float:
    """Interquartile mean: the mean of the values left after dropping the lowest and the highest quarter
    (floor(n / 4) of each, as scipy.stats.trim_mean(values, 0.25) and rliable do; all of them when n < 4)."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    cut = len(x) // 4
    return float(x[cut:len(x) - cut].mean())


def bootstrap_ci(values: np.ndarray, level: float = LEVEL, resamples: int = RESAMPLES,
                 seed: int = BOOTSTRAP_SEED) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap interval of the mean over axis 0 (the seeds): resample the seeds with replacement
    `resamples` times and take the (1 - level) / 2 and (1 + level) / 2 quantiles of the resampled means.
    Works on (n,) values or (n, points) curves; one seed gives the point itself."""
    x = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(resamples, len(x)))].mean(axis=1)
    tail = (1 - level) / 2
    return np.quantile(means, tail, axis=0), np.quantile(means, 1 - tail, axis=0)


@dataclass(frozen=True)
class Estimate:
    """One figure over seeds: the per-seed values, their mean, IQM and the 95% bootstrap interval of the mean."""

    values: tuple[float, ...]
    mean: float
    iqm: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float | None]) -> Estimate | None:
        """None when any seed lacks the figure (e.g. no episode finished yet): a mean of the rest would be biased."""
        if not values or any(v is None or not math.isfinite(v) for v in values):
            return None
        x = np.asarray(values, dtype=np.float64)
        low, high = bootstrap_ci(x)
        return cls(tuple(map(float, x)), float(x.mean()), iqm(x), float(low), float(high))

    def overlaps(self, other: Estimate) -> bool:
        return self.low <= other.high and other.low <= self.high


FIGURES = ("final_return", "return_at_equal_steps", "return_at_equal_time", "sps")
FIGURE_NAMES = {"final_return": "final return", "return_at_equal_steps": "return @ {steps} steps",
                "return_at_equal_time": "return @ {time}", "sps": "SPS"}


@dataclass(frozen=True)
class GroupStats:
    """A label's figures over its seeds."""

    label: str
    seeds: int
    final_return: Estimate | None
    return_at_equal_steps: Estimate | None
    return_at_equal_time: Estimate | None
    sps: Estimate | None


def equal_points(groups: Sequence[RunGroup], at_steps: float | None = None) -> tuple[float, float]:
    """(env steps, wall seconds) every run reached: the shortest run's, unless `at_steps` is given."""
    runs = [r for g in groups for r in g.runs]
    steps = min(float(r.metrics["env_steps"][-1]) for r in runs) if at_steps is None else at_steps
    return steps, min(float(r.metrics["wall_time"][-1]) for r in runs)


def group_stats(groups: Sequence[RunGroup], equal_steps: float, equal_time: float) -> list[GroupStats]:
    return [GroupStats(
        label=g.label, seeds=len(g.runs),
        final_return=Estimate.of([r.final_return for r in g.runs]),
        return_at_equal_steps=Estimate.of([return_at_step(r, equal_steps) for r in g.runs]),
        return_at_equal_time=Estimate.of([return_at(r, equal_time) for r in g.runs]),
        sps=Estimate.of([r.steady_sps for r in g.runs]),
    ) for g in groups]


def differences(stats: Sequence[GroupStats], figure: str, name: str) -> list[str]:
    """For one figure: the label with the highest mean against each other label, a difference named only where
    the 95% intervals do not overlap."""
    have = [(s.label, getattr(s, figure)) for s in stats if getattr(s, figure) is not None]
    if len(have) < 2:
        return []
    have.sort(key=lambda item: -item[1].mean)
    best_label, best = have[0]
    lines = []
    for label, est in have[1:]:
        pair = f"{name}: {best_label} {fmt(best)} vs {label} {fmt(est)}"
        if min(len(best.values), len(est.values)) < 2:
            lines.append(f"{pair}: one seed, so no interval: no difference shown")
        elif best.overlaps(est):
            lines.append(f"{pair}: the 95% intervals overlap: no difference shown")
        else:
            lines.append(f"{pair}: {best_label} is higher (the 95% intervals do not overlap)")
    return lines


def num(x: float) -> str:
    """Three significant digits, without an exponent for the sizes reports show (returns, SPS)."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def fmt(est: Estimate | None) -> str:
    """`mean [low, high]`."""
    return "-" if est is None else f"{num(est.mean)} [{num(est.low)}, {num(est.high)}]"


def curve(runs: Sequence[Run], x_column: str, points: int = 200) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                          np.ndarray] | None:
    """The seeds' mean episodic return on a common grid of `x_column` (env_steps or wall_time), from the first
    point where every seed has a return to the shortest seed's end, with its pointwise 95% bootstrap band:
    (x, mean, low, high). None when there is no such span."""
    series = []
    for run in runs:
        x, y = run.metrics[x_column], run.metrics["episodic_return_mean"]
        ok = np.isfinite(y)
        if ok.sum() < 2:
            return None
        series.append((x[ok], y[ok]))
    start, end = max(x[0] for x, _ in series), min(x[-1] for x, _ in series)
    if end <= start:
        return None
    grid = np.linspace(start, end, points)
    values = np.stack([np.interp(grid, x, y) for x, y in series])
    low, high = bootstrap_ci(values, resamples=2000)
    return grid, values.mean(axis=0), low, high
