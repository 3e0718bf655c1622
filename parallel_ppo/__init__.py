"""parallel_ppo: PPO on CPUs, sequential, across worker processes or as data-parallel ranks, with an honest
benchmarking suite.

The public API, loaded on first use (so that reading runs needs no torch):

- `train(config, mode=..., output_dir=..., overrides=...) -> Run`: train and return the finished run;
- `load_policy(where, seed=0) -> Policy`, whose `predict(obs, deterministic=False)` takes one observation or a batch;
- `evaluate(policy, episodes=..., levels=...) -> EvalResult` (the returns; writes no eval.json);
- `compare({label: run_dir, ...}, output_dir=...) -> Comparison`: what compare_results.py prints and writes;
- `export(policy, format="onnx"|"torchscript", output=None) -> Path`: the policy as one inference file;
- `Config` and its sections, buildable in code; `load_run`, `Run`; the errors `ParallelPPOError` (`ConfigError`,
  `RunDataError`: bad input, exit status 2 on the command line), `RunFailed`, `WriteFailed` and `ExportMismatch`
  (exit status 1).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "train": "parallel_ppo.api", "load_policy": "parallel_ppo.api", "evaluate": "parallel_ppo.api",
    "compare": "parallel_ppo.api", "export": "parallel_ppo.api", "Policy": "parallel_ppo.core.policy",
    "EvalResult": "parallel_ppo.core.evaluate", "Comparison": "parallel_ppo.runs.report.numbers",
    "Run": "parallel_ppo.runs.reading", "load_run": "parallel_ppo.runs.reading",
    "Config": "parallel_ppo.core.config", "EnvConfig": "parallel_ppo.core.config",
    "ParallelConfig": "parallel_ppo.core.config", "ModelConfig": "parallel_ppo.core.config",
    "TrainingConfig": "parallel_ppo.core.config", "RunConfig": "parallel_ppo.core.config",
    "EvalConfig": "parallel_ppo.core.config", "DistributedConfig": "parallel_ppo.core.config",
    "LoggingConfig": "parallel_ppo.core.config", "TrackingConfig": "parallel_ppo.core.config",
    "ParallelPPOError": "parallel_ppo.errors", "ConfigError": "parallel_ppo.errors",
    "RunDataError": "parallel_ppo.errors", "RunFailed": "parallel_ppo.errors", "WriteFailed": "parallel_ppo.errors",
    "ExportMismatch": "parallel_ppo.errors",
}
__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'parallel_ppo' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
