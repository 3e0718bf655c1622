#!/usr/bin/env python
"""Learning runs over seeds, as evidence: each label's seeds' final return, success (where the env reports it) and
entropy (their last metrics.csv row), and a table of their mean and range at given env steps (each seed's row
nearest the step), written into an evidence file under a name (figures `<name>_<label>_...`, table `<name>`).

    .venv/bin/python scripts/seed_table.py docs/results/<machine>/overlap.json lift_seeds \\
        --steps 100000,200000,300000,400000,500000 --command "how the runs were made" \\
        synchronous=docs/results/<machine>/runs/lift_overlap/synchronous overlapped=...

A LABEL=DIR names a parent of seed runs or one run (as compare_results takes them). Each seed's first env steps at
a success rate of 0.5 and of 0.8 (in a metrics.csv row: one update's window) are figures, where the env reports
success (`..._first_success_50_steps`, null where a seed never got there), and with `--return-target R` its first
env steps at a mean return of R (`..._first_return_R_steps`). Where the runs logged them, the policy lag, the lagged
share (`parallel.overlap`) and the share of the steps cut (`rollout_cut`, `sync_fraction`) are figures too. A mean
and a range are of the seeds whose figure is a number (whose episodes had ended). With `--until N`, each run is read
up to N env steps only (its final figures are its last row by then), so that runs of different lengths are compared
at one point.
Bad input, or a run that ends before the table's last step or N: one line, exit status 2.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from parallel_ppo.cli.common import OneLineParser  # noqa: E402
from parallel_ppo.core.files import read_evidence, write_text  # noqa: E402
from parallel_ppo.errors import ConfigError, RunDataError  # noqa: E402
from parallel_ppo.runs import fingerprint  # noqa: E402
from parallel_ppo.runs.figures import logged_by  # noqa: E402
from parallel_ppo.runs.reading import Run, load_groups, parse_run_spec  # noqa: E402

SHOWN = {"return": "episodic_return_mean", "success": "success_rate", "entropy": "entropy"}
"""What the table and the final figures show, by metrics.csv column."""
PLURAL = {"return": "returns", "success": "successes", "entropy": "entropies"}
SUCCESS_MARKS = (0.5, 0.8)
"""Success rates whose first env steps are figures."""


def rounded(value: float, digits: int) -> float | None:
    return None if math.isnan(value) else round(float(value), digits)


def at(run: Run, column: str, steps: int | None = None) -> float:
    """The column's value in the run's last row, or in its row nearest `steps` (NaN where the run has no such
    column)."""
    values = run.metrics.get(column)
    if values is None:
        return math.nan
    row = len(values) - 1 if steps is None else int(np.abs(run.metrics["env_steps"] - steps).argmin())
    return float(values[row])


def first_reached(run: Run, value: float, column: str = "success_rate") -> int | None:
    """The env steps of the run's first row whose `column` is `value` or more (None where none is)."""
    hits = np.flatnonzero(run.metrics.get(column, np.array([])) >= value)
    return int(run.metrics["env_steps"][hits[0]]) if hits.size else None


def cut(run: Run, steps: int) -> Run:
    """The run as read up to `steps` env steps: its metrics rows by then (none: RunDataError)."""
    last = logged_by(run.metrics["env_steps"], steps)
    if last < 0:
        raise RunDataError(f"{run.path} logged no update by --until {steps:,}")
    return dataclasses.replace(run, metrics={name: values[:last + 1] for name, values in run.metrics.items()})


def number(value: float) -> str:
    """`value` as a figure's name takes it: no exponent, no trailing zeros (475, 0.5, 1000000)."""
    return f"{value:f}".rstrip("0").rstrip(".")


def cuts_stragglers(run: Run) -> bool:
    """Whether the run cut its slowest workers' or ranks' rollouts short (a `sync_fraction` below 1)."""
    return run.config.parallel.sync_fraction < 1 or run.config.distributed.sync_fraction < 1


def spread(values: list[float], digits: int) -> tuple[float | None, str]:
    """The mean and `low to high` of the values that are numbers (an episode had ended), to `digits` decimals;
    None and n/a where none is."""
    numbers = [v for v in values if not math.isnan(v)]
    if not numbers:
        return None, "n/a"
    return round(float(np.mean(numbers)), digits), f"{min(numbers):.{digits}f} to {max(numbers):.{digits}f}"


def reports_success(runs: list[Run]) -> bool:
    """Whether the runs' env reports success: some metrics row has a success rate."""
    return any(np.isfinite(r.metrics.get("success_rate", np.array([]))).any() for r in runs)


