"""Imported once by the forkserver that forks every worker, so workers share these pages copy-on-write.

torch (~150 MB private per process) and what the env's family preloads (`envs.families.Family.preload`: a game's
assets, say, hundreds of MB per process) are loaded here once instead of once per worker: with W workers the tree
holds one copy, not W. The coordinator names the env in PRELOAD_ENV_VAR before the forkserver starts.
"""

import os
import signal

import torch  # noqa: F401

from parallel_ppo.engines.parallel.worker import IGNORED_SIGNALS, PRELOAD_ENV_VAR

for sig in IGNORED_SIGNALS:  # a signal to the whole group must not take the forkserver (it ends with its parent)
    signal.signal(sig, signal.SIG_IGN)

if os.environ.get(PRELOAD_ENV_VAR):
    from parallel_ppo.envs.families import preload

    try:
        preload(os.environ[PRELOAD_ENV_VAR])
    except Exception:  # noqa: BLE001 - each worker makes its envs and reports what fails there, in one line
        pass

try:
    import setproctitle

    setproctitle.setproctitle("parallel_ppo forkserver (forks workers)")
except ImportError:  # pragma: no cover
    pass
