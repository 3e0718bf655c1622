"""The numbers of timed runs side by side: one table row per run (`RunStats`), the reference points, the warnings
about what makes the runs less comparable than they look, and the figures across seeds (`compare`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from parallel_ppo.errors import ConfigError
from parallel_ppo.runs import seeds
from parallel_ppo.runs.figures import efficiency, first_reaching, first_return, logged_by, return_at, speedup
from parallel_ppo.runs.reading import Run, RunGroup
from parallel_ppo.runs.reference import Reference
from parallel_ppo.runs.report.formatting import NO_EPISODES, describe_hardware, fmt_duration, fmt_return
from parallel_ppo.runs.summary import MAIN_PHASES

PHASE_NAMES = (*MAIN_PHASES, "other")
"""Bars of the phase breakdown; `other` = publish + log + checkpoint + anything untimed."""

LAYOUT_KEYS = ("env.num_envs", "run.output_dir", "run.duration", "run.total_steps", "run.checkpoint_interval",
               "logging.progress", "logging.progress_seconds", "logging.tensorboard", "tracking.wandb",
               "tracking.project", "tracking.entity", "tracking.group", "tracking.tags")
"""Config keys that may differ between compared runs without a warning (besides the whole `parallel`
section): the env layout, where and how long a run goes, and logging and tracking switches. Duration is checked on the
measured time instead."""

OTHER_LOAD_CORES = 0.25
"""Mean CPU use of processes outside a run (in cores) above which its timings are flagged as disturbed."""


@dataclass(frozen=True)
class RunStats:
    """One row of the comparison table (plus the phase breakdown), computed from a run's own files."""

    label: str
    mode: str
    layout: str
    workers: int
    num_envs: int
    total_env_steps: int
    wall_seconds: float
    sps: float
    """Steady-state env steps per second (`runs.figures.steady_sps`)."""
    speedup: float
    efficiency: float
    final_return: float | None
    normalized_return: float | None
    """final_return as Procgen's normalized score (None: not a Procgen game in easy mode)."""
    test_return: float | None
    """The run's last evaluation (summary.json's test_return_mean), None if it had none."""
    success_rate: float | None
    """The success rate of its last episodes (summary.json's final_metrics), None where the env reports none."""
    episodes: int
    return_at_equal_time: float | None
    time_to_threshold: float | None
    steps_to_threshold: int | None
    peak_rss_mb: float
    peak_pss_mb: float | None
    mean_cpu_percent: float
    other_load_cores: float | None
    """Mean CPU use of the rest of the machine during the run, in cores (None: not logged)."""
    logical_cores: int | None
    phase_seconds: dict[str, float]


@dataclass(frozen=True)
class Comparison:
    """Everything the report shows: the runs, their table rows, and the reference points used."""

    runs: list[Run]
    stats: list[RunStats]
    baseline: str
    equal_time: float
    """The shortest run's last logged wall time (s): returns are compared at this time."""
    threshold: float | None
    """Return threshold for 'time to threshold' (None: none was given and none derived, `threshold_source` says why)."""
    threshold_source: str
    """Where the threshold comes from, or `none: ` and why there is none."""
    warnings: list[str] = field(default_factory=list)
    groups: list[RunGroup] = field(default_factory=list)
    """The labels as given, each with its runs (seeds); the table above lists every run on its own."""
    group_stats: list[seeds.GroupStats] = field(default_factory=list)
    equal_steps: float = 0.0
    """Env steps at which returns are compared across seeds (the shortest run's, unless given), and references'."""
    references: list[Reference] = field(default_factory=list)
    """Published curves shown beside the runs (`--reference`): no runs, compared by return at `equal_steps` only."""

    @property
    def has_seeds(self) -> bool:
        """Some label has several runs: the across-seeds section, verdict and curves are shown."""
        return any(len(g.runs) > 1 for g in self.groups)

    @property
    def baseline_stats(self) -> RunStats:
        return next(s for s in self.stats if s.label == self.baseline)

    @property
    def envs(self) -> list[str]:
        """The envs the runs train, each once: returns are compared only where there is one."""
        return list(dict.fromkeys(r.summary.env_id for r in self.runs))


