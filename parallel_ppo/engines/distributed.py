"""Data-parallel learning across processes and hosts (DD-PPO) over torch.distributed: the ranks under torchrun,
each rank's minibatch (its own, or its share when the envs are split), and the collectives the training loop
needs (the envs' split is the config's: `core.configure.derive_distributed_envs`).

Every rank runs the rollout source it would run alone over its share of the envs and computes gradients on its
own rollout; before each optimizer step the gradients are averaged in one flat all-reduce, so the ranks keep
identical parameters. `Ranks` implements the group protocol of `core.group` (whose `ALONE` is a single process,
with nothing to exchange), so the trainer has one loop for every mode.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import time
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from parallel_ppo.core.config import Config, TrainingConfig, share_waited_for
from parallel_ppo.core.group import ALONE, STOP_REASONS, Group
from parallel_ppo.core.lifetime import signal_on_parent_death
from parallel_ppo.core.model import policy_tensors
from parallel_ppo.errors import ConfigError

LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""What torchrun sets for each rank; `--distributed` without them is a user error."""

RESTART_COUNT_VAR = "TORCHELASTIC_RESTART_COUNT"
"""Set by torchrun in every rank: how many times it has restarted the group (`--max-restarts`)."""

RUN_ID_VAR = "TORCHELASTIC_RUN_ID"
"""Set by torchrun in every rank: its job's id (`--rdzv-id`, or a fresh one with `--standalone`)."""

FINISH_TIMEOUT = timedelta(hours=1)
"""How long a rank that has finished waits for rank 0's last writes (a final evaluation included)."""

T = TypeVar("T")


class PeerLost(RuntimeError):
    """Another rank died, hung past the collective timeout, or closed its connection: this rank cannot go on."""


def torchrun_world(distributed: bool) -> int | None:
    """The ranks of a distributed run as torchrun announced them (None when not `distributed`)."""
    if not distributed:
        return None
    if not launched_by_torchrun():
        raise ConfigError("--distributed runs under torchrun, e.g. torchrun --standalone --nproc_per_node 2 "
                          "train_timed.py --distributed ... (see docs/distributed.md)")
    world = int(os.environ["WORLD_SIZE"])
    check_elastic(world)
    return world


def check_elastic(world: int | None) -> None:
    """torchrun shares its rendezvous store with the ranks (unless TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1), and its
    restart count is kept by each host's agent (pytorch/pytorch#135712): with restarts across hosts, the ranks of
    a restarted group could meet under different attempt numbers and wait for each other until the timeout."""
    hosts_share_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0)
    if world and world != int(os.environ.get("LOCAL_WORLD_SIZE", world)) and hosts_share_store and restarts:
        raise ConfigError("torchrun --max-restarts across hosts needs TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in "
                          "torchrun's environment on every host (pytorch/pytorch#135712)")


def attempt_store(rank: int, world_size: int, timeout: float) -> dist.Store:
    """The store the ranks meet in (torchrun's agent's, or one rank 0 serves), under a prefix of this attempt's own:
    a group that torchrun restarts meets in the same store, where the keys of the attempt before (the dead ranks'
    addresses) would otherwise be taken for this one's. The restart count is each host agent's own, so this holds
    on one host; across hosts `check_elastic` asks for a store of each attempt's own instead."""
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                          is_master=not agent and rank == 0, timeout=timedelta(seconds=timeout))
    if not agent:  # a store of this attempt's own, which rank 0 serves
        return store
    return dist.PrefixStore(f"parallel_ppo/attempt_{os.environ.get(RESTART_COUNT_VAR, '0')}", store)


def launched_by_torchrun() -> bool:
    return all(name in os.environ for name in LAUNCH_VARIABLES)


