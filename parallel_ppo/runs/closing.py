"""A run's closing lines and exit status, read from its summary (summary.json's fields): what the console prints
once a run has ended, for the command lines and the Python API alike."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from parallel_ppo.core.config import Config
from parallel_ppo.runs.report.formatting import fmt_flop
from parallel_ppo.runs.summary import ERROR_TRACE

ONE_SLOWEST_SHARE = 0.8
"""The share of a run's rollouts one worker must be the slowest of for the run to name it: by chance, with two
workers, 16 or more of 20 rollouts happen about once in 85 runs, and far less often over more rollouts or workers."""
MIN_ROLLOUTS = 20
"""Rollouts counted before a run names a worker the slowest."""


def one_slowest_line(record: dict[str, Any] | None, distributed: bool = False) -> str | None:
    """A closing line for a run whose rollouts kept waiting for the same worker (`ONE_SLOWEST_SHARE` of at least
    `MIN_ROLLOUTS`, `record` being summary.json's `worker_pace`: rank 0's workers' in a `distributed` run, where no
    setting cuts a worker short), else None."""
    if record is None or record["rollouts"] < MIN_ROLLOUTS or record["slowest_share"] < ONE_SLOWEST_SHARE:
        return None
    worker = max(range(len(record["slowest"])), key=record["slowest"].__getitem__)
    who, cut = ("rank 0's worker", "") if distributed else ("worker", "; parallel.sync_fraction below 1, without "
                                                              "parallel.early_start, cuts the slowest short instead "
                                                              "of waiting")
    return (f"{who} {worker} was the slowest in "
            f"{record['slowest_share']:.0%} of {record['rollouts']} rollouts (at its pace the slowest would take "
            f"{record['slowest_excess_seconds']:.3g} s a rollout more than the mean worker): a core it shares with "
            f"another job, or slower envs, would do that (summary.json's worker_pace{cut})")


def end_lines(cfg: Config, run_dir: Path, summary: dict[str, Any]) -> list[str]:
    """The closing lines of a run (those starting `warning:` or `error:` go to stderr)."""
    ret, sps = summary["episodic_return_mean"], summary["sps"]
    window = min(summary["episodes"], cfg.logging.return_window)
    lines = [f"{summary['stop_reason']} after {summary['total_env_steps']:,} steps in {summary['wall_seconds']:.0f} s "
             f"({'n/a' if sps is None else f'{sps:.0f}'} SPS); mean return {'n/a' if ret is None else f'{ret:.2f}'} "
             f"over the last {window} episodes"]
    if (success := (summary.get("final_metrics") or {}).get("success_rate")) is not None:
        lines.append(f"success rate {success:.0%} (of the recent episodes whose env reported success)")
    if summary["normalized_return"] is not None:
        lines.append(f"normalized return {summary['normalized_return']:.3f} (Procgen easy-mode constants)")
    if summary["test_return_mean"] is not None:
        norm, gap = summary["test_normalized_return"], summary["generalization_gap"]
        lines.append(f"evaluation on {summary['eval_levels']} levels: mean return {summary['test_return_mean']:.2f}"
                     + ("" if norm is None else f" (normalized {norm:.3f})")
                     + ("" if gap is None else f"; generalization gap {gap:.2f}"))
    if summary["limit_efficiency"] is not None:
        lines.append(f"{100 * summary['limit_efficiency']:.0f}% of this machine's compute limit "
                     f"({summary['compute_limit']['limit_sps']:.0f} SPS, measured before the run)")
    if summary["achieved_gflops"] is not None:
        lines.append(f"{fmt_flop(summary['achieved_gflops'] * 1e9, '/s')} achieved "
                     f"({fmt_flop(summary['flops_per_env_step'])} per env step), {100 * summary['peak_fraction']:.0f}% "
                     f"of the {summary['precision']} matmul peak ({summary['peak_gflops']:.0f} GFLOP/s)")
    if (slowest := one_slowest_line(summary["worker_pace"], bool(summary["distributed"]))) is not None:
        lines.append(slowest)
    checksums = {r["checksum"] for r in (summary["distributed"] or {}).get("ranks", [])}
    if len(checksums) > 1:
        lines.append(f"warning: the ranks ended with different parameters (checksums {', '.join(sorted(checksums))} "
                     "in summary.json); please report it with the ranks' hosts")
    if summary["stop_reason"] == "error":
        trace = f"; its traceback in {ERROR_TRACE}" if (run_dir / ERROR_TRACE).is_file() else ""
        lines.append(f"error: {summary['error']} (checkpoint and summary written to {run_dir}{trace})")
    return lines


def exit_status(summary: dict[str, Any]) -> int:
    """1 after an error, 128 + N after signal N, else 0."""
    if summary["stop_reason"] == "error":
        return 1
    if summary["stop_reason"] == "signal":
        return 128 + signal.Signals[summary["signal"]].value
    return 0
