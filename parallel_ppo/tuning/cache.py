"""The cache of measured learner choices (`learner_settings`, `learner_threads`, the matmul peaks): one JSON file
per user, keyed by what a measurement depends on (`machine_digest`), rewritten atomically under a lock; a lost or
foreign file only means measuring again."""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

import torch

from parallel_ppo.core.config import Config
from parallel_ppo.core.files import write_json
from parallel_ppo.core.model import learner_device
from parallel_ppo.runs import fingerprint

try:
    import fcntl
except ImportError:  # Windows: the cache is written unlocked
    fcntl = None  # type: ignore[assignment]

CACHE_DIR_VARIABLE = "PARALLEL_PPO_CACHE_DIR"


def cache_path() -> Path:
    """$PARALLEL_PPO_CACHE_DIR, else $XDG_CACHE_HOME/parallel_ppo, else ~/.cache/parallel_ppo; then the file."""
    root = os.environ.get(CACHE_DIR_VARIABLE)
    if not root:
        root = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "parallel_ppo")
    return Path(root) / "learner_settings.json"


def machine_digest(cfg: Config, **fields: Any) -> str:
    """A cache key: `fields` with what every learner measurement depends on (CPU and its kind, torch, threads,
    device and a CUDA GPU's name: two CPU kinds that share a model name, one with native bf16 and one without, never
    share an entry), and the CPU's family and model where /proc/cpuinfo tells them (`cpu_family`, as where one home
    directory serves machines of several; only where known, so keys elsewhere stay valid)."""
    hw = fingerprint.hardware()
    device = learner_device(cfg)
    machine = {"cpu": hw["cpu_model"], "cpu_kind": hw["cpu_kind"], "cores": hw["logical_cores"],
               "torch": torch.__version__, "threads": torch.get_num_threads(), "device": str(device)}
    if device.type == "cuda":  # an A100 node and an H100 node of one home directory never share an entry
        machine["gpu"] = torch.cuda.get_device_name(device)
    if hw.get("cpu_family"):
        machine["cpu_family"] = hw["cpu_family"]
    return hashlib.sha256(json.dumps({**machine, **fields}, sort_keys=True).encode()).hexdigest()[:16]


def read_cache(path: Path) -> dict[str, Any]:
    """The cached choices; an unreadable or foreign file counts as empty (it is only a cache: it is rewritten)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def number(value: Any) -> bool:
    """A finite int or float (not a bool), as a cached rate or peak must be."""
    try:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    except OverflowError:  # an int past a float's range
        return False


def cached_rates(entry: dict[str, Any]) -> dict[str, float] | None:
    """An entry's measured `rates` (label → steps/s; none recorded: {}), None where they are malformed: a file
    edited or written otherwise is measured again rather than trusted."""
    rates = entry.get("rates", {})
    if not isinstance(rates, dict) or not all(isinstance(k, str) and number(v) for k, v in rates.items()):
        return None
    return {k: float(v) for k, v in rates.items()}


def store(path: Path, key: str, entry: dict[str, Any]) -> bool:
    """Add `entry` to the cache file (atomically); False when it cannot be written (a read-only home: the run
    goes on, and measures again next time)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = _lock(path.with_name(path.name + ".lock"))  # two runs starting at once keep both entries
        try:
            write_json(path, {**read_cache(path), key: entry})
        finally:
            if lock is not None:
                os.close(lock)
    except OSError:
        return False
    return True


def _lock(path: Path) -> int | None:
    """A descriptor holding the lock file `path` (closing it lets go); None where nothing locks (no flock on this
    system or file system, another user's lock file that this one may not create): the cache is then written
    unlocked, as before there was a lock."""
    if fcntl is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        os.close(fd)
        return None
    return fd
