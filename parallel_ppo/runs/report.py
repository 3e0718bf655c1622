"""Timed runs side by side: the numbers (`compare`), the report text and markdown, the JSON, and two figures.

Everything is rendered in memory (`render_outputs`) and only then written (`write_outputs`), so a failure
never leaves a half-written comparison behind.
"""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from parallel_ppo.runs import seeds
from parallel_ppo.core.config import ConfigError
from parallel_ppo.core.files import atomic_write
from parallel_ppo.runs.reading import (
    MAIN_PHASES,
    SPEEDUP_DEFINITION,
    Run,
    RunGroup,
    RunSummary,
    efficiency,
    first_reaching,
    return_at,
    speedup,
)

PHASE_NAMES = (*MAIN_PHASES, "other")
"""Bars of the phase breakdown; `other` = publish + log + checkpoint + anything untimed."""

OUTPUT_FILES = ("comparison.png", "phase_breakdown.png", "comparison_report.txt", "comparison.md",
                "comparison.json")
SEED_FILES = ("learning_curves.png",)
"""Written besides OUTPUT_FILES when a label has several runs (seeds)."""

LAYOUT_KEYS = ("env.num_envs", "run.output_dir", "run.duration", "run.total_steps", "run.checkpoint_interval",
               "logging.progress", "logging.tensorboard")
"""Config keys that may differ between compared runs without a warning (besides the whole `parallel`
section): the env layout, where and how long a run goes, and logging switches. Duration is checked on the
measured time instead."""

NO_EPISODES = "no episodes finished"

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
    """Steady-state env steps per second (`runs.steady_sps`)."""
    speedup: float
    efficiency: float
    final_return: float | None
    normalized_return: float | None
    """final_return as Procgen's normalized score (None: not a Procgen game in easy mode)."""
    test_return: float | None
    """The run's last evaluation (summary.json's test_return_mean), None if it had none."""
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
    """Return threshold for 'time to threshold' (None when no run finished an episode)."""
    threshold_source: str
    warnings: list[str] = field(default_factory=list)
    groups: list[RunGroup] = field(default_factory=list)
    """The labels as given, each with its runs (seeds); the table above lists every run on its own."""
    group_stats: list[seeds.GroupStats] = field(default_factory=list)
    equal_steps: float = 0.0
    """Env steps at which returns are compared across seeds (the shortest run's, unless given)."""

    @property
    def has_seeds(self) -> bool:
        """Some label has several runs: the across-seeds section, verdict and curves are shown."""
        return any(len(g.runs) > 1 for g in self.groups)

    @property
    def baseline_stats(self) -> RunStats:
        return next(s for s in self.stats if s.label == self.baseline)


# ----------------------------------------------------------------------------------------------- numbers
def compare(items: Sequence[RunGroup | Run], baseline: str | None = None, threshold: float | None = None,
            declared_modes: Mapping[str, str] | None = None, at_steps: float | None = None) -> Comparison:
    """Compute the table, with speed-ups against `baseline` (default: first sequential run, else first run),
    and, when a label has several runs (seeds), the figures across seeds at `at_steps` env steps (default:
    the shortest run's).

    `declared_modes` maps a label to the mode the user said it has (`--sequential`/`--parallel`); a run whose
    summary says otherwise gets a warning.
    """
    groups = [g if isinstance(g, RunGroup) else RunGroup(g.label, [g]) for g in items]
    runs = [r for g in groups for r in g.runs]
    if len(runs) < 2:
        raise ConfigError("nothing to compare: give at least two runs (--sequential/--parallel or --run)")
    labels = [r.label for r in runs]
    multi = {g.label: g.runs[0].label for g in groups if len(g.runs) > 1}
    baseline = multi.get(baseline, baseline) if baseline is not None else None
    if baseline is None:
        baseline = next((r.label for r in runs if r.summary.mode == "sequential"), runs[0].label)
    elif baseline not in labels:
        raise ConfigError(f"--baseline {baseline!r} is not one of the runs ({', '.join(labels)})")
    base = runs[labels.index(baseline)]
    if threshold is not None and not math.isfinite(threshold):
        raise ConfigError(f"--threshold must be a finite number, got {threshold}")

    equal_time = min(float(r.metrics["wall_time"][-1]) for r in runs)
    finals = [r.final_return for r in runs if r.final_return is not None]
    if threshold is not None:
        source = "given with --threshold"
    elif finals:
        best = max(finals)
        threshold = best - 0.2 * abs(best)
        source = "80% of the best final return" if best >= 0 else "20% below the best final return"
    else:
        source = "none: no run finished an episode"

    stats = []
    for run in runs:
        gain = speedup(run.steady_sps, base.steady_sps)
        reached = first_reaching(run, threshold)
        stats.append(RunStats(
            label=run.label, mode=run.summary.mode, layout=run.layout, workers=run.workers,
            num_envs=run.summary.num_envs, total_env_steps=run.summary.total_env_steps,
            wall_seconds=run.summary.wall_seconds, sps=run.steady_sps,
            speedup=gain, efficiency=efficiency(gain, run.workers, base.workers),
            final_return=run.final_return, episodes=run.summary.episodes,
            normalized_return=run.summary.normalized_return, test_return=run.summary.test_return_mean,
            return_at_equal_time=return_at(run, equal_time),
            time_to_threshold=None if reached is None else float(run.metrics["wall_time"][reached]),
            steps_to_threshold=None if reached is None else int(run.metrics["env_steps"][reached]),
            peak_rss_mb=run.summary.peak_rss_mb, peak_pss_mb=run.summary.peak_pss_mb,
            mean_cpu_percent=run.mean_cpu_percent,
            other_load_cores=other_load(run), logical_cores=run.summary.hardware.get("logical_cores"),
            phase_seconds=phase_seconds(run),
        ))
    equal_steps, _ = seeds.equal_points(groups, at_steps)
    seeded = any(len(g.runs) > 1 for g in groups)
    return Comparison(list(runs), stats, baseline, equal_time, threshold, source,
                      _warnings(runs, declared_modes or {}, seeded), list(groups),
                      seeds.group_stats(groups, equal_steps, equal_time), equal_steps)


