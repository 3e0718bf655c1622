"""The parallel trainer: it reproduces the sequential one exactly, learns, and leaves nothing behind."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import torch
from sessions import assert_nothing_left, shm_entries, start

from parallel_ppo.core import loop
from parallel_ppo.core.checkpoint import load_checkpoint
from parallel_ppo.core.collect import CollectResult, SequentialCollector
from parallel_ppo.core.configure import build_config
from parallel_ppo.core.distributions import log_prob_entropy
from parallel_ppo.core.model import network
from parallel_ppo.core.pause import PAUSE_ENV_VAR, release_file
from parallel_ppo.core.threads import thread_plan, worker_cpus
from parallel_ppo.core.timing import PhaseTimer
from parallel_ppo.engines.parallel import coordinator as coordinator_module
from parallel_ppo.engines.parallel.coordinator import ParallelCoordinator
from parallel_ppo.engines.parallel.idle import IdleWorkers, LaggedSteps, LentCores, idle_note, lag_note
from parallel_ppo.engines.parallel.pace import WorkerPace
from parallel_ppo.envs.batch import env_spaces
from parallel_ppo.runs.closing import one_slowest_line
from parallel_ppo.runs.training import RunPlan, train_run
from parallel_ppo.tuning.compute_limit import threads_kept

pytestmark = pytest.mark.slow  # every test here trains or starts trainers

ROOT = Path(__file__).resolve().parents[1]
BUFFER_FIELDS = ("obs", "actions", "rewards", "bootstrap", "dones", "logprobs", "values", "last_values", "last_obs")


SETTINGS = {
    # 4 CartPole envs × 32 steps: the rollout crosses episode ends
    "CartPole-v1": ("config/cartpole.yaml", 4, ["training.n_steps=32", "training.batch_size=32"]),
    # 8 starpilot envs × 16 steps through the IMPALA CNN
    "starpilot": ("config/ppo_sequential.yaml", 8, ["training.n_steps=16", "training.batch_size=64",
                                                     "training.microbatch_size=64", "run.limit_seconds=0"]),
    # 4 Pendulum envs × 32 steps, continuous actions, observations and rewards normalized; two updates, so that the
    # second rollout is collected with the statistics the first one published
    "Pendulum-v1": ("config/mujoco.yaml", 4, ["training.n_steps=32", "training.batch_size=32",
                                              "run.total_steps=129", "run.limit_seconds=0"]),
    # 4 envs × 32 steps of a dict observation (an 8×8 camera image, a vector and a scalar) through the multi-input
    # network, its vector keys normalized; two updates
    "toy_envs:CameraReach-v0": ("config/cartpole.yaml", 4, [
        "training.n_steps=32", "training.batch_size=32", "run.total_steps=129", "run.limit_seconds=0",
        "model.kind=auto", "model.impala_depths=[4, 8]", "model.hidden_size=32", "training.normalize_obs=true"]),
}


def _config(env_id: str, parallel: bool, workers: int, out: Path, extra: tuple[str, ...]):
    config, envs, sets = SETTINGS[env_id]
    flags = {"env.id": env_id, "run.seed": 3, "run.output_dir": str(out), "run.total_steps": 1}
    sets = [*sets, *extra, "training.n_epochs=2", "eval.interval_seconds=0", "logging.tensorboard=false",
            "training.precision=fp32",
            f"env.num_envs={envs}", f"parallel.num_workers={workers}",
            f"parallel.num_envs_per_worker={envs // workers}"]
    return build_config(config, flags, sets, parallel)


def _one_update(tmp_path: Path, env_id: str, workers: int,
                extra: tuple[str, ...]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Train for exactly one update; return the rollout buffer's contents and the final parameters."""
    out = tmp_path / f"{env_id}_w{workers}"
    out.mkdir()
    cfg = _config(env_id, workers > 0, max(workers, 1), out, extra)
    spaces = env_spaces(cfg.env)
    if workers:
        source = ParallelCoordinator(cfg, spaces, thread_plan(cfg, parallel=True))
    else:
        source = SequentialCollector(cfg, 1)
    summary = train_run(RunPlan(cfg, spaces, out, source.mode, {}), source)
    assert summary["updates"] == -(-cfg.run.total_steps // cfg.rollout_size)
    buffer = {name: getattr(source.buffer, name).clone() for name in BUFFER_FIELDS}
    checkpoint = load_checkpoint(out / "checkpoint.pt")
    params = checkpoint["model"]
    if checkpoint["obs_normalizer"] is not None:  # the float64 statistics behind the network's buffers
        params |= {f"obs_normalizer.{k}": torch.as_tensor(v) for k, v in checkpoint["obs_normalizer"].items()}
    return buffer, params


@pytest.mark.parametrize("env_id,worker_counts,extra", [
    ("CartPole-v1", (1, 2), ()), ("starpilot", (2,), ()),
    ("CartPole-v1", (2,), ("training.normalize_reward=true",)),  # GAE on rewards scaled by the running std
    ("Pendulum-v1", (1, 2), ()),  # a Gaussian policy, observation normalization
    # a dict observation: packed rows, the multi-input network; and a final-info entry of the user's to log
    ("toy_envs:CameraReach-v0", (1, 2), ("logging.episode_info=[distance_to_goal]",)),
    # an asymmetric actor-critic (the critic reads `steps` too, which the actor learns to predict) and frames
    # shifted in the update
    ("toy_envs:CameraReach-v0", (2,), ("model.actor_keys=[camera,state]", "training.augment_shift=2",
                                       "training.predict_privileged=0.5")),
])
def test_parallel_update_equals_sequential(tmp_path, monkeypatch, env_id, worker_counts, extra):
    """Same seed, same envs: 1 or 2 workers collect the sequential rollout and take the same update."""
    monkeypatch.chdir(ROOT)
    seq_buffer, seq_params = _one_update(tmp_path, env_id, 0, extra)
    if env_id == "CartPole-v1":
        assert seq_buffer["dones"].sum() > 0, "the rollout should cross at least one episode end"
    if env_id == "toy_envs:CameraReach-v0" and extra[0].startswith("model.actor_keys"):
        assert {"cnns.0.0.conv.weight", "actor_mlp.0.weight", "critic_mlp.0.weight", "predictor.weight"
                } <= seq_params.keys()
    elif env_id == "toy_envs:CameraReach-v0":
        assert seq_buffer["obs"].dtype == torch.uint8 and seq_buffer["obs"].shape == (32, 4, 2 * 4 + 8 * 8 * 3)
        assert seq_params["obs_mean"].shape == (2,) and seq_params["obs_mean"].abs().sum() > 0
        assert {"cnns.0.0.conv.weight", "mlp.0.weight", "dense.weight"} <= seq_params.keys()
    if env_id == "Pendulum-v1":
        assert seq_buffer["actions"].dtype == torch.float32 and seq_buffer["actions"].shape == (32, 4, 1)
        assert not torch.equal(seq_params["net.log_std"], torch.zeros(1)), "the log-std is learned"
        assert seq_params["obs_mean"].abs().sum() > 0, "the statistics were published into the network"
    for workers in worker_counts:
        buffer, params = _one_update(tmp_path, env_id, workers, extra)
        # a continuous action is a continuous function of the network's output, whose last bits depend on the batch
        # size of the forward pass; so are the states it leads to
        exact = ("obs", "actions", "dones") if env_id != "Pendulum-v1" else ("dones",)
        for name in exact:
            assert torch.equal(buffer[name], seq_buffer[name]), f"{workers} worker(s): {name} differs"
        for name in {"obs", "actions", "rewards", "bootstrap", "logprobs", "values", "last_values"} - set(exact):
            torch.testing.assert_close(buffer[name], seq_buffer[name], rtol=1e-5, atol=1e-5)
        assert params.keys() == seq_params.keys()
        for key in params:
            torch.testing.assert_close(params[key], seq_params[key], rtol=1e-4, atol=1e-5)
    if env_id == "toy_envs:CameraReach-v0" and extra[0].startswith("logging"):  # success and distance_to_goal reach
        # metrics.csv and the summary alike
        _same_episode_statistics([tmp_path / f"{env_id}_w{workers}" for workers in (0, *worker_counts)])


@pytest.mark.parametrize("env_id, lag, held", [("CartPole-v1", 0, False), ("CartPole-v1", 1, False),
                                                ("Pendulum-v1", 0, False), ("Pendulum-v1", 1, True)])
def test_overlapped_updates_equal_sequential_where_on_policy(tmp_path, monkeypatch, env_id, lag, held):
    """The overlapped path's first update is on-policy, whatever the lag: it equals the sequential trainer's (with a
    lag of 1, the workers are already collecting the next rollout when the run stops, and that one is abandoned).
    With a lag of 0 so do later ones: Pendulum's two updates, its observations and rewards normalized, the second
    rollout collected with the statistics the first published; and with a lag of 1 where the workers wait for
    each update's parameters before their first step (`parallel.max_lagged_share` below a step), so that no step
    lags: the second buffer in turn, and the update's parameters published while the workers wait for them at
    their first step and taken there by refreshing workers."""
    monkeypatch.chdir(ROOT)
    seq_buffer, seq_params = _one_update(tmp_path, env_id, 0, ())
    (tmp_path / f"{env_id}_w0").rename(tmp_path / "sequential")
    hold = ("parallel.max_lagged_share=0.001",) if held else ()
    buffer, params = _one_update(tmp_path, env_id, 2, ("parallel.overlap=true", f"parallel.policy_lag={lag}", *hold))
    for name in BUFFER_FIELDS:
        torch.testing.assert_close(buffer[name], seq_buffer[name], rtol=1e-5, atol=1e-5)
    for key in params:
        torch.testing.assert_close(params[key], seq_params[key], rtol=1e-4, atol=1e-5)
    summary = json.loads((tmp_path / f"{env_id}_w2" / "summary.json").read_text())
    final = summary["final_metrics"]
    assert summary["policy_lag"] == final["policy_lag"] == int(held) and final["lagged_share"] == 0


def test_an_overlapped_run_says_once_that_its_workers_wait_for_the_learner():
    idle = IdleWorkers()
    assert idle.observe(9.0, 10.0) is None and idle.observe(4.0, 10.0) is None  # busy, then one idle rollout
    assert idle.observe(5.0, 10.0) is None, "idle half the time is not waiting for the learner: the count restarts"
    assert idle.observe(4.0, 10.0) is None
    assert idle.observe(2.0, 10.0) == pytest.approx(0.8), "the second idle rollout running"
    assert idle.observe(1.0, 10.0) is None and idle.observe(1.0, 10.0) is None, "said once"
    short = IdleWorkers()
    assert all(short.observe(0.01, 0.5) is None for _ in range(5)), "rollouts under a second are not counted"
    assert short.observe(0.1, 1.0) is None and short.observe(0.1, 1.0) is not None
    cpu = idle_note(0.8, 2.0, 10.0, "cpu", 3)
    assert "idle 80% of the last rollout (2.0 s busy of 10.0 s)" in cpu and "the update bounds this run" in cpu
    assert "the 3 thread(s) the workers leave" in cpu and "fewer workers" in cpu and "--device cuda" in cpu
    assert "parallel.overlap: false" in cpu
    assert "the 1 thread(s) the workers leave (16 while they wait)" in idle_note(0.8, 2.0, 10.0, "cpu", 1, 16)
    assert "max_lagged_share" not in cpu, "a run without the cap never waits for the update on its account"
    capped = idle_note(0.8, 2.0, 10.0, "cuda", 1, cap=0.25)
    assert "after parallel.max_lagged_share (0.25) of each rollout" in capped and "at 1 they never wait" in capped
    gpu = idle_note(0.8, 2.0, 10.0, "cuda", 1)  # a GPU learner: its update owes nothing to the cores left
    assert "the update bounds this run" in gpu and "thread" not in gpu and "--device" not in gpu


def test_a_rollout_woken_early_counts_its_wait_for_the_learner_from_when_it_is_in_flight(monkeypatch):
    """With parallel.early_start a worker done with rollout k is woken into k+1 while the coordinator waits for k's
    slowest: k+1's span from that wake covered two rollouts' straggling, and the run said its workers waited for the
    update when they waited for a slow worker. The idle note reads the span from k+1's start (`flight`)."""
    from parallel_ppo.engines.parallel import rollout as rollouts

    clock = iter([1.0, 3.0, 5.0])  # woken early at 1 s, in flight at 3 s, its last result taken at 5 s
    monkeypatch.setattr(rollouts.time, "perf_counter", lambda: next(clock))
    early = rollouts.Rollout(slot=1, call=2)
    early.wake(0, 0)
    early.launch()
    early.wake(1, 0)  # the other workers, as it starts
    early.end()
    assert (early.seconds, early.flight) == (4.0, 2.0)


def test_the_pace_counts_the_slowest_worker_of_each_rollout_by_its_seconds_a_step():
    """Busy seconds are stepping, drawing and inferring; the slowest takes the most of them a step, so a worker cut
    short after fewer steps can be it; a rollout missing a worker's result is not counted, nor a run of one worker,
    which waits for no other."""
    pace = WorkerPace(3, n_steps=10)
    assert pace.record() is None
    for env in ([1.0, 2.0, 1.5], [1.0, 1.2, 1.1], [0.5, 0.6, 0.5]):  # whole rollouts: worker 1 the slowest each time
        pace.observe([CollectResult([], [], e, 0.25, [], 0.25) for e in env], [10, 10, 10])
    pace.observe([CollectResult([], [], 9.0, 0.0, [])] * 2, [10, 10])  # one missing: a worker dropped as it stopped
    pace.observe([CollectResult([], [], 0.4, 0.0, []), CollectResult([], [], 0.4, 0.0, []),
                  CollectResult([], [], 0.3, 0.0, [])], [10, 10, 5])  # worker 2 cut after 5 steps: 0.06 s a step
    record = pace.record()
    assert record["rollouts"] == 4 and record["slowest"] == [0, 3, 1] and record["slowest_share"] == 0.75
    assert record["busy_seconds"] == pytest.approx([4.4 / 4, 5.7 / 4, 4.9 / 4])  # the first three: env time + 0.5 s
    # the slowest's seconds a step over the mean worker's, times the 10 steps of a whole rollout
    excess = (2.5 - 2.0) + (1.7 - 1.6) + (1.1 - 3.1 / 3) + 10 * (0.06 - 0.14 / 3)
    assert record["slowest_excess_seconds"] == pytest.approx(excess / 4, abs=1e-4)
    alone = WorkerPace(1, n_steps=10)
    alone.observe([CollectResult([], [], 1.0, 0.0, [])], [10])
    assert alone.record() is None


def test_a_run_names_the_worker_its_rollouts_kept_waiting_for():
    """Where one worker was the slowest in 80% or more of 20 rollouts or more (16 of 20 by chance with two workers:
    about once in 85 runs), the run's closing lines name it; not otherwise, nor without workers."""
    from parallel_ppo.runs.closing import end_lines

    def pace(slowest: list[int]) -> dict:
        return {"rollouts": sum(slowest), "slowest": slowest, "busy_seconds": [1.0] * len(slowest),
                "slowest_share": max(slowest) / sum(slowest), "slowest_excess_seconds": 0.4}

    line = one_slowest_line(pace([1, 2, 17]))
    assert line.startswith("worker 2 was the slowest in 85% of 20 rollouts (at its pace the slowest would take 0.4")
    assert "parallel.sync_fraction" in line and "worker_pace" in line
    assert one_slowest_line(pace([16, 4])) is not None, "80% exactly"
    assert one_slowest_line(pace([15, 5])) is None and one_slowest_line(pace([15, 4])) is None  # 75%; 19 rollouts
    assert one_slowest_line(None) is None
    summary = {"stop_reason": "duration", "total_env_steps": 4096, "wall_seconds": 2.0, "sps": 3000.0,
               "episodic_return_mean": None, "episodes": 0, "normalized_return": None, "test_return_mean": None,
               "limit_efficiency": None, "achieved_gflops": None, "distributed": None, "worker_pace": pace([2, 18])}
    cfg = SimpleNamespace(logging=SimpleNamespace(return_window=100))
    assert end_lines(cfg, Path("run"), summary)[1].startswith("worker 1 was the slowest in 90% of 20 rollouts")
    summary["distributed"] = {"ranks": []}  # a distributed run's pace is rank 0's workers', which nothing cuts short
    line = end_lines(cfg, Path("run"), summary)[1]
    assert line.startswith("rank 0's worker 1 was the slowest in 90%") and "sync_fraction" not in line, line


def test_an_overlapped_run_says_once_that_most_of_its_steps_lag_under_the_clip_around_the_acting_policy():
    """Two rollouts running of which more than half the steps lagged, in a run whose continuous actions are clipped
    around the policy that took them: said once."""
    lagging = LaggedSteps(watching=True)
    assert lagging.observe(0.9) is None and lagging.observe(0.3) is None, "one rollout, then the count restarts"
    assert lagging.observe(0.6) is None and lagging.observe(1.0) == 1.0, "the second running that lagged"
    assert lagging.observe(1.0) is None and lagging.observe(1.0) is None, "said once"
    decoupled = LaggedSteps(watching=False)  # parallel.decoupled_clip on: nothing to suggest
    assert all(decoupled.observe(1.0) is None for _ in range(5))
    assert lagging.observe(0.5) is None and lagging.observe(0.5) is None, "half is not most"
    note = lag_note(1.0)
    assert "100% of the last rollout's steps" in note and "parallel.decoupled_clip: true" in note

    def widening(config: str, continuous: bool, *sets: str) -> bool:
        spaces = SimpleNamespace(actions=SimpleNamespace(continuous=continuous))
        return LaggedSteps.widening(build_config(config, {}, ["parallel.overlap=true", *sets], True), spaces)
    assert widening("config/mujoco.yaml", True), "continuous actions, the clip around the acting policy"
    assert not widening("config/mujoco.yaml", True, "parallel.decoupled_clip=true")
    assert not widening("config/cartpole.yaml", False), "discrete actions: the decoupled clip did not help there"
    camera = "config/robosuite_lift_camera.yaml"  # frames shifted in the loss
    assert widening(camera, True) and not widening(camera, True, "training.augment_anchor=true"), \
        "the anchor on shifted frames is decoupled already"


@pytest.mark.parametrize("sets", [(), ("parallel.decoupled_clip=true",)])
def test_a_coordinator_watches_for_lagged_steps_where_the_clip_widens_the_policy(tmp_path, monkeypatch, sets):
    """Pendulum's continuous actions, overlapped: watched unless the clip is decoupled (no worker started)."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(ParallelCoordinator, "_start_workers", lambda self: None)
    cfg = _config("Pendulum-v1", True, 2, tmp_path, ("parallel.overlap=true", *sets))
    assert ParallelCoordinator(cfg, env_spaces(cfg.env), thread_plan(cfg, True))._lagging.watching == (not sets)


@pytest.mark.parametrize(("progress", "rank", "says"), [("auto", None, True), ("off", None, False), ("on", 0, True),
                                                         ("on", 1, False)])
def test_the_idle_note_is_silent_with_progress_off_and_on_all_ranks_but_the_first(capsys, progress, rank, says):
    coordinator = SimpleNamespace(_idle=IdleWorkers(), _lent=LentCores(1, 1), _rank=rank,
                                  _lagging=LaggedSteps(watching=True), lagged_share=1.0,
                                  cfg=SimpleNamespace(logging=SimpleNamespace(progress=progress),
                                                      parallel=SimpleNamespace(max_lagged_share=1.0)))
    for _ in range(2):  # two rollouts of 10 s, the workers busy 1 s of each, every step lagged
        ParallelCoordinator._say_if_idle(coordinator, 1.0, 10.0, torch.nn.Linear(2, 2))
    err = capsys.readouterr().err
    assert ("the workers sat idle 90%" in err) == says and ("parallel.decoupled_clip: true" in err) == says


class SaysEveryTime(IdleWorkers):
    """The idle-worker check, with every rollout it is shown recorded and each counted as waiting."""

    seen: list[tuple[float, float]]

    def observe(self, busy: float, seconds: float) -> float | None:
        self.seen.append((busy, seconds))
        return 0.9


@pytest.mark.parametrize("lag", [1, 0])
def test_overlapped_rollouts_trail_the_learner_by_one_update(tmp_path, monkeypatch, capsys, lag):
    """With overlap (the workers not refreshing their parameters mid-rollout), the rollout returned by collect k was
    collected with the parameters given to collect k-1: it holds exactly what a synchronous coordinator collects when
    given those parameters at its k-th call. With a lag of 0, the two buffers filled in turn hold what the
    synchronous coordinator collects with the same ones. Only the lagged rollouts are shown to the idle-worker
    check, whose note is printed. While a rollout is in flight, the learner takes its lent threads from the first
    minibatch step after the workers have collected it (`during_update`), and has its own again as the next starts."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(coordinator_module, "IdleWorkers", SaysEveryTime)
    monkeypatch.setattr(SaysEveryTime, "seen", [], raising=False)
    cfg = _config("CartPole-v1", True, 2, tmp_path, ())
    models = []
    for i in range(3):  # three different parameter sets, as three updates would leave
        torch.manual_seed(i)
        models.append(network(cfg, env_spaces(cfg.env)))

    def rollouts(overlap: bool, given: list[int]) -> tuple[list[dict[str, torch.Tensor]], list[int]]:
        cfg = _config("CartPole-v1", True, 2, tmp_path, (f"parallel.overlap={str(overlap).lower()}",
                                                         f"parallel.policy_lag={lag}", "parallel.refresh_params=false"))
        threads = dataclasses.replace(thread_plan(cfg, parallel=True), learner=1, idle_learner=3)
        source = ParallelCoordinator(cfg, env_spaces(cfg.env), threads)
        try:
            out, lags = [], []
            for index in given:
                source.collect(models[index], PhaseTimer())
                out.append({name: getattr(source.buffer, name).clone() for name in BUFFER_FIELDS})
                lags.append((source.policy_lag, [b is source.buffer for b in source.buffers].index(True)))
                lent.append((torch.get_num_threads(), threads_while_updating(source)))
            return out, lags
        finally:
            source.close()

    lent: list[tuple[int, int]] = []
    with threads_kept():
        torch.set_num_threads(1)
        overlapped, lags = rollouts(True, [0, 1, 2])
        assert torch.get_num_threads() == 1, "closing gives them back"
    # (threads as collect returned, then once the rollout in flight, if any, was collected) of each rollout
    assert lent == [(1, 3 if lag else 1)] * 3

    synchronous, sync_lags = rollouts(False, [0, 0, 1] if lag else [0, 1, 2])  # what the overlapped workers used
    for rollout, after in zip(synchronous[:-1], synchronous[1:], strict=True):  # the envs go on from the last obs
        assert torch.equal(rollout["last_obs"], after["obs"][0])
    # (lag, buffer) of each rollout: the overlapped ones fill the two buffers in turn
    assert lags == list(zip([0, 1, 1] if lag else [0, 0, 0], [0, 1, 0], strict=True))
    assert sync_lags == [(0, 0)] * 3
    assert len(SaysEveryTime.seen) == (2 if lag else 0), "the lagged rollouts, each once"
    assert all(0 < busy and 0 < seconds for busy, seconds in SaysEveryTime.seen)
    said = capsys.readouterr().err
    assert said.count("the workers sat idle 90% of the last rollout") == (2 if lag else 0)
    assert said.count("fewer workers with a learner thread") == (2 if lag else 0), "a CPU learner's remedies"
    for k, (ours, theirs) in enumerate(zip(overlapped, synchronous, strict=True)):
        for name in BUFFER_FIELDS:
            torch.testing.assert_close(ours[name], theirs[name], rtol=1e-5, atol=1e-5, msg=f"rollout {k}: {name}")
    if lag:
        assert not torch.equal(overlapped[2]["logprobs"], rollouts(False, [0, 1, 2])[0][2]["logprobs"]), \
            "the third rollout of a synchronous run with the same models differs (it acts with the newest)"


def test_an_early_start_sets_a_done_worker_on_the_next_rollout_while_the_slowest_ends_this_one(tmp_path, monkeypatch):
    """`parallel.early_start`: with worker 1 held at the start of its second rollout, worker 0 collects its share of
    the third, with the parameters published for it, while the coordinator still waits for the second (without it,
    worker 0 would wait for the second to end); the second, once worker 1 is let go, is whole and one update behind."""
    monkeypatch.chdir(ROOT)
    held = tmp_path / "held"
    monkeypatch.setenv(PAUSE_ENV_VAR, f"worker1:2:{held}")  # spawned workers start with this environment
    cfg = _config("CartPole-v1", True, 2, tmp_path, ("parallel.overlap=true", "parallel.early_start=true",
                                                     "parallel.start_method=spawn"))
    source = ParallelCoordinator(cfg, env_spaces(cfg.env), thread_plan(cfg, parallel=True))
    third: list[int] = []  # worker 0's steps once it has collected three rollouts, and worker 1's then

    def watch() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and int(source.progress[0]) < 3 * cfg.training.n_steps:
            time.sleep(0.01)
        third.extend(int(steps) for steps in source.progress)
        release_file(held).touch()

    try:
        model = network(cfg, source.spaces)
        source.collect(model, PhaseTimer())
        watcher = threading.Thread(target=watch)
        watcher.start()
        source.collect(model, PhaseTimer())
        watcher.join()
        assert third == [3 * cfg.training.n_steps, cfg.training.n_steps], "worker 0 went on; worker 1 was held"
        assert bool((source.buffer.lengths == cfg.training.n_steps).all()) and source.policy_lag == 1
        early = source.buffers[source._in_flight.slot].versions[:, :cfg.parallel.num_envs_per_worker]
        assert bool((early == int(source.policy.version)).all()), "with the parameters of the second collect"
    finally:
        release_file(held).touch()
        source.close()


def threads_while_updating(source: ParallelCoordinator) -> int:
    """The learner's torch threads once the rollout in flight (if any) is collected, `during_update` asked as
    before each minibatch step meanwhile."""
    deadline = time.monotonic() + 60
    while source._in_flight is not None and not source._lent.lending and time.monotonic() < deadline:
        source.during_update()
        time.sleep(0.01)
    return torch.get_num_threads()


def release_when_published(source: ParallelCoordinator, version: int, held: Path) -> None:
    """End the workers' hold (its pid file `held`) once `source` has published parameters of `version`."""
    deadline = time.monotonic() + 120
    while int(source.policy.version) < version and time.monotonic() < deadline:
        time.sleep(0.01)
    release_file(held).touch()


def test_refreshing_workers_act_with_the_last_parameters_then_with_the_new_ones(tmp_path, monkeypatch):
    """Overlapped workers that refresh their parameters (the default). The second rollout, collected while the
    learner held the first, is held halfway (step 16 of 32) in each worker until the next collect, given other
    parameters and observation statistics, has published them. The worker held first acts with the first
    parameters and statistics to step 16 and with the new ones from there; the other switches at or before it;
    `lagged_share` counts the steps before the switches. While a worker is held, the learner takes no lent threads."""
    monkeypatch.chdir(ROOT)
    held = tmp_path / "held"
    monkeypatch.setenv(PAUSE_ENV_VAR, f"rollout:2:{held}")  # spawned workers start with this environment
    cfg = _config("CartPole-v1", True, 2, tmp_path, ("parallel.overlap=true", "parallel.start_method=spawn",
                                                     "training.normalize_obs=true"))
    models = []
    for i in range(2):
        torch.manual_seed(i)
        models.append(network(cfg, env_spaces(cfg.env)))
    with torch.no_grad():  # the second acts far from the first: every step's log-prob says which one acted
        for tensor in models[1].parameters():
            tensor.mul_(3.0)
        models[1].obs_mean.fill_(0.5)  # and normalizes otherwise: a step taken with the new parameters and the
        models[1].obs_std.fill_(2.0)  # old statistics (or the reverse) would match neither model
    threads = dataclasses.replace(thread_plan(cfg, parallel=True), learner=1, idle_learner=3)
    source = ParallelCoordinator(cfg, env_spaces(cfg.env), threads)
    try:
        source.collect(models[0], PhaseTimer())
        assert (source.policy_lag, source.lagged_share) == (0, 0.0)
        deadline = time.monotonic() + 60
        while not held.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert held.exists(), "no worker reached the hold"
        with threads_kept():
            for _ in range(20):  # as before each minibatch step of the update
                source.during_update()
            assert not source._lent.lending, "a worker still collects the rollout in flight"
        release = threading.Thread(target=release_when_published, args=(source, 4, held), daemon=True)
        release.start()
        source.collect(models[1], PhaseTimer())  # publishes models[1] while the workers are held at step 16
        release.join()
        with threads_kept():  # the next rollout, not held: its workers collect it, then the learner takes their cores
            torch.set_num_threads(1)
            assert threads_while_updating(source) == 3
        assert int(source.policy.version) == 4, "each collect publishes once (a version is 2 writes)"
        obs, actions, logprobs = (getattr(source.buffer, name).clone() for name in ("obs", "actions", "logprobs"))
        lagged = source.lagged.clone()
    finally:
        source.close()
    n, envs = logprobs.shape
    with torch.no_grad():
        acted = [log_prob_entropy(m(obs.flatten(0, 1))[0], actions.flatten(0, 1))[0].view(n, envs) for m in models]
    new = (logprobs - acted[1]).abs() < (logprobs - acted[0]).abs()
    torch.testing.assert_close(logprobs, torch.where(new, acted[1], acted[0]), rtol=1e-5, atol=1e-5)
    switches = [int(new[:, env].int().argmax()) if new[:, env].any() else n for env in range(envs)]
    for env, switch in enumerate(switches):
        assert not new[:switch, env].any() and new[switch:, env].all(), f"env {env}: not one switch, old to new"
    assert switches[0] == switches[1] and switches[2] == switches[3], "a worker's envs switch at the same step"
    assert max(switches) == n // 2, f"the held worker switches where it was held: {switches}"
    assert source.policy_lag == 1 and source.lagged_share == sum(switches) / (n * envs)
    assert torch.equal(lagged, ~new), "the lagged steps are those the old parameters took"


def test_workers_wait_for_the_update_once_they_took_their_lagged_share(tmp_path, monkeypatch):
    """`parallel.max_lagged_share` 0.25 of a 32-step rollout: while the learner holds the first rollout (no next
    `collect`), each worker takes the first 8 steps of the second with the first parameters and waits there, however
    long the learner takes, and the learner takes their cores meanwhile; the next `collect` publishes others, and they
    take the other 24 steps with those. A rollout abandoned while they wait ends at once: each answers."""
    monkeypatch.chdir(ROOT)
    cfg = _config("CartPole-v1", True, 2, tmp_path, ("parallel.overlap=true", "parallel.max_lagged_share=0.25"))
    models = []
    for i in range(2):
        torch.manual_seed(i)
        models.append(network(cfg, env_spaces(cfg.env)))
    threads = dataclasses.replace(thread_plan(cfg, parallel=True), learner=1, idle_learner=3)
    source = ParallelCoordinator(cfg, env_spaces(cfg.env), threads)
    try:
        with threads_kept():
            torch.set_num_threads(1)
            source.collect(models[0], PhaseTimer())
            held_at(source, 32 + 8)
            time.sleep(0.5)  # a worker that did not wait would step on
            assert source.progress.tolist() == [32 + 8, 32 + 8], "each waits after its 8 steps"
            source.during_update()
            assert torch.get_num_threads() == 3, "the learner takes the cores of the workers that wait"
            source.collect(models[1], PhaseTimer())
            assert torch.get_num_threads() == 1, "given back before they go on"
        obs, actions, logprobs = (getattr(source.buffer, name).clone() for name in ("obs", "actions", "logprobs"))
        lagged, share = source.lagged.clone(), source.lagged_share
        held_at(source, 64 + 8)  # the third rollout, in flight
        source.abandon_rollout()
        deadline = time.monotonic() + 60
        while not all(w.conn.poll() for w in source._workers) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert all(w.conn.poll() for w in source._workers), "an abandoned rollout ends for the workers that wait"
    finally:
        source.close()
    with torch.no_grad():
        acted = [log_prob_entropy(m(obs.flatten(0, 1))[0], actions.flatten(0, 1))[0].view(32, 4) for m in models]
    torch.testing.assert_close(logprobs[:8], acted[0][:8], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logprobs[8:], acted[1][8:], rtol=1e-5, atol=1e-5)
    assert share == 0.25 and lagged[:8].all() and not lagged[8:].any()


def held_at(source: ParallelCoordinator, steps: int) -> None:
    """Wait (at most a minute) until every worker of `source` has taken `steps` steps in all."""
    deadline = time.monotonic() + 60
    while int(source.progress.min()) < steps and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.mark.parametrize("decoupled", [True, False])
def test_an_overlapped_update_is_decoupled_where_its_rollout_trails(tmp_path, monkeypatch, capsys, decoupled):
    """With `parallel.decoupled_clip`, the updates whose rollouts trail the learner (all but the first) clip around
    the policy they start from; the first, on-policy, and every update without the setting, are PPO's own. With
    `parallel.fresh_values` (here where the clip is not decoupled, and the workers take no parameters mid-rollout, so
    that every step of a trailing rollout lags), the values GAE read are the learner's own on every step. (Without
    it, with the workers taking each update as it ends, which steps lag depends on timing: not asserted.) Its
    actions are discrete, so the run never suggests the setting (`LaggedSteps.widening`)."""
    monkeypatch.chdir(ROOT)
    seen, own_values = [], []
    original = loop.ppo_update

    def update(*args):
        model, data = args[0], args[2]
        with torch.no_grad():
            own_values.append(torch.allclose(data.values, model(data.obs)[1], rtol=1e-5, atol=1e-5))
        seen.append(args[9])
        return original(*args)

    monkeypatch.setattr(loop, "ppo_update", update)
    sets = ("parallel.decoupled_clip=true", "parallel.fresh_values=false") if decoupled else (
        "parallel.refresh_params=false",)
    cfg = _config("CartPole-v1", True, 2, tmp_path, ("parallel.overlap=true", "run.total_steps=384", *sets))
    spaces = env_spaces(cfg.env)
    train_run(RunPlan(cfg, spaces, tmp_path, "parallel", {}), ParallelCoordinator(cfg, spaces, thread_plan(cfg, True)))
    assert seen == [False, decoupled, decoupled]
    assert "parallel.decoupled_clip: true" not in capsys.readouterr().err, "CartPole's actions are discrete"
    if decoupled:  # the workers took each update's parameters once it ended: only what they took before lagged
        assert own_values[0]
    else:
        assert own_values == [True, True, True]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="this platform does not pin processes")
