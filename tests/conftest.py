"""Shared helpers: the repository root and a runner for the timed-training entry point."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

# Before torch loads, here and in every trainer the tests start: OpenMP threads that wait for work sleep instead of
# spinning. `make test` runs two test files at once on as few as 2 cores, and spinning threads of one process then
# take the cores the other needs (an in-process evaluation took 9.1 s beside one busy process, 4.6 s with this).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import sessions  # noqa: E402

from parallel_ppo.core.threads import draw_threads_kept  # noqa: E402
from parallel_ppo.tuning.cache import CACHE_DIR_VARIABLE  # noqa: E402
from parallel_ppo.tuning.compute_limit import threads_kept  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TRAIN_TIMED = ROOT / "train_timed.py"


def run_train_timed(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run `train_timed.py ARGS` from the repository root with this interpreter; capture its output."""
    return subprocess.run([sys.executable, str(TRAIN_TIMED), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


MAKE_SETTINGS = {*re.findall(r"^([A-Z][A-Z0-9_]*) *\?=", (ROOT / "Makefile").read_text(), re.MULTILINE), "PYTHON"}
"""The Makefile's settings that an environment variable of the same name gives: those it sets with `?=`, and PYTHON."""


def make_environ() -> dict[str, str]:
    """This process's environment for a `make` a test runs, without make's own variables (MAKEFLAGS and the like, set
    where `make test` runs the suite) and the Makefile's settings (`MAKE_SETTINGS`): the test's command line gives
    those it means (a shell's ENV=/etc/profile, inherited, made `make compare` name the env /etc/profile)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("MAKE") and k not in MAKE_SETTINGS}


def toy_envs_environ() -> dict[str, str]:
    """This process's environment with tests/ first on PYTHONPATH: a trainer started with it imports toy_envs, in
    its workers too, as it would a user's own env module."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}


@pytest.fixture
def genesis_taken_as_installed(monkeypatch):
    """`importlib.util.find_spec` finds the module `genesis` (its extra is outside dev): enough for the family checks
    of a config, which never import it."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: real("json") if name == "genesis"
                        else real(name, *a))


@pytest.fixture(scope="session")
def train_timed():
    """The `run_train_timed` helper, as a fixture."""
    return run_train_timed


LONGEST_FIRST = ("test_tracking.py", "test_distributed.py", "test_api.py", "test_signals.py", "test_reliability.py",
                 "test_bench_suite.py", "test_eval.py", "test_compare.py", "test_seeds.py", "test_continuous.py",
                 "test_outputs.py", "test_parallel.py", "test_study.py")
"""The files that take longest, run first: `make test` hands whole files to two pytest-xdist workers (`-n 2 --dist
loadfile`, so a file's module fixtures train once), and a long file started last would leave a core idle at the end.
(test_tracking.py's 70 s run mostly sleeps: started first, it overlaps the others.)"""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's own order is kept


@pytest.fixture(scope="session", autouse=True)
def _own_learner_cache(tmp_path_factory):
    """Trainers started by the tests measure and cache their `auto` settings in a cache of the test run's own (one
    for all its xdist workers), not the user's (~/.cache/parallel_ppo)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "learner_cache"
        shared.mkdir(exist_ok=True)
        os.environ[CACHE_DIR_VARIABLE] = str(shared)
    else:
        os.environ[CACHE_DIR_VARIABLE] = str(tmp_path_factory.mktemp("learner_cache"))


@pytest.fixture(scope="session", autouse=True)
def _own_temp_dir():
    """Temporary files of the processes the tests start (a killed trainer's multiprocessing folder `pymp-*`,
    torchrun's `torchelastic_*`) go into a folder of the session's own, removed at its end, not left in /tmp: one
    with a short name beside /tmp's others, as a forkserver's socket path must stay under 104 characters (macOS)."""
    tempfile.gettempdir()  # this process keeps the system's (its multiprocessing folder goes at its exit)
    own, before = tempfile.mkdtemp(prefix="ppo-tests-"), os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = own
    yield
    if before is None:
        del os.environ["TMPDIR"]
    else:
        os.environ["TMPDIR"] = before
    shutil.rmtree(own, ignore_errors=True)


@pytest.fixture(autouse=True)
def _own_threads_kept():
    """A trainer's CLI or a script run in this process sets torch's threads and Mesa's drawing threads (LP_NUM_THREADS)
    for the run, and bench.py or a measuring script its SIGTERM handler (`stop_on_sigterm`), as a process of its own
    would keep them (`train_cli` in test_eval.py, test_user_input.py; one refused
    in test_privileged.py): put back after each test, so that no later test of this process (`make test` runs whole
    files one after another in each of its workers) starts on what an earlier one left."""
    sigterm = signal.getsignal(signal.SIGTERM)  # bench.py's main and the measuring scripts' stop on it
    with threads_kept(), draw_threads_kept():
        yield
    signal.signal(signal.SIGTERM, sigterm)


@pytest.fixture(autouse=True)
def _no_leftover_sessions():
    """Trainers a test started in their own session do not outlive it, even when it fails."""
    yield
    sessions.kill_started()