def label_figures(name: str, label: str, runs: list[Run], target: float | None = None) -> dict[str, object]:
    """A label's final figures over its seeds (success only where the env reports it; each seed's first env steps
    at a mean return of `target`, where given)."""
    out: dict[str, object] = {f"{name}_{label}_seeds": [r.config.run.seed for r in runs]}
    success = reports_success(runs)
    for what, column in SHOWN.items():
        if what == "success" and not success:
            continue
        finals = [rounded(at(r, column), 1 if what == "return" else 2) for r in runs]
        out[f"{name}_{label}_final_{PLURAL[what]}"] = finals
        if what != "entropy" and None not in finals:
            out[f"{name}_{label}_{what}_range"] = [min(finals), max(finals)]
    if success:
        for rate in SUCCESS_MARKS:
            out[f"{name}_{label}_first_success_{round(rate * 100)}_steps"] = [first_reached(r, rate) for r in runs]
    if target is not None:
        out[f"{name}_{label}_first_return_{number(target)}_steps"] = [first_reached(r, target, SHOWN["return"])
                                                                      for r in runs]
    if all("rollout_cut" in r.metrics for r in runs) and any(cuts_stragglers(r) for r in runs):
        cuts = np.concatenate([r.metrics["rollout_cut"] for r in runs])
        out[f"{name}_{label}_rollout_cut_mean"] = rounded(float(np.nanmean(cuts)), 3)
        out[f"{name}_{label}_rollout_cut_max"] = rounded(float(np.nanmax(cuts)), 3)
    if any("policy_lag" not in r.metrics for r in runs):  # runs from before the lag was logged
        return out
    lag = max(int(np.nanmax(r.metrics["policy_lag"])) for r in runs)
    out[f"{name}_{label}_policy_lag"] = lag
    if lag and all("lagged_share" in r.metrics for r in runs):  # the first rollout, before any update, lags nothing
        shares = np.concatenate([r.metrics["lagged_share"][1:] for r in runs])
        out[f"{name}_{label}_lagged_share_mean"] = rounded(float(np.nanmean(shares)), 3)
        out[f"{name}_{label}_lagged_share_max"] = rounded(float(np.nanmax(shares)), 3)
    return out


def table(groups: dict[str, list[Run]], steps: list[int]) -> dict[str, list]:
    """Per step, each label's mean return, return range, mean success (where the env reports it) and mean entropy
    over its seeds."""
    shown = ("success", "entropy") if any(reports_success(runs) for runs in groups.values()) else ("entropy",)
    columns = ["env steps"]
    for label in groups:
        columns += [f"{label}: mean return", f"{label}: return range", *(f"{label}: mean {what}" for what in shown)]
    rows = []
    for step in steps:
        row: list[object] = [f"{step:,}"]
        for runs in groups.values():
            row += [*spread([at(r, SHOWN["return"], step) for r in runs], 1),
                    *(spread([at(r, SHOWN[what], step) for r in runs], 2)[0] for what in shown)]
        rows.append(row)
    return {"columns": columns, "rows": rows}


def main(argv: list[str]) -> int:
    p = OneLineParser(prog="seed_table.py", description=__doc__.splitlines()[0])
    p.add_argument("evidence", type=Path, help="the evidence JSON file to write into (it must exist)")
    p.add_argument("name", help="the figures' prefix and the table's name")
    p.add_argument("runs", nargs="+", metavar="LABEL=DIR")
    p.add_argument("--steps", required=True, help="env steps of the table's rows, comma-separated")
    p.add_argument("--command", required=True, help="how the runs were made, recorded as <name>_command")
    p.add_argument("--return-target", type=float, metavar="R",
                   help="each seed's first env steps at a mean return of R or more is a figure (null: never)")
    p.add_argument("--until", type=int, help="read each run only up to these env steps (its final figures are its "
                                            "last row by then): runs of different lengths compared at one point")
    args = p.parse_args(argv)
    try:
        steps = [int(s) for s in args.steps.split(",")]
        if args.return_target is not None and not math.isfinite(args.return_target):
            raise ValueError(f"--return-target is a finite return, not {args.return_target}")
        if args.until is not None and args.until < max(steps):
            raise ValueError(f"--until {args.until:,} lies before the table's last step, {max(steps):,}")
        end, what = (max(steps), "the table's last step") if args.until is None else (args.until, "--until")
        evidence = read_evidence(args.evidence)
        groups = {g.label: g.runs for g in load_groups([parse_run_spec(spec) for spec in args.runs])}
        for run in (r for runs in groups.values() for r in runs):
            if run.metrics["env_steps"][-1] < end:
                raise RunDataError(f"{run.path} ends at {int(run.metrics['env_steps'][-1]):,} env steps, before "
                                   f"{what}, {end:,}")
        if args.until is not None:
            groups = {label: [cut(r, args.until) for r in runs] for label, runs in groups.items()}
    except (ValueError, OSError, ConfigError, RunDataError) as error:
        print(f"seed_table.py: {error}", file=sys.stderr)
        return 2
    commit = fingerprint.source_commit(ROOT) or "unknown"
    flags = "" if args.until is None else f" --until {args.until}"
    flags += "" if args.return_target is None else f" --return-target {number(args.return_target)}"
    evidence[f"{args.name}_command"] = f"{args.command}; scripts/seed_table.py{flags} at {commit}"
    evidence[f"{args.name}_date"] = datetime.date.today().isoformat()
    for label, runs in groups.items():
        evidence.setdefault("figures", {}).update(label_figures(args.name, label, runs, args.return_target))
    evidence.setdefault("tables", {})[args.name] = table(groups, steps)
    write_text(args.evidence, json.dumps(evidence, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps(evidence["tables"][args.name], ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
