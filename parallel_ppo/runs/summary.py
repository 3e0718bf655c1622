"""The run directory's contract: the files it holds, metrics.csv's columns, and summary.json as a typed record
(built once by the trainer, read back by `runs.reading.load_run`)."""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from parallel_ppo.core.timing import PHASES
from parallel_ppo.errors import RunDataError

ERROR_TRACE = "error.txt"
"""The traceback beneath the error a run's last session stopped on (`runs.training.keep_trace`)."""
RUN_FILES = ("metrics.csv", "summary.json", "checkpoint.pt", "config.yaml", "logs", "eval.json", "demo.mp4", "wandb",
             "policy.onnx", "policy.pt", ERROR_TRACE)
"""What a run directory holds, its evaluations, default demo video, W&B files and default exports included
(`--overwrite` replaces exactly these)."""

BUDGETS = ("duration", "total_steps")
"""Stop reasons that mean the run met its budget."""

READ_COLUMNS = ("update", "env_steps", "wall_time", "sps", "episodic_return_mean", "episodic_length_mean",
                "episodes", "test_return_mean", "success_rate", *(f"time_{p}" for p in PHASES), "cpu_percent",
                "system_cpu_percent", "rss_mb", "pss_mb", "rollout_cut")
"""The metrics.csv columns that reading and reporting a run use, each present in what `load_run` returns (NaN where
an older run lacks it). The writer's columns come from the declared metrics (`core.metrics`, listed in
docs/run-directory.md); `wall_time` is the run's elapsed seconds at the end of the update, `sps` that update's own
rate, logging and checkpoints included, `test_return_mean` the mean return of the evaluation after that update."""

MAIN_PHASES = ("env", "render", "inference", "sync", "gae", "update")
"""Phases the comparison breaks wall time into; the rest (publish, log, checkpoint, untimed) is 'other'."""

FINITE_COLUMNS = ("update", "env_steps", "wall_time", "sps", *(f"time_{p}" for p in MAIN_PHASES if p != "render"),
                  "cpu_percent", "rss_mb")
"""metrics.csv columns that must be present and hold a finite number in every row (`time_render` is newer than
some runs)."""


