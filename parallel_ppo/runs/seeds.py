"""Learning compared across seeds, after rliable (Agarwal et al. 2021) where it fits: with enough seeds the
interquartile mean and its percentile bootstrap 95% interval, and a verdict that names a difference only where two
labels' intervals do not overlap; with fewer, the seeds' range and no verdict. Also the mean curves with bands.

Pure numbers on loaded runs (no plotting): `report` draws and renders what this computes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from parallel_ppo.core.episodes import COLUMN_PREFIX, info_metric
from parallel_ppo.errors import ConfigError
from parallel_ppo.runs.figures import return_at, return_at_step
from parallel_ppo.runs.reading import Run, RunGroup

LEVEL = 0.95
RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
"""The bootstrap's random stream is fixed so that a report is reproducible."""
MIN_CI_SEEDS = 5
"""Seeds a label needs for a bootstrap 95% interval. With 2 or 3 seeds a percentile bootstrap is the seeds' range
(every resample of all-lowest or all-highest seeds has probability >= 1/27 > 2.5%); with 4 it nearly is (1/256 at
each end) and covers far less than 95%. So up to 4 seeds a label shows its range, and no verdict is drawn from it."""
RANGE = "range of seeds"
CI = f"{LEVEL:.0%} bootstrap CI"
MORE_SEEDS = f"≥ {MIN_CI_SEEDS} seeds per label for a {LEVEL:.0%} interval"


