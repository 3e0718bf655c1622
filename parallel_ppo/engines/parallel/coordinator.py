"""The coordinator: shared policy parameters and rollout buffers, W workers (synchronous, or collecting through the
update), faults and shutdown."""

from __future__ import annotations

import signal
import sys
import time
from multiprocessing.connection import wait

import setproctitle
import torch
from torch import nn

from parallel_ppo.core.buffer import RolloutBuffer
from parallel_ppo.core.collect import CollectResult, RolloutError, StopCheck, never
from parallel_ppo.core.config import Config
from parallel_ppo.core.model import module_device, network, policy_tensors
from parallel_ppo.core.threads import ThreadPlan, worker_cpus
from parallel_ppo.core.timing import PhaseTimer
from parallel_ppo.engines.parallel.idle import IdleWorkers, LaggedSteps, LentCores, idle_note, lag_note
from parallel_ppo.engines.parallel.pace import WorkerPace
from parallel_ppo.engines.parallel.processes import (
    WorkerProcess,
    describe_exit,
    start_forkserver,
    stop_process,
    thread_env,
    try_recv,
)
from parallel_ppo.engines.parallel.published import PublishedPolicy, hold_step, lagged_steps
from parallel_ppo.engines.parallel.rollout import Rollout
from parallel_ppo.engines.parallel.watchdog import Watchdog, auto_bound, describe, work_seconds
from parallel_ppo.engines.parallel.worker import Collect, Done, Failed, Ready, Stop, WorkerSpec, worker_main
from parallel_ppo.envs.families import family_of
from parallel_ppo.envs.spaces import EnvSpaces

STARTUP_TIMEOUT = 180.0
"""Seconds a new worker may neither run nor wait for a core while it imports, builds its envs and reports ready (as
the watchdog counts them; one that computes may take the watchdog's ceiling)."""

PREEMPT_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)

ABANDON_GRACE = 5.0  # seconds an abandoned rollout waits for a worker that has stopped stepping

class WorkerError(RolloutError):
    """A worker failed in a way a restart cannot fix, or a slot used up its restarts."""


class _Died(Exception):
    """A worker process ended before saying it was ready (a restart may help)."""


