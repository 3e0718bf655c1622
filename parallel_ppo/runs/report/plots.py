"""The comparison's figures (comparison.png, phase_breakdown.png and, across seeds, learning_curves.png) and its
output files.

Everything is rendered in memory (`render_outputs`) and only then written, all or none (`write_outputs`), so a failure
never leaves a half-written comparison behind.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import textwrap
from collections.abc import Callable, Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import colormaps, rc_context
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from parallel_ppo.core.files import current_umask, new_folders, writing
from parallel_ppo.errors import ConfigError
from parallel_ppo.runs import seeds
from parallel_ppo.runs.report.formatting import NO_EPISODES, fmt_duration, fmt_return
from parallel_ppo.runs.report.numbers import PHASE_NAMES, Comparison
from parallel_ppo.runs.report.text import (
    render_markdown,
    render_text,
    report_title,
    return_window,
    run_name,
    to_json,
)

PHASE_LABELS = {"env": "env step (physics)", "render": "render (observed frames)", "inference": "policy inference",
                "sync": "sync (waiting on workers)", "gae": "GAE", "update": "PPO update",
                "other": "other (publish, log, checkpoint)"}
PHASE_COLORS = {"env": "#2ca02c", "render": "#8fd18f", "inference": "#1f77b4", "sync": "#d62728", "gae": "#9467bd",
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


def _wrapped(title: str) -> str:
    """A figure's title on at most two lines of about the figure's width, cut short with an ellipsis beyond."""
    return "\n".join(textwrap.wrap(title, 110, max_lines=2, placeholder=" …"))


def _legend_below(fig: Figure, handles: list[Any], names: list[str]) -> None:
    """The runs' legend below the panels, in as many columns (at most 4) as fit the figure's width: long labels take
    more rows rather than run off its edges."""
    FigureCanvasAgg(fig)
    for ncol in range(min(len(names), 4), 0, -1):
        legend = fig.legend(handles, names, loc="outside lower center", ncol=ncol, fontsize=11)
        if ncol == 1 or legend.get_window_extent(fig.canvas.get_renderer()).width <= fig.bbox.width:
            return
        legend.remove()


def plot_comparison(cmp: Comparison) -> bytes:
    """comparison.png: return vs wall time, return vs env steps, SPS over time, CPU and memory over time."""
    colors = _run_colors(len(cmp.runs))
    longest = max(float(r.metrics["wall_time"][-1]) for r in cmp.runs)
    scale, unit = _time_unit(longest)
    fig = Figure(figsize=(14, 9.5), layout="constrained")
    (ax_time, ax_steps), (ax_sps, ax_res) = fig.subplots(2, 2)
    fig.suptitle(_wrapped(report_title(cmp)), fontsize=14, fontweight="bold")  # the legend names every run
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
    _draw_references(cmp, ax_steps)
    _decorate_sps(cmp, ax_sps, unit)
    _decorate_resources(cmp, ax_res, ax_mem, unit, mem_col, mem_gb)
    for ax in (ax_time, ax_steps, ax_sps, ax_res):
        ax.set_xlim(left=0)
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], color=c, lw=2.5) for c in colors]
    names = [f"{run_name(s)}: {s.sps:,.0f} SPS" for s in cmp.stats]
    _legend_below(fig, handles, names)
    return _png(fig)


def plot_seeds(cmp: Comparison) -> bytes:
    """learning_curves.png: each label's mean return across seeds vs env steps and vs wall time, with its pointwise
    band (`seeds.band_name`: the range of up to 4 seeds, else the 95% bootstrap interval of the mean), and the
    equal-steps line."""
    colors = _run_colors(len(cmp.groups))
    fig = Figure(figsize=(14, 5.5), layout="constrained")
    ax_steps, ax_time = fig.subplots(1, 2)
    names_of_bands = sorted({seeds.band_name(len(g.runs)) for g in cmp.groups})
    bands = " or ".join(names_of_bands)
    title = f"Mean return across seeds (band: {bands}) of {', '.join(g.label for g in cmp.groups)}"  # cut at its end
    fig.suptitle(_wrapped(title), fontsize=13, fontweight="bold")
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
        n = len(group.runs)
        band = f", band: {seeds.band_name(n)}" if len(names_of_bands) > 1 else ""  # else the title says it
        names.append(f"{group.label} ({n} seed{'s' if n > 1 else ''}{band})")
    ax_steps.axvline(cmp.equal_steps, color="0.35", ls=":", lw=1)
    _draw_references(cmp, ax_steps)
    ax_steps.xaxis.set_major_formatter(FuncFormatter(_count))
    ax_steps.set(xlabel="env steps", ylabel=f"mean episodic return ({return_window(cmp)})",
                 title="Return vs env steps (learning per step)")
    ax_time.set(xlabel=f"wall time ({unit})", ylabel=f"mean episodic return ({return_window(cmp)})",
                title="Return vs wall time (learning per hour)")
    for ax in (ax_steps, ax_time):
        ax.grid(alpha=0.3)
    _legend_below(fig, [Line2D([], [], color=c, lw=2.5) for c in colors], names)
    return _png(fig)


REFERENCE_STYLES = (("0.1", "--"), ("0.45", "--"), ("0.1", "-."), ("0.45", "-."))
"""Colour and dash of each reference curve in turn: dark and dashed, apart from the runs' colours."""


