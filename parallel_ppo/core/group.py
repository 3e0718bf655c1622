"""The group protocol: a learner's place among the learners it trains with, and the exchanges between them. The
loop takes a `Group` and never asks which kind it has: `ALONE` for one process, `engines.distributed.Ranks` for a
rank of a data-parallel run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import nn

from parallel_ppo.core.collect import CollectResult, PeerCut
from parallel_ppo.core.config import Config, TrainingConfig

T = TypeVar("T")

STOP_REASONS = ("error", "signal", "total_steps", "duration")
"""Reasons a learner may want to stop after an update, in the order that wins when the ranks differ (an error over a
signal, as after a rollout: `agree_rollout`)."""


class Group:
    """A process's place among the learners it trains with, and every exchange between them. This base is one
    process alone (the sequential and parallel trainers), where every exchange returns its input;
    `engines.distributed.Ranks` is a rank among the others of a torch.distributed run."""

    rank = 0
    world_size = 1
    local_world_size = 1
    is_main = True
    distributed = False
    host: str | None = None
    job_id: str | None = None
    """The launcher's id of the job (torchrun's run id; None alone), recorded in its checkpoints."""

    def local_training(self, cfg: Config) -> TrainingConfig:
        """This process's training settings: the config's, alone."""
        return cfg.training

    def broadcast_parameters(self, model: nn.Module) -> None:
        pass

    def broadcast(self, obj: T) -> T:
        return obj

    def gather(self, obj: T, patient: bool = False) -> list[T]:
        return [obj]

    def gather_columns(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def own_columns(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def agree_stop(self, reason: str, signum: int | None) -> tuple[str, int | None]:
        return reason, (signum if reason == "signal" else None)

    @property
    def gradients(self) -> None:
        """What the update averages its gradients, statistics and KL with: nothing, alone."""
        return None

    def rollout_cut(self, cfg: Config) -> PeerCut | None:
        """What ends this process's rollout once enough others have ended theirs: nothing, alone."""
        return None

    def pop_seconds(self) -> float:
        return 0.0

    def close(self, wait: bool = True) -> None:
        pass


ALONE = Group()
"""The group of a process that learns alone (the default wherever a group is taken)."""


@dataclass
class AgreedRollout:
    """What the ranks agree on after a rollout (alone: the rollout as it is)."""

    result: CollectResult
    """Every rank's episodes, in rank order."""
    error: str | None
    """Any rank's error (named by its rank in a group)."""
    signum: int | None
    """A signal any rank received."""
    started: float
    """Rank 0's elapsed seconds when the rollout began: the clock an annealed learning rate follows, so that
    every rank steps with the same rate."""
    lengths: torch.Tensor
    """The steps each env took (`RolloutBuffer.lengths`), every rank's envs side by side in rank order."""

    @property
    def steps(self) -> int:
        """Env steps the rollout took, over every rank."""
        return int(self.lengths.sum())

    def taken(self, n_steps: int) -> torch.Tensor | None:
        """(T, every rank's envs) bool: the steps taken (as `RolloutBuffer.taken`); None where no rollout was cut."""
        return None if bool((self.lengths == n_steps).all()) else torch.arange(n_steps)[:, None] < self.lengths


def agree_rollout(group: Group, result: CollectResult, lengths: torch.Tensor, error: str | None, signum: int | None,
                  started: float, num_envs: int) -> AgreedRollout:
    """One exchange after every rollout: episodes (returns, lengths, final-info entries by name), rewards, the steps
    each env took (`lengths`), errors, signals, fresh envs (numbered over all ranks' envs, each rank having
    `num_envs`) and rank 0's clock."""
    reports = group.gather({"error": error, "signum": signum, "started": started, "result": result,
                            "lengths": lengths})
    errors = [e if group.world_size == 1 else f"rank {rank}: {e}"
              for rank, r in enumerate(reports) if (e := r["error"])]
    fresh = [rank * num_envs + env for rank, r in enumerate(reports) for env in r["result"].fresh_envs]
    merged = CollectResult.merged([r["result"] for r in reports], result.time_env, result.time_inference,
                                  result.time_render, fresh)
    signum = max((r["signum"] for r in reports if r["signum"]), default=None)
    return AgreedRollout(merged, "; ".join(errors) or None, signum, reports[0]["started"],
                         torch.cat([r["lengths"] for r in reports]))