def compare(items: Sequence[RunGroup | Run], baseline: str | None = None, threshold: float | None = None,
            declared_modes: Mapping[str, str] | None = None, at_steps: float | None = None,
            references: Sequence[Reference] = ()) -> Comparison:
    """Compute the table, with speed-ups against `baseline` (default: first sequential run, else first run),
    and, when a label has several runs (seeds), the figures across seeds at `at_steps` env steps (default:
    the shortest run's). `references` (published curves) are kept to be shown beside the runs.

    `declared_modes` maps a label to the mode the user said it has (`--sequential`/`--parallel`); a run whose
    summary says otherwise gets a warning.
    """
    groups = [g if isinstance(g, RunGroup) else RunGroup(g.label, [g]) for g in items]
    runs = [r for g in groups for r in g.runs]
    if len(runs) < 2:
        raise ConfigError("nothing to compare: give at least two runs (--sequential/--parallel or --run)")
    seeds.check_distinct_seeds(groups)
    baseline = _baseline_label(groups, runs, baseline)
    base = next(r for r in runs if r.label == baseline)
    if threshold is not None and not math.isfinite(threshold):
        raise ConfigError(f"--threshold must be a finite number, got {threshold}")
    if at_steps is not None and not (math.isfinite(at_steps) and at_steps > 0):
        raise ConfigError(f"--at-steps must be a positive number of env steps, got {at_steps}")
    if at_steps is not None and not references and all(len(g.runs) == 1 for g in groups):
        raise ConfigError("--at-steps compares returns across seeds or against a --reference, and these runs have "
                          "neither: give a label several seeds (LABEL=DIR1,DIR2 or a parent of seed_<n> runs)")
    equal_time = min(float(r.metrics["wall_time"][-1]) for r in runs)
    threshold, source = _threshold(runs, threshold)
    stats = [_run_stats(run, base, threshold, equal_time) for run in runs]
    equal_steps, _ = seeds.equal_points(groups, at_steps)
    seeded = any(len(g.runs) > 1 for g in groups)
    early = _read_early(runs, equal_steps) if seeded else []
    return Comparison(list(runs), stats, baseline, equal_time, threshold, source,
                      _warnings(runs, declared_modes or {}, seeded) + early, list(groups),
                      seeds.group_stats(groups, equal_steps, equal_time), equal_steps, list(references))


def _baseline_label(groups: Sequence[RunGroup], runs: Sequence[Run], baseline: str | None) -> str:
    """The run the speed-ups are measured against: `baseline` (for a label over seeds, the label alone means its
    first run and `LABEL/<directory>` names one), else the first sequential run, else the first run."""
    labels = [r.label for r in runs]
    multi = {g.label: g.runs[0].label for g in groups if len(g.runs) > 1}
    baseline = multi.get(baseline, baseline) if baseline is not None else None
    if baseline is None:
        return next((r.label for r in runs if r.summary.mode == "sequential"), runs[0].label)
    if baseline not in labels:
        raise ConfigError(f"--baseline {baseline!r} is not one of the runs ({', '.join(labels)})")
    return baseline


THRESHOLD_SHARE = 0.8
"""A derived threshold lies this share of the way from the highest first return to the best final return."""


def _threshold(runs: Sequence[Run], threshold: float | None) -> tuple[float | None, str]:
    """The return threshold for 'time to threshold' and where it comes from: as given, else THRESHOLD_SHARE of the
    way from the highest first logged return of any run to the best final return, so that no run has reached it
    when it first logs; else none (no run finished an episode, or none ended above that start: no target would mean
    progress)."""
    if len({r.summary.env_id for r in runs}) > 1:  # a --threshold given too: one env's time to it is not another's
        return None, "none: the runs train different envs, whose returns are not on one scale"
    if threshold is not None:
        return threshold, "given with --threshold"
    finals = [r.final_return for r in runs if r.final_return is not None]
    firsts = [f for f in map(first_return, runs) if f is not None]
    if not finals or not firsts:
        return None, "none: no run finished an episode"
    start, best = max(firsts), max(finals)
    if best <= start:
        return None, f"none: no run ended above the highest first logged return ({fmt_return(start)})"
    return (start + THRESHOLD_SHARE * (best - start),
            f"{THRESHOLD_SHARE:.0%} of the way from the highest first logged return, {fmt_return(start)}, "
            "to the best final return")


