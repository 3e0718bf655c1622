"""The thread policy (core/threads.py): the torch, env and drawing threads of each process of a run."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest
import torch

from parallel_ppo.bench.scaling import default_worker_counts
from parallel_ppo.bench.study import available_cores
from parallel_ppo.core.configure import build_config
from parallel_ppo.core.threads import (
    OWN_DRAW_THREADS,
    draw_threads_kept,
    draw_with,
    thread_plan,
    usable_cpus,
    user_draw_threads,
    worker_cpus,
)
from parallel_ppo.engines.parallel.idle import LentCores
from parallel_ppo.errors import ConfigError
from parallel_ppo.tuning.compute_limit import threads_kept

CARTPOLE = str(Path(__file__).resolve().parents[1] / "config" / "cartpole.yaml")


def test_a_worker_steps_on_one_thread_and_draws_on_its_share_of_the_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    plan = thread_plan(build_config(CARTPOLE, {}, ["parallel.num_workers=4"], parallel=True), parallel=True)
    assert (plan.env, plan.draw) == (1, 4)
    plan = thread_plan(build_config(CARTPOLE, {}, ["parallel.num_workers=32"], parallel=True), parallel=True)
    assert (plan.env, plan.draw) == (1, 1)
    sequential = thread_plan(build_config(CARTPOLE, {}, [], parallel=False), parallel=False)
    assert (sequential.env, sequential.draw) == (16, 16)
    rank = thread_plan(build_config(CARTPOLE, {}, [], parallel=False), parallel=False, ranks_on_host=4)
    assert (rank.env, rank.draw) == (4, 4)
    ranks = thread_plan(build_config(CARTPOLE, {}, ["parallel.num_workers=2"], parallel=True), True, ranks_on_host=4)
    assert (ranks.env, ranks.draw) == (1, 2), "2 workers of each of 4 ranks on 16 cores"
    set_ = thread_plan(build_config(CARTPOLE, {}, ["env.env_threads=3"], parallel=True), parallel=True)
    assert (set_.env, set_.draw) == (3, 3)


def test_an_overlapped_learner_gets_the_cores_its_workers_leave(monkeypatch):
    """Overlapped workers step through the update: an automatic learner takes the cores they leave, at least one;
    a synchronous one every core; a configured count is kept."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)

    def learner(*sets: str) -> int:
        return thread_plan(build_config(CARTPOLE, {}, ["parallel.learner_threads=0", *sets], True), True).learner

    assert learner("parallel.num_workers=4") == 16
    assert learner("parallel.num_workers=4", "parallel.overlap=true") == 12
    assert learner("parallel.num_workers=16", "parallel.overlap=true") == 1
    assert learner("parallel.num_workers=32", "parallel.overlap=true") == 1
    assert learner("parallel.num_workers=4", "parallel.overlap=true", "parallel.learner_threads=3") == 3
    assert learner("parallel.num_workers=4", "parallel.overlap=true", "parallel.policy_lag=0") == 16, \
        "workers that wait for the update leave it every core"


def test_an_overlapped_learner_takes_every_core_while_its_workers_wait(monkeypatch):
    """The plan's ceiling for an overlapped learner whose workers have collected (`auto` chooses within it), or the
    count set; none where the workers never collect through the update."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)

    def idle(*sets: str) -> int:
        return thread_plan(build_config(CARTPOLE, {}, ["parallel.num_workers=16", *sets], True), True).idle_learner

    assert idle("parallel.overlap=true") == 16
    assert idle("parallel.overlap=true", "parallel.idle_learner_threads=0") == 16
    assert idle("parallel.overlap=true", "parallel.idle_learner_threads=4") == 4
    assert idle() == 0 and idle("parallel.overlap=true", "parallel.policy_lag=0") == 0
    assert idle("parallel.overlap=true", "parallel.refresh_params=false") == 0, "runs that reproduce exactly"
    assert idle("parallel.overlap=true", "parallel.refresh_params=false", "parallel.idle_learner_threads=4") == 4
    assert thread_plan(build_config(CARTPOLE, {}, ["parallel.overlap=true"], False), False).idle_learner == 0


def test_lent_cores_are_taken_once_the_workers_have_collected_and_given_back_as_the_next_rollout_starts():
    asked = []

    def collected(answer: bool):
        return lambda: asked.append(answer) or answer

    with threads_kept():
        torch.set_num_threads(1)
        cores = LentCores(1, 3)
        cores.lend_if(collected(False))
        assert torch.get_num_threads() == 1 and not cores.lending
        cores.lend_if(collected(True))
        assert torch.get_num_threads() == 3 and cores.lending
        cores.lend_if(collected(True))
        assert asked == [False, True], "not asked again while lending"
        cores.give_back()
        assert torch.get_num_threads() == 1 and not cores.lending
        cores.give_back()
        assert torch.get_num_threads() == 1
        torch.set_num_threads(2)  # a learner on other threads than its plan's (a test's, the Python API's) keeps them
        cores.lend_if(collected(True))
        cores.give_back()
        assert torch.get_num_threads() == 2
        LentCores(2, 2).lend_if(collected(True))
        assert asked == [False, True, True] and torch.get_num_threads() == 2, "nothing to lend: not asked"


def test_the_plan_counts_the_cpus_this_process_may_use_not_the_machines(monkeypatch):
    """A Slurm job or container pinned to 2 of 64 CPUs plans for 2 (its affinity mask); without a mask (macOS,
    Windows), for the machine's."""
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 64)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 7}, raising=False)
    assert usable_cpus() == 2
    automatic = ["parallel.learner_threads=0"]  # cartpole.yaml sets 1
    sequential = thread_plan(build_config(CARTPOLE, {}, automatic, parallel=False), parallel=False)
    assert (sequential.learner, sequential.env, sequential.draw) == (2, 2, 2)
    parallel = thread_plan(build_config(CARTPOLE, {}, [*automatic, "parallel.num_workers=4"], parallel=True), True)
    assert (parallel.learner, parallel.env, parallel.draw) == (2, 1, 1)
    assert default_worker_counts() == [1, 2] and available_cores() == 2  # the sweeps' defaults too
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    assert usable_cpus() == 64


