"""Checkpoints and JSON results written atomically (temp file + rename), and validated on load."""

from __future__ import annotations

import json
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import torch

from parallel_ppo.config import ConfigError

FORMAT_VERSION = 1


def atomic_write(path: Path, write: Any) -> None:
    """Call `write(file_object)` on a temp file beside `path`, fsync it, then rename it over `path`."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, data: dict) -> None:
    atomic_write(path, lambda f: f.write((json.dumps(data, indent=2, allow_nan=False, default=str) + "\n").encode()))


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    atomic_write(path, lambda f: torch.save({"format_version": FORMAT_VERSION, **state}, f))


REQUIRED_KEYS = ("format_version", "config", "model", "optimizer", "update", "env_steps", "elapsed")


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load and check a checkpoint; any problem is a ConfigError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"checkpoint not found: {path}")
    try:  # tensors and plain data only: a checkpoint from elsewhere must not be able to run code
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "weights_only" in str(e) or "Unsupported global" in str(e):
            raise ConfigError(f"checkpoint {path} holds objects other than tensors and plain data; "
                              "refusing to load it (unpickling them could run code)") from None
        raise ConfigError(f"checkpoint {path} is corrupt or unreadable (UnpicklingError)") from None
    except Exception as e:  # truncated zip, garbage, ...
        raise ConfigError(f"checkpoint {path} is corrupt or unreadable ({type(e).__name__})") from None
    if not isinstance(state, dict) or any(k not in state for k in REQUIRED_KEYS):
        raise ConfigError(f"checkpoint {path} is not a parallel_ppo checkpoint")
    if state["format_version"] != FORMAT_VERSION:
        raise ConfigError(f"checkpoint {path} has format version {state['format_version']}, expected {FORMAT_VERSION}")
    return state
