"""A run's forkserver workers import the checkout that started the run, wherever it was started from."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import multiprocessing, sys
sys.path.insert(0, {checkout!r})  # as running the checkout's script does
from parallel_ppo.engines.parallel.processes import package_first_on_path
{call}
context = multiprocessing.get_context("forkserver")
context.set_forkserver_preload(["parallel_ppo"])  # as the coordinator's, whose import the children inherit
with context.Pool(1) as pool:
    print(pool.apply(eval, ("__import__('parallel_ppo').__file__",)))
"""


def _worker_imports(checkout: Path, cwd: Path, call: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", CHILD.format(checkout=str(checkout), call=call)], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.strip()


def test_forkserver_workers_import_the_checkout_that_started_them(tmp_path):
    """A copy of the checkout, its package imported from there by a process started in another folder: Python
    3.11's forkserver imports its preload modules without that process's sys.path, so without
    `package_first_on_path` the child has the installed package (this checkout), with it the copy."""
    checkout, elsewhere = tmp_path / "checkout", tmp_path / "elsewhere"
    shutil.copytree(ROOT / "parallel_ppo", checkout / "parallel_ppo", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", checkout)
    elsewhere.mkdir()
    copy = str(checkout / "parallel_ppo" / "__init__.py")
    assert _worker_imports(checkout, elsewhere, "pass") != copy  # the trap the function mends
    assert _worker_imports(checkout, elsewhere, "package_first_on_path()") == copy
