"""A rollout the coordinator set its workers on: the buffer it fills, the parameters it starts with and where it
waits for newer ones, and which workers were asked for their share."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch


@dataclass
class Rollout:
    """A rollout the workers were set on."""

    slot: int  # the buffer it fills
    call: int  # the `collect` call that published its parameters
    requested: float = 0.0
    """When the first worker was woken (perf_counter)."""
    seconds: float = 0.0
    """From waking the first worker to taking the last one's result (after the update it was collected during)."""
    started: float = 0.0
    """When it became the rollout in flight (perf_counter): after `requested` for one woken early."""
    flight: float = 0.0
    """From `started` to taking the last worker's result: the span its workers could wait for the learner in. A
    worker woken early (`parallel.early_start`) waited for the slowest of the rollout before, not for the learner,
    and what it did before `started` counts in its busy time."""
    hold: tuple[int, int] | None = None
    """(step, version): one collected during an update, where its workers wait for a newer policy (`Collect.hold`)."""
    held: torch.Tensor | None = None  # each worker's step count (`progress`) once it waits there
    woken: set[int] = field(default_factory=set)
    """The workers asked to collect it (`parallel.early_start`: some before the rollout before it ended)."""

    def launch(self) -> None:
        """Count it the rollout in flight from now."""
        self.started = time.perf_counter()

    def end(self) -> None:
        """Its last worker's result is taken now."""
        now = time.perf_counter()
        self.seconds, self.flight = now - self.requested, now - self.started

    def wake(self, index: int, progress: int) -> None:
        """Count worker `index` asked for its share, `progress` the steps it has taken so far (it holds, if this
        rollout holds, that many steps on)."""
        if not self.woken:
            self.requested = time.perf_counter()
        self.woken.add(index)
        if self.held is not None and self.hold is not None:
            self.held[index] = progress + self.hold[0]
