"""A run's forkserver workers import the checkout that started the run, wherever it was started from."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import multiprocessing, sys
sys.path.insert(0, {checkout!r})  # as running the checkout's script does
from parallel_ppo.engines.parallel.processes import start_forkserver
context = multiprocessing.get_context("forkserver")
context.set_forkserver_preload(["parallel_ppo"])  # as the coordinator's, whose import the children inherit
start_forkserver()
with context.Pool(1) as pool:
    print(pool.apply(eval, ("__import__('parallel_ppo').__file__",)))
"""


def copy_checkout(to: Path) -> Path:
    shutil.copytree(ROOT / "parallel_ppo", to / "parallel_ppo", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", to)
    return to / "parallel_ppo" / "__init__.py"


@pytest.mark.parametrize("started_in", ["a folder without the package", "another checkout"])
def test_forkserver_workers_import_the_checkout_that_started_them(tmp_path, started_in):
    """A copy of the checkout, its package imported from there by a process started in another folder (one without
    the package, or another copy of it): the forkserver's child imports the copy, not the installed package (this
    checkout) nor the folder's."""
    copy, cwd = copy_checkout(tmp_path / "checkout"), tmp_path / "elsewhere"
    if started_in == "another checkout":
        copy_checkout(cwd)
    cwd.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    out = subprocess.run([sys.executable, "-c", CHILD.format(checkout=str(tmp_path / "checkout"))], cwd=cwd,
                         env=env, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == str(copy)
