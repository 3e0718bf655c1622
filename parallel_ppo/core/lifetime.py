"""A process's life tied to its parent's: Linux's parent-death signal, and a check on multiprocessing's parent."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable


def signal_on_parent_death(sig: signal.Signals) -> None:
    """Ask Linux to send this process `sig` when its parent dies; if the parent is gone already, send it now.
    Elsewhere (no prctl) nothing happens: the parent's own clean-up still applies."""
    if not sys.platform.startswith("linux"):
        return
    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(sig))
    except (OSError, AttributeError):  # pragma: no cover
        return
    if os.getppid() == 1:  # the parent died before the request was made
        os.kill(os.getpid(), sig)


def parent_process_watch() -> Callable[[], bool]:
    """A check, about a microsecond to ask, that turns true once the process that started this one through
    multiprocessing's spawn or forkserver (a worker's coordinator) has died or let it go: its end of their pipe is
    closed (under fork, siblings forked later would hold copies of it). A forkserver's child keeps the forkserver
    alive, so no parent-death signal comes when the coordinator dies; this tells. Never true in a process that
    multiprocessing did not start."""
    poller = _parent_pipe()
    return (lambda: False) if poller is None else lambda: bool(poller.poll(0))


def exit_when_orphaned(grace: float) -> None:
    """End this process `grace` seconds after the process that started it through spawn or forkserver has gone
    (`parent_process_watch`'s pipe closed), from a thread of its own: for a worker whose env step never returns, and
    so never looks at that check (under the forkserver, no parent-death signal comes), where the step leaves Python's
    lock to other threads (it sleeps, waits or computes in a library that releases it). Nothing in a process that
    multiprocessing did not start."""
    poller = _parent_pipe()
    if poller is None:
        return

    def watch() -> None:
        poller.poll()  # blocks until the pipe closes
        time.sleep(grace)  # a worker that is not stuck has ended by then, as it does between steps
        os._exit(1)

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


def _parent_pipe() -> select.poll | None:
    """A poll of the pipe from the process that started this one through multiprocessing's spawn or forkserver,
    which carries nothing: readable means closed (that process gone, or done with this one); None where
    multiprocessing did not start this process."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return None
    poller = select.poll()
    poller.register(parent.sentinel, select.POLLIN)
    return poller
