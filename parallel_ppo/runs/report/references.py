"""The reference curves in words (`--reference`): each one's row logged last by the comparison's equal env steps, as
the reports' "References" table, comparison.json's `references` and the console's lines. A reference is a published
curve, not a run: it has no wall time or speed, so only its return at equal env steps is shown."""

from __future__ import annotations

from typing import Any

from parallel_ppo.runs.reference import Reference, Row, row_at
from parallel_ppo.runs.report.formatting import Table, fmt_return
from parallel_ppo.runs.report.numbers import Comparison


def _rows(cmp: Comparison) -> list[tuple[Reference, Row | None]]:
    return [(ref, row_at(ref, cmp.equal_steps)) for ref in cmp.references]


def _span(ref: Reference) -> str:
    return f"its curve spans {ref.env_steps[0]:,.0f} to {ref.env_steps[-1]:,.0f} env steps"


def _band(row: Row) -> str:
    return "-" if row.low is None or row.high is None else f"{fmt_return(row.low)} to {fmt_return(row.high)}"


def reference_table(cmp: Comparison) -> Table:
    """One row per reference: its file and its row logged last by `cmp.equal_steps` ("-" where its curve does not
    span them)."""
    rows = [[ref.label, str(ref.path), *(["-", "-", "-"] if row is None else
             [f"{row.env_steps:,.0f}", fmt_return(row.episodic_return_mean), _band(row)])]
            for ref, row in _rows(cmp)]
    return Table(["reference", "file", f"env steps (its row by {cmp.equal_steps:,.0f})", "return", "band"], rows,
                 left=2)


def reference_note(cmp: Comparison) -> str:
    """The sentence under the table: what a reference is and where it is compared."""
    unspanned = [f"{ref.label}: {_span(ref)}" for ref, row in _rows(cmp) if row is None]
    return ("A reference is a published learning curve, not a run made here: it has no wall time and no speed, so "
            f"it is compared with the runs only by its return at equal env steps ({cmp.equal_steps:,.0f}: the row "
            "logged last by then, as for the runs)." + (f" Not logged there ({'; '.join(unspanned)})."
                                                       if unspanned else ""))


def references_json(cmp: Comparison) -> list[dict[str, Any]]:
    """comparison.json's `references`: each one's label, file, span and row logged last by `cmp.equal_steps` (null
    where its curve does not span them)."""
    return [{"label": ref.label, "file": str(ref.path), "compared_at_env_steps": cmp.equal_steps,
             "first_env_steps": float(ref.env_steps[0]), "last_env_steps": float(ref.env_steps[-1]),
             "env_steps": None if row is None else row.env_steps,
             "episodic_return_mean": None if row is None else row.episodic_return_mean,
             "return_low": None if row is None else row.low, "return_high": None if row is None else row.high}
            for ref, row in _rows(cmp)]


def console_lines(cmp: Comparison) -> list[str]:
    """One line per reference for the console summary."""
    return [f"reference {ref.label} ({ref.path}, a published curve, not run here): " + (
        f"not logged at {cmp.equal_steps:,.0f} env steps ({_span(ref)})" if row is None else
        f"return {fmt_return(row.episodic_return_mean)} at {row.env_steps:,.0f} env steps (its row by "
        f"{cmp.equal_steps:,.0f}), band {_band(row)}") for ref, row in _rows(cmp)]
