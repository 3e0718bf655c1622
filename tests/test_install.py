"""`make install` says what it needs: scripts/check_system.py names the missing system libraries and the apt-get
line that adds them, and the Makefile picks a Python that pyproject.toml supports or says which to install."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_environ

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "scripts" / "check_system.py"
MAKE = shutil.which("make")
needs_make = pytest.mark.skipif(MAKE is None, reason="make is not installed")


def _check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECK), *args], capture_output=True, text=True, timeout=60)


def test_the_system_check_passes_on_this_machine():
    """The tests run Procgen, so its libraries are here; the renderer's, where missing, only warn."""
    result = _check()
    assert result.returncode == 0, result.stderr
    assert "Procgen lacks" not in result.stderr


def test_a_missing_procgen_library_stops_the_install_with_the_apt_line():
    result = _check("--pretend-missing", "libGL.so.1", "--pretend-missing", "libgthread-2.0.so.0")
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert any("Procgen lacks libGL.so.1, libgthread-2.0.so.0 (required" in line for line in lines), lines
    assert [line for line in lines if "apt-get install" in line][0].endswith("apt-get install libgl1 libglib2.0-0")
    assert "CHECK_SYSTEM=no" in lines[-1]


def test_a_missing_renderer_library_warns_and_one_apt_line_installs_everything():
    result = _check("--pretend-missing", "libEGL.so.1")
    assert result.returncode == 0
    assert "warning: MuJoCo's EGL rendering lacks libEGL.so.1 (optional" in result.stderr
    assert result.stderr.rstrip().endswith("apt-get install libegl1")

    result = _check("--pretend-missing", "libglib-2.0.so.0", "--pretend-missing", "swrast_dri.so")
    assert result.returncode == 2
    apt_lines = [line for line in result.stderr.splitlines() if "apt-get install" in line]
    assert len(apt_lines) == 1 and apt_lines[0].endswith("apt-get install libglib2.0-0 libgl1-mesa-dri")


def test_without_apt_the_check_names_the_libraries_and_the_debian_packages():
    result = subprocess.run([sys.executable, str(CHECK), "--pretend-missing", "libGL.so.1"], capture_output=True,
                            text=True, timeout=60, env={"PATH": "/nonexistent"})
    assert result.returncode == 2
    assert "install the packages that provide these libraries (Debian/Ubuntu: apt-get install libgl1)" in result.stderr


def test_too_little_disk_space_stops_a_fresh_install_and_says_where(tmp_path):
    """A full disk shows up early and by name, not as pip's "Connection interrupted while downloading"."""
    venv = tmp_path / "venv"
    result = _check("--venv", str(venv), "--pretend-free", "0.5")
    assert result.returncode == 2 and result.stdout == ""
    first, last = result.stderr.splitlines()
    # tmp_path lies in the temporary directory: one disk, both needs summed
    assert first.startswith(f"check_system: 0.5 GB free on the disk of {tmp_path}, and a fresh install needs about "
                            f"4.5 GB there (3.5 GB for {venv} in {tmp_path}, 1.0 GB for pip's downloads in ")
    assert "make install VENV=/path/venv" in first and "CHECK_SYSTEM=no" in last
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    assert _check("--venv", str(venv), "--pretend-free", "0.5").returncode == 2  # half made: checked again
    (venv / ".installed-dev").touch()
    assert _check("--venv", str(venv), "--pretend-free", "0.5").returncode == 0  # installed once: no check
    assert _check("--venv", str(tmp_path / "other"), "--pretend-free", "9").returncode == 0


