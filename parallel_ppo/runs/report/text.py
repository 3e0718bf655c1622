"""The comparison in words: its tables, verdict and definitions, rendered as the text report, the markdown
report, the JSON and the console summary, and the names the figures share with them (`run_name`,
`report_title`, `return_window`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from parallel_ppo.runs import seeds
from parallel_ppo.runs.figures import SPEEDUP_DEFINITION
from parallel_ppo.runs.report.formatting import (
    NO_EPISODES,
    Table,
    describe_hardware,
    describe_versions,
    fmt_cpu,
    fmt_duration,
    fmt_flops,
    fmt_memory,
    fmt_return,
    for_console,
)
from parallel_ppo.runs.report.numbers import PHASE_NAMES, Comparison, RunStats, finite
from parallel_ppo.runs.report.references import console_lines, reference_note, reference_table, references_json


def run_name(s: RunStats) -> str:
    """`label (W×M envs)`, with the mode too when the label does not already say it."""
    mode = "" if s.label == s.mode else f"{s.mode}, "
    return f"{s.label} ({mode}{s.layout} envs)"


def report_title(cmp: Comparison) -> str:
    """The reports' and comparison.png's title: the games and the labels."""
    envs = sorted({r.summary.env_id for r in cmp.runs})
    return f"PPO timed runs compared on {', '.join(envs)}: {', '.join(s.label for s in cmp.stats)}"


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
    extra = [(name, key) for name, key in (("normalized", "normalized_return"), ("test return", "test_return"),
                                           ("success", "success_rate"))
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
            row.insert(9, _extra_cell(key, value))
        if with_flops:
            row.insert(header.index("GFLOP/s (of peak)"), fmt_flops(run.summary))
        rows.append(row)
    return Table(header, rows, left=2)


def _extra_cell(key: str, value: float | None) -> str:
    """A cell of the optional return columns: normalized score, test return or success rate."""
    if value is None:
        return "—"
    if key == "normalized_return":
        return f"{value:.3f}"
    return f"{value:.0%}" if key == "success_rate" else fmt_return(value)


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
        if len(cmp.envs) > 1:
            sentence = speed
        elif mine is None and theirs is None:
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
    if len(cmp.envs) > 1:
        lines.append(envs_apart(cmp))
    elif finished:
        best = max(finished, key=lambda s: s.final_return or 0.0)
        lines.append(f"Best final return: {fmt_return(best.final_return)} by {best.label} "
                     f"after {best.total_env_steps:,} env steps in {fmt_duration(best.wall_seconds)}.")
    else:
        lines.append("No run finished an episode, so returns cannot be compared.")
    return lines


def envs_apart(cmp: Comparison) -> str:
    """The verdict's line where the runs train several envs, whose returns it does not compare."""
    return f"Returns are not compared: the runs train different envs ({', '.join(cmp.envs)})."


def seed_figure_names(cmp: Comparison) -> dict[str, str]:
    return {f: seeds.figure_name(f).format(steps=f"{cmp.equal_steps:,.0f}", time=fmt_duration(cmp.equal_time))
            for f in [*seeds.FIGURES, *seeds.shown_figures(cmp.group_stats)]}


def seed_table(cmp: Comparison) -> Table:
    """One row per label: seeds and what its intervals are, then each figure's mean, IQM and interval across seeds
    (the range of the seeds, or the 95% bootstrap interval of the IQM: `seeds.Estimate`)."""
    names = seed_figure_names(cmp)
    kinds = {g.interval for g in cmp.group_stats}
    word = f"{seeds.LEVEL:.0%} CI" if kinds == {seeds.CI} else "range" if kinds == {seeds.RANGE} else "interval"
    header = ["label", "seeds", "interval"]
    shown = seeds.shown_figures(cmp.group_stats)
    for figure in shown:
        header += [f"{names[figure]}: mean", "IQM", word]
    rows = []
    for g in cmp.group_stats:
        row = [g.label, str(g.seeds), g.interval]
        for figure in shown:
            est = g.figure(figure)
            row += ["-", "-", "-"] if est is None else [
                seeds.num(est.mean), seeds.num(est.iqm), f"[{seeds.num(est.low)}, {seeds.num(est.high)}]"]
        rows.append(row)
    return Table(header, rows, left=3)


SEED_CELLS = (f"mean [{seeds.RANGE}] up to {seeds.MIN_CI_SEEDS - 1} seeds, IQM [{seeds.CI}] from "
              f"{seeds.MIN_CI_SEEDS}")