def test_mesa_draws_with_the_plan_unless_the_user_set_its_threads(monkeypatch):
    for name in ("LP_NUM_THREADS", OWN_DRAW_THREADS):  # set, then removed: monkeypatch restores the original
        monkeypatch.setenv(name, "0")
        monkeypatch.delenv(name)
    draw_with(16)  # a sequential run
    assert os.environ["LP_NUM_THREADS"] == "16" and user_draw_threads() is None
    draw_with(1)  # a worker started after it from the same Python inherits ours and replaces it
    assert os.environ["LP_NUM_THREADS"] == "1"
    monkeypatch.setenv("LP_NUM_THREADS", "3")  # the user's own
    draw_with(1)
    assert os.environ["LP_NUM_THREADS"] == "3" and user_draw_threads() == "3"


def test_the_drawing_threads_are_put_back_after_a_run_in_this_python(monkeypatch):
    monkeypatch.setenv("LP_NUM_THREADS", "0")
    monkeypatch.delenv("LP_NUM_THREADS")
    monkeypatch.setenv(OWN_DRAW_THREADS, "5")
    with draw_threads_kept():
        draw_with(16)
        assert os.environ["LP_NUM_THREADS"] == "16"
    assert "LP_NUM_THREADS" not in os.environ and os.environ[OWN_DRAW_THREADS] == "5"


def test_validating_a_config_sets_no_drawing_threads_and_a_run_sets_them_before_its_first_frame(tmp_path,
                                                                                                monkeypatch):
    """Validation (`--print-config` runs it too) changes nothing in this process; a sequential run sets the drawing
    threads of its plan before the spaces' probe (Mesa reads them once per process), and the API puts them back."""
    import parallel_ppo as ppo
    from parallel_ppo import launch

    for name in ("LP_NUM_THREADS", OWN_DRAW_THREADS):
        monkeypatch.setenv(name, "0")
        monkeypatch.delenv(name)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    launch.checked_spaces(*launch.validated_config(launch.Request(CARTPOLE)))
    assert "LP_NUM_THREADS" not in os.environ
    probe, seen = launch.env_spaces, []
    monkeypatch.setattr(launch, "env_spaces", lambda env: seen.append(os.environ.get("LP_NUM_THREADS")) or probe(env))
    tiny = {"run.total_steps": 16 * 8, "training.n_steps": 16, "training.batch_size": 64, "run.limit_seconds": 0,
            "training.precision": "fp32", "logging.tensorboard": False}
    ppo.train(CARTPOLE, output_dir=tmp_path / "run", overrides=tiny, verbose=False)
    assert seen == ["3"], "the plan's drawing threads (3 usable CPUs), set before the probe"
    assert "LP_NUM_THREADS" not in os.environ and OWN_DRAW_THREADS not in os.environ


def test_pinned_workers_take_the_usable_cpus_in_turn_where_the_platform_pins(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {7, 3, 5}, raising=False)
    assert [worker_cpus(slot, 1) for slot in range(4)] == [(3,), (5,), (7,), (3,)]
    assert [worker_cpus(slot, 2) for slot in range(2)] == [(3, 5), (7, 3)]  # blocks of two, round the list again
    monkeypatch.delattr(os, "sched_setaffinity", raising=False)
    with pytest.raises(ConfigError, match="parallel.pin_workers pins workers"):
        build_config(CARTPOLE, {}, ["parallel.pin_workers=true"], True)
    assert build_config(CARTPOLE, {}, ["parallel.pin_workers=true"], False).parallel.pin_workers  # sequential: unused
