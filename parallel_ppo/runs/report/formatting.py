"""How the report writes a duration, a return, memory, CPU use, FLOP/s, a run's machine and versions, and a table
(in full for the files, in brief for a terminal): shared by the comparison's warnings (`numbers`), its text (`text`)
and its figures (`plots`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from parallel_ppo.runs.reading import Run
from parallel_ppo.runs.summary import RunSummary

NO_EPISODES = "no episodes finished"


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
    """Achieved GFLOP/s and its share of the run's matmul peak, e.g. `152 (62%)`, `0.85 (0%)` (`152` where the peak
    was not measured)."""
    if summary.achieved_gflops is None:
        return "—"
    gflops, share = summary.achieved_gflops, summary.peak_fraction
    return (f"{gflops:,.0f}" if gflops >= 100 else f"{gflops:.3g}") + ("" if share is None else f" ({share:.0%})")


def fmt_flop(count: float, per: str = "") -> str:
    """FLOPs (a rate with `per="/s"`) in the unit that shows them: `0.61 GFLOP`, `43.5 MFLOP`, `810 FLOP`."""
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(count) >= 0.1 * scale:
            value = count / scale
            return f"{value:,.0f} {prefix}FLOP{per}" if abs(value) >= 100 else f"{value:.3g} {prefix}FLOP{per}"
    return f"{count:.0f} FLOP{per}"


def describe_hardware(run: Run, kind: bool = True, family: bool = True) -> str:
    """CPU model (and kind: `avx512`, `bf16`, unless `kind` is False; and x86 family/model, unless `family` is False),
    cores and memory of the run's machine."""
    hw = run.summary.hardware
    parts = list(hw.get("cpu_kind") or []) if kind else []
    if family and hw.get("cpu_family"):
        parts.append(f"family {hw['cpu_family']}")
    flags = f" ({', '.join(parts)})" if parts else ""
    return (f"{hw.get('cpu_model', '?')}{flags}, {hw.get('logical_cores', '?')} logical / "
            f"{hw.get('physical_cores', '?')} physical cores, {hw.get('memory_gb', '?')} GB RAM")


def describe_versions(run: Run) -> str:
    return ", ".join(f"{k} {v}" for k, v in run.summary.versions.items() if v is not None)


@dataclass(frozen=True)
class Table:
    """Cells as strings; the first `left` columns are text (left-aligned), the rest numbers. A header cell may hold
    a line break: the text table prints it on two lines, markdown on one."""

    header: list[str]
    rows: list[list[str]]
    left: int = 1

    def text(self) -> str:
        depth = max(h.count("\n") + 1 for h in self.header)
        heads = [[""] * (depth - h.count("\n") - 1) + h.split("\n") for h in self.header]
        widths = [max(len(c) for c in [*heads[i], *(r[i] for r in self.rows)]) for i in range(len(self.header))]

        def line(cells: list[str]) -> str:
            return "  ".join(c.ljust(w) if i < self.left else c.rjust(w)
                             for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

        return "\n".join([*(line([h[k] for h in heads]) for k in range(depth)), "  ".join("-" * w for w in widths),
                          *map(line, self.rows)])

    def markdown(self) -> str:
        align = ["---" if i < self.left else "---:" for i in range(len(self.header))]
        return "\n".join("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"
                         for cells in [self.header, align, *self.rows])

    def without(self, names: Sequence[str]) -> Table:
        """The table less the columns whose header is in `names`."""
        keep = [i for i, h in enumerate(self.header) if h not in names]
        return Table([self.header[i] for i in keep], [[r[i] for i in keep] for r in self.rows],
                     sum(i < self.left for i in keep))

    def width(self) -> int:
        return max(map(len, self.text().splitlines()))


CONSOLE_WIDTH = 120
CONSOLE_LEAVES_OUT = ("normalized", "GFLOP/s", "peak", "CPU cores busy")
"""Columns (header prefixes) only the report files show: the console table is the comparison in brief."""
CONSOLE_DROPS = ("mode", "test return", "wall time", "env steps", "time to", "success")
"""Further columns left out, in this order, while the console table is wider than `CONSOLE_WIDTH` (the success rate,
where an env reports one, last)."""
BREAKS = {"workers×envs": "workers\n×envs"}


def _two_lines(header: str) -> str:
    """A header of more than 8 characters broken at its space nearest the middle."""
    spaces = [i for i, c in enumerate(header) if c == " "]
    if header in BREAKS or len(header) <= 8 or not spaces:
        return BREAKS.get(header, header)
    cut = min(spaces, key=lambda i: abs(i - len(header) / 2))
    return f"{header[:cut]}\n{header[cut + 1:]}"


def for_console(full: Table, leave_out: Sequence[str] = CONSOLE_LEAVES_OUT,
                drops: Sequence[str] = CONSOLE_DROPS) -> tuple[Table, list[str]]:
    """`full` for a terminal, headers on two lines: less the columns `leave_out` names, then less those `drops`
    names, in order, while wider than `CONSOLE_WIDTH`; and the headers of the columns left out."""
    gone = [h for h in full.header if h.startswith(tuple(leave_out))]
    candidates = [h for name in drops for h in full.header if h.startswith(name) and h not in gone]
    while True:
        kept = full.without(gone)
        table = Table([_two_lines(h) for h in kept.header], kept.rows, kept.left)
        if table.width() <= CONSOLE_WIDTH or not candidates:
            return table, gone
        gone.append(candidates.pop(0))
