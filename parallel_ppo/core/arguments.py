"""Checks of the arguments a Python caller gives (`api`, `Policy.predict`, `load_run`): a ConfigError naming the
argument where the command line's parser would refuse the same, numpy's numbers taken as Python's."""

from __future__ import annotations

import math
import numbers
import os
from pathlib import Path
from typing import Any

import numpy as np

from parallel_ppo.core.files import path_problem
from parallel_ppo.errors import ConfigError

A_PATH = "a path (a str, bytes or pathlib.Path)"


def shown(value: Any) -> str:
    """A value as a message shows it: its repr on one line, cut to 80 characters."""
    try:
        text = " ".join(repr(value).split())
    except ValueError:  # an int of more digits than Python will write
        return f"a {type(value).__name__} too long to show"
    return text if len(text) <= 80 else text[:77] + "..."


def path_argument(value: Any, name: str, kind: str = A_PATH) -> Path:
    """An argument that names a file or folder: a str, bytes or os.PathLike that `path_problem` passes; `kind` says
    what else it may be, where a message names it."""
    if not isinstance(value, (str, bytes, os.PathLike)):
        raise ConfigError(f"{name} must be {kind}, got {type(value).__name__}")
    text = os.fsdecode(os.fspath(value))
    if problem := path_problem(text):
        raise ConfigError(f"{name}: {problem}")
    return Path(text)


def label_argument(value: Any, name: str) -> str:
    """A run's label: a string of more than spaces (as the command line refuses `--run =DIR`)."""
    if not isinstance(value, str):
        raise ConfigError(f"{name} must be a string, got {shown(value)}")
    if not value.strip():
        raise ConfigError(f"{name} must not be empty, got {value!r}")
    return value


def switch(value: Any, name: str) -> bool:
    """A yes/no argument: True or False (numpy's too) only; a string such as "no" would read as True."""
    if not isinstance(value, (bool, np.bool_)):
        raise ConfigError(f"{name} must be True or False, got {shown(value)}")
    return bool(value)


def whole(value: Any, name: str, least: int, most: float = math.inf) -> int:
    """A whole number (numpy's too) of at least `least` and at most `most`."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value < least:
        raise ConfigError(f"{name} must be a whole number of at least {least}, got {shown(value)}")
    if value > most:
        raise ConfigError(f"{name} must be at most {most:,}, got {shown(value)}")
    return int(value)


def number(value: Any, name: str) -> float | None:
    """A number (numpy's too) as a float, or None; what it may be beyond that is the caller's to check."""
    if value is None:
        return None
    refusal = ConfigError(f"{name} must be a number a float holds, got {shown(value)}")
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise refusal
    try:
        return float(value)
    except OverflowError:
        raise refusal from None


def plain(value: Any) -> Any:
    """A numpy scalar as the Python value it holds (a float as its shortest digits: np.float32(3e-4) is 0.0003, not
    0.0003000000142492354), in a list too; anything else as it is."""
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, np.floating):
        return float(np.format_float_positional(value, unique=True, trim="-"))
    if isinstance(value, (np.bool_, np.integer, np.str_)):
        return value.item()
    return value