def finite(value: Any) -> Any:
    """NaN/inf → None, recursively (JSON has no NaN; a summary's NaN is a figure not reported)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def _run_stats(run: Run, base: Run, threshold: float | None, equal_time: float) -> RunStats:
    """One run's table row, its speed-up against `base`."""
    gain = speedup(run.steady_sps, base.steady_sps)
    reached = first_reaching(run, threshold)
    return RunStats(
        label=run.label, mode=run.summary.mode, layout=run.layout, workers=run.workers,
        num_envs=run.summary.num_envs, total_env_steps=run.summary.total_env_steps,
        wall_seconds=run.summary.wall_seconds, sps=run.steady_sps,
        speedup=gain, efficiency=efficiency(gain, run.workers, base.workers),
        final_return=run.final_return, episodes=run.summary.episodes,
        normalized_return=run.summary.normalized_return, test_return=run.summary.test_return_mean,
        success_rate=finite(run.summary.final_metrics.get("success_rate")),  # NaN: none reported
        return_at_equal_time=return_at(run, equal_time),
        time_to_threshold=None if reached is None else float(run.metrics["wall_time"][reached]),
        steps_to_threshold=None if reached is None else int(run.metrics["env_steps"][reached]),
        peak_rss_mb=run.summary.peak_rss_mb, peak_pss_mb=run.summary.peak_pss_mb,
        mean_cpu_percent=run.mean_cpu_percent,
        other_load_cores=other_load(run), logical_cores=run.summary.hardware.get("logical_cores"),
        phase_seconds=phase_seconds(run),
    )


def other_load(run: Run) -> float | None:
    """Mean cores kept busy by processes outside the run (machine CPU minus the run's), if logged."""
    machine = run.metrics["system_cpu_percent"]
    if not np.isfinite(machine).all():
        return None
    return float(np.mean(np.maximum(machine - run.metrics["cpu_percent"], 0.0))) / 100


def phase_seconds(run: Run) -> dict[str, float]:
    """Total seconds per phase from metrics.csv; `other` is the rest of the logged wall time."""
    seconds = {p: float(np.nansum(run.metrics[f"time_{p}"])) for p in MAIN_PHASES}  # NaN: a phase newer than the run
    seconds["other"] = max(0.0, float(run.metrics["wall_time"][-1]) - sum(seconds.values()))
    return seconds


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _grouped(values: Mapping[str, Any]) -> str:
    """`{label: value}` → `'a' (x, y) vs 'b' (z)`, grouping labels that share a value."""
    groups: dict[str, list[str]] = {}
    for label, value in values.items():
        groups.setdefault(str(value), []).append(label)
    return " vs ".join(f"{value} ({', '.join(labels)})" for value, labels in groups.items())


def _warnings(runs: Sequence[Run], declared_modes: Mapping[str, str], seeded: bool = False) -> list[str]:
    """What makes the runs less comparable than they look; seeds differing is expected when `seeded`."""
    out = _machine_warnings(runs)
    config = _config_warning(runs, seeded)
    if config:
        out.append(config)
    duration = _duration_warning(runs)
    if duration:
        out.append(duration)
    for run in runs:
        out += _run_warnings(run, declared_modes.get(run.label))
    return out


READ_EARLY = 0.05
"""A run whose last update by the equal steps ended this share of them or more before is said to be read early."""


def _read_early(runs: Sequence[Run], steps: float) -> list[str]:
    """The runs whose return at `steps` env steps is their return at an update that ended well before (they log
    every few thousand steps, or a rollout of other size), grouped by where they were read; [] where none was."""
    at: dict[str, list[str]] = {}
    for run in runs:
        index = logged_by(run.metrics["env_steps"], steps)
        read = int(run.metrics["env_steps"][index]) if index >= 0 else 0
        if read < (1 - READ_EARLY) * steps:
            at.setdefault(f"{read:,} ({1 - read / steps:.0%} before)", []).append(run.label)
    if not at:
        return []
    where = "; ".join(f"{', '.join(labels)} at {read}" for read, labels in at.items())
    return [f"the return @ {steps:,.0f} steps is each run's at its last update by then, which ended well before for "
            f"some: {where}"]