class Ranks(Group):
    """This rank's place among the others, and the collectives of a DD-PPO loop (gloo on CPU).

    A collective that fails (a rank died, or hung past `timeout` seconds) raises PeerLost. The seconds spent in
    the update's all-reduces are counted (`pop_seconds`), so that the loop can report them apart.
    """

    distributed = True

    def __init__(self, timeout: float) -> None:
        """Join the ranks torchrun started (its variables must be set: see `launched_by_torchrun`)."""
        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.local_world_size = int(os.environ["LOCAL_WORLD_SIZE"])
        self.is_main = self.rank == 0
        self.host = socket.gethostname()
        self.job_id = os.environ.get(RUN_ID_VAR)
        self._seconds = 0.0
        stop_with_launcher()
        try:
            self._store = attempt_store(self.rank, self.world_size, timeout)
            dist.init_process_group("gloo", store=self._store, rank=self.rank, world_size=self.world_size,
                                    timeout=timedelta(seconds=timeout))
            self._patient = dist.new_group(backend="gloo", timeout=FINISH_TIMEOUT)
        except (RuntimeError, ValueError) as e:
            raise PeerLost(f"could not join the other ranks at {os.environ['MASTER_ADDR']}:"
                           f"{os.environ['MASTER_PORT']}: {first_line(e)}") from None

    def local_training(self, cfg: Config) -> TrainingConfig:
        """This rank's training settings: with envs split over the ranks (`distributed.num_envs_total`), its share of
        the global minibatch (`training.batch_size` / world size); otherwise the minibatch is each rank's own."""
        t = cfg.training
        if not cfg.distributed.num_envs_total:
            return t
        return dataclasses.replace(t, batch_size=t.batch_size // self.world_size)

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except (RuntimeError, ValueError) as e:  # gloo raises RuntimeError (DistBackendError) on a lost peer
            raise PeerLost(f"rank {self.rank} lost the other ranks during {what}: {first_line(e)}") from None

    def broadcast_parameters(self, model: nn.Module) -> None:
        """Every rank takes rank 0's parameters (seeding alone does not make them equal across hosts); at start,
        with the long timeout, as `broadcast`."""
        tensors = policy_tensors(model)  # the observation statistics too
        vector = parameters_to_vector(tensors).detach().cpu()
        self._call("the parameter broadcast", dist.broadcast, vector, 0, self._patient)
        vector_to_parameters(vector.to(next(model.parameters()).device), tensors)

    def broadcast(self, obj: T) -> T:
        """Rank 0's `obj` on every rank (at start, where a rank may take long: measuring its learner settings
        while the others have them cached, so with the long timeout)."""
        box = [obj]
        self._call("a broadcast", dist.broadcast_object_list, box, 0, self._patient)
        return box[0]

    def gather(self, obj: T, patient: bool = False) -> list[T]:
        """Every rank's `obj`, in rank order, on every rank; `patient`: with the long timeout (at the end of a run,
        where the others wait while rank 0 writes its last checkpoint)."""
        out: list[Any] = [None] * self.world_size
        self._call("a gather", dist.all_gather_object, out, obj, self._patient if patient else None)
        return out

    def gather_columns(self, tensor: torch.Tensor) -> torch.Tensor:
        """The ranks' (T, N) tensors side by side: (T, world × N), rank 0's envs first."""
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        self._call("a gather", dist.all_gather, parts, tensor.contiguous())
        return torch.cat(parts, dim=1)

    def own_columns(self, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's columns of a `gather_columns` result."""
        n = tensor.shape[1] // self.world_size
        return tensor[:, self.rank * n:(self.rank + 1) * n]

    def agree_stop(self, reason: str, signum: int | None) -> tuple[str, int | None]:
        """The stop reason every rank takes, with the signal behind it: an error after rank 0's update (its hooks), else
        any rank's signal, else the step budget, else any rank's deadline ("" = all go on). The other ranks wait here
        while rank 0 logs, checkpoints and evaluates, so this exchange alone among the loop's has a long timeout (a
        hung rank is caught at the next short one)."""
        flags = torch.tensor([float(signum or 0) if reason == r == "signal" else float(reason == r)
                              for r in STOP_REASONS], dtype=torch.float64)
        self._call("the stop agreement", dist.all_reduce, flags, dist.ReduceOp.MAX, self._patient)
        agreed = next((r for r, flag in zip(STOP_REASONS, flags.tolist(), strict=True) if flag), "")
        return agreed, int(flags[STOP_REASONS.index("signal")]) if agreed == "signal" else None

    @property
    def gradients(self) -> Ranks:
        return self

    def mean_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Average `tensor` over the ranks in place (one all-reduce), counting the time it took."""
        self.sum_(tensor, "the gradient all-reduce")
        tensor /= self.world_size
        return tensor

    def sum_(self, tensor: torch.Tensor, what: str = "the advantage statistics") -> torch.Tensor:
        """Sum `tensor` over the ranks in place (through the CPU for a tensor on an accelerator: gloo is CPU's)."""
        start = time.perf_counter()
        host = tensor if tensor.device.type == "cpu" else tensor.cpu()
        self._call(what, dist.all_reduce, host, dist.ReduceOp.SUM)
        if host is not tensor:
            tensor.copy_(host)
        self._seconds += time.perf_counter() - start
        return tensor

    def rollout_cut(self, cfg: Config) -> RankCut | None:
        """DD-PPO's pre-emption of the slowest ranks (`distributed.sync_fraction` below 1), else None."""
        d = cfg.distributed
        if d.sync_fraction >= 1 or self.world_size == 1:  # one rank alone has none to cut
            return None
        needed = share_waited_for(d.sync_fraction, self.world_size)
        return RankCut(dist.PrefixStore("parallel_ppo/ended", self._store), needed, self.is_main)

    def pop_seconds(self) -> float:
        """Seconds spent in the update's all-reduces since the last call."""
        seconds, self._seconds = self._seconds, 0.0
        return seconds

    def close(self, wait: bool = True) -> None:
        """Leave the group; with `wait`, only once every rank is done (rank 0 writes its files last), so that no
        rank tears its connections down under another one still at work."""
        if not dist.is_initialized():
            return
        if wait:
            try:
                dist.monitored_barrier(timeout=FINISH_TIMEOUT)
            except RuntimeError:  # a rank that already failed has said so; leaving is all that is left
                pass
        dist.destroy_process_group()


class RankCut:
    """The ranks' count of ended rollouts in the store they met in (a key per rollout): a rank's rollout is cut
    once `needed` ranks have ended theirs (`core.collect.PeerCut`). The count is read at most every `CHECK_SECONDS`
    (a round trip to the store), so fast envs do not wait on it each step."""

    CHECK_SECONDS = 0.005

    def __init__(self, store: dist.Store, needed: int, is_main: bool) -> None:
        self.store, self.needed, self.is_main = store, needed, is_main
        self.rollout, self.checked, self.cut = 0, 0.0, False
        self.lost: BaseException | None = None

    def __call__(self) -> bool:
        now = time.monotonic()
        if not self.cut and now - self.checked >= self.CHECK_SECONDS:
            self.checked = now
            try:
                self.cut = self.store.add(str(self.rollout), 0) >= self.needed
            except (RuntimeError, ValueError) as e:  # mid-rollout: end it here, and ended() says the store is gone
                self.lost, self.cut = e, True
        return self.cut

    def ended(self) -> None:
        """Count this rank's rollout as ended, and go on to the next. Rank 0 drops the key of the rollout before: every
        rank has agreed on that one, so none reads it again. PeerLost where the store's host is gone."""
        try:
            if self.lost is not None:
                raise self.lost
            self.store.add(str(self.rollout), 1)
            if self.is_main and self.rollout:
                self.store.delete_key(str(self.rollout - 1))
        except (RuntimeError, ValueError) as e:
            raise PeerLost(f"lost the other ranks' count of ended rollouts: {first_line(e)}") from None
        self.rollout, self.checked, self.cut = self.rollout + 1, 0.0, False


def stop_with_launcher() -> None:
    """Ask Linux to send this rank SIGTERM when its launcher dies (a SIGKILLed torchrun would otherwise leave the
    ranks training on their own): the ranks then stop together as on any signal."""
    signal_on_parent_death(signal.SIGTERM)


def first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def join(cfg: Config, distributed: bool) -> Group:
    """The group of this process: ALONE unless `distributed`, else this rank joined to the others."""
    return Ranks(cfg.distributed.timeout_seconds) if distributed else ALONE

