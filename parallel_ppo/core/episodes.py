"""Episode statistics, one path for any of them (as Sample Factory's `episode_extra_stats`): the numeric entries of an
episode's final info that a run logs (`logging.episode_info`, and `is_success` wherever an env reports it) are read
for each ended episode by the collector (`envs.batch.episode_info`), carried by name in `CollectResult.episode_info`
(merged over workers and ranks with the returns), kept in rolling windows of `logging.return_window` episodes
(`EpisodeWindows`, saved in checkpoints) and logged as the metric `episode/<key>` (metrics.csv `episode_<key>`,
TensorBoard, summary.json's `final_metrics`, the comparison across seeds); `is_success` as `charts/success_rate`."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from parallel_ppo.core.config import Config
from parallel_ppo.core.metrics import NAME, metric
from parallel_ppo.envs.batch import SUCCESS
from parallel_ppo.errors import ConfigError

EPISODE_INFO = metric("episode/{name}", "mean of the final-info entry {name} (one of logging.episode_info) over the "
                      "last logging.return_window episodes whose info had it; empty where none did",
                      column="episode_{name}", summary=True)
COLUMN_PREFIX = "episode_"
"""What starts the metrics.csv column (and summary.json `final_metrics` key) of an episode statistic."""


def info_metric(key: str) -> str:
    """The metric key of the final-info entry `key` of `logging.episode_info`: `episode/<key>`."""
    return EPISODE_INFO.replace("{name}", key)


def info_keys(cfg: Config) -> tuple[str, ...]:
    """The final-info entries a run collects: `is_success` (where an env reports it) and `logging.episode_info`."""
    return (SUCCESS, *cfg.logging.episode_info)


def check_names(names: Sequence[str], key: str = "logging.episode_info") -> None:
    """Refuse (ConfigError naming `key`) a name that is no info entry's to log: not letters, digits and `_` (a
    malformed list), `is_success` (always read), or named twice."""
    for name in names:
        if not re.fullmatch(NAME, name):
            raise ConfigError(f"{key}: {name!r} is not the name of an info entry (letters, digits and _), e.g. "
                              f"{key}=[distance_to_goal]")
        if name == SUCCESS:
            raise ConfigError(f"{key}: {SUCCESS} is always read where an env reports it (charts/success_rate); "
                              "leave it out")
    if twice := sorted({name for name in names if names.count(name) > 1}):
        raise ConfigError(f"{key} names {', '.join(twice)} twice")


def not_numbers_error(not_numbers: Mapping[str, str], env_id: str) -> str | None:
    """The error of a rollout whose episodes ended with final-info entries to log that are not numbers (one line,
    naming the first), None where there are none."""
    if not not_numbers:
        return None
    key, shown = sorted(not_numbers.items())[0]
    why = "" if key == SUCCESS else "; logging.episode_info logs numeric entries only"
    return f"{key} in the final info of {env_id}'s episodes is {' '.join(shown.split())}, not a number{why}"


class EpisodeWindows:
    """Per final-info entry, its values in the last `window` ended episodes that had it (one rolling window each,
    as the returns have), and their means as an update's metrics."""

    def __init__(self, keys: Iterable[str], window: int, metrics: Mapping[str, str]) -> None:
        """`metrics`: the metric key of an entry that is not logged as `episode/<key>` (is_success's)."""
        self.windows: dict[str, deque[float]] = {key: deque(maxlen=window) for key in keys}
        self.metrics = {key: metrics.get(key) or info_metric(key) for key in self.windows}

    def extend(self, values: Mapping[str, Iterable[float]]) -> None:
        """Add the values of a rollout's ended episodes, by entry (entries this run does not log are left out)."""
        for key, found in values.items():
            if key in self.windows:
                self.windows[key].extend(found)

    def row(self) -> dict[str, float]:
        """Each entry's mean over its window (NaN while empty), under its metric key."""
        return {self.metrics[key]: float(np.mean(w)) if w else float("nan") for key, w in self.windows.items()}

    def state_dict(self) -> dict[str, list[float]]:
        return {key: list(w) for key, w in self.windows.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """The windows saved by `state_dict` (those of entries this run no longer logs are dropped)."""
        self.extend(state)
