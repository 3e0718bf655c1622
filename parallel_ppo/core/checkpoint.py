"""Checkpoints: written atomically, loaded as tensors and plain data only, and validated."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

from parallel_ppo.core.files import atomic_write
from parallel_ppo.errors import RunDataError

FORMAT_VERSION = 1


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    atomic_write(path, lambda f: torch.save({"format_version": FORMAT_VERSION, **state}, f))


REQUIRED_KEYS = ("format_version", "config", "model", "optimizer", "update", "env_steps", "elapsed", "episodes",
                 "episode_returns", "episode_lengths", "generator", "torch_rng")
"""What `TrainState.from_checkpoint` reads without a default."""


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load and check a checkpoint; any problem is a RunDataError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise RunDataError(f"checkpoint not found: {path}")
    try:  # tensors and plain data only: a checkpoint from elsewhere must not be able to run code
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "weights_only" in str(e) or "Unsupported global" in str(e):
            raise RunDataError(f"checkpoint {path} holds objects other than tensors and plain data; "
                              "refusing to load it (unpickling them could run code)") from None
        raise RunDataError(f"checkpoint {path} is corrupt or unreadable (UnpicklingError)") from None
    except Exception as e:  # truncated zip, garbage, ...
        raise RunDataError(f"checkpoint {path} is corrupt or unreadable ({type(e).__name__})") from None
    if not isinstance(state, dict):
        raise RunDataError(f"checkpoint {path} is not a parallel_ppo checkpoint")
    if missing := [key for key in REQUIRED_KEYS if key not in state]:
        raise RunDataError(f"checkpoint {path} is not a parallel_ppo checkpoint (it lacks {', '.join(missing)})")
    if state["format_version"] != FORMAT_VERSION:
        raise RunDataError(f"checkpoint {path} has format version {state['format_version']}, expected {FORMAT_VERSION}")
    return state


def next_resume_count(checkpoint: dict[str, Any] | None) -> int:
    """How many times a run continuing from `checkpoint` has been resumed (0 for a new run)."""
    return 0 if checkpoint is None else checkpoint.get("resumes", 0) + 1