def console_seed_table(cmp: Comparison) -> Table:
    """`seed_table` in brief: one cell per figure, `seeds.short` (see `SEED_CELLS`)."""
    names = seed_figure_names(cmp)
    shown = seeds.shown_figures(cmp.group_stats)
    rows = [[g.label, f"{g.seeds}, {'range' if g.interval == seeds.RANGE else f'{seeds.LEVEL:.0%} CI'}",
             *(seeds.short(g.figure(f)) for f in shown)] for g in cmp.group_stats]
    return Table(["label", "seeds", *(names[f] for f in shown)], rows, left=2)


def seed_verdict(cmp: Comparison) -> list[str]:
    """Per figure, the best label against each other one (`seeds.differences`): a difference is named only between
    labels of 5 seeds or more whose 95% intervals do not overlap; SPS alone where the runs train different envs."""
    names = seed_figure_names(cmp)
    figures = seeds.shown_figures(cmp.group_stats)
    mixed = len(cmp.envs) > 1  # one env's returns (and success, episode statistics) against another's mean nothing
    lines = [line for figure in (["sps"] if mixed else figures)
             for line in seeds.differences(cmp.group_stats, figure, names[figure])]
    if mixed:
        lines.append(envs_apart(cmp))
    return lines or ["Too few labels with the figures to compare across seeds."]


def seed_definitions(cmp: Comparison) -> list[str]:
    n = seeds.MIN_CI_SEEDS
    return [
        "Across seeds: each label's runs are distinct seeds of one config (a label repeating a seed is refused). "
        "Mean and interquartile mean (IQM: the mean of the middle half, the lowest and highest quarter dropped, "
        f"as rliable). Return @ {cmp.equal_steps:,.0f} steps: each run's mean return at its last update by that "
        "many env steps.",
        f"Intervals: with {n} seeds or more, the {seeds.LEVEL:.0%} percentile bootstrap interval of the IQM "
        f"({seeds.RESAMPLES:,} resamples of each label's own seeds, rliable's stratified bootstrap with one task); "
        f"the verdict names a difference only where two labels' intervals do not overlap, and overlapping ones "
        f"mean no difference was shown, not that there is none. With {n - 1} seeds or fewer, the range of the "
        "seeds (min to max): a percentile bootstrap of 2 or 3 seeds is exactly that range, and of 4 nearly, so it "
        f"is no {seeds.LEVEL:.0%} interval and no difference is claimed from it: run {seeds.MORE_SEEDS}.",
    ]


def _reached(s: RunStats) -> str:
    return "not reached" if s.time_to_threshold is None else fmt_duration(s.time_to_threshold)


def return_window(cmp: Comparison) -> str:
    """`last 100 episodes`: the rolling window the runs' returns are averaged over (logging.return_window)."""
    windows = sorted({r.config.logging.return_window for r in cmp.runs})
    return f"last {'/'.join(map(str, windows))} episodes"