def iqm_along(x: np.ndarray, axis: int = 0) -> np.ndarray:
    """Interquartile mean along `axis`: the mean of what is left after dropping the lowest and the highest quarter
    (floor(n / 4) of each, as scipy.stats.trim_mean(x, 0.25) and rliable do; nothing when n < 4)."""
    x = np.sort(x, axis=axis)
    n = x.shape[axis]
    return np.take(x, np.arange(n // 4, n - n // 4), axis=axis).mean(axis=axis)


def iqm(values: Sequence[float]) -> float:
    """Interquartile mean of `values` (`iqm_along`)."""
    return float(iqm_along(np.asarray(values, dtype=np.float64)))


def bootstrap_ci(values: np.ndarray, level: float = LEVEL, resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED,
                 aggregate: Callable[..., np.ndarray] = np.mean) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap interval of `aggregate` (np.mean or `iqm_along`) over axis 0 (the seeds): resample the
    seeds with replacement `resamples` times and take the (1 - level) / 2 and (1 + level) / 2 quantiles of the
    resampled aggregates. Works on (n,) values or (n, points) curves; one seed gives the point itself."""
    x = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    stats = aggregate(x[rng.integers(0, len(x), size=(resamples, len(x)))], axis=1)
    tail = (1 - level) / 2
    return np.quantile(stats, tail, axis=0), np.quantile(stats, 1 - tail, axis=0)


@dataclass(frozen=True)
class Estimate:
    """One figure over a label's seeds: the per-seed values, their mean and IQM, and an interval: with
    `MIN_CI_SEEDS` or more, the 95% bootstrap interval of the IQM (rliable's stratified bootstrap: each label's
    seeds resampled on their own); with fewer, the range of the seeds (`interval` says which)."""

    values: tuple[float, ...]
    mean: float
    iqm: float
    low: float
    high: float
    interval: str
    """`RANGE` or `CI`."""

    @classmethod
    def of(cls, values: Sequence[float | None]) -> Estimate | None:
        """None when any seed lacks the figure (e.g. no episode finished yet): a mean of the rest would be biased."""
        if not values or any(v is None or not math.isfinite(v) for v in values):
            return None
        x = np.asarray(values, dtype=np.float64)
        if len(x) >= MIN_CI_SEEDS:
            low, high, interval = *bootstrap_ci(x, aggregate=iqm_along), CI
        else:
            low, high, interval = x.min(), x.max(), RANGE
        return cls(tuple(map(float, x)), float(x.mean()), iqm(x), float(low), float(high), interval)

    @property
    def center(self) -> float:
        """The figure shown with the interval: the IQM with a 95% interval, the mean with a range."""
        return self.iqm if self.interval == CI else self.mean

    def overlaps(self, other: Estimate) -> bool:
        return self.low <= other.high and other.low <= self.high


def check_distinct_seeds(groups: Sequence[RunGroup]) -> None:
    """Refuse (ConfigError) a label with two runs of one seed (config.yaml's run.seed): its statistics would count
    one seed twice, and a deterministic run repeated gives a zero-width interval; or with runs of different envs,
    whose returns are not one figure's seeds."""
    for group in groups:
        envs = {run.config.env.id: run.path for run in group.runs}
        if len(envs) > 1:
            shown = ", ".join(f"{env} ({path})" for env, path in envs.items())
            raise ConfigError(f"run label {group.label!r} has runs of different envs: {shown}; a label's runs must be "
                              "seeds of one env (give each env a label of its own)")
        seen: dict[int, Path] = {}
        for run in group.runs:
            seed = run.config.run.seed
            if seed in seen:
                raise ConfigError(f"run label {group.label!r} has two runs of seed {seed} ({seen[seed]} and "
                                  f"{run.path}): a label's runs must be distinct seeds (repeats of one seed "
                                  "need labels of their own)")
            seen[seed] = run.path


FIGURES = ("final_return", "return_at_equal_steps", "return_at_equal_time", "sps", "success_rate")
FIGURE_NAMES = {"final_return": "final return", "return_at_equal_steps": "return @ {steps} steps",
                "return_at_equal_time": "return @ {time}", "sps": "SPS", "success_rate": "success rate"}
OPTIONAL_FIGURES = ("success_rate",)
"""Figures shown only where some label has them (an env that reports success), as are the episode statistics: the
`episode_<key>` entries of summary.json's final_metrics (`logging.episode_info`), named `episode/<key>`."""


@dataclass(frozen=True)
class GroupStats:
    """A label's figures over its seeds."""

    label: str
    seeds: int
    final_return: Estimate | None
    return_at_equal_steps: Estimate | None
    return_at_equal_time: Estimate | None
    sps: Estimate | None
    success_rate: Estimate | None
    """The success rate of each seed's last episodes (summary.json's final_metrics)."""
    episode_info: dict[str, Estimate | None] = field(default_factory=dict)
    """Each episode statistic's final value (summary.json's final_metrics `episode_<key>`) across seeds, by that
    key, where some seed has it."""

    def figure(self, name: str) -> Estimate | None:
        """One of FIGURES, or an episode statistic (`episode_<key>`)."""
        return self.episode_info.get(name) if name.startswith(COLUMN_PREFIX) else getattr(self, name)

    @property
    def interval(self) -> str:
        """What its intervals are: `CI` with `MIN_CI_SEEDS` seeds or more, else `RANGE`."""
        return CI if self.seeds >= MIN_CI_SEEDS else RANGE


def equal_points(groups: Sequence[RunGroup], at_steps: float | None = None) -> tuple[float, float]:
    """(env steps, wall seconds) every run reached: the shortest run's, or `at_steps` (a ConfigError naming the runs
    that stopped before it: their last return is not their return there)."""
    runs = [r for g in groups for r in g.runs]
    ends = {r.label: float(r.metrics["env_steps"][-1]) for r in runs}
    short = [f"{label} ({end:,.0f})" for label, end in ends.items() if at_steps is not None and end < at_steps]
    if short:
        given = f"{at_steps:,.0f}" if float(at_steps).is_integer() else f"{at_steps:,}"  # as given, 2,048.5 too
        raise ConfigError(f"--at-steps {given} is past the end of {', '.join(short)}: at most the shortest "
                          f"run's {min(ends.values()):,.0f} env steps")
    return min(ends.values()) if at_steps is None else at_steps, min(float(r.metrics["wall_time"][-1]) for r in runs)


def group_stats(groups: Sequence[RunGroup], equal_steps: float, equal_time: float) -> list[GroupStats]:
    return [GroupStats(
        label=g.label, seeds=len(g.runs),
        final_return=Estimate.of([r.final_return for r in g.runs]),
        return_at_equal_steps=Estimate.of([return_at_step(r, equal_steps) for r in g.runs]),
        return_at_equal_time=Estimate.of([return_at(r, equal_time) for r in g.runs]),
        sps=Estimate.of([r.steady_sps for r in g.runs]),
        success_rate=Estimate.of([r.summary.final_metrics.get("success_rate") for r in g.runs]),
        episode_info={key: Estimate.of([r.summary.final_metrics.get(key) for r in g.runs])
                      for key in sorted({k for r in g.runs for k in r.summary.final_metrics
                                         if k.startswith(COLUMN_PREFIX)})},
    ) for g in groups]


def shown_figures(stats: Sequence[GroupStats]) -> list[str]:
    """FIGURES, less the optional ones that no label has, then the episode statistics some label has."""
    extra = sorted({key for s in stats for key, est in s.episode_info.items() if est is not None})
    return [f for f in FIGURES if f not in OPTIONAL_FIGURES or any(s.figure(f) is not None for s in stats)] + extra


def figure_name(figure: str) -> str:
    """How the tables name a figure: FIGURE_NAMES' (to format), or an episode statistic's metric key."""
    return FIGURE_NAMES.get(figure) or info_metric(figure.removeprefix(COLUMN_PREFIX))


def differences(stats: Sequence[GroupStats], figure: str, name: str) -> list[str]:
    """For one figure: the label with the highest IQM (or mean, `Estimate.center`) against each other label. A
    difference is named only where both have `MIN_CI_SEEDS` seeds or more and their 95% intervals do not overlap;
    with fewer seeds the line asks for more instead."""
    have = [(s.label, s.figure(figure)) for s in stats if s.figure(figure) is not None]
    if len(have) < 2:
        return []
    have.sort(key=lambda item: -item[1].center)
    best_label, best = have[0]
    lines = []
    for label, est in have[1:]:
        pair = f"{name}: {best_label} {fmt(best)} vs {label} {fmt(est)}"
        fewest = min(len(best.values), len(est.values))
        if fewest < 2:
            lines.append(f"{pair}: one seed, so no interval: no difference shown")
        elif fewest < MIN_CI_SEEDS:
            lines.append(f"{pair}: {fewest} seeds, so no difference claimed ({MORE_SEEDS})")
        elif best.overlaps(est):
            lines.append(f"{pair}: the {LEVEL:.0%} intervals overlap: no difference shown")
        else:
            lines.append(f"{pair}: {best_label} is higher (the {LEVEL:.0%} intervals do not overlap)")
    return lines


def num(x: float) -> str:
    """Three significant digits, without an exponent for the sizes reports show (returns, SPS)."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def fmt(est: Estimate | None) -> str:
    """`IQM 41 [95% CI 40, 42]` or `mean 41 [range 40, 42]`."""
    if est is None:
        return "-"
    if est.interval == CI:
        return f"IQM {num(est.iqm)} [{LEVEL:.0%} CI {num(est.low)}, {num(est.high)}]"
    return f"mean {num(est.mean)} [range {num(est.low)}, {num(est.high)}]"


def short(est: Estimate | None) -> str:
    """`41 [40, 42]`: `Estimate.center` and the interval, for a table cell."""
    return "-" if est is None else f"{num(est.center)} [{num(est.low)}, {num(est.high)}]"


def band_name(seeds: int) -> str:
    """What a mean curve's band over `seeds` runs is (`curve`)."""
    return f"{LEVEL:.0%} bootstrap CI of the mean" if seeds >= MIN_CI_SEEDS else RANGE


def curve(runs: Sequence[Run], x_column: str, points: int = 200) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                          np.ndarray] | None:
    """The seeds' mean episodic return on a common grid of `x_column` (env_steps or wall_time), from the first
    point where every seed has a return to the shortest seed's end, with its pointwise band (`band_name`): the 95%
    bootstrap interval of the mean with `MIN_CI_SEEDS` seeds or more, else the seeds' range: (x, mean, low, high).
    None when there is no such span."""
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
    if len(runs) >= MIN_CI_SEEDS:
        low, high = bootstrap_ci(values, resamples=2000)
    else:
        low, high = values.min(axis=0), values.max(axis=0)
    return grid, values.mean(axis=0), low, high
