#!/usr/bin/env python
"""A published learning curve as compare_results' `--reference` reads it: the seeds' logs (one CSV each, as their
authors published them) averaged at the env steps every seed logged, with the seeds' range as the band.

    .venv/bin/python scripts/reference_curve.py OUT.csv --steps "exploration/num steps total" \\
        --return "exploration/Returns Mean" --max-steps 1000000 seed17/progress.csv seed59/progress.csv ...

Writes `env_steps,episodic_return_mean,return_low,return_high`, one row per step count logged by every seed (up to
--max-steps). Bad input (a missing column, a value that is not a number, no step count common to every seed, a seed's
log twice, a place no file goes): one line, exit status 2, nothing written; a disk that does not take it, exit 1.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from parallel_ppo.core.files import atomic_write, new_folders, writing  # noqa: E402
from parallel_ppo.errors import RunDataError, WriteFailed  # noqa: E402
from parallel_ppo.runs.directory import check_writable  # noqa: E402
from parallel_ppo.runs.reading import csv_rows  # noqa: E402


def read_seed(path: Path, steps: str, returns: str) -> dict[float, float]:
    """One seed's return at each step count it logged."""
    header, *rows = csv_rows(path, str(path))  # refuses a file with no line
    missing = [c for c in (steps, returns) if c not in header]
    if missing or not any(rows):
        raise ValueError(f"{path}: no column {missing[0]!r}" if missing else f"{path}: no rows")
    repeated = [c for c in (steps, returns) if header.count(c) > 1]
    if repeated:
        raise ValueError(f"{path}: more than one column {repeated[0]!r}")
    i, j = header.index(steps), header.index(returns)
    curve = {}
    for line, row in ((line, row) for line, row in enumerate(rows, start=2) if row):  # blank records skipped
        try:
            step, value = float(row[i]), float(row[j])
        except (IndexError, ValueError):  # a short row, or text
            cells = " or ".join(f"{name} {row[k]!r}" if k < len(row) else f"{name} missing"
                                for name, k in ((steps, i), (returns, j)))
            raise ValueError(f"{path}, record {line}: {cells} is not a number") from None
        if not (math.isfinite(step) and math.isfinite(value)):
            raise ValueError(f"{path}, record {line}: a value is not finite")
        curve[step] = value
    return curve


def averaged(curves: list[dict[float, float]], max_steps: float) -> list[tuple[float, float, float, float]]:
    """(steps, mean, low, high) at each step count every curve has, up to `max_steps`."""
    common = sorted(s for s in set.intersection(*(set(c) for c in curves)) if s <= max_steps)
    if not common:
        raise ValueError("no step count is logged by every seed" + (" up to --max-steps" if max_steps < math.inf
                                                                    else ""))
    return [(s, sum(c[s] for c in curves) / len(curves), min(c[s] for c in curves), max(c[s] for c in curves))
            for s in common]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("output", type=Path, help="the reference CSV to write")
    p.add_argument("seeds", type=Path, nargs="+", help="one published log (CSV) per seed")
    p.add_argument("--steps", required=True, help="the column of env steps")
    p.add_argument("--return", dest="returns", required=True, help="the column of the mean episodic return")
    p.add_argument("--max-steps", type=float, default=math.inf, help="leave out later rows")
    args = p.parse_args(argv)
    text = io.StringIO(newline="")
    try:
        if twice := next((path for i, path in enumerate(args.seeds) if path.resolve() in
                          {p.resolve() for p in args.seeds[:i]}), None):
            raise ValueError(f"{twice} is given twice: each seed's log once")
        check_writable(args.output.parent, f"the reference CSV {args.output}")
        rows = averaged([read_seed(path, args.steps, args.returns) for path in args.seeds], args.max_steps)
        out = csv.writer(text)
        out.writerow(["env_steps", "episodic_return_mean", "return_low", "return_high"])
        out.writerows([f"{s:.0f}", *(f"{v:.4f}" for v in values)] for s, *values in rows)
        with writing(args.output), new_folders(args.output.parent):
            atomic_write(args.output, lambda f: f.write(text.getvalue().encode()))
    except (ValueError, OSError, RunDataError, WriteFailed) as error:  # ConfigError is a ValueError
        print(f"reference_curve.py: error: {error}", file=sys.stderr)
        return 1 if isinstance(error, WriteFailed) else 2
    print(f"{args.output}: {len(rows)} rows from {len(args.seeds)} seeds, {rows[0][0]:,.0f} to {rows[-1][0]:,.0f} "
          "env steps")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