@dataclass(frozen=True)
class RunSummary:
    """summary.json: built once by the trainer at the end of a run, read back by `load_run`.

    Fields without a default must be present; those with one may be missing in runs that predate them.
    """

    mode: str
    """`sequential`, `parallel` or `distributed`."""
    env_id: str
    num_workers: int
    """Worker processes; 0 for a sequential run."""
    num_envs_per_worker: int
    num_envs: int
    total_env_steps: int
    wall_seconds: float
    """Elapsed seconds of the run's training (over all sessions, when resumed): each session's from once its workers
    are up and the learner's settings and compute limit measured to its stop after its last update (the final
    checkpoint and evaluation left out)."""
    episodes: int
    """Episodes finished during the run (0 = none: the returns are None)."""
    updates: int
    stop_reason: str
    """duration, total_steps, signal or error."""
    precision: str
    peak_rss_mb: float
    """Peak of the summed resident sets of the run's processes (shared memory counted once per process)."""
    hardware: dict
    versions: dict
    threads: dict = dataclasses.field(default_factory=dict)
    sps: float | None = None
    """Steady-state env steps per second (`steady_sps`): the run's throughput, as every report shows it."""
    overall_sps: float | None = None
    """total_env_steps / wall_seconds: update 1 and the logging, checkpoints and evaluations between updates included;
    start-up and the compute-limit measurement are not."""
    episodic_return_mean: float | None = None
    """Mean return of the last `logging.return_window` (default 100) episodes."""
    episodic_length_mean: float | None = None
    error: str | None = None
    signal: str | None = None
    peak_pss_mb: float | None = None
    """Peak proportional set size (shared pages split among processes): an upper bound, see metrics.py."""
    peak_main_rss_mb: float | None = None
    peak_worker_rss_mb: float | None = None
    mean_cpu_percent: float | None = None
    """Mean CPU use of the run's processes, 100 = one core busy."""
    compute_limit: dict | None = None
    limit_efficiency: float | None = None
    """sps / compute_limit.limit_sps."""
    phase_seconds: dict = dataclasses.field(default_factory=dict)
    phase_fractions: dict = dataclasses.field(default_factory=dict)
    worker_restarts: int = 0
    worker_pace: dict | None = None
    """Which worker each rollout (none abandoned) waited for (`engines.parallel.pace.WorkerPace.record`; a
    distributed run's: rank 0's workers); None without workers."""
    policy_lag: int = 0
    """The largest policy lag of this session's updates (`charts/policy_lag`): 1 with `parallel.overlap` (0 with its
    `policy_lag: 0`)."""
    resumes: int = 0
    restarts: int = 0
    """Resumes that a restart made by itself: a group torchrun restarted, or `--resume-if-exists`."""
    seed: int | None = None
    normalized_return: float | None = None
    """episodic_return_mean as Procgen's normalized score (easy mode constants; None for other envs)."""
    test_return_mean: float | None = None
    """Mean return of the last evaluation (`eval` config): on held-out test levels unless eval.levels is train."""
    test_normalized_return: float | None = None
    generalization_gap: float | None = None
    """episodic_return_mean − test_return_mean."""
    eval_levels: str | None = None
    learner: dict | None = None
    """How precision, microbatch and device were decided (`learner_settings.LearnerChoice.to_dict`), and under `threads`
    the learner's thread count (`learner_threads.ThreadChoice.to_dict`)."""
    roofline: dict | None = None
    """The network's FLOPs per sample and env step, and this machine's fp32 and bf16 matmul peaks (GFLOP/s), and
    tf32's on a GPU that has it."""
    flops_per_env_step: float | None = None
    """FLOPs one collected env step costs: one forward to act, n_epochs × forward+backward to learn."""
    achieved_gflops: float | None = None
    """sps × flops_per_env_step / 1e9."""
    peak_gflops: float | None = None
    """The matmul peak of the run's precision on the learner's threads: the physical limit."""
    peak_fraction: float | None = None
    """achieved_gflops / peak_gflops."""
    world_size: int = 1
    """Ranks of a distributed run (1 otherwise)."""
    final_metrics: dict = dataclasses.field(default_factory=dict)
    """The last update's value of every metric declared with `summary=True` (`core.metrics`), by metrics.csv column:
    the session's own last update (empty where the session that wrote it finished none)."""
    distributed: dict | None = None
    """A distributed run's ranks: the rollout source each runs, its envs, and per rank its host, layout, threads,
    parameter checksum and phase seconds (mode distributed only)."""
    observation: dict | None = None
    """What the env observes (`observation_record`): `obs_shape` and `dtype`, the packed row the rollout buffer
    holds per env step (a dict observation's keys packed side by side as bytes, so a state run of robosuite Lift
    shows `[240]`: 60 float32s), and `keys`, a dict observation's layout by key (each key's `shape` as the env
    gives it and its `dtype`; null for a Box). `compute_limit.obs_shape` is that packed row too."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, with non-finite floats as None."""
        return {k: None if isinstance(v, float) and not math.isfinite(v) else v
                for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def read(cls, path: Path) -> RunSummary:
        """Parse and type-check summary.json; unknown fields are ignored."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):
            raise RunDataError(f"{path} is not valid JSON (corrupt or truncated)") from None
        if not isinstance(data, dict):
            raise RunDataError(f"{path} is not a run summary (expected a JSON object)")
        hints = typing.get_type_hints(cls)
        values = {}
        for f in dataclasses.fields(cls):
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            if f.name not in data:
                if required:
                    raise RunDataError(f"{path} lacks the field {f.name!r}; is it a parallel_ppo run summary?")
                continue
            if not _has_type(data[f.name], hints[f.name]):
                raise RunDataError(f"{path}: field {f.name!r} has an unexpected value {short_repr(data[f.name])}")
            values[f.name] = data[f.name]
        _check_nested(path, values)
        summary = cls(**values)
        if summary.mode not in ("sequential", "parallel", "distributed"):
            raise RunDataError(f"{path}: mode must be sequential, parallel or distributed, got {summary.mode!r}")
        if summary.wall_seconds <= 0 or summary.updates <= 0:
            raise RunDataError(f"{path} describes a run that never finished an update")
        return summary


def observation_record(spaces: Any) -> dict[str, Any]:
    """summary.json's `observation` for an env's `EnvSpaces`: the packed buffer row (`obs_shape`, `dtype`) and,
    for a dict observation, each key's shape (as the env gives it) and dtype, in the row's order (vectors as
    float32, then images as uint8)."""
    layout = spaces.layout
    keys = None if layout is None else {
        p.key: {"shape": list(p.source_shape), "dtype": "uint8" if p.image else "float32"} for p in layout.parts}
    return {"obs_shape": [int(d) for d in spaces.obs_shape], "dtype": np.dtype(spaces.obs_dtype).name, "keys": keys}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_text_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


HARDWARE_TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "cpu_model": (lambda v: _has_type(v, str), "a string"),
    "logical_cores": (lambda v: _has_type(v, float), "a finite number"),
    "physical_cores": (lambda v: _has_type(v, float), "a finite number"),
    "memory_gb": (lambda v: _has_type(v, float), "a finite number"),
    "cpu_kind": (_is_text_list, "a list of strings"),
    "cpu_family": (lambda v: _has_type(v, str), "a string"),
}
"""What the report reads of summary.json's `hardware` (`fingerprint.hardware`), each entry absent or null or this."""


def _check_nested(path: Path, values: dict[str, Any]) -> None:
    """Refuse (RunDataError naming the file and the entry) a `hardware` entry not as `HARDWARE_TYPES` says, or a
    `final_metrics` value that is neither a number nor null (NaN is fine: the report reads it as missing)."""
    hardware, final = values["hardware"], values.get("final_metrics", {})
    checks = [(f"hardware.{key}", hardware[key], *HARDWARE_TYPES[key]) for key in HARDWARE_TYPES if key in hardware]
    checks += [(f"final_metrics.{key}", value, _is_number, "a number") for key, value in final.items()]
    for name, value, fits, expected in checks:
        if value is not None and not fits(value):
            raise RunDataError(f"{path}: field {name!r} has an unexpected value {short_repr(value)} "
                               f"(expected {expected} or null)")


def _has_type(value: Any, hint: Any) -> bool:
    """`value` fits a field hint (int, float, str, dict, or one of them or None); floats must be finite."""
    if isinstance(hint, types.UnionType):
        return any(_has_type(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if isinstance(value, bool):
        return hint is bool
    if hint is float:
        return isinstance(value, (int, float)) and math.isfinite(value)
    return isinstance(value, hint)


# ------------------------------------------------------------------------------------------------ figures


def short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"