class ParallelCoordinator:
    """Rollout source backed by worker processes that write straight into a shared-memory buffer.

    Synchronous (the default): `collect` publishes the current parameters, wakes every worker, and returns when all
    have filled their env slice, so the update always sees on-policy data (no policy lag). With
    `parallel.sync_fraction` below 1, the slowest workers' slices end short once that share of workers is done
    (DD-PPO's pre-emption of stragglers). With `parallel.overlap` and a `policy_lag` of 1, `collect` returns one
    rollout and sets the workers on the next, into the other buffer, with the same parameters: they collect while the
    learner updates, and each rollout after the first trails the parameters it updates by one update. With
    `parallel.refresh_params` too, the next `collect` publishes the updated parameters at once and the workers act
    with them from their next step: only the steps taken during the update (and what the loop did after it) trail it
    (`lagged_share`; at most `max_lagged_share`, where they wait). Once every worker has collected the rollout in
    flight, the learner takes their cores until the next starts (`LentCores`, `ThreadPlan.idle_learner`)."""

    mode = "parallel"

    def __init__(self, cfg: Config, spaces: EnvSpaces, threads: ThreadPlan, resumes: int = 0, env_offset: int = 0,
                 rank: int | None = None) -> None:
        """`spaces`: the env's (`env_spaces`, read once before); `env_offset`: the global index of the first env (a
        distributed rank's share starts there); `rank`: the distributed rank, shown in the process title."""
        p = cfg.parallel
        self.cfg = cfg
        self.env_threads, self.draw_threads = threads.env, threads.draw
        self.worker_threads = threads.worker or 1  # a parallel plan always has one; the field is optional
        self.spaces = spaces
        self.policy = PublishedPolicy.allocate(sum(t.numel() for t in policy_tensors(network(cfg, spaces))))
        self.progress = torch.zeros(p.num_workers, dtype=torch.int64).share_memory_()
        self.abandon = torch.zeros((), dtype=torch.int64).share_memory_()
        self.cut = torch.zeros((), dtype=torch.int64).share_memory_()
        self.buffers = tuple(RolloutBuffer.allocate(cfg.training.n_steps, cfg.env.num_envs, spaces.obs_shape,
                                                    spaces.obs_dtype, spaces.actions, shared=True)
                             for _ in range(p.rollout_buffers))
        self.buffer = self.buffers[0]
        """The buffer of the rollout `collect` returned last."""
        self.lag = p.lag
        self.policy_lag = 0
        """Updates by which the parameters of the rollout `collect` returned last trail the model it was given."""
        self.lagged: torch.Tensor | None = None
        """(T, N) bool: the steps of that rollout not taken with the model it was given (None: none)."""
        self.lagged_share = 0.0
        """Of the env steps of that rollout, the share `lagged`."""
        self._refresh, self._early = bool(self.lag and p.refresh_params), bool(self.lag and p.early_start)
        self._hold_at = hold_step(p.max_lagged_share, cfg.training.n_steps) if self._refresh else None
        self._idle, self._lent = IdleWorkers(), LentCores(threads.learner, threads.idle_learner)
        self._lagging = LaggedSteps(watching=LaggedSteps.widening(cfg, spaces))
        self._calls = 0
        self._in_flight: Rollout | None = None
        self._slot = len(self.buffers) - 1  # the buffer filled last: each rollout fills the next one, in turn
        self.layout = {"num_workers": p.num_workers, "num_envs_per_worker": p.num_envs_per_worker,
                       "num_envs": cfg.env.num_envs}
        self.restarts, self.pace = 0, WorkerPace(p.num_workers, cfg.training.n_steps)  # whom the rollouts waited for
        self._fresh_envs: set[int] = set()
        self._resumes, self._env_offset, self._rank = resumes, env_offset, rank
        self._slot_restarts = [0] * p.num_workers
        self._ctx = torch.multiprocessing.get_context(p.start_method)
        if p.start_method == "forkserver":
            self._ctx.set_forkserver_preload(["parallel_ppo.engines.parallel.preload"])
        self._workers: list[WorkerProcess | None] = [None] * p.num_workers
        self._start_seconds = [0.0] * p.num_workers
        self._title = setproctitle.getproctitle()  # put back by `close`
        who = "coordinator" if rank is None else f"coordinator rank {rank}"
        setproctitle.setproctitle(f"parallel_ppo {who} ({p.num_workers} workers × {p.num_envs_per_worker} envs, "
                                  f"{cfg.env.id})")
        self._start_workers()
        self.watchdog = Watchdog(self._bound())

    def _start_workers(self) -> None:
        """Start every worker and wait until each is ready; on failure, stop them all (WorkerError if one died)."""
        try:
            # the forkserver and multiprocessing's resource tracker start with the first worker, in this process
            # group: they must not die of a pre-emption signal sent to the group (they ignore SIGINT and SIGTERM)
            previous = signal.pthread_sigmask(signal.SIG_BLOCK, PREEMPT_SIGNALS)
            try:
                if self._ctx.get_start_method() == "forkserver":
                    start_forkserver(self.cfg.env.id if family_of(self.cfg.env.id).preload is not None else None)
                for i in range(len(self._workers)):
                    self._workers[i] = self._spawn(i, restart=0)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, previous)
            for i in range(len(self._workers)):
                self._await_ready(i)
        except _Died as e:
            self.close()
            raise WorkerError(f"a worker {e}") from None
        except BaseException:
            self.close()
            raise

    # -- the watchdog -----------------------------------------------------------------------------------
    def _bound(self) -> float:
        """Seconds a worker may neither step nor compute (`parallel.worker_timeout`, or `auto`'s measured bound)."""
        timeout = self.cfg.parallel.worker_timeout
        return auto_bound(max(self._start_seconds)) if timeout == "auto" else float(timeout)

    def describe_watchdog(self) -> str:
        """One line for the start of a run: how long a worker may neither step nor compute, and why."""
        return describe(self._rank, self.cfg.parallel.worker_timeout, self.watchdog.bound, max(self._start_seconds))

    # -- worker lifecycle -------------------------------------------------------------------------------
    def _spawn(self, index: int, restart: int) -> WorkerProcess:
        m = self.cfg.parallel.num_envs_per_worker
        spec = WorkerSpec(index=index, first_env=index * m, num_envs=m, stream=(self._resumes, restart),
                          cfg=self.cfg, spaces=self.spaces, buffers=self.buffers,
                          policy=self.policy, progress=self.progress, abandon=self.abandon, cut=self.cut,
                          env_threads=self.env_threads, draw_threads=self.draw_threads,
                          torch_threads=self.worker_threads, env_offset=self._env_offset,
                          cpus=worker_cpus(self._env_offset // m + index, self.draw_threads)
                          if self.cfg.parallel.pin_workers else None)
        parent, child = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(target=worker_main, args=(spec, child), name=f"ppo-worker-{index}",
                                    daemon=True)
        with thread_env(self.worker_threads):
            process.start()
        child.close()
        return WorkerProcess(process, parent, spec)

    def _await_ready(self, index: int, stopping: StopCheck = never) -> bool:
        """Await a new worker's hello (False: `stopping()` first); _Died if it dies first, WorkerError if it fails."""
        worker = self._workers[index]
        assert worker is not None
        starting = Watchdog(STARTUP_TIMEOUT)  # a start kept waiting for a core (a busy machine, `nice`) is slow
        while not wait([worker.conn, worker.process.sentinel], timeout=1.0):
            if stopping():
                return False
            if why := starting.hung(index, 0, work_seconds(worker.process.pid), time.monotonic()):
                why = why.replace("neither stepped nor computed", "neither ran nor waited for a core")
                raise WorkerError(f"worker {index} was not ready: while starting it {why}")
        message = try_recv(worker.conn)
        if isinstance(message, Ready):
            self._start_seconds[index] = message.start_seconds
            return True
        if isinstance(message, Failed):
            raise WorkerError(f"worker {index} failed to start: {message.summary}", message.traceback)
        worker.process.join(1.0)
        raise _Died(f"died while starting ({describe_exit(worker.process.exitcode)})")

    def _replace(self, index: int, why: str, stopping: StopCheck) -> bool:
        """Restart a dead or stuck worker with fresh envs and ask it for its share of the rollout in flight, or give up
        after `max_worker_restarts`; False where the run is stopped meanwhile (the new worker too: a slow start does
        not hold a SIGTERM up)."""
        limit = self.cfg.parallel.max_worker_restarts
        while True:
            stop_process(self._workers[index], kill=True)
            if self._slot_restarts[index] >= limit:
                raise WorkerError(f"worker {index} {why}; it was restarted {limit} times already "
                                  f"(parallel.max_worker_restarts), stopping")
            self._slot_restarts[index] += 1
            self.restarts += 1
            m = self.cfg.parallel.num_envs_per_worker
            self._fresh_envs.update(range(index * m, (index + 1) * m))
            print(f"parallel_ppo: worker {index} {why}; restarting it with fresh envs "
                  f"({self._slot_restarts[index]}/{limit})", file=sys.stderr, flush=True)
            self._workers[index] = self._spawn(index, restart=self._slot_restarts[index])
            try:
                if not self._await_ready(index, stopping):
                    stop_process(self._workers[index], kill=True)
                    return False
                self.watchdog.bound = max(self.watchdog.bound, self._bound())  # a slower start: more room
                self._request(index)
                return True
            except _Died as e:  # a signal to the whole group may have reached it: no restart once stopping
                why = str(e)
                if stopping():
                    return False

    # -- the rollout ------------------------------------------------------------------------------------
    def collect(self, model: nn.Module, timers: PhaseTimer, stopping: StopCheck = never) -> CollectResult:
        self._calls += 1
        start, publish, version = time.perf_counter(), 0.0, None
        if self._in_flight is None:  # the first rollout, or every one without a lag
            publish, version = self._start(model, timers)
        elif self._refresh:  # the workers take `model` from their next step on (and, early, the next rollout)
            self._lent.give_back()  # those waiting for it go on with their cores
            with timers.phase("publish"):
                version = self.policy.publish(model)
            publish = time.perf_counter() - start
        rollout = self._in_flight
        assert rollout is not None
        upcoming = self._rollout(version) if self._early and not stopping() else None
        results = self._finish(rollout, stopping, upcoming)
        waited = time.perf_counter() - start - publish
        self._in_flight = None
        self.buffer, self.policy_lag = self.buffers[rollout.slot], self._calls - rollout.call
        if not self.abandon:  # each worker's steps taken: all, or those before a cut (`lengths`, per env)
            self.pace.observe(results, self.buffer.lengths[::self.cfg.parallel.num_envs_per_worker].tolist())
        self.lagged = lagged_steps(self.buffer, version, self._refresh)
        self.lagged_share = 0.0 if self.lagged is None else int(self.lagged.sum()) / int(self.buffer.lengths.sum())
        if self.lag and not stopping():  # the next rollout, with these parameters, while the learner updates
            self._start(model, timers, version, upcoming)
        n = max(len(results), 1)
        t_env, t_inf, t_render = (sum(getattr(r, name) for r in results) / n
                                  for name in ("time_env", "time_inference", "time_render"))
        if self.policy_lag:
            self._say_if_idle(t_env + t_render + t_inf, rollout.flight, model)
        # of the workers' rollout, only what the learner waited for is this update's: the rest ran during the last
        seen = min(1.0, waited / max(rollout.seconds, 1e-9))
        timers.add("env", t_env * seen)
        timers.add("render", t_render * seen)
        timers.add("inference", t_inf * seen)
        timers.add("sync", max(0.0, waited - (t_env + t_render + t_inf) * seen))
        fresh, self._fresh_envs = sorted(self._fresh_envs), set()
        return CollectResult.merged(results, t_env, t_inf, t_render, fresh)

    def _say_if_idle(self, busy: float, seconds: float, model: nn.Module) -> None:
        """Say once each, on stderr, where an overlapped rollout's workers waited for the learner (`IdleWorkers`) and
        where most of its steps lagged, the clip around the acting one (`LaggedSteps`); first rank only, progress on."""
        idle, lagged = self._idle.observe(busy, seconds), self._lagging.observe(self.lagged_share)
        if self._rank or self.cfg.logging.progress == "off":
            return
        if idle is not None:
            lent, cap = (self._lent.lent if self._lent.lends else 0), self.cfg.parallel.max_lagged_share
            print(idle_note(idle, busy, seconds, module_device(model).type, self._lent.own, lent, cap), file=sys.stderr)
        if lagged is not None:
            print(lag_note(lagged), file=sys.stderr)

    def during_update(self) -> None:
        """Before each minibatch step: once the workers are done with the rollout in flight, the learner takes their
        cores (`LentCores`)."""
        if self._in_flight is not None:
            self._lent.lend_if(self._collected)

    def _collected(self) -> bool:
        """Whether every worker answered for the rollout in flight (or ended), or waits for the update's parameters."""
        held = self._in_flight.held if self._in_flight is not None else None
        try:
            return all(w is None or w.conn.poll() or (held is not None and int(self.progress[i]) >= int(held[i]))
                       for i, w in enumerate(self._workers))
        except OSError:  # a pipe closed on this side: its worker was stopped, and collects nothing
            return True

    def _start(self, model: nn.Module, timers: PhaseTimer, version: int | None = None,
               upcoming: Rollout | None = None) -> tuple[float, int]:
        """Publish `model`'s parameters (unless they are already, as `version`) and wake every worker to collect into
        the next buffer (in turn), but those `upcoming` woke already; returns the seconds it took (phase `publish`)
        and the version published."""
        started = time.perf_counter()
        self._lent.give_back()
        with timers.phase("publish"):
            rollout = upcoming or self._rollout(version)  # held through an update: `version` was published before
            if version is None:
                version = self.policy.publish(model)
            self._slot, self._in_flight = rollout.slot, rollout
            rollout.launch()
            self.abandon.fill_(0)
            for i in range(len(self._workers)):
                if i not in rollout.woken:
                    self._request(i, rollout)
        return time.perf_counter() - started, version

    def _rollout(self, version: int | None) -> Rollout:
        """The next rollout, into the next buffer (in turn); `version`: the parameters published before the update
        it is collected during, which its workers hold at `max_lagged_share` of it until newer ones."""
        hold = None if version is None or self._hold_at is None else (self._hold_at, version)
        return Rollout((self._slot + 1) % len(self.buffers), self._calls, hold=hold,
                       held=None if hold is None else self.progress.clone())

    def _finish(self, rollout: Rollout, stopping: StopCheck, upcoming: Rollout | None = None) -> list[CollectResult]:
        """Wait for every worker of `rollout`; dead or stuck workers are replaced and re-collect their slice. With
        `upcoming` (`parallel.early_start`), each worker done is set on it at once. Once `stopping()` is true, the
        rollout is abandoned: the workers end theirs where they are, and one that died (a signal to the whole group
        may have reached it) is not replaced. The results are then partial. Once `parallel.sync_fraction` of the
        workers are done, the others end theirs before their next step, once a quarter of their steps are taken."""
        watchdog = self.watchdog
        pending = set(range(len(self._workers)))
        results: dict[int, CollectResult] = {}
        while pending:
            if stopping() and not self.abandon:
                self.abandon.fill_(1)
            if len(results) >= self.cfg.parallel.workers_waited_for and not self.cut:
                self.cut.fill_(1)
            handles = {}
            for i in pending:
                w = self._workers[i]
                handles[w.conn] = i
                handles[w.process.sentinel] = i
            ready = wait(list(handles), timeout=min(0.5, watchdog.bound))
            for i in sorted({handles[h] for h in ready}):
                w = self._workers[i]
                message = try_recv(w.conn)
                if message is None and (self.abandon or stopping()):  # a signal may have reached it: no restart
                    pending.discard(i)
                elif message is None:  # the pipe closed or the process ended without an answer
                    w.process.join(1.0)
                    if not self._replace(i, f"died ({describe_exit(w.process.exitcode)})", stopping):
                        pending.discard(i)
                elif isinstance(message, Done):
                    results[i] = message.result
                    pending.discard(i)
                    if upcoming is not None and not (self.abandon or stopping()):
                        self._request(i, upcoming)
                elif isinstance(message, Failed):
                    raise WorkerError(f"worker {i} failed: {message.summary}", message.traceback)
            for i in list(pending):
                steps, cpu = int(self.progress[i]), work_seconds(self._workers[i].process.pid)
                now = time.monotonic()  # a restart above may have taken seconds: read each slot at its own time
                if self.abandon:  # never restarted now; one that stays stepless is stopped by force in `close`
                    if watchdog.read(i, steps, cpu, now)[1] > ABANDON_GRACE:
                        pending.discard(i)
                elif why := watchdog.hung(i, steps, cpu, now):
                    auto = " auto" if self.cfg.parallel.worker_timeout == "auto" else ""
                    if not self._replace(i, f"{why} (parallel.worker_timeout{auto})", stopping):
                        pending.discard(i)
        rollout.end()
        self.cut.fill_(0)  # every worker has ended this rollout
        return [results[i] for i in sorted(results)]

    def _request(self, index: int, rollout: Rollout | None = None) -> None:
        """Ask worker `index` to collect its share of `rollout` (the one in flight: a restarted worker's again)."""
        w, rollout = self._workers[index], rollout or self._in_flight
        assert rollout is not None
        self.watchdog.forget(index)
        rollout.wake(index, int(self.progress[index]))
        try:
            w.conn.send(Collect(rollout.slot, self._refresh, rollout.hold))
        except (BrokenPipeError, OSError):
            pass  # it died; the wait loop sees its sentinel

    # -- shutdown ---------------------------------------------------------------------------------------
    def abandon_rollout(self) -> None:
        """End the rollout still in flight, if any (an overlapped one the run stopped before waiting for): the
        workers stop stepping where they are, and nothing reads what they wrote."""
        self.abandon.fill_(1)

    def close(self) -> None:
        """Stop every worker (politely, then by force); safe to call more than once. A rollout still in flight is
        abandoned, and the learner has its own threads again."""
        self.abandon_rollout()
        self._lent.give_back()
        for w in self._workers:
            if w is not None:
                try:
                    w.conn.send(Stop())
                except (BrokenPipeError, OSError):
                    pass
        deadline = time.monotonic() + 5.0
        for i, w in enumerate(self._workers):
            if w is not None:
                w.process.join(max(0.0, deadline - time.monotonic()))
                stop_process(w, kill=True)  # workers ignore SIGTERM: one still there after Stop is killed
                self._workers[i] = None
        setproctitle.setproctitle(self._title)  # a process that goes on (the Python API's caller) is itself again