def other_load(run: Run) -> float | None:
    """Mean cores kept busy by processes outside the run (machine CPU minus the run's), if logged."""
    machine = run.metrics["system_cpu_percent"]
    if not np.isfinite(machine).all():
        return None
    return float(np.mean(np.maximum(machine - run.metrics["cpu_percent"], 0.0))) / 100


def phase_seconds(run: Run) -> dict[str, float]:
    """Total seconds per phase from metrics.csv; `other` is the rest of the logged wall time."""
    seconds = {p: float(np.sum(run.metrics[f"time_{p}"])) for p in MAIN_PHASES}
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
    out = []
    hardware = {r.label: describe_hardware(r) for r in runs}
    if len(set(hardware.values())) > 1:
        out.append(f"runs ran on different hardware, so their speeds are not comparable: "
                   f"{_grouped(hardware)}")
    version_keys = sorted({k for r in runs for k in r.summary.versions})
    for key in version_keys:
        values = {r.label: r.summary.versions.get(key) for r in runs}
        if len(set(map(str, values.values()))) > 1:
            out.append(f"software versions differ: {key} {_grouped(values)}")
    configs = {r.label: _flatten(r.config.to_dict()) for r in runs}
    keys = sorted({k for c in configs.values() for k in c
                   if not k.startswith("parallel.") and k not in LAYOUT_KEYS and not (seeded and k == "run.seed")})
    differing = [k for k in keys if len({repr(c.get(k)) for c in configs.values()}) > 1]
    if differing:
        shown = "; ".join(f"{k}: {_grouped({label: c.get(k) for label, c in configs.items()})}"
                          for k in differing[:4])
        more = f"; and {len(differing) - 4} more" if len(differing) > 4 else ""
        out.append(f"config differs beyond the parallel layout: {shown}{more}")
    walls = [r.summary.wall_seconds for r in runs]
    if max(walls) > 1.1 * min(walls):
        spans = _grouped({r.label: fmt_duration(r.summary.wall_seconds) for r in runs})
        out.append(f"runs differ in duration ({spans}): final returns are not comparable; "
                   f"compare the return at equal wall time")
    for run in runs:
        declared = declared_modes.get(run.label)
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


