"""Trainer subprocesses in their own sessions: start one, find everything it spawned, check what outlived it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

STARTED: list[subprocess.Popen] = []
"""Every session started by `start`; conftest kills what is left of them after each test."""


def start(cmd: list[str], **kwargs) -> subprocess.Popen:
    """Popen `cmd` as the leader of a new session (its id is the pid), remembered for clean-up."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            **kwargs)
    STARTED.append(proc)
    return proc


def session_pids(sid: int) -> list[int]:
    """Live (non-zombie) processes of session `sid`: a run and everything it spawned, orphans included.

    Found by session, not by an environment tag: process titles (setproctitle) overwrite the memory
    that /proc/<pid>/environ shows, so a tag would hide the very workers we look for.
    """
    pids = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getsid(proc.pid) == sid:
                pids.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return pids


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Wait until `path` exists (a paused run's pid file), failing if `proc` ends or `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)


def shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def assert_nothing_left(sid: int, shm_before: set[str], grace: float = 10) -> None:
    """No process of session `sid` and no new /dev/shm entry remains (after `grace` seconds to exit)."""
    deadline = time.monotonic() + grace
    while session_pids(sid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if left := session_pids(sid):  # raised, not asserted, so scripts run with -O check it too
        raise AssertionError(f"processes outlived the run: {left}")
    if leaked := shm_entries() - shm_before:  # torch's segments live for an instant (created, opened, unlinked):
        time.sleep(1.0)  # another process's, caught in that instant, is gone a second later; a leak stays
        leaked &= shm_entries()
    if leaked:
        raise AssertionError(f"shared-memory segments outlived the run: {sorted(leaked)}")


def kill_started() -> None:
    """SIGKILL whatever is left of every started session, so a failed test leaves no trainer running."""
    while STARTED:
        proc = STARTED.pop()
        for pid in session_pids(proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        proc.kill()
        proc.wait()


def torchrun(script: str, ranks: int = 2) -> list[str]:
    """The command that runs `script --distributed` as `ranks` ranks on this host."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks), script,
            "--distributed"]


def sessions_of(launcher: int) -> list[int]:
    """The launcher's session and its children's (torchrun starts each rank in a session of its own)."""
    return [launcher, *(child.pid for child in psutil.Process(launcher).children())]