def _make_install(path: Path | None, *assignments: str) -> subprocess.CompletedProcess:
    """`make -n install` for a fresh virtual environment (nothing runs), with only `path` on PATH when given."""
    outer = make_environ()  # as run by `make test` too
    env = {"PATH": str(path), "HOME": str(path), "PIP_CONFIG_FILE": "/dev/null"} if path else outer
    return subprocess.run([MAKE, "-n", "--no-print-directory", "install", "VENV=/nonexistent/venv", *assignments],
                          cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def _fake_pythons(tmp_path: Path, **versions: str | None) -> Path:
    """A bin directory of fake interpreters, each printing its version (None: fails, like a pyenv shim of a version
    that is not active), and grep, which the Makefile's pip configuration lookup uses."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, version in versions.items():
        script = bin_dir / name.replace("_", ".")
        script.write_text(f"#!/bin/sh\necho {version}\n" if version else "#!/bin/sh\nexit 127\n")
        script.chmod(0o755)
    if shutil.which("grep"):
        (bin_dir / "grep").symlink_to(shutil.which("grep"))
    return bin_dir


@needs_make
def test_make_install_checks_the_system_before_it_creates_the_environment():
    lines = _make_install(None, "PYTHON=/opt/py/python3.11").stdout.splitlines()
    assert lines[0].startswith("v=$(/opt/py/python3.11 -c ")  # its version, checked first
    assert lines[1] == "/opt/py/python3.11 scripts/check_system.py --venv /nonexistent/venv"
    assert lines[2] == "test -x /nonexistent/venv/bin/python || /opt/py/python3.11 -m venv /nonexistent/venv"
    lines = _make_install(None, "PYTHON=/opt/py/python3.11", "CHECK_SYSTEM=no").stdout.splitlines()
    assert "check_system" not in lines[1] and "-m venv" in lines[1]


@needs_make
def test_make_install_refuses_another_python_or_a_venv_without_pip_in_one_line(tmp_path):
    """PYTHON=... of a version pyproject does not take stops before anything is made; a venv left without pip (made
    where python3-venv was missing; here a fake interpreter makes none) says how to start again. Neither is tried
    three times as pip's own failure would be."""
    bin_dir = _fake_pythons(tmp_path, python3_13="3.13", python3_11="3.11")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "PIP_CONFIG_FILE": "/dev/null"}
    venv = tmp_path / "venv"
    for python, says in ((bin_dir / "python3.13", f"{bin_dir / 'python3.13'} is Python 3.13, not one of 3.12 3.11"),
                         (bin_dir / "python3.11", f"{venv} has no pip (made where python3-venv was missing?): rm -rf")):
        result = subprocess.run([MAKE, "--no-print-directory", "install", f"VENV={venv}", f"PYTHON={python}",
                                 "CHECK_SYSTEM=no"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and f"make install: error: {says}" in result.stderr, result.stderr
        assert "attempt" not in result.stderr and not (venv / ".installed-dev").exists()


@needs_make
@pytest.mark.parametrize("versions, chosen", [
    ({"python3_12": None, "python3_11": "3.11", "python3": "3.13"}, "python3.11"),
    ({"python3_12": "3.12", "python3_10": "3.10"}, "python3.12"),
    ({"python3": "3.10"}, "python3"),
])
def test_make_install_picks_a_supported_python(tmp_path, versions, chosen):
    result = _make_install(_fake_pythons(tmp_path, **versions))
    assert result.returncode == 0, result.stderr
    assert f"|| {chosen} -m venv /nonexistent/venv" in result.stdout


@needs_make
@pytest.mark.parametrize("versions, python3", [({"python3": "3.13"}, "python3 is 3.13"), ({}, "no python3 on PATH")])
def test_make_install_says_which_python_to_install(tmp_path, versions, python3):
    result = _make_install(_fake_pythons(tmp_path, **versions))
    assert result.returncode != 0 and "-m venv" not in result.stdout
    assert f"no Python 3.10-3.12 found ({python3}): install one (apt-get install python3.11" in result.stderr
    assert "make install PYTHON=/path/to/python3.11" in result.stderr


@needs_make
def test_python_on_the_command_line_wins(tmp_path):
    result = _make_install(_fake_pythons(tmp_path, python3_11="3.11"), "PYTHON=/opt/python3.13")
    assert result.returncode == 0, result.stderr
    assert "|| /opt/python3.13 -m venv" in result.stdout and "python3.11" not in result.stdout


def test_the_makefile_looks_for_the_versions_pyproject_supports():
    low, high = re.search(r'requires-python = ">=3\.(\d+),<3\.(\d+)"', (ROOT / "pyproject.toml").read_text()).groups()
    listed = re.search(r"^PYTHON_VERSIONS := (.*)$", (ROOT / "Makefile").read_text(), re.M).group(1).split()
    assert listed == [f"3.{minor}" for minor in range(int(high) - 1, int(low) - 1, -1)]