# ------------------------------------------------------------------------------------------- formatting
def fmt_duration(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def fmt_return(value: float | None, missing: str = NO_EPISODES) -> str:
    if value is None:
        return missing
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def fmt_memory(mb: float) -> str:
    return f"{mb / 1024:.2f} GB" if mb >= 1024 else f"{mb:.0f} MB"


def fmt_cpu(percent: float, cores: int | None) -> str:
    return f"{percent / 100:.1f}" + (f" / {cores}" if cores else "")


def fmt_flops(summary: RunSummary) -> str:
    """Achieved GFLOP/s and its share of the run's matmul peak, e.g. `152 (62%)`."""
    if summary.achieved_gflops is None:
        return "—"
    return f"{summary.achieved_gflops:,.0f} ({summary.peak_fraction:.0%})"


def run_name(s: RunStats) -> str:
    """`label (W×M envs)`, with the mode too when the label does not already say it."""
    mode = "" if s.label == s.mode else f"{s.mode}, "
    return f"{s.label} ({mode}{s.layout} envs)"


def describe_hardware(run: Run) -> str:
    hw = run.summary.hardware
    return (f"{hw.get('cpu_model', '?')}, {hw.get('logical_cores', '?')} logical / "
            f"{hw.get('physical_cores', '?')} physical cores, {hw.get('memory_gb', '?')} GB RAM")


def describe_versions(run: Run) -> str:
    return ", ".join(f"{k} {v}" for k, v in run.summary.versions.items() if v is not None)


@dataclass(frozen=True)
class Table:
    """Cells as strings; the first `left` columns are text (left-aligned), the rest numbers."""

    header: list[str]
    rows: list[list[str]]
    left: int = 1

    def text(self) -> str:
        widths = [max(len(r[i]) for r in [self.header, *self.rows]) for i in range(len(self.header))]

        def line(cells: list[str]) -> str:
            return "  ".join(c.ljust(w) if i < self.left else c.rjust(w)
                             for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

        return "\n".join([line(self.header), "  ".join("-" * w for w in widths), *map(line, self.rows)])

    def markdown(self) -> str:
        align = ["---" if i < self.left else "---:" for i in range(len(self.header))]
        return "\n".join("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"
                         for cells in [self.header, align, *self.rows])


def table(cmp: Comparison) -> Table:
    """The comparison table, one row per run."""
    thr = cmp.threshold
    to_threshold = "time to threshold" if thr is None else f"time to return {fmt_return(thr)}"
    header = ["run", "mode", "workers×envs", "env steps", "wall time", "SPS", "speed-up", "efficiency",
              "final return", f"return @ {fmt_duration(cmp.equal_time)}", to_threshold, "peak RSS",
              "CPU cores busy"]
    with_pss = any(s.peak_pss_mb is not None for s in cmp.stats)
    if with_pss:
        header.insert(-1, "peak PSS")
    extra = [(name, key) for name, key in (("normalized", "normalized_return"), ("test return", "test_return"))
             if any(getattr(s, key) is not None for s in cmp.stats)]
    for name, _ in reversed(extra):
        header.insert(9, name)
    with_flops = any(run.summary.achieved_gflops is not None for run in cmp.runs)
    if with_flops:
        header.insert(header.index("peak RSS"), "GFLOP/s (of peak)")
    rows = []
    for run, s in zip(cmp.runs, cmp.stats, strict=True):
        reached = "—" if cmp.threshold is None else _reached(s)
        not_yet = "no episodes yet" if s.final_return is not None else NO_EPISODES
        at_equal = fmt_return(s.return_at_equal_time, not_yet)
        row = [
            s.label, s.mode, s.layout, f"{s.total_env_steps:,}", fmt_duration(s.wall_seconds),
            f"{s.sps:,.0f}", f"{s.speedup:.2f}×", f"{s.efficiency:.0%}", fmt_return(s.final_return),
            at_equal, reached, fmt_memory(s.peak_rss_mb), fmt_cpu(s.mean_cpu_percent, s.logical_cores),
        ]
        if with_pss:
            row.insert(-1, "—" if s.peak_pss_mb is None else fmt_memory(s.peak_pss_mb))
        for _, key in reversed(extra):
            value = getattr(s, key)
            row.insert(9, "—" if value is None else f"{value:.3f}" if key == "normalized_return" else fmt_return(value))
        if with_flops:
            row.insert(header.index("GFLOP/s (of peak)"), fmt_flops(run.summary))
        rows.append(row)
    return Table(header, rows, left=2)


def phase_table(cmp: Comparison) -> Table:
    """Share of logged wall time per phase, one row per run."""
    header = ["run", *PHASE_NAMES, "s per 1k steps"]
    rows = []
    for s in cmp.stats:
        total = sum(s.phase_seconds.values()) or 1.0
        rows.append([s.label, *(f"{s.phase_seconds[p] / total:.0%}" for p in PHASE_NAMES),
                     f"{1000 * total / s.total_env_steps:.3g}"])
    return Table(header, rows)


def verdict(cmp: Comparison) -> list[str]:
    """Plain-words conclusions, one sentence per run against the baseline, then the best return; across seeds
    (`seed_verdict`) when a label has several runs."""
    if cmp.has_seeds:
        return seed_verdict(cmp)
    base = cmp.baseline_stats
    lines = []
    at = fmt_duration(cmp.equal_time)
    for s in cmp.stats:
        if s.label == base.label:
            continue
        if round(s.speedup, 2) == 1:
            speed = f"{s.label} ran at the speed of {base.label}"
        elif s.speedup > 1:
            speed = f"{s.label} was {s.speedup:.2f}× faster than {base.label}"
        else:
            speed = f"{s.label} was {1 / s.speedup:.2f}× slower than {base.label}"
        speed += f" ({s.sps:,.0f} vs {base.sps:,.0f} steady-state env steps/s)"
        if s.workers != base.workers:
            unit = "processes" if s.mode == "distributed" else "workers"
            speed += f" at {s.efficiency:.0%} parallel efficiency with {s.workers} {unit}"
        mine, theirs = s.return_at_equal_time, base.return_at_equal_time
        if mine is None and theirs is None:
            sentence = f"{speed}; at equal wall time ({at}) neither had finished an episode"
        else:
            sentence = (f"{speed}; at equal wall time ({at}) it reached a mean return of "
                        f"{fmt_return(mine, 'none (no episode yet)')} vs "
                        f"{fmt_return(theirs, 'none (no episode yet)')}")
        if cmp.threshold is not None:
            sentence += (f"; time to a return of {fmt_return(cmp.threshold)}: "
                         f"{_reached(s)} vs {_reached(base)}")
        lines.append(sentence + ".")
    finished = [s for s in cmp.stats if s.final_return is not None]
    if finished:
        best = max(finished, key=lambda s: s.final_return or 0.0)
        lines.append(f"Best final return: {fmt_return(best.final_return)} by {best.label} "
                     f"after {best.total_env_steps:,} env steps in {fmt_duration(best.wall_seconds)}.")
    else:
        lines.append("No run finished an episode, so returns cannot be compared.")
    return lines


def seed_figure_names(cmp: Comparison) -> dict[str, str]:
    return {k: v.format(steps=f"{cmp.equal_steps:,.0f}", time=fmt_duration(cmp.equal_time))
            for k, v in seeds.FIGURE_NAMES.items()}


def seed_table(cmp: Comparison) -> Table:
    """One row per label: seeds, then mean, IQM and 95% bootstrap interval of each figure across seeds."""
    names = seed_figure_names(cmp)
    header = ["label", "seeds"]
    for figure in seeds.FIGURES:
        header += [f"{names[figure]}: mean", "IQM", "95% CI"]
    rows = []
    for g in cmp.group_stats:
        row = [g.label, str(g.seeds)]
        for figure in seeds.FIGURES:
            est = getattr(g, figure)
            row += ["-", "-", "-"] if est is None else [
                seeds.num(est.mean), seeds.num(est.iqm), f"[{seeds.num(est.low)}, {seeds.num(est.high)}]"]
        rows.append(row)
    return Table(header, rows, left=1)


def seed_verdict(cmp: Comparison) -> list[str]:
    """Per figure, the best label against each other one; a difference is named only where intervals do not overlap."""
    names = seed_figure_names(cmp)
    lines = [line for figure in seeds.FIGURES for line in seeds.differences(cmp.group_stats, figure, names[figure])]
    return lines or ["Too few labels with the figures to compare across seeds."]


def seed_definitions(cmp: Comparison) -> list[str]:
    return [
        f"Across seeds: each label's runs are seeds of one config. Mean, interquartile mean (IQM: the mean of "
        f"the middle half, the lowest and highest quarter dropped) and the {seeds.LEVEL:.0%} percentile bootstrap "
        f"interval of the mean ({seeds.RESAMPLES:,} resamples of the seeds). Return @ {cmp.equal_steps:,.0f} "
        f"steps: each run's mean return at its last update by that many env steps. With 3 seeds or fewer the "
        "interval is the range of the seeds: overlapping intervals mean no difference was shown, not that "
        "there is none.",
    ]


def _reached(s: RunStats) -> str:
    return "not reached" if s.time_to_threshold is None else fmt_duration(s.time_to_threshold)


def return_window(cmp: Comparison) -> str:
    """`last 100 episodes`: the rolling window the runs' returns are averaged over (logging.return_window)."""
    windows = sorted({r.config.logging.return_window for r in cmp.runs})
    return f"last {'/'.join(map(str, windows))} episodes"


def definitions(cmp: Comparison) -> list[str]:
    thr = ("no threshold (no run finished an episode)" if cmp.threshold is None
           else f"{fmt_return(cmp.threshold)} ({cmp.threshold_source})")
    return [
        f"Baseline: {cmp.baseline}. {SPEEDUP_DEFINITION[0].upper()}{SPEEDUP_DEFINITION[1:]}.",
        f"Final return: the mean episodic return of the {return_window(cmp)} (summary.json). Normalized: "
        "(R - R_min) / (R_max - R_min) with the Procgen paper's easy-mode constants (parallel_ppo/evaluate.py). "
        "Test return: the run's last evaluation (eval config), on held-out test levels unless it says otherwise.",
        f"Return @ {fmt_duration(cmp.equal_time)}: episodic_return_mean in each run's last metrics row at or "
        f"before {cmp.equal_time:.1f} s, the shortest run's logged duration.",
        f"Time to return: wall time of the first update whose mean return reached {thr}.",
        "CPU cores busy: mean CPU use of all the run's processes (1.0 = one core fully busy) / logical "
        "cores. Peak RSS: the largest sampled sum of the resident memory of the run's processes, which "
        "counts memory they share once per process; peak PSS splits shared pages among them, so it is "
        "what the run really occupied (the fair figure for parallel runs).",
        "GFLOP/s: SPS × the network's FLOPs per env step (one forward to act, n_epochs forward+backward passes to "
        "learn; torch's FlopCounterMode), and in brackets its share of the matmul peak of the run's precision "
        "measured before the run (`make roofline`): how close the run came to the machine's arithmetic limit.",
    ]


def run_descriptions(cmp: Comparison) -> list[str]:
    out = []
    for run in cmp.runs:
        threads = ", ".join(f"{k} {v}" for k, v in run.summary.threads.items())
        out.append(f"{run.label}: {run.path} — {run.summary.mode}, {run.layout} envs on {run.summary.env_id}, "
                   f"{run.summary.precision}, threads {threads or '?'}, seed {run.config.run.seed}, "
                   f"stopped by {run.summary.stop_reason}. "
                   f"Hardware: {describe_hardware(run)}. Versions: {describe_versions(run)}.")
    return out


# ---------------------------------------------------------------------------------- text and markdown
def console_summary(cmp: Comparison, written: Sequence[Path]) -> str:
    """What compare_results.py prints: the table, the verdict, the warnings, and the files written."""
    across = ["Across seeds:", seed_table(cmp).text(), ""] if cmp.has_seeds else []
    lines = [table(cmp).text(), "", *across, *(f"  {line}" for line in verdict(cmp)),
             *(f"  warning: {line}" for line in cmp.warnings)]
    if written:
        lines += ["", f"wrote {', '.join(p.name for p in written)} to {written[0].parent}"]
    return "\n".join(lines) + "\n"


def _sections(cmp: Comparison) -> list[tuple[str, str, Any]]:
    """The report as (title, kind, content) with kind `table` or `list`; rendered as text or markdown."""
    warnings = cmp.warnings or ["none: same hardware, versions, config (apart from the parallel layout) "
                                "and duration"]
    across = [("Across seeds", "table", seed_table(cmp))]
    figures = [("learning_curves.png", "mean return vs env steps and vs wall time across seeds, with the 95% "
                                       "bootstrap band")] if cmp.has_seeds else []
    return [
        *(across if cmp.has_seeds else []),
        ("Results", "table", table(cmp)),
        ("Verdict", "list", verdict(cmp)),
        ("Warnings", "list", warnings),
        ("Where the time goes (share of wall time)", "table", phase_table(cmp)),
        ("How the numbers are computed", "list", definitions(cmp) + (seed_definitions(cmp) if cmp.has_seeds else [])),
        ("Runs (hardware and versions fingerprint)", "list", run_descriptions(cmp)),
        ("Figures", "figures", [
            ("comparison.png",
             "return vs wall time, return vs env steps, SPS over time, CPU and memory over time"),
            ("phase_breakdown.png",
             "where the time goes: phase seconds per 1,000 env steps and share of wall time"),
            *figures,
        ]),
    ]


def _title(cmp: Comparison) -> str:
    envs = sorted({r.summary.env_id for r in cmp.runs})
    return f"PPO timed runs compared on {', '.join(envs)}: {', '.join(s.label for s in cmp.stats)}"


def render_text(cmp: Comparison) -> str:
    parts = [_title(cmp), "=" * len(_title(cmp))]
    for title, kind, content in _sections(cmp):
        parts += ["", title, "-" * len(title)]
        if kind == "table":
            parts.append(content.text())
        elif kind == "list":
            parts += [f"- {item}" for item in content]
        else:
            parts += [f"- {name}: {what}" for name, what in content]
    return "\n".join(parts) + "\n"


def render_markdown(cmp: Comparison) -> str:
    parts = [f"# {_title(cmp)}"]
    for title, kind, content in _sections(cmp):
        parts += ["", f"## {title}", ""]
        if kind == "table":
            parts.append(content.markdown())
        elif kind == "list":
            parts += [f"- {item}" for item in content]
        else:
            for name, what in content:
                parts += [f"{name}: {what}", "", f"![{what}]({name})", ""]
    return "\n".join(parts).rstrip() + "\n"


def to_json(cmp: Comparison) -> dict[str, Any]:
    """Every number in the table (unrounded), the reference points, warnings and verdict."""
    runs = []
    for run, s in zip(cmp.runs, cmp.stats, strict=True):
        total = sum(s.phase_seconds.values()) or 1.0
        runs.append({
            "label": s.label, "path": str(run.path), "mode": s.mode, "env_id": run.summary.env_id,
            "num_workers": run.summary.num_workers, "workers_counted": s.workers,
            "num_envs_per_worker": run.summary.num_envs_per_worker, "num_envs": s.num_envs,
            "total_env_steps": s.total_env_steps, "wall_seconds": s.wall_seconds, "updates": run.updates,
            "sps": s.sps, "speedup": s.speedup, "efficiency": s.efficiency,
            "final_return": s.final_return, "episodes": s.episodes, "normalized_return": s.normalized_return,
            "test_return": s.test_return, "test_normalized_return": run.summary.test_normalized_return,
            "generalization_gap": run.summary.generalization_gap, "eval_levels": run.summary.eval_levels,
            "return_at_equal_time": s.return_at_equal_time,
            "time_to_threshold_seconds": s.time_to_threshold, "steps_to_threshold": s.steps_to_threshold,
            "peak_rss_mb": s.peak_rss_mb, "peak_pss_mb": s.peak_pss_mb,
            "mean_cpu_percent": s.mean_cpu_percent, "other_load_cores": s.other_load_cores,
            "logical_cores": s.logical_cores,
            "phase_seconds": s.phase_seconds,
            "phase_fractions": {p: v / total for p, v in s.phase_seconds.items()},
            "precision": run.summary.precision, "stop_reason": run.summary.stop_reason, "threads": run.summary.threads,
            "learner": run.summary.learner, "flops_per_env_step": run.summary.flops_per_env_step,
            "achieved_gflops": run.summary.achieved_gflops, "peak_gflops": run.summary.peak_gflops,
            "peak_fraction": run.summary.peak_fraction,
            "hardware": run.summary.hardware, "versions": run.summary.versions,
        })
    return _finite({
        "baseline": cmp.baseline, "speedup_definition": SPEEDUP_DEFINITION,
        "equal_wall_time_seconds": cmp.equal_time, "return_threshold": cmp.threshold,
        "threshold_source": cmp.threshold_source, "runs": runs, "verdict": verdict(cmp),
        "warnings": cmp.warnings, **(_seeds_json(cmp) if cmp.has_seeds else {}),
    })


def _seeds_json(cmp: Comparison) -> dict[str, Any]:
    labels = []
    for group, g in zip(cmp.groups, cmp.group_stats, strict=True):
        figures = {f: None if getattr(g, f) is None else vars(getattr(g, f)) for f in seeds.FIGURES}
        labels.append({"label": g.label, "seeds": g.seeds, "runs": [r.label for r in group.runs], **figures})
    return {"across_seeds": {"equal_env_steps": cmp.equal_steps, "confidence_level": seeds.LEVEL,
                             "bootstrap_resamples": seeds.RESAMPLES, "labels": labels}}


def _finite(value: Any) -> Any:
    """NaN/inf → None, recursively (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


# ------------------------------------------------------------------------------------------------- plots
PHASE_COLORS = {"env": "#2ca02c", "inference": "#1f77b4", "sync": "#d62728", "gae": "#9467bd",
                "update": "#ff7f0e", "other": "#b0b0b0"}


def _run_colors(n: int) -> list[Any]:
    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _time_unit(seconds: float) -> tuple[float, str]:
    if seconds <= 180:
        return 1.0, "s"
    if seconds <= 3 * 3600:
        return 60.0, "min"
    return 3600.0, "h"


def _count(x: float, _pos: object = None) -> str:
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:g}{suffix}"
    return f"{x:g}"


def _rolling_median(values: np.ndarray) -> np.ndarray:
    window = max(1, len(values) // 25) | 1
    if window == 1:
        return values
    pad = window // 2
    padded = np.pad(values, pad, mode="edge")
    return np.median(np.lib.stride_tricks.sliding_window_view(padded, window), axis=1)


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def plot_comparison(cmp: Comparison) -> bytes:
    """comparison.png: return vs wall time, return vs env steps, SPS over time, CPU and memory over time."""
    colors = _run_colors(len(cmp.runs))
    longest = max(float(r.metrics["wall_time"][-1]) for r in cmp.runs)
    scale, unit = _time_unit(longest)
    fig = Figure(figsize=(14, 9.5), layout="constrained")
    (ax_time, ax_steps), (ax_sps, ax_res) = fig.subplots(2, 2)
    fig.suptitle(_title(cmp), fontsize=14, fontweight="bold")
    # PSS (shared pages split among processes) when every run logged it; RSS double-counts shared memory.
    mem_col = "pss_mb" if all(np.isfinite(r.metrics["pss_mb"]).all() for r in cmp.runs) else "rss_mb"
    mem_gb = max(float(np.max(r.metrics[mem_col])) for r in cmp.runs) >= 2048
    ax_mem = ax_res.twinx()
    for i, (run, s, color) in enumerate(zip(cmp.runs, cmp.stats, colors, strict=True)):
        m = run.metrics
        t = m["wall_time"] / scale
        # Later runs draw thinner, so a curve that coincides with an earlier one still shows both colours.
        kw: dict[str, Any] = {"color": color, "lw": max(1.2, 3.0 - 0.6 * i), "marker": "o" if len(t) < 30 else None,
                              "ms": 3}
        ax_time.plot(t, m["episodic_return_mean"], **kw)
        ax_steps.plot(m["env_steps"], m["episodic_return_mean"], **kw)
        ax_sps.plot(t, m["sps"], color=color, lw=0.8, alpha=0.25)
        ax_sps.plot(t, _rolling_median(m["sps"]), **kw)
        ax_sps.axhline(s.sps, color=color, lw=1, ls="--")
        ax_res.plot(t, m["cpu_percent"] / 100, **kw)
        ax_mem.plot(t, m[mem_col] / (1024 if mem_gb else 1), color=color, lw=1.5, ls="--")
        if s.return_at_equal_time is not None:
            ax_time.plot(cmp.equal_time / scale, s.return_at_equal_time, "o", color=color, ms=8,
                         mec="black", mew=0.8, zorder=5)
    _decorate_returns(cmp, ax_time, ax_steps, scale, unit, longest)
    _decorate_sps(cmp, ax_sps, unit)
    _decorate_resources(cmp, ax_res, ax_mem, unit, mem_col, mem_gb)
    for ax in (ax_time, ax_steps, ax_sps, ax_res):
        ax.set_xlim(left=0)
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], color=c, lw=2.5) for c in colors]
    names = [f"{run_name(s)}: {s.sps:,.0f} SPS" for s in cmp.stats]
    fig.legend(handles, names, loc="outside lower center", ncol=min(len(names), 4), fontsize=11)
    return _png(fig)


def plot_seeds(cmp: Comparison) -> bytes:
    """learning_curves.png: each label's mean return across seeds vs env steps and vs wall time, with the
    pointwise 95% bootstrap band, and the equal-steps line."""
    colors = _run_colors(len(cmp.groups))
    fig = Figure(figsize=(14, 5.5), layout="constrained")
    ax_steps, ax_time = fig.subplots(1, 2)
    fig.suptitle(f"Mean return across seeds, {seeds.LEVEL:.0%} bootstrap band: "
                 f"{', '.join(g.label for g in cmp.groups)}", fontsize=13, fontweight="bold")
    longest = max(float(r.metrics["wall_time"][-1]) for r in cmp.runs)
    scale, unit = _time_unit(longest)
    names = []
    for group, color in zip(cmp.groups, colors, strict=True):
        for ax, column, x_scale in ((ax_steps, "env_steps", 1.0), (ax_time, "wall_time", scale)):
            drawn = seeds.curve(group.runs, column)
            if drawn is None:
                continue
            x, mean, low, high = drawn
            ax.plot(x / x_scale, mean, color=color, lw=2)
            ax.fill_between(x / x_scale, low, high, color=color, alpha=0.2, lw=0)
        names.append(f"{group.label} ({len(group.runs)} seed{'s' if len(group.runs) > 1 else ''})")
    ax_steps.axvline(cmp.equal_steps, color="0.35", ls=":", lw=1)
    ax_steps.xaxis.set_major_formatter(FuncFormatter(_count))
    ax_steps.set(xlabel="env steps", ylabel=f"mean episodic return ({return_window(cmp)})",
                 title="Return vs env steps (learning per step)")
    ax_time.set(xlabel=f"wall time ({unit})", ylabel=f"mean episodic return ({return_window(cmp)})",
                title="Return vs wall time (learning per hour)")
    for ax in (ax_steps, ax_time):
        ax.grid(alpha=0.3)
    fig.legend([Line2D([], [], color=c, lw=2.5) for c in colors], names, loc="outside lower center",
               ncol=min(len(names), 4), fontsize=11)
    return _png(fig)


def _decorate_returns(cmp: Comparison, ax_time: Any, ax_steps: Any, scale: float, unit: str, longest: float) -> None:
    """The return panels: threshold, runs without episodes, the equal-time line, titles and labels."""
    for ax in (ax_time, ax_steps):
        if cmp.threshold is not None:
            ax.axhline(cmp.threshold, color="0.35", ls="--", lw=1)
            ax.annotate(f"threshold {fmt_return(cmp.threshold)}", (0.01, cmp.threshold),
                        xycoords=("axes fraction", "data"), xytext=(0, 3), textcoords="offset points",
                        fontsize=9, color="0.3")
        ax.set_ylabel(f"mean episodic return ({return_window(cmp)})")
        missing = [s.label for s in cmp.stats if s.final_return is None]
        if missing:
            ax.text(0.99, 0.02, f"{NO_EPISODES}: {', '.join(missing)}", transform=ax.transAxes,
                    ha="right", va="bottom", fontsize=9, color="0.3")
    ax_time.axvline(cmp.equal_time / scale, color="0.35", ls=":", lw=1.2)
    right_side = cmp.equal_time < 0.3 * longest  # keep the label inside the axes
    ax_time.annotate(f"equal time {fmt_duration(cmp.equal_time)}", (cmp.equal_time / scale, 0.98),
                     xycoords=("data", "axes fraction"), xytext=(6 if right_side else -10, 0),
                     textcoords="offset points", ha="left" if right_side else "right", va="top",
                     fontsize=9, color="0.3")
    ax_time.set(title="Return vs wall time (circles: return at equal time)", xlabel=f"wall time ({unit})")
    ax_steps.set(title="Return vs env steps (sample efficiency)", xlabel="env steps")
    ax_steps.xaxis.set_major_formatter(FuncFormatter(_count))


def _decorate_sps(cmp: Comparison, ax_sps: Any, unit: str) -> None:
    ax_sps.set(title="Throughput over time", xlabel=f"wall time ({unit})", ylabel="env steps per second")
    ax_sps.set_ylim(0, max(float(np.max(r.metrics["sps"])) for r in cmp.runs) * 1.3)
    ax_sps.yaxis.set_major_formatter(FuncFormatter(_count))
    ax_sps.legend(handles=[Line2D([], [], color="0.3", lw=0.8, alpha=0.4, label="per update"),
                           Line2D([], [], color="0.3", lw=1.8, label="rolling median"),
                           Line2D([], [], color="0.3", lw=1, ls="--", label="steady-state SPS (table)")],
                  loc="upper center", ncol=3, fontsize=9)


def _decorate_resources(cmp: Comparison, ax_res: Any, ax_mem: Any, unit: str, mem_col: str, mem_gb: bool) -> None:
    cores = max((s.logical_cores or 0) for s in cmp.stats)
    if cores:
        ax_res.axhline(cores, color="0.35", ls=":", lw=1)
    ax_res.set(title="CPU and memory over time", xlabel=f"wall time ({unit})",
               ylabel="CPU cores busy (1 = one core)")
    ax_res.set_ylim(0, max(cores, max(float(np.max(r.metrics["cpu_percent"])) for r in cmp.runs) / 100) * 1.3)
    ax_mem.set_ylabel(f"memory of all processes, {'PSS' if mem_col == 'pss_mb' else 'RSS'} "
                      f"({'GB' if mem_gb else 'MB'})")
    mem_top = max(float(np.max(r.metrics[mem_col])) for r in cmp.runs)
    ax_mem.set_ylim(0, mem_top / (1024 if mem_gb else 1) * 1.4)
    ax_mem.legend(handles=[Line2D([], [], color="0.3", lw=1.8, label="CPU (left axis)"),
                           Line2D([], [], color="0.3", lw=1.5, ls="--", label="memory (right axis)"),
                           Line2D([], [], color="0.35", lw=1, ls=":", label=f"{cores} logical cores")],
                  loc="upper center", ncol=3, fontsize=9)


def plot_phases(cmp: Comparison) -> bytes:
    """phase_breakdown.png: stacked bars per run, seconds per 1,000 env steps and share of wall time."""
    n = len(cmp.stats)
    fig = Figure(figsize=(14, 2.2 + 0.75 * n), layout="constrained")
    ax_abs, ax_rel = fig.subplots(1, 2, sharey=True)
    fig.suptitle("Where the time goes (phase times from metrics.csv)", fontsize=14, fontweight="bold")
    y = np.arange(n)
    left_abs = np.zeros(n)
    left_rel = np.zeros(n)
    totals = np.array([sum(s.phase_seconds.values()) or 1.0 for s in cmp.stats])
    per_k = np.array([1000 / s.total_env_steps for s in cmp.stats])
    for phase in PHASE_NAMES:
        secs = np.array([s.phase_seconds[phase] for s in cmp.stats])
        width_abs, width_rel = secs * per_k, 100 * secs / totals
        ax_abs.barh(y, width_abs, left=left_abs, color=PHASE_COLORS[phase], edgecolor="white", height=0.6)
        bars = ax_rel.barh(y, width_rel, left=left_rel, color=PHASE_COLORS[phase], edgecolor="white",
                           height=0.6)
        labels = [f"{w:.0f}%" if w >= 6 else "" for w in width_rel]
        ax_rel.bar_label(bars, labels=labels, label_type="center", fontsize=9)
        left_abs += width_abs
        left_rel += width_rel
    for i, total in enumerate(left_abs):
        ax_abs.annotate(f"{total:.3g} s", (total, i), xytext=(4, 0), textcoords="offset points",
                        va="center", fontsize=9)
    ax_abs.set_yticks(y, [run_name(s).replace(" (", "\n(") for s in cmp.stats])
    ax_abs.invert_yaxis()
    ax_abs.set_xlim(0, float(left_abs.max()) * 1.15)
    ax_abs.set(title="Seconds per 1,000 env steps (lower is faster)", xlabel="seconds per 1,000 env steps")
    ax_rel.set(title="Share of wall time", xlabel="% of wall time", xlim=(0, 100))
    for ax in (ax_abs, ax_rel):
        ax.grid(axis="x", alpha=0.3)
    handles = [Patch(color=PHASE_COLORS[p]) for p in PHASE_NAMES]
    names = ["env step", "policy inference", "sync (waiting on workers)", "GAE", "PPO update",
             "other (publish, log, checkpoint)"]
    note = None
    if any(r.summary.mode == "parallel" for r in cmp.runs):
        note = ("parallel runs: env and inference are per-worker means (the workers run concurrently); "
                "sync is the coordinator's wait beyond that")
    fig.legend(handles, names, loc="outside lower center", ncol=len(names), fontsize=10, title=note,
               title_fontsize=9)
    return _png(fig)


# ------------------------------------------------------------------------------------------------ output
def render_outputs(cmp: Comparison) -> dict[str, bytes]:
    """Every output file's content, built in memory."""
    makers: dict[str, Callable[[Comparison], bytes]] = {
        "comparison.png": plot_comparison,
        "phase_breakdown.png": plot_phases,
        "comparison_report.txt": lambda c: render_text(c).encode(),
        "comparison.md": lambda c: render_markdown(c).encode(),
        "comparison.json": lambda c: (json.dumps(to_json(c), indent=2, allow_nan=False) + "\n").encode(),
    }
    if cmp.has_seeds:
        makers["learning_curves.png"] = plot_seeds
    return {name: make(cmp) for name, make in makers.items()}


def write_outputs(outputs: Mapping[str, bytes], out_dir: Path) -> list[Path]:
    """Create `out_dir` and write each file atomically (temp file + rename); returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    umask = os.umask(0)
    os.umask(umask)
    mode = 0o666 & ~umask  # what a plain open() would give (atomic_write's temp files are private, 0600)

    def writer(data: bytes) -> Callable[[BinaryIO], None]:
        def write(f: BinaryIO) -> None:
            os.fchmod(f.fileno(), mode)
            f.write(data)
        return write

    written = []
    for name, data in outputs.items():
        atomic_write(out_dir / name, writer(data))
        written.append(out_dir / name)
    return written