def definitions(cmp: Comparison) -> list[str]:
    to_return = (f"Time to threshold: none; {cmp.threshold_source.removeprefix('none: ')}." if cmp.threshold is None
                 else "Time to return: wall time of the first update whose mean return reached "
                 f"{fmt_return(cmp.threshold)} ({cmp.threshold_source}).")
    return [
        f"Baseline: {cmp.baseline}. {SPEEDUP_DEFINITION[0].upper()}{SPEEDUP_DEFINITION[1:]}.",
        f"Final return: the mean episodic return of the {return_window(cmp)} (summary.json). Normalized: "
        "(R - R_min) / (R_max - R_min) with the Procgen paper's easy-mode constants "
        "(parallel_ppo/envs/procgen_envs.py). "
        "Test return: the run's last evaluation (eval config), on held-out test levels unless it says otherwise. "
        "Success: of the training episodes in the last return window whose env reported success (info is_success), "
        "the fraction that succeeded.",
        f"Return @ {fmt_duration(cmp.equal_time)}: episodic_return_mean in each run's last metrics row at or "
        f"before {cmp.equal_time:.1f} s, the shortest run's logged duration.",
        to_return,
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


def console_summary(cmp: Comparison, written: Sequence[Path]) -> str:
    """What compare_results.py prints: the tables in brief (`for_console`), the verdict, the warnings, and the
    files written."""
    brief, gone = for_console(table(cmp))
    lines = [brief.text(), *([f"(also in comparison.md: {', '.join(gone)})"] if gone else []), ""]
    if cmp.has_seeds:  # too wide, it drops the episode statistics first, SPS last
        order = ("return_at_equal_time", "success_rate", "sps")
        figures = sorted(seeds.shown_figures(cmp.group_stats)[2:], key=lambda f: order.index(f) if f in order else -1)
        across, left_out = for_console(console_seed_table(cmp), (), [seed_figure_names(cmp)[f] for f in figures])
        lines += [f"Across seeds ({SEED_CELLS}):", across.text(),
                  *([f"(also in comparison.md: {', '.join(left_out)})"] if left_out else []), ""]
    lines += [*(f"  {line}" for line in [*verdict(cmp), *console_lines(cmp)]),
              *(f"  warning: {line}" for line in cmp.warnings)]
    if written:
        lines += ["", f"wrote {', '.join(p.name for p in written)} to {written[0].parent}"]
    return "\n".join(lines) + "\n"


def _sections(cmp: Comparison) -> list[tuple[str, str, Any]]:
    """The report as (title, kind, content) with kind `table`, `noted table` (a table and a sentence), `list` or
    `figures`; rendered as text or markdown."""
    warnings = cmp.warnings or ["none: same hardware, versions, config (apart from the parallel layout) "
                                "and duration"]
    across = [("Across seeds", "table", seed_table(cmp))]
    bands = " or ".join(sorted({seeds.band_name(g.seeds) for g in cmp.group_stats}))
    figures = [("learning_curves.png", f"mean return vs env steps and vs wall time across seeds, band: {bands}")
               ] if cmp.has_seeds else []
    return [
        *(across if cmp.has_seeds else []),
        ("Results", "table", table(cmp)),
        *([("References", "noted table", (reference_table(cmp), reference_note(cmp)))] if cmp.references else []),
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


def render_text(cmp: Comparison) -> str:
    parts = [report_title(cmp), "=" * len(report_title(cmp))]
    for title, kind, content in _sections(cmp):
        parts += ["", title, "-" * len(title)]
        if kind == "table":
            parts.append(content.text())
        elif kind == "noted table":
            parts += [content[0].text(), "", content[1]]
        elif kind == "list":
            parts += [f"- {item}" for item in content]
        else:
            parts += [f"- {name}: {what}" for name, what in content]
    return "\n".join(parts) + "\n"


def render_markdown(cmp: Comparison) -> str:
    parts = [f"# {report_title(cmp)}"]
    for title, kind, content in _sections(cmp):
        parts += ["", f"## {title}", ""]
        if kind == "table":
            parts.append(content.markdown())
        elif kind == "noted table":
            parts += [content[0].markdown(), "", content[1]]
        elif kind == "list":
            parts += [f"- {item}" for item in content]
        else:
            for name, what in content:
                parts += [f"{name}: {what}", "", f"![{what}]({name})", ""]
    return "\n".join(parts).rstrip() + "\n"


def to_json(cmp: Comparison) -> dict[str, Any]:
    """Every number in the table (unrounded), the reference points, warnings, verdict and reference curves."""
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
            "test_return": s.test_return, "success_rate": s.success_rate,
            "test_normalized_return": run.summary.test_normalized_return,
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
    return finite({
        "baseline": cmp.baseline, "speedup_definition": SPEEDUP_DEFINITION,
        "equal_wall_time_seconds": cmp.equal_time, "return_threshold": cmp.threshold,
        "threshold_source": cmp.threshold_source, "runs": runs, "verdict": verdict(cmp),
        "warnings": cmp.warnings, "references": references_json(cmp), **(_seeds_json(cmp) if cmp.has_seeds else {}),
    })


def _seeds_json(cmp: Comparison) -> dict[str, Any]:
    labels = []
    for group, g in zip(cmp.groups, cmp.group_stats, strict=True):
        figures = {f: None if g.figure(f) is None else vars(g.figure(f)) for f in [*seeds.FIGURES, *g.episode_info]}
        labels.append({"label": g.label, "seeds": g.seeds, "interval": g.interval,
                       "runs": [r.label for r in group.runs], **figures})
    return {"across_seeds": {"equal_env_steps": cmp.equal_steps, "min_seeds_for_ci": seeds.MIN_CI_SEEDS,
                             "confidence_level": seeds.LEVEL, "bootstrap_resamples": seeds.RESAMPLES,
                             "labels": labels}}