def test_pinned_workers_run_each_on_its_share_of_the_cpus(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = _config("CartPole-v1", True, 2, tmp_path, ("parallel.pin_workers=true",))
    plan = thread_plan(cfg, parallel=True)
    source = ParallelCoordinator(cfg, env_spaces(cfg.env), plan)
    try:
        pinned = [os.sched_getaffinity(w.process.pid) for w in source._workers]
    finally:
        source.close()
    assert pinned == [set(worker_cpus(0, plan.draw)), set(worker_cpus(1, plan.draw))]
    if len(os.sched_getaffinity(0)) >= 2:
        assert not pinned[0] & pinned[1], "two workers on two or more CPUs share none"


def test_a_rollout_the_run_stopped_in_shows_no_workers_pace(tmp_path, monkeypatch):
    """A rollout abandoned as the run stops (a signal) ends where each worker is, its buffer's lengths unwritten: not
    counted; the next whole one is."""
    monkeypatch.chdir(ROOT)
    cfg = _config("CartPole-v1", True, 2, tmp_path, ())
    model = network(cfg, env_spaces(cfg.env))
    source = ParallelCoordinator(cfg, env_spaces(cfg.env), thread_plan(cfg, parallel=True))
    try:
        source.collect(model, PhaseTimer(), stopping=lambda: True)
        assert bool(source.abandon) and source.pace.record() is None
        source.collect(model, PhaseTimer())
        assert source.pace.record()["rollouts"] == 1
    finally:
        source.close()


def test_a_straggler_is_cut_short_and_its_envs_go_on_from_where_they_stopped(tmp_path, monkeypatch):
    """`parallel.sync_fraction` 0.5 with worker 1 held (SIGSTOP) until worker 0 is done: the coordinator cuts worker
    1's rollout, which ends after a quarter of its 32 steps. Its envs go on from there: two cut rollouts hold, in
    order, the first 16 steps a synchronous coordinator collects with the same parameters; worker 0's are whole."""
    monkeypatch.chdir(ROOT)
    cfg = _config("CartPole-v1", True, 2, tmp_path, ("parallel.sync_fraction=0.5",))
    torch.manual_seed(0)
    model = network(cfg, env_spaces(cfg.env))

    def held(source: ParallelCoordinator) -> dict[str, torch.Tensor]:
        if source.cfg.parallel.sync_fraction == 1:  # nothing would release it
            source.collect(model, PhaseTimer())
            return {name: getattr(source.buffer, name).clone() for name in (*BUFFER_FIELDS, "lengths")}
        pid = source._workers[1].process.pid
        os.kill(pid, signal.SIGSTOP)

        def release() -> None:  # once the coordinator has cut this rollout (or after a minute, to fail below)
            deadline = time.monotonic() + 60
            while not source.cut and time.monotonic() < deadline:
                time.sleep(0.01)
            os.kill(pid, signal.SIGCONT)

        releaser = threading.Thread(target=release)
        releaser.start()
        source.collect(model, PhaseTimer())
        releaser.join()
        return {name: getattr(source.buffer, name).clone() for name in (*BUFFER_FIELDS, "lengths")}

    def collected(sync_fraction: str, rollouts: int) -> list[dict[str, torch.Tensor]]:
        run_cfg = _config("CartPole-v1", True, 2, tmp_path, (f"parallel.sync_fraction={sync_fraction}",))
        source = ParallelCoordinator(run_cfg, env_spaces(run_cfg.env), thread_plan(run_cfg, parallel=True))
        try:
            return [held(source) for _ in range(rollouts)]
        finally:
            paces[sync_fraction] = source.pace.record()
            source.close()

    paces: dict[str, dict] = {}
    cut = collected("0.5", 2)
    whole = collected("1", 2)
    assert set(paces) == {"0.5", "1"}
    for pace in paces.values():  # cut or whole, each rollout counts its slowest worker
        assert pace["rollouts"] == sum(pace["slowest"]) == 2 and len(pace["busy_seconds"]) == 2
    for rollout in cut:
        assert rollout["lengths"].tolist() == [32, 32, 8, 8]
    assert [r["lengths"].tolist() for r in whole] == [[32] * 4] * 2
    for name in ("obs", "actions", "rewards", "dones", "logprobs", "values"):
        for k in range(2):  # worker 0 (envs 0 and 1) collected as if nothing was cut
            torch.testing.assert_close(cut[k][name][:, :2], whole[k][name][:, :2], rtol=1e-5, atol=1e-5)
        stitched = torch.cat([cut[0][name][:8, 2:], cut[1][name][:8, 2:]])
        torch.testing.assert_close(stitched, whole[0][name][:16, 2:], rtol=1e-5, atol=1e-5, msg=name)
    # the cut rollout bootstraps from the state it stopped in: the value the next rollout starts from
    torch.testing.assert_close(cut[0]["last_values"][2:], cut[1]["values"][0, 2:], rtol=1e-5, atol=1e-5)


STRAGGLING_ENV = '''
import os
import time

import gymnasium
from gymnasium.envs.classic_control import CartPoleEnv

FLAG = {flag!r}


class StragglingCartPole(CartPoleEnv):
    """CartPole whose 10th step, in the first env to get there (which creates FLAG), holds until FLAG.go exists (at
    most 60 s); none in the others."""

    def step(self, action):
        self.steps = getattr(self, "steps", 0) + 1
        if self.steps == 10:
            try:
                os.close(os.open(FLAG, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                deadline = time.monotonic() + 60
                while not os.path.exists(FLAG + ".go") and time.monotonic() < deadline:
                    time.sleep(0.01)
        return super().step(action)


gymnasium.register("StragglingCartPole-v0", entry_point=StragglingCartPole, max_episode_steps=500)
'''


def test_an_overlapped_run_cuts_its_straggler_and_counts_the_steps_taken(tmp_path, monkeypatch):
    """Overlapped workers with `parallel.sync_fraction` 0.5, one env of one worker held at its 10th step (in the
    first rollout; the env is named in a module written here, since a forkserver another test of this process
    started keeps the environment it started with) until the coordinator has cut the rollout: that worker's 2 envs
    stop after 10 of 32 steps, and each update counts the steps its rollout took."""
    monkeypatch.chdir(ROOT)
    (tmp_path / "straggling_env.py").write_text(STRAGGLING_ENV.format(flag=str(tmp_path / "straggled")))
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    out.mkdir()
    cfg = build_config("config/cartpole.yaml", {"env.id": "straggling_env:StragglingCartPole-v0", "run.seed": 3,
                                                "run.output_dir": str(out), "run.total_steps": 84 + 2 * 128}, [
        "training.n_steps=32", "training.batch_size=32", "training.n_epochs=1", "eval.interval_seconds=0",
        "logging.tensorboard=false", "env.num_envs=4", "parallel.num_workers=2", "parallel.num_envs_per_worker=2",
        "parallel.overlap=true", "parallel.sync_fraction=0.5", "run.limit_seconds=0", "training.precision=fp32"],
        parallel=True)
    spaces = env_spaces(cfg.env)
    source = ParallelCoordinator(cfg, spaces, thread_plan(cfg, True))
    held = tmp_path / "straggled"

    ended = threading.Event()

    def release_once_cut() -> None:  # the cut is set while the held worker is still out, so it cannot be missed
        while not (held.exists() and int(source.cut)) and not ended.wait(0.01):
            pass
        release_file(held).touch()

    releaser = threading.Thread(target=release_once_cut, daemon=True)
    releaser.start()
    try:
        train_run(RunPlan(cfg, spaces, out, "parallel", {}), source)
    finally:
        ended.set()
        releaser.join()
    with open(out / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    cuts = [float(r["rollout_cut"]) for r in rows]
    # the held worker's rollout ends after its 10th step (the other worker's envs pass their 10th only once it holds;
    # or after 8, the least, if the watchdog replaced it while held); the others may be cut too, by a few steps, as the
    # two workers' timing goes
    assert 2 * 22 / 128 <= max(cuts) and all(0 <= cut <= 2 * 24 / 128 for cut in cuts), cuts
    steps = [int(r["env_steps"]) for r in rows]
    assert [b - a for a, b in zip([0, *steps], steps, strict=False)] == [round(128 * (1 - cut)) for cut in cuts]
    assert [int(r["policy_lag"]) for r in rows] == [0] + [1] * (len(rows) - 1)
    assert json.loads((out / "summary.json").read_text())["final_metrics"]["rollout_cut"] == pytest.approx(cuts[-1])


def _same_episode_statistics(runs: list[Path]) -> None:
    """The runs' last rows and summaries hold the same success rate and mean distance_to_goal."""
    figures = []
    for out in runs:
        with open(out / "metrics.csv", newline="") as f:
            last = list(csv.DictReader(f))[-1]
        final = json.loads((out / "summary.json").read_text())["final_metrics"]
        figures.append([float(last[c]) for c in ("success_rate", "episode_distance_to_goal")])
        assert [final["success_rate"], final["episode_distance_to_goal"]] == pytest.approx(figures[-1], rel=1e-5)
    assert all(f == pytest.approx(figures[0], rel=1e-5) for f in figures), figures


def _launch(tmp_path: Path, extra: list[str], env_extra: dict[str, str] | None = None):
    out = tmp_path / "run"
    cmd = [sys.executable, "train_parallel_timed.py", "--config", "config/cartpole.yaml", "--output-dir", str(out),
           "--set", "logging.tensorboard=false", *extra]
    proc = start(cmd, cwd=ROOT, env={**os.environ, **(env_extra or {})})
    return proc, out


def test_worker_exception_stops_cleanly(tmp_path):
    shm_before = shm_entries()
    proc, out = _launch(tmp_path, ["--total-steps", "100000"], {"PARALLEL_PPO_INJECT_FAULT": "1:3"})
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1
    assert "worker 1 failed: RuntimeError: fault injected" in err and "its traceback in error.txt" in err
    assert "Traceback" not in err
    assert "RuntimeError: fault injected" in (out / "error.txt").read_text(), "the worker's traceback"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stop_reason"] == "error" and summary["updates"] == 2
    assert (out / "checkpoint.pt").is_file()
    assert_nothing_left(proc.pid, shm_before)


SLEEPY_ENV = '''
import os
import time

import gymnasium
from gymnasium.envs.classic_control import CartPoleEnv


class SleepyCartPole(CartPoleEnv):
    """CartPole that, built anywhere but in process {parent}, sleeps for a minute first (a start that hangs)."""

    def __init__(self, **kwargs):
        if os.getpid() != {parent}:
            time.sleep(60)
        super().__init__(**kwargs)


gymnasium.register("SleepyCartPole-v0", entry_point=SleepyCartPole, max_episode_steps=500)
'''


def test_a_worker_that_neither_runs_nor_waits_while_starting_is_given_up(tmp_path, monkeypatch):
    """A worker whose env sleeps while it is built (in a module written here, as the straggler test's) is given up
    on once it has neither run nor waited for a core for STARTUP_TIMEOUT seconds (2 here), with a line that says so
    and no worker left."""
    from parallel_ppo.engines.parallel import coordinator
    from parallel_ppo.engines.parallel.coordinator import WorkerError

    monkeypatch.chdir(ROOT)
    (tmp_path / "sleepy_env.py").write_text(SLEEPY_ENV.format(parent=os.getpid()))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(coordinator, "STARTUP_TIMEOUT", 2.0)
    cfg = _config("CartPole-v1", True, 2, tmp_path, ())
    cfg.env.id = "sleepy_env:SleepyCartPole-v0"
    with pytest.raises(WorkerError, match=r"^worker 0 was not ready: while starting it neither ran nor waited for a "
                                          r"core for 2 s$"):
        ParallelCoordinator(cfg, env_spaces(cfg.env), thread_plan(cfg, parallel=True))
    workers = [p for p in psutil.Process().children(recursive=True) if p.name().startswith("parallel_ppo worker")]
    assert not workers, workers


def test_a_worker_that_fails_to_start_hands_on_its_traceback():
    """A worker restarted mid-run whose env raises as it starts: its error carries the worker's traceback, for the
    run's error.txt, as a worker failing during a rollout does."""
    import multiprocessing

    from parallel_ppo.engines.parallel.worker import Failed

    parent, child = multiprocessing.Pipe()
    child.send(Failed("RuntimeError: reset boom", "Traceback (most recent call last):\nRuntimeError: reset boom"))
    coordinator = object.__new__(ParallelCoordinator)  # its wait for a worker's hello, on a worker that said this
    coordinator._workers = [SimpleNamespace(conn=parent, process=SimpleNamespace(sentinel=child, pid=os.getpid()))]
    with pytest.raises(coordinator_module.WorkerError, match="worker 0 failed to start: RuntimeError: reset boom") as e:
        coordinator._await_ready(0)
    assert e.value.trace.endswith("RuntimeError: reset boom")
