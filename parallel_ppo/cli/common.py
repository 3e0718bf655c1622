"""What every command line shares: the one-line error report and argparse types and parser."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NoReturn

from parallel_ppo.core.units import to_unit
from parallel_ppo.errors import ConfigError


def fail(prog: str, error: Exception, status: int) -> int:
    """Report `error` as the one line `PROG: error: ...` on stderr; returns the exit status to end with."""
    print(f"{prog}: error: {error}", file=sys.stderr)
    return status


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line (no usage dump) and exits with status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def duration_in(unit: str) -> Callable[[str], float]:
    """argparse type: a positive duration with a unit (`90s`, `10m`, `1.5h`) or a bare number in `unit`, returned
    in `unit` (core/units.py)."""

    def duration(text: str) -> float:
        try:
            value = to_unit(text, unit)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be a positive duration, got {text!r}")
        return value

    return duration


def positive_int(text: str) -> int:
    """argparse type: a whole number above 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def seed_number(text: str) -> int:
    """argparse type: a seed, a whole number in 0..2**31-1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 0 <= value < 2**31:
        raise argparse.ArgumentTypeError(f"must be in 0..2147483647, got {text!r}")
    return value


def int_list(text: str, name: str) -> list[int]:
    """`1,2,4` or `1 2 4` as positive whole numbers (flag `name` in the error)."""
    try:
        values = [int(v) for v in text.replace(",", " ").split()]
    except ValueError:
        raise ConfigError(f"{name} must be whole numbers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise ConfigError(f"{name} must be positive whole numbers, got {text!r}")
    return values
