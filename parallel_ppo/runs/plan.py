"""The run plan: what a run is resolved to before its first update (`launch.prepare`), the one input every mode
trains (`runs.training.train_run`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from parallel_ppo.core.config import Config
from parallel_ppo.envs.spaces import EnvSpaces


@dataclass(frozen=True)
class RunPlan:
    """A run resolved once before its first update and passed on unchanged to every mode: its config (validated, with
    the learner's settings and the run directory in place), its env spaces, threads and the measurements made before
    it (recorded in summary.json), and the checkpoint it resumes."""

    cfg: Config
    spaces: EnvSpaces
    run_dir: Path
    mode: str
    """`sequential`, `parallel` or `distributed`."""
    threads: dict[str, int]
    learner: dict | None = None
    """How precision, microbatch and device were chosen (`tuning.learner_settings.LearnerChoice.to_dict`), and under
    `threads` the learner's thread count (`tuning.learner_threads.ThreadChoice.to_dict`)."""
    compute_limit: dict | None = None
    """The bare network's compute limit (`tuning.compute_limit.measure_compute_limit`)."""
    roofline: dict | None = None
    """The network's FLOPs and this machine's matmul peaks."""
    resume: dict | None = None
    """The checkpoint the run continues from (None: a new run)."""
    overwrite: bool = False
    """Whether an earlier run's files in `run_dir` are replaced."""