def _draw_references(cmp: Comparison, ax: Any) -> None:
    """Each reference curve on a return-vs-env-steps panel, up to the longest run's last env steps: a dashed dark
    line, its band (where given) light, and a legend entry `LABEL (reference)` on the panel (none for a curve that
    starts after that)."""
    end = max(float(r.metrics["env_steps"][-1]) for r in cmp.runs)
    handles = []
    for i, ref in enumerate(cmp.references):
        color, dash = REFERENCE_STYLES[i % len(REFERENCE_STYLES)]
        shown = ref.env_steps <= end
        x = ref.env_steps[shown]
        if not x.size:
            continue
        ax.plot(x, ref.returns[shown], color=color, ls=dash, lw=1.8, marker="o" if len(x) < 2 else None, ms=4)
        if ref.low is not None and ref.high is not None:
            ax.fill_between(x, ref.low[shown], ref.high[shown], color=color, alpha=0.12, lw=0)
        handles.append(Line2D([], [], color=color, ls=dash, lw=1.8, label=f"{ref.label} (reference)"))
    if handles:
        ax.legend(handles=handles, loc="best", fontsize=9)


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
    names = [PHASE_LABELS[p] for p in PHASE_NAMES]
    note = None
    if any(r.summary.mode == "parallel" for r in cmp.runs):
        note = ("parallel runs: env, render and inference are per-worker means (the workers run concurrently); "
                "sync is the coordinator's wait beyond that")
    fig.legend(handles, names, loc="outside lower center", ncol=len(names), fontsize=10, title=note,
               title_fontsize=9)
    return _png(fig)


SEED_CURVES = "learning_curves.png"
"""The one output of a comparison with seeds only: one without removes an earlier comparison's from its folder."""


def render_outputs(cmp: Comparison) -> dict[str, bytes]:
    """Every output file's content, built in memory; the figures' text as written (a label's `$` is no TeX)."""
    makers: dict[str, Callable[[Comparison], bytes]] = {
        "comparison.png": plot_comparison,
        "phase_breakdown.png": plot_phases,
        "comparison_report.txt": lambda c: render_text(c).encode(),
        "comparison.md": lambda c: render_markdown(c).encode(),
        "comparison.json": lambda c: (json.dumps(to_json(c), indent=2, allow_nan=False) + "\n").encode(),
    }
    if cmp.has_seeds:
        makers[SEED_CURVES] = plot_seeds
    with rc_context({"text.parse_math": False}):
        return {name: make(cmp) for name, make in makers.items()}


def write_outputs(outputs: Mapping[str, bytes], out_dir: Path) -> list[Path]:
    """Create `out_dir` and write every file or none: a directory where a file goes is refused first (ConfigError),
    then each file goes to a temp file beside it, and the temp files are renamed into place once all are written (a
    rename that fails after others succeeded, the directory changed meanwhile, leaves those). A failed write (a full
    disk) is WriteFailed naming the file, the folders made for it removed; returns the paths written. An earlier
    comparison's learning curves, which this one has not, are removed."""
    targets = [out_dir / name for name in outputs]
    for target in targets:
        if target.is_dir():
            raise ConfigError(f"cannot write the comparison to {out_dir}: {target} is a directory in the way")
    temps: list[Path] = []
    with writing(out_dir), new_folders(out_dir):
        try:
            for target, data in zip(targets, outputs.values(), strict=True):
                with writing(target):
                    temps.append(_write_temp(target, data))
            for temp, target in zip(temps, targets, strict=True):
                with writing(target):
                    os.replace(temp, target)
        except BaseException:
            for temp in temps:
                temp.unlink(missing_ok=True)
            raise
    if SEED_CURVES not in outputs and (out_dir / SEED_CURVES).is_file():  # an earlier comparison's, which this
        with suppress(OSError):  # report would seem to include (one that stays changes no figure of this one)
            (out_dir / SEED_CURVES).unlink()
    return targets


def _write_temp(target: Path, data: bytes) -> Path:
    """`data` in a new temp file beside `target` (mode as a plain open() gives), fsynced."""
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~current_umask())  # mkstemp makes it 0600
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return Path(name)
