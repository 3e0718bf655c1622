"""Hardware and software fingerprint recorded with every result."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import sys
from pathlib import Path

import psutil

from parallel_ppo.core.threads import user_draw_threads

CPUINFO = Path("/proc/cpuinfo")


def cpuinfo_entries(cpuinfo: Path = CPUINFO) -> list[tuple[str, str]]:
    """Each `key: value` line of `cpuinfo`, stripped, in order (every processor's); empty where the file is missing."""
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        return []
    return [(key.strip(), value.strip()) for key, _, value in (line.partition(":") for line in lines)]


@functools.cache
def cpu_model() -> str:
    name = next((value for key, value in cpuinfo_entries() if key == "model name"), None)
    return name or platform.processor() or platform.machine()


NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
"""CPU flags of bf16 arithmetic in hardware (x86 AVX-512 and AMX, Arm); without one torch emulates bf16 (a bf16
matmul ran at ~1/100 of fp32 on an AMD EPYC without AVX-512)."""


def read_cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The CPU's feature flags in `cpuinfo` (x86 `flags`, Arm `Features`); empty where the file is missing."""
    return frozenset(flag for key, value in cpuinfo_entries(cpuinfo) if key in ("flags", "Features")
                     for flag in value.split())


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags (`read_cpu_flags`), read once."""
    return read_cpu_flags()


def read_cpu_family(cpuinfo: Path = CPUINFO) -> str | None:
    """The x86 CPU's `family/model` in `cpuinfo` (`25/17`: an AMD EPYC of the Zen 4 generation); None where either is
    missing (Arm). Two CPUs of one model name and `cpu_kind` but another family computed a seeded robosuite run's
    floats differently from its first update: a seeded run repeats only on its own family and model."""
    fields: dict[str, str] = {}
    for key, value in cpuinfo_entries(cpuinfo):
        fields.setdefault(key, value)  # the first processor's
    family, model = fields.get("cpu family"), fields.get("model")
    return f"{family}/{model}" if family and model else None


def cpu_kind(flags: frozenset[str] | None = None) -> list[str]:
    """What tells our machine kinds apart beyond the model name: `avx512` and `bf16` (NATIVE_BF16_FLAGS)."""
    flags = cpu_flags() if flags is None else flags
    return [name for name, has in (("avx512", "avx512f" in flags), ("bf16", bool(NATIVE_BF16_FLAGS & flags))) if has]


def describe_cpu() -> str:
    """The CPU model with its kind, e.g. `AMD EPYC (avx512, bf16)` or `AMD EPYC (no AVX-512, no native bf16)`."""
    return f"{cpu_model()} ({', '.join(cpu_kind()) or 'no AVX-512, no native bf16'})"


def source_commit(checkout: Path | None = None) -> str | None:
    """The commit `checkout` (default: the one the package runs from) is at (`git describe --always --dirty`), None
    outside a git checkout."""
    import subprocess

    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=10,
                             cwd=checkout or Path(__file__).resolve().parent)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


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
        "cpu_kind": cpu_kind(),
        "cpu_family": read_cpu_family(),
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
        "mujoco": _version("mujoco"),
        "robosuite": _version("robosuite"),
        "platform": f"{sys.platform}-{platform.machine()}",
    }


DRAWING_VARIABLES = ("MUJOCO_GL", "PYOPENGL_PLATFORM", "EGL_PLATFORM", "__EGL_VENDOR_LIBRARY_FILENAMES",
                     "LIBGL_ALWAYS_SOFTWARE", "GALLIUM_DRIVER", "LIBGL_DRIVERS_PATH", "LP_NUM_THREADS")
"""The variables that choose how envs draw their frames: the OpenGL platform, EGL's vendor (a GPU's driver or Mesa's
software renderer), Mesa's driver and its software renderer's threads."""


def drawing() -> dict[str, str]:
    """The drawing variables set in this environment, which the runs inherit (an LP_NUM_THREADS the trainer set,
    not the user, left out)."""
    drawn = {k: os.environ[k] for k in DRAWING_VARIABLES if k in os.environ}
    if user_draw_threads() is None:
        drawn.pop("LP_NUM_THREADS", None)
    return drawn


def mesa_egl(drawn: dict[str, str]) -> bool:
    """Whether `drawn` (`drawing()`'s) chose Mesa's software renderer for EGL: its vendor Mesa's alone, or software
    rendering forced (on a GPU box, the CPU draws)."""
    vendors = [v for v in drawn.get("__EGL_VENDOR_LIBRARY_FILENAMES", "").split(":") if v]
    forced = drawn.get("LIBGL_ALWAYS_SOFTWARE", "").lower() in ("1", "true", "yes")
    return bool(vendors and all("mesa" in Path(v).name.lower() for v in vendors)) or forced


def osmesa(drawn: dict[str, str]) -> bool:
    """Whether `drawn` chose OSMesa, Mesa's off-screen software renderer."""
    return "osmesa" in (drawn.get("MUJOCO_GL"), drawn.get("PYOPENGL_PLATFORM"))
