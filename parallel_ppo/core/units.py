"""Durations written with a unit, the one convention of every command and config file: `90s`, `10m`, `1.5h`
(also `2d`, and Slurm's `H:MM:SS`). A bare number is in the unit its flag or field names (`--duration` and
`run.duration`: hours; `--seconds` and `*_seconds` fields: seconds; `--minutes`: minutes)."""

from __future__ import annotations

import math
import re

SECONDS_PER = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([smhd]?)\s*")
_CLOCK = re.compile(r"\s*([0-9]+):([0-5][0-9]):([0-5][0-9])\s*")


def to_unit(value: str | float, unit: str) -> float:
    """`value` (a number, or text with an optional unit) expressed in `unit` (s, m, h or d); a bare number is already
    in `unit`. Raises ValueError, naming the accepted forms, for anything else or a value that is not finite."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 90s, 10m, 1.5h or 1:30:00, got {value!r}")
    if isinstance(value, (int, float)):
        number, given = float(value), unit
    elif clock := _CLOCK.fullmatch(value):
        number, given = int(clock[1]) * 3600 + int(clock[2]) * 60 + int(clock[3]), "s"
    else:
        match = _DURATION.fullmatch(value)
        if match is None:
            raise ValueError(f"expected a duration such as 90s, 10m, 1.5h or 1:30:00, got {value!r}")
        number, given = float(match[1]), match[2] or unit
    result = number * SECONDS_PER[given] / SECONDS_PER[unit]
    if not math.isfinite(result):
        raise ValueError(f"expected a finite duration, got {value!r}")
    return result