def _duration_warning(runs: Sequence[Run]) -> str | None:
    """Runs of different lengths, or None. Runs that all stopped at their step budget (run.total_steps) are
    measured in env steps, so equal budgets are comparable whatever their wall times; others in wall time."""
    if all(r.summary.stop_reason == "total_steps" for r in runs):
        steps = [r.summary.total_env_steps for r in runs]
        if max(steps) <= 1.1 * min(steps):
            return None
        spans = _grouped({r.label: f"{r.summary.total_env_steps:,} env steps" for r in runs})
        equal_at = "equal env steps"
    else:
        walls = [r.summary.wall_seconds for r in runs]
        if max(walls) <= 1.1 * min(walls):
            return None
        spans = _grouped({r.label: fmt_duration(r.summary.wall_seconds) for r in runs})
        equal_at = "equal wall time"
    return f"runs differ in duration ({spans}): final returns are not comparable; compare the return at {equal_at}"


def _machine_warnings(runs: Sequence[Run]) -> list[str]:
    """Different hardware, and each software version that differs among those every run recorded (a package one run
    did not have, or a field written before it was recorded, is no difference)."""
    out = []
    with_kind = all("cpu_kind" in r.summary.hardware for r in runs)  # runs recorded before the kind was
    with_family = all(r.summary.hardware.get("cpu_family") for r in runs)  # before the family was, or not x86
    hardware = {r.label: describe_hardware(r, kind=with_kind, family=with_family) for r in runs}
    if len(set(hardware.values())) > 1:
        out.append(f"runs ran on different hardware, so their speeds are not comparable: "
                   f"{_grouped(hardware)}")
    for key in sorted({k for r in runs for k in r.summary.versions}):
        values = {r.label: r.summary.versions.get(key) for r in runs}
        if None not in values.values() and len(set(map(str, values.values()))) > 1:
            out.append(f"software versions differ: {key} {_grouped(values)}")
    return out


def _config_warning(runs: Sequence[Run], seeded: bool) -> str | None:
    """The config keys that differ beyond the layout (the first four named), or None."""
    configs = {r.label: _flatten(r.config.to_dict()) for r in runs}
    keys = sorted({k for c in configs.values() for k in c
                   if not k.startswith("parallel.") and k not in LAYOUT_KEYS and not (seeded and k == "run.seed")})
    differing = [k for k in keys if len({repr(c.get(k)) for c in configs.values()}) > 1]
    if not differing:
        return None
    shown = "; ".join(f"{k}: {_grouped({label: c.get(k) for label, c in configs.items()})}"
                      for k in differing[:4])
    more = f"; and {len(differing) - 4} more" if len(differing) > 4 else ""
    return f"config differs beyond the parallel layout: {shown}{more}"


def _run_warnings(run: Run, declared: str | None) -> list[str]:
    """One run's own caveats: a mode other than declared, a stop before its end, resumes, worker restarts, no
    episodes, and CPU figures that are rank 0's alone or disturbed by other processes."""
    out = []
    if declared and declared != run.summary.mode:
        out.append(f"{run.label!r} was given as the {declared} run but its summary says mode "
                   f"{run.summary.mode!r}")
    if run.summary.stop_reason == "signal":
        out.append(f"{run.label!r} was interrupted ({run.summary.signal or 'a signal'} after "
                   f"{fmt_duration(run.summary.wall_seconds)})")
    elif run.summary.stop_reason == "error":
        out.append(f"{run.label!r} stopped with an error after {fmt_duration(run.summary.wall_seconds)}: "
                   f"{run.summary.error or 'unknown'}")
    resumes = run.summary.resumes or 0
    if resumes:
        out.append(f"{run.label!r} was resumed {resumes} time(s) from a checkpoint; its wall time leaves "
                   "out the time it was stopped")
    restarts = run.summary.worker_restarts or 0
    if restarts:
        out.append(f"{run.label!r} restarted workers {restarts} time(s); its throughput includes the "
                   "restarts")
    if run.final_return is None:
        out.append(f"{run.label!r}: {NO_EPISODES} (its returns are blank)")
    load = other_load(run)
    if run.summary.mode == "distributed":  # the other ranks are not rank 0's processes, yet no intruders
        out.append(f"{run.label!r} is distributed: its CPU and memory figures are rank 0's processes alone")
    elif load is not None and load > OTHER_LOAD_CORES:
        out.append(f"other processes kept {load:.2f} cores busy on average during {run.label!r}: "
                   "its timings understate what the machine can do alone")
    return out
