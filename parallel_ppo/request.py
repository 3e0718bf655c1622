"""What to train, as a command line or the Python API asks for it (`Request`), and the checks a new run's request
passes before the trainer's modules (and torch) load, so a refused setting or a taken run directory costs a user a
fraction of a second, not torch's import."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parallel_ppo.core.config import Config
from parallel_ppo.core.configure import build_config
from parallel_ppo.errors import ConfigError
from parallel_ppo.runs.directory import resolve_run_dir

RUN_ID_VAR = "TORCHELASTIC_RUN_ID"
"""Set by torchrun in every rank: its job's id (engines.distributed's twin, which imports torch, as this module may
not)."""


@dataclass(frozen=True)
class Request:
    """What to train, as a command line or `parallel_ppo.train` asks for it, before any check."""

    config: str | Path | Config | None = None
    """A YAML file, a Config built in code, or None for the defaults."""
    flags: dict[str, Any] = field(default_factory=dict)
    """`{section.key: value}` set on top of it (None: not given), as the trainers' flags set them."""
    sets: tuple[str, ...] = ()
    """`section.key=value` items, applied last."""
    parallel: bool = False
    distributed: bool = False
    """One rank of a run under torchrun."""
    overwrite: bool = False
    resume: str | None = None
    """A run directory to continue from its checkpoint (its own config.yaml, then the flags)."""
    resume_if_exists: bool = False
    """Continue the run in the output directory if it has a checkpoint, else start it there (a requeued job)."""

    @property
    def mode(self) -> str:
        return "distributed" if self.distributed else "parallel" if self.parallel else "sequential"


def check_new_run(request: Request) -> None:
    """Refuse (ConfigError) a process torchrun started as one of several ranks without `--distributed`
    (`check_launch`), and a new run's settings or its taken run directory, as `launch.prepare` would, without loading
    torch. A resume, a distributed rank (its world is torchrun's) and a run that goes on from the checkpoint in its
    directory are checked by `prepare` alone; this builds and refuses nothing else."""
    check_launch(request)
    if request.resume is not None or request.distributed:
        return
    cfg = build_config(request.config, request.flags, list(request.sets), request.parallel)
    if request.resume_if_exists and cfg.run.output_dir and (Path(cfg.run.output_dir) / "checkpoint.pt").is_file():
        return
    resolve_run_dir(cfg, request.mode, request.overwrite)


def check_launch(request: Request) -> None:
    """Refuse (ConfigError) a process torchrun started as one of several ranks, asked to run without `--distributed`:
    each rank would train a run of its own."""
    world = os.environ.get("WORLD_SIZE", "1")
    if not request.distributed and RUN_ID_VAR in os.environ and world.isdigit() and int(world) > 1:
        raise ConfigError(f"this process is one of {world} ranks torchrun started, without --distributed: each rank "
                          "would train a run of its own; add --distributed")


def speaks(request: Request) -> bool:
    """Whether this process reports the request's refusals and output: any but the ranks other than rank 0 (torchrun's
    RANK) of a distributed run or of torchrun's ranks, which would repeat rank 0's line each."""
    if not (request.distributed or RUN_ID_VAR in os.environ):
        return True
    try:
        return int(os.environ.get("RANK", "0")) == 0
    except ValueError:
        return True
