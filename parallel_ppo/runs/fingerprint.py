"""Hardware and software fingerprint recorded with every result."""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import sys

import psutil


@functools.cache
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def hardware() -> dict:
    return {
        "cpu_model": cpu_model(),
        "logical_cores": psutil.cpu_count(logical=True),
        "physical_cores": psutil.cpu_count(logical=False),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
    }


def versions() -> dict:
    import numpy
    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "procgen": _version("procgen-mirror") or _version("procgen"),
        "gymnasium": _version("gymnasium"),
        "platform": f"{sys.platform}-{platform.machine()}",
    }
