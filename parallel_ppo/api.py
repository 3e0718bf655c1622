"""The public Python API (re-exported by `parallel_ppo`): train a policy, load it and predict with it, evaluate it,
compare runs. The command lines are layers over the same code (`launch`, `core.policy`, `runs.report`).

    import parallel_ppo as ppo

    run = ppo.train("config/cartpole.yaml", mode="parallel", output_dir="runs/cartpole")
    policy = ppo.load_policy(run)
    action = policy.predict(observation, deterministic=True)
    ppo.evaluate(policy, episodes=20)
    ppo.export(run, format="onnx")  # RUN_DIR/policy.onnx: inference without parallel_ppo (onnxruntime)
    ppo.compare({"sequential": "runs/a", "parallel": "runs/b"}, output_dir="runs/comparison")

The parallel mode starts worker processes: in a script, call it under `if __name__ == "__main__":`, as for any
multiprocessing code (a notebook needs nothing).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from parallel_ppo.core.allocator import release_freed_memory
from parallel_ppo.core.arguments import label_argument, number, path_argument, plain, shown, switch, whole
from parallel_ppo.core.collect import RolloutError
from parallel_ppo.core.config import Config
from parallel_ppo.core.configure import maximum_of
from parallel_ppo.core.evaluate import EvalResult
from parallel_ppo.core.policy import Policy
from parallel_ppo.core.threads import draw_threads_kept
from parallel_ppo.engines.distributed import PeerLost
from parallel_ppo.errors import ConfigError, RunFailed
from parallel_ppo.launch import execute, prepare
from parallel_ppo.request import Request
from parallel_ppo.runs.directory import check_writable
from parallel_ppo.runs.reading import Run, load_groups, load_run
from parallel_ppo.runs.report.numbers import Comparison
from parallel_ppo.runs.report.numbers import compare as compare_groups

MODES = ("sequential", "parallel")


def _optional_path(value: Any, name: str) -> Path | None:
    return None if value is None else path_argument(value, name)


RUN_OR_FILE = "a Run, a run directory or a checkpoint file"


def _where(value: Any, name: str) -> Any:
    """A run (`Run`), a loaded `Policy`, or the path of a run directory or checkpoint file, checked as a path."""
    return value if isinstance(value, (Run, Policy)) else path_argument(value, name, RUN_OR_FILE)


def _settings(overrides: Any) -> dict[str, Any]:
    """`overrides` as `{"section.key": value}`, numpy's numbers (a sweep's `np.int64`, in a list too) as Python's."""
    if overrides is None:
        return {}
    if not isinstance(overrides, Mapping) or not all(isinstance(key, str) for key in overrides):
        raise ConfigError(f"overrides must be a mapping of 'section.key' names to values, got {shown(overrides)}")
    return {key: plain(value) for key, value in overrides.items()}


def train(config: str | Path | Config | None = None, *, mode: str = "sequential",
          output_dir: str | Path | None = None, overrides: Mapping[str, Any] | None = None, overwrite: bool = False,
          resume: str | Path | None = None, verbose: bool = True) -> Run:
    """Train until the config's duration or step budget is spent; returns the finished run.

    `config`: a YAML file, a `Config` built in code, or None for the defaults. `overrides`: `{"section.key":
    value}` set on top of it, e.g. `{"env.id": "CartPole-v1", "run.total_steps": 50_000}`. `mode`: "sequential"
    (one process) or "parallel" (worker processes; its layout in `parallel.*`). `resume`: a run directory to
    continue from its checkpoint. `verbose`: print the run's start and end lines, and show its progress
    (`logging.progress`: a bar on a terminal, else INFO lines on the `parallel_ppo.progress` logger, seen where
    logging is set up); False also turns the progress off unless `overrides` sets it.

    Settings that cannot run, and arguments of the wrong kind (`overwrite="no"`, a number for a path), raise
    ConfigError before anything starts, naming the config key (`section.key`) or the argument (an entry of
    `logging.episode_info` that the env gives as no number: when the first such episode ends); a run that stops on
    an error (a worker that keeps failing, say) raises RunFailed once its checkpoint and summary are written (where
    the disk allows; envs that failed to start: `run_dir` None, nothing written); Ctrl-C (SIGINT) or SIGTERM stops
    it at the next update and it returns, its `summary.stop_reason` saying so (KeyboardInterrupt when no update had
    finished, or on a second Ctrl-C). What the run changes in this process (torch's threads and CPU random state,
    LP_NUM_THREADS, glibc's starting thresholds, the title) is put back when it returns: docs/python.md.
    """
    if mode not in MODES:
        raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if config is not None and not isinstance(config, Config):
        config = path_argument(config, "config", "a YAML file's path, a Config or None")
    flags = _settings(overrides)
    if output_dir is not None:
        flags["run.output_dir"] = str(path_argument(output_dir, "output_dir"))
    if not switch(verbose, "verbose"):
        flags.setdefault("logging.progress", "off")
    resume = _optional_path(resume, "resume")
    request = Request(config, flags, parallel=mode == "parallel", overwrite=switch(overwrite, "overwrite"),
                      resume=None if resume is None else str(resume))
    threads = torch.get_num_threads()
    try:  # the run seeds torch's generator: the caller's (CPU) random state goes on as it was
        with draw_threads_kept(), torch.random.fork_rng(devices=[]):
            try:
                prepared = prepare(request)
            except (RolloutError, PeerLost) as e:  # workers (or ranks) that failed to start: nothing was written
                raise RunFailed(f"the run did not start: {e}", None) from e
            summary, _ = execute(prepared, "parallel_ppo" if verbose else None, interrupt=True)
    finally:
        torch.set_num_threads(threads)
        release_freed_memory()  # `prepare` kept freed memory for the run's steps
    run_dir = prepared.plan.run_dir
    if summary["stop_reason"] == "error":
        raise RunFailed(f"the run in {run_dir} stopped on an error: {summary['error']}", run_dir)
    if summary["stop_reason"] == "signal" and not summary["updates"]:
        raise KeyboardInterrupt(f"the run in {run_dir} was stopped before its first update")
    return load_run(run_dir.resolve().name, run_dir)  # output_dir "." or ".." too


