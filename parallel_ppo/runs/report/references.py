"""The reference curves in words (`--reference`): each one's row nearest the comparison's equal env steps, as the
reports' "References" table, comparison.json's `references` and the console's lines. A reference is a published
curve, not a run: it has no wall time or speed, so only its return at equal env steps is shown."""

from __future__ import annotations

from typing import Any

from parallel_ppo.runs.reference import Reference, Row, nearest_row
from parallel_ppo.runs.report.formatting import Table, fmt_return
from parallel_ppo.runs.report.numbers import Comparison


def _nearest(cmp: Comparison) -> list[tuple[Reference, Row]]:
    return [(ref, nearest_row(ref, cmp.equal_steps)) for ref in cmp.references]


def _band(row: Row) -> str:
    return "-" if row.low is None or row.high is None else f"{fmt_return(row.low)} to {fmt_return(row.high)}"


def reference_table(cmp: Comparison) -> Table:
    """One row per reference: its file and its row nearest `cmp.equal_steps`."""
    rows = [[ref.label, str(ref.path), f"{row.env_steps:,.0f}", fmt_return(row.episodic_return_mean), _band(row)]
            for ref, row in _nearest(cmp)]
    return Table(["reference", "file", f"env steps (row nearest {cmp.equal_steps:,.0f})", "return", "band"], rows,
                 left=2)


def reference_note(cmp: Comparison) -> str:
    return ("A reference is a published learning curve, not a run made here: it has no wall time and no speed, so "
            f"it is compared with the runs only by its return at equal env steps ({cmp.equal_steps:,.0f}, the row "
            "nearest them).")


def references_json(cmp: Comparison) -> list[dict[str, Any]]:
    """comparison.json's `references`: each one's label, file and row nearest `cmp.equal_steps`."""
    return [{"label": ref.label, "file": str(ref.path), "compared_at_env_steps": cmp.equal_steps,
             "env_steps": row.env_steps, "episodic_return_mean": row.episodic_return_mean, "return_low": row.low,
             "return_high": row.high} for ref, row in _nearest(cmp)]


def console_lines(cmp: Comparison) -> list[str]:
    """One line per reference for the console summary."""
    return [f"reference {ref.label} ({ref.path}, a published curve, not run here): return "
            f"{fmt_return(row.episodic_return_mean)} at {row.env_steps:,.0f} env steps (the row nearest "
            f"{cmp.equal_steps:,.0f}), band {_band(row)}" for ref, row in _nearest(cmp)]
