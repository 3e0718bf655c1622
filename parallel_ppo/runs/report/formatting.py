"""How the report writes a duration, a return, memory, CPU use, FLOP/s and a run's machine and versions: shared
by the comparison's warnings (`numbers`), its text (`text`) and its figures (`plots`)."""

from __future__ import annotations

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
    """Achieved GFLOP/s and its share of the run's matmul peak, e.g. `152 (62%)`."""
    if summary.achieved_gflops is None:
        return "—"
    return f"{summary.achieved_gflops:,.0f} ({summary.peak_fraction:.0%})"


def describe_hardware(run: Run) -> str:
    hw = run.summary.hardware
    return (f"{hw.get('cpu_model', '?')}, {hw.get('logical_cores', '?')} logical / "
            f"{hw.get('physical_cores', '?')} physical cores, {hw.get('memory_gb', '?')} GB RAM")


def describe_versions(run: Run) -> str:
    return ", ".join(f"{k} {v}" for k, v in run.summary.versions.items() if v is not None)