def load_policy(where: str | Path | Run, seed: int = 0) -> Policy:
    """The policy of a run (a `Run`, a run directory or a checkpoint file); `seed` seeds its sampled actions."""
    seed = whole(seed, "seed", 0)
    return Policy.load(where.path if isinstance(where, Run) else path_argument(where, "where", RUN_OR_FILE), seed)


def evaluate(policy: Policy | Run | str | Path, episodes: int = 20, levels: str | None = None, num_envs: int = 8,
             deterministic: bool = False, seed: int = 0) -> EvalResult:
    """Play `episodes` complete episodes with a policy (or a run's) on fresh envs. `levels`: "test" (Procgen
    levels the run never trained on), "train" (its own levels, the only set of other envs) or "auto" (None, the
    default: test where the run has levels to hold out, else train). Returns the episodes' returns
    (`EvalResult`); unlike `parallel-ppo eval`, it writes no eval.json and records no video."""
    from parallel_ppo.core.evaluate import play_episodes

    episodes = whole(episodes, "episodes", 1, maximum_of("eval.episodes"))
    num_envs = whole(num_envs, "num_envs", 1, maximum_of("eval.num_envs"))
    seed, deterministic = whole(seed, "seed", 0), switch(deterministic, "deterministic")
    if levels is None:
        levels = "auto"
    if not isinstance(levels, str) or levels not in ("auto", "train", "test"):
        raise ConfigError(f"levels must be auto, train or test, got {shown(levels)}")
    if not isinstance(policy, Policy):
        policy = load_policy(_where(policy, "policy"), seed)
    return play_episodes(policy.model, policy.cfg, levels, episodes, num_envs, deterministic, seed)


def export(policy: Policy | Run | str | Path, format: str = "onnx", output: str | Path | None = None) -> Path:
    """Write a policy (or a run's) as one ONNX or TorchScript ("torchscript") file for inference without this
    package, observation normalization inside; returns its path (default RUN_DIR/policy.onnx or RUN_DIR/policy.pt).
    What the file takes and returns: `runs.export` and docs/evaluation.md, "Export"."""
    from parallel_ppo.runs.export import export_policy

    where = _where(policy, "policy")
    return export_policy(where.path if isinstance(where, Run) else where, format, _optional_path(output, "output")).path


def compare(runs: Mapping[str, str | Path | Run | Sequence[str | Path]], output_dir: str | Path | None = None,
            baseline: str | None = None, threshold: float | None = None, at_steps: float | None = None,
            references: Mapping[str, str | Path] | None = None) -> Comparison:
    """Compare runs by label (a label with several run directories, or a parent of seed runs, is compared across
    seeds), at `at_steps` env steps across seeds, beside published `references` ({label: CSV}, as
    `--reference`); returns the comparison (`Comparison`) and, with `output_dir`, writes its
    table, plots and reports there as compare_results.py does."""
    from parallel_ppo.runs.reference import load_references
    from parallel_ppo.runs.report.plots import render_outputs, write_outputs

    if not isinstance(runs, Mapping) or not isinstance(references or {}, Mapping):
        raise ConfigError("runs (and references) must be mappings of labels to run directories (CSV files)")
    for label in (*runs, *(references or {})):
        label_argument(label, "a label")
    specs = []
    for label, where in runs.items():
        one = isinstance(where, (str, bytes, os.PathLike, Run, Mapping)) or not isinstance(where, Iterable)
        specs.append((label, [d.path if isinstance(d, Run) else path_argument(d, f"run {label}") for d in
                              ([where] if one else list(where))]))
    out = _optional_path(output_dir, "output_dir")
    if out is not None:
        check_writable(out)  # before the runs are read
    curves = [(label, path_argument(path, f"reference {label}")) for label, path in (references or {}).items()]
    threshold, at_steps = number(threshold, "threshold"), number(at_steps, "at_steps")
    groups = load_groups(specs)
    comparison = compare_groups(groups, baseline, threshold, at_steps=at_steps,
                                references=load_references(curves, groups))
    if out is not None:
        write_outputs(render_outputs(comparison), out)
    return comparison
