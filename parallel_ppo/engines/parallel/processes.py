"""A worker process from the coordinator's side: its handle and pipe, its thread settings, how it ended, and
stopping it."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from parallel_ppo.core.threads import environ_kept
from parallel_ppo.engines.parallel.worker import Done, Failed, Ready, WorkerSpec

THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@dataclass
class WorkerProcess:
    """A started worker: its process, the coordinator's end of its pipe, and what it was given."""

    process: Any  # multiprocessing Process
    conn: Connection
    spec: WorkerSpec


def describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "stopped responding"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with status {exitcode}"


@contextmanager
def thread_env(threads: int) -> Iterator[None]:
    """Children inherit these at spawn: one OpenMP/MKL thread pool of `threads` per worker."""
    with environ_kept(THREAD_ENV_VARS):
        os.environ.update({k: str(threads) for k in THREAD_ENV_VARS})
        yield


def package_first_on_path() -> None:
    """Put the source checkout this `parallel_ppo` was imported from first on PYTHONPATH, for a forkserver yet to
    start: Python 3.11's forkserver does not take its parent's sys.path, so the workers of a run started by one
    checkout's script from another folder would import the package found there (or an installed copy) instead. An
    installed package (no checkout around it) is left to the path as it is."""
    root = Path(__file__).resolve().parents[3]
    if not (root / "pyproject.toml").is_file():
        return
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if paths[:1] != [str(root)]:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(root), *paths])


def try_recv(conn: Connection) -> Ready | Done | Failed | None:
    try:
        if conn.poll():
            return conn.recv()
    except (EOFError, OSError):
        pass
    return None


def stop_process(worker: WorkerProcess, kill: bool) -> None:
    """Make sure the worker process is gone and its pipe closed."""
    process = worker.process
    if process.is_alive():
        (process.kill if kill else process.terminate)()
        process.join(2.0)
        if process.is_alive():
            process.kill()
            process.join(2.0)
    try:
        worker.conn.close()
    except OSError:
        pass
