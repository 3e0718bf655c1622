"""Shared helpers: the repository root and a runner for the timed-training entry point."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sessions

from parallel_ppo.bench.learner_settings import CACHE_DIR_VARIABLE

ROOT = Path(__file__).resolve().parent.parent
TRAIN_TIMED = ROOT / "train_timed.py"


def run_train_timed(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run `train_timed.py ARGS` from the repository root with this interpreter; capture its output."""
    return subprocess.run([sys.executable, str(TRAIN_TIMED), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="session")
def train_timed():
    """The `run_train_timed` helper, as a fixture."""
    return run_train_timed


@pytest.fixture(scope="session", autouse=True)
def _own_learner_cache(tmp_path_factory):
    """Trainers started by the tests measure and cache their `auto` settings in a cache of the session's own,
    not the user's (~/.cache/parallel_ppo)."""
    os.environ[CACHE_DIR_VARIABLE] = str(tmp_path_factory.mktemp("learner_cache"))


@pytest.fixture(autouse=True)
def _no_leftover_sessions():
    """Trainers a test started in their own session do not outlive it, even when it fails."""
    yield
    sessions.kill_started()
