"""Whether this machine has the system libraries that the project's wheels load but do not carry, and the one
`apt-get install` line that adds the missing ones. `make install` runs it before it creates the virtual environment,
so it runs with any Python 3 and imports nothing outside the standard library.

    python3 scripts/check_system.py [--verbose] [--venv PATH] [--pretend-missing NAME ...] [--pretend-free GB]

Procgen is required: procgen-mirror's libenv.so (procgen's on Python 3.10 is built the same way) links the Qt it
carries, and that Qt links the system's libGL.so.1 (which brings libGLX, libGLdispatch, libX11, libxcb) and GLib.
MuJoCo from pixels (env.pixels, videos of MuJoCo envs) is optional: it renders through EGL, for which PyOpenGL
loads libEGL.so.1, the GLVND dispatcher, which loads Mesa's EGL vendor library, which runs Mesa's software driver;
state-based MuJoCo, Atari, CartPole and Procgen do without it, so its absence is a warning. Each library is probed
by loading it, as the wheels will (dlopen: a library that is present but lacks one of its own dependencies fails).

With --venv PATH (the Makefile's $(VENV)) and no finished install there (no `.installed-*` stamp), it also checks
the free disk space: a full disk otherwise shows up late, as pip's "Connection interrupted while downloading".

Exit 0: everything present, or only the optional renderer missing (warning lines); 2: a required library missing,
or too little space. Problems go to stderr, one line per group, then the apt-get line that installs every missing
package. Not Linux: no library to check. --pretend-missing NAME treats that library (or driver file) as absent,
--pretend-free GB reads that much free space everywhere (tests).
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import math
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass


@dataclass(frozen=True)
class Need:
    """One library (a soname, or a driver file name), installed by `package`; it or any of `probes` will do."""

    name: str
    package: str
    probes: tuple[str, ...] = ()  # other sonames or driver files that serve as well


@dataclass(frozen=True)
class Group:
    name: str
    required: bool
    why: str
    needs: tuple[Need, ...]


GROUPS = (
    Group("Procgen", True, "required: the Procgen games, the default envs", (
        Need("libGL.so.1", "libgl1"),
        Need("libglib-2.0.so.0", "libglib2.0-0"),
        Need("libgthread-2.0.so.0", "libglib2.0-0"),
    )),
    Group("MuJoCo's EGL rendering", False, "optional: only what draws frames needs it (env.pixels, robosuite "
          "cameras, videos of MuJoCo envs); MUJOCO_GL=osmesa with libosmesa6 is the other way", (
        Need("libEGL.so.1", "libegl1"),
        # GLVND's vendor: Mesa's (software rendering on any machine), or NVIDIA's where its driver is installed.
        Need("libEGL_mesa.so.0", "libegl-mesa0", ("libEGL_nvidia.so.0",)),
        # Mesa's software rasterizer (libgallium-*.so holds it from Mesa 24.2 on); NVIDIA's EGL needs none.
        Need("swrast_dri.so", "libgl1-mesa-dri", ("libgallium-*.so", "libEGL_nvidia.so.0")),
    )),
)

# The default install (the dev extras, torch's CPU build); a CUDA torch or the genesis extra takes gigabytes more.
VENV_GB = 3.5  # .venv after `make install`: 3.0 GB measured, and a margin
DOWNLOAD_GB = 1.0  # pip's downloads and unpacked wheels in the temporary directory while it installs

DRIVER_DIRS = ("/usr/lib/*/dri", "/usr/lib64/dri", "/usr/lib/dri", "/usr/local/lib/*/dri", "/usr/local/lib/dri")
LIB_DIRS = ("/usr/lib/*", "/usr/lib64", "/usr/lib", "/lib/*", "/lib64")


def loads(soname: str) -> bool:
    """Whether the dynamic loader finds `soname` and everything it links (LD_LIBRARY_PATH, ldconfig's cache, ...)."""
    try:
        ctypes.CDLL(soname)
    except OSError:
        return False
    return True


def file_loads(name: str) -> bool:
    """A Mesa driver file, in LIBGL_DRIVERS_PATH or the usual driver directories (`libgallium-*`: the library
    directories), that loads."""
    dirs = [d for d in os.environ.get("LIBGL_DRIVERS_PATH", "").split(":") if d]
    dirs += DRIVER_DIRS if name.endswith("_dri.so") else LIB_DIRS
    return any(loads(path) for d in dirs for path in glob.glob(os.path.join(d, name))[:1])


def present(need: Need, pretend_missing: set[str]) -> bool:
    for probe in (need.name, *need.probes):
        if probe in pretend_missing:
            continue
        if probe.endswith(".so") or "*" in probe:
            if file_loads(probe):
                return True
        elif loads(probe):
            return True
    return False


def space_problem(venv: str, pretend_free: float | None = None) -> str | None:
    """One line on what lacks room for a fresh install into `venv`, or None (also where an install there finished
    once: an update adds little; a half-made one, left by a full disk, is checked again)."""
    if os.path.exists(os.path.join(venv, "bin", "python")) and glob.glob(os.path.join(venv, ".installed-*")):
        return None
    home = os.path.dirname(os.path.abspath(venv))
    while not os.path.exists(home):
        home = os.path.dirname(home)
    if not os.path.isdir(home):
        return f"check_system: cannot create {venv}: {home} is not a directory"
    disks: dict[int, list[tuple[str, float, str]]] = {}  # file system → what goes there: (folder, GB, what)
    for part in ((home, VENV_GB, venv), (tempfile.gettempdir(), DOWNLOAD_GB, "pip's downloads")):
        disks.setdefault(os.stat(part[0]).st_dev, []).append(part)
    for parts in disks.values():
        need = sum(gb for _, gb, _ in parts)
        free = shutil.disk_usage(parts[0][0]).free / 1e9 if pretend_free is None else pretend_free
        if free < need:
            listed = ", ".join(f"{gb:.1f} GB for {what} in {folder}" for folder, gb, what in parts)
            return (f"check_system: {math.floor(free * 10) / 10:.1f} GB free on the disk of {parts[0][0]}, and a "
                    f"fresh install needs about {need:.1f} GB there ({listed}): free some space, or put them "
                    "elsewhere (make install VENV=/path/venv, TMPDIR=/path)")
    return None


def check(pretend_missing: set[str], verbose: bool = False) -> int:
    if not sys.platform.startswith("linux") and not pretend_missing:
        return 0
    packages: list[str] = []
    failed = False
    for group in GROUPS:
        missing = [need for need in group.needs if not present(need, pretend_missing)]
        if verbose:
            for need in group.needs:
                state = "missing" if need in missing else "ok"
                print(f"check_system: {need.name:<20} {need.package:<16} {state:<8} {group.name}")
        if not missing:
            continue
        failed |= group.required
        names = ", ".join(need.name for need in missing)
        label = "" if group.required else "warning: "
        print(f"check_system: {label}{group.name} lacks {names} ({group.why})", file=sys.stderr)
        packages += [need.package for need in missing]
    packages = list(dict.fromkeys(packages))
    if not packages:
        print("check_system: the system libraries that Procgen and MuJoCo's EGL rendering load are present")
        return 0
    line = "apt-get install " + " ".join(packages)
    if shutil.which("apt-get"):
        print(f"check_system: to install them, as root: {line}", file=sys.stderr)
    else:
        print(f"check_system: install the packages that provide these libraries (Debian/Ubuntu: {line})",
              file=sys.stderr)
    if failed:
        print("check_system: stopping (make install CHECK_SYSTEM=no skips this check)", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verbose", "-v", action="store_true", help="one line per library checked")
    parser.add_argument("--venv", metavar="PATH", help="where the virtual environment goes: check the free space")
    parser.add_argument("--pretend-missing", action="append", default=[], metavar="NAME",
                        help="treat this soname or driver file as absent (for tests; repeatable)")
    parser.add_argument("--pretend-free", type=float, metavar="GB", help="read this much free space (for tests)")
    args = parser.parse_args(argv)
    problem = space_problem(args.venv, args.pretend_free) if args.venv else None
    if problem:
        print(problem, file=sys.stderr)
        print("check_system: stopping (make install CHECK_SYSTEM=no skips this check)", file=sys.stderr)
        return 2
    return check(set(args.pretend_missing), args.verbose)


if __name__ == "__main__":
    sys.exit(main())
