"""What an overlapped run does when its workers wait for the learner, and what it says then and where most of its
steps lag (`LaggedSteps`). Where the update takes longer than the rollout, the workers finish theirs and sit idle
until the learner asks for the next, and the update bounds the run. The learner then takes their cores
(`LentCores`), and where they waited most of two rollouts, the run says so. On 16 cores the wrist camera's Nature CNN
took 42 to 47 s an update on the one thread 16 workers leave, while they collected a rollout in about 10 s: the
overlapped runs made 149 and 136 steps/s against the synchronous run's 385
(docs/results/intel-xeon-avx512-bf16-16c-h200/overlap_16c.md)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from parallel_ppo.core.config import Config
from parallel_ppo.core.ppo import anchor_pass
from parallel_ppo.envs.spaces import EnvSpaces

IDLE_SHARE = 0.5
"""The share of a rollout's time the workers sat idle above which a rollout counts as waiting for the learner (the
update then took about twice their collecting, or more)."""
ROLLOUTS = 2
"""Rollouts running that must wait so before the run says so: one long evaluation or checkpoint does not."""
MIN_SECONDS = 1.0
"""Rollouts shorter than this are not counted: their idle time is the rollout's fixed cost (waking the workers,
publishing the parameters), and a run of them is fast whatever the trainer (CartPole's take milliseconds)."""


class LentCores:
    """An overlapped learner's torch threads: its `own` (the cores its workers leave) while they collect, `lent`
    from its first minibatch step after every worker has collected the rollout in flight until the next starts."""

    def __init__(self, own: int, lent: int) -> None:
        self.own, self.lent = own, lent
        self.lending = False
        self._before = own

    @property
    def lends(self) -> bool:
        """Whether there are more threads to lend than the learner's own."""
        return self.lent > self.own

    def lend_if(self, collected: Callable[[], bool]) -> None:
        """Before a minibatch step: take the lent threads once `collected()` (asked only while they would help)."""
        if self.lends and not self.lending and collected():
            self._before = torch.get_num_threads()
            torch.set_num_threads(self.lent)
            self.lending = True

    def give_back(self) -> None:
        """As the next rollout starts: the threads the learner had before it took the lent ones."""
        if self.lending:
            torch.set_num_threads(self._before)
            self.lending = False


class IdleWorkers:
    """Counts the overlapped rollouts whose workers waited for the learner."""

    def __init__(self) -> None:
        self.running = 0
        self.said = False

    def observe(self, busy: float, seconds: float) -> float | None:
        """A rollout of `seconds` (from its becoming the rollout in flight to the coordinator taking its workers'
        results: after the update, for a rollout collected during it; `Rollout.flight`) in which the mean worker was
        busy (stepping, drawing, inferring) `busy` seconds. Returns its idle share the first time ROLLOUTS running of
        at least MIN_SECONDS were idle more than IDLE_SHARE of their time (the run says so once), else None."""
        idle = 1.0 - busy / max(seconds, 1e-9)
        self.running = self.running + 1 if idle > IDLE_SHARE and seconds >= MIN_SECONDS else 0
        if self.said or self.running < ROLLOUTS:
            return None
        self.said = True
        return idle


def idle_note(idle: float, busy: float, seconds: float, device: str, learner_threads: int, lent: int = 0,
              cap: float = 1.0) -> str:
    """The line an overlapped run prints once its workers waited for the learner (`IdleWorkers.observe`), with the
    remedies that fit its learner's `device` (`lent`: the threads it takes while they wait, if more; `cap`: the
    run's `parallel.max_lagged_share`, the share of a rollout after which they wait for the update)."""
    said = (f"parallel_ppo: the workers sat idle {idle:.0%} of the last rollout ({busy:.1f} s busy of {seconds:.1f} "
            "s), waiting for the update: the update bounds this run, and more workers gain nothing.")
    if cap < 1:
        said += (f" They wait for it after parallel.max_lagged_share ({cap:g}) of each rollout: a larger share keeps "
                 "them stepping (at 1 they never wait), with that many more steps one update behind.")
    if device != "cpu":
        return said
    has = f"the {learner_threads} thread(s) the workers leave" + (f" ({lent} while they wait)" if lent else "")
    return (f"{said} The learner has {has}: fewer workers with a learner "
            "thread for each core they leave (parallel.learner_threads), the synchronous trainer (parallel.overlap: "
            "false), whose learner takes every core, or a learner on a GPU (--device cuda) may be faster.")


LAGGED_SHARE = 0.5
"""The share of a rollout's steps taken with older parameters above which the run suggests the decoupled clip."""


class LaggedSteps:
    """Counts the overlapped rollouts most of whose steps lagged, where the clip around the acting policy widens the
    policy (`widening`; `watching` False: never)."""

    def __init__(self, watching: bool) -> None:
        self.watching, self.running = watching, 0

    @staticmethod
    def widening(cfg: Config, spaces: EnvSpaces) -> bool:
        """Whether a run's lagged steps are clipped around the policy that took them (neither `decoupled_clip` nor
        `training.augment_anchor` on shifted frames in the loss) with continuous actions, whose spread that clip
        widens; with discrete ones (CartPole) the decoupled clip did not help (docs/training.md)."""
        anchored = anchor_pass(cfg.training, bool(cfg.training.augment_shift), False) == "minibatch"
        return spaces.actions.continuous and not (cfg.parallel.decoupled_clip or anchored)

    def observe(self, share: float) -> float | None:
        """A rollout whose `share` of steps lagged. Returns it the first time ROLLOUTS running lagged more than
        LAGGED_SHARE (the run says so once), else None."""
        self.running = self.running + 1 if share > LAGGED_SHARE else 0
        if not self.watching or self.running < ROLLOUTS:
            return None
        self.watching = False
        return share


def lag_note(share: float) -> str:
    """The line an overlapped run prints once most of its steps lagged under the clip around the acting policy."""
    return (f"parallel_ppo: {share:.0%} of the last rollout's steps acted with the parameters of an update before. "
            "PPO's clip around the policy that took them widens a policy that has narrowed since (on HalfCheetah, "
            "every step lagging, it ended at about half the synchronous trainer's return); parallel.decoupled_clip: "
            "true clips around the policy the update starts from: it learned more on HalfCheetah, while on Lift from "
            "state (few steps lagging) its three finished runs ended narrower than the synchronous trainer's, two "
            "at a far lower success; measure before keeping it (docs/training.md).")
