"""A worker process from the coordinator's side: its handle and pipe, its thread settings, how it ended, and
stopping it."""

from __future__ import annotations

import multiprocessing.forkserver
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from parallel_ppo.core.threads import environ_kept
from parallel_ppo.engines.parallel.worker import PRELOAD_ENV_VAR, Done, Failed, Ready, WorkerSpec

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


def start_forkserver(preload: str | None = None) -> None:
    """Start the workers' forkserver, where it is not running, importing this source checkout's package: Python
    before 3.12.8 starts it without its parent's sys.path, from the parent's folder, so the workers of a run that
    one checkout's script started elsewhere would get the package found there (or an installed copy). The checkout
    goes first on PYTHONPATH, and the start folder off the path (PYTHONSAFEPATH), for the forkserver's start only;
    an installed package (no checkout around it) starts it as multiprocessing would. `preload`: the env id whose
    family's preload the forkserver runs (PRELOAD_ENV_VAR, unless set already), for its start only too."""
    root = Path(__file__).resolve().parents[3]
    with environ_kept(("PYTHONPATH", "PYTHONSAFEPATH", PRELOAD_ENV_VAR)):
        if preload is not None:
            os.environ.setdefault(PRELOAD_ENV_VAR, preload)
        if (root / "pyproject.toml").is_file():
            given = os.environ.get("PYTHONPATH")
            os.environ["PYTHONPATH"] = str(root) + (os.pathsep + given if given else "")
            os.environ["PYTHONSAFEPATH"] = "1"
        multiprocessing.forkserver.ensure_running()


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
