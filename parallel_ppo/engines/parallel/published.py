"""The learner's policy in shared memory: the coordinator publishes it, each worker takes a whole copy of it.

A sequence lock keeps a copy whole: the version is odd while the coordinator writes, and a worker copies again
if the version changed while it copied. Workers may take a copy in the middle of a rollout (`parallel.overlap`
with `parallel.refresh_params`), while the coordinator publishes the parameters of the update that just ended.
The lock is exact where a CPU keeps stores, and loads, in program order (x86-64); elsewhere (ARM) it relies on
the ordered atomic operations torch's reference counting executes between the copy and the version's update.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from parallel_ppo.core.buffer import RolloutBuffer
from parallel_ppo.core.model import policy_tensors

AWAIT_POLL = 0.0005
"""Seconds between a waiting worker's looks at the published version: a small share of a step, no core's worth."""


@dataclass
class PublishedPolicy:
    """Flat policy parameters and buffers (`policy_tensors`) with their version, both in shared memory."""

    flat: torch.Tensor
    version: torch.Tensor
    """One int64: even once a publication is whole, odd while one is written; 0 before the first."""

    @classmethod
    def allocate(cls, numel: int) -> PublishedPolicy:
        return cls(torch.zeros(numel).share_memory_(), torch.zeros((), dtype=torch.int64).share_memory_())

    def publish(self, model: nn.Module) -> int:
        """Write `model`'s parameters and buffers; returns the version they have."""
        flat = torch.nn.utils.parameters_to_vector(policy_tensors(model)).detach().cpu()  # off a GPU, unlocked
        self.version += 1
        self.flat.copy_(flat)
        self.version += 1
        return int(self.version)


class PolicyCopy:
    """A worker's own copy of the published policy, in `model`'s parameters and buffers (which it owns)."""

    def __init__(self, published: PublishedPolicy, model: nn.Module, gone: Callable[[], bool] = lambda: False) -> None:
        self.published = published
        self.gone = gone
        """True once the publisher is gone, perhaps in the middle of a publication that will never be whole."""
        self.flat = torch.zeros_like(published.flat)
        torch.nn.utils.vector_to_parameters(self.flat, policy_tensors(model))  # the model's tensors view `flat`
        self.version = -1
        """The version the model holds (-1: none yet)."""

    def refresh(self) -> int:
        """Take the published policy if it is newer than the model's; returns the version the model holds."""
        while (version := int(self.published.version)) != self.version:
            if version % 2:  # a publication is being written: a few microseconds
                if self.gone():
                    break  # the model keeps what it holds, for a rollout that ends
                os.sched_yield()  # to the coordinator, where the workers fill the cores
                continue
            self.flat.copy_(self.published.flat)
            if int(self.published.version) == version:  # nothing was written while it copied
                self.version = version
        return self.version


def hold_step(share: float, n_steps: int) -> int | None:
    """The step of a rollout collected during an update before which its workers wait for the update's parameters:
    `share` of it (`parallel.max_lagged_share`), rounded down, taken; None at 1: never."""
    return math.floor(share * n_steps + 1e-9) if share < 1 else None  # 0.29 × 100 is 28.999999999999996


def await_newer(published: PublishedPolicy, version: int, stopping: Callable[[], bool]) -> None:
    """Wait until a policy newer than `version` is published (or being written), or `stopping()`: a worker that
    took its share of the rollout with older parameters (`parallel.max_lagged_share`) waits for the update's."""
    while int(published.version) == version and not stopping():
        time.sleep(AWAIT_POLL)


def lagged_steps(buffer: RolloutBuffer, version: int | None, refreshed: bool) -> torch.Tensor | None:
    """(T, N) bool: the steps of `buffer`'s rollout taken with another policy than the one published as `version`
    (the model the rollout is for; None: it was not published, so all of them); None where no step was. Without
    `refreshed` workers, each rollout acts wholly with the model it is for (0 lag) or with an older one (policy_lag)."""
    if not refreshed and version is not None:
        return None
    lagged = buffer.versions != version if refreshed else torch.ones(buffer.versions.shape, dtype=torch.bool)
    taken = buffer.taken()  # the rows after a cut hold an older rollout's steps
    if taken is not None:
        lagged &= taken
    return lagged if bool(lagged.any()) else None
