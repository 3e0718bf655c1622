"""A process's life tied to its parent's: Linux's parent-death signal, and a check that works everywhere."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
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


def parent_watch() -> Callable[[], bool]:
    """A check, cheap to ask often, that turns true once this process's parent has died: the orphan is adopted by
    another process, so its parent's pid changes. It ends a wait that no pipe would end (off Linux, where no
    parent-death signal comes)."""
    parent = os.getppid()
    return lambda: os.getppid() != parent
