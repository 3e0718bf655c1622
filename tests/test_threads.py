"""The thread policy (core/threads.py): the torch, env and drawing threads of each process of a run."""

from __future__ import annotations

import os
from pathlib import Path

import psutil

from parallel_ppo.core.configure import build_config
from parallel_ppo.core.threads import OWN_DRAW_THREADS, draw_threads_kept, draw_with, thread_plan, user_draw_threads

CARTPOLE = str(Path(__file__).resolve().parents[1] / "config" / "cartpole.yaml")


def test_a_worker_steps_on_one_thread_and_draws_on_its_share_of_the_cores(monkeypatch):
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 16)
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
