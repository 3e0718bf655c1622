"""Imported once by the forkserver that forks every worker, so workers share these pages copy-on-write.

torch (~150 MB private per process) and, for Procgen runs, the game assets (~350 MB per process) are loaded
here once instead of once per worker: with W workers the tree holds one copy, not W.
"""

import os
import signal

import torch  # noqa: F401

from parallel_ppo.engines.parallel.worker import IGNORED_SIGNALS, PRELOAD_PROCGEN_VAR

for sig in IGNORED_SIGNALS:  # a signal to the whole group must not take the forkserver (it ends with its parent)
    signal.signal(sig, signal.SIG_IGN)

if os.environ.get(PRELOAD_PROCGEN_VAR):
    from parallel_ppo.core.procgen_envs import import_procgen

    import_procgen()
    from procgen import ProcgenGym3Env

    ProcgenGym3Env(num=1, env_name=os.environ[PRELOAD_PROCGEN_VAR], num_threads=0).close()  # loads the assets

try:
    import setproctitle

    setproctitle.setproctitle("parallel_ppo forkserver (forks workers)")
except ImportError:  # pragma: no cover
    pass
