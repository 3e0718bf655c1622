"""The thread policy (core/threads.py): the torch, env and drawing threads of each process of a run."""

from __future__ import annotations

import os
from pathlib import Path

import psutil

from parallel_ppo.core.configure import build_config
from parallel_ppo.core.threads import OWN_DRAW_THREADS, draw_with_env_threads, thread_plan

CARTPOLE = str(Path(__file__).resolve().parents[1] / "config" / "cartpole.yaml")


def test_a_workers_envs_get_one_thread_and_a_sequential_runs_every_core(monkeypatch):
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 16)
    cfg = build_config(CARTPOLE, {}, [], parallel=True)
    assert thread_plan(cfg, parallel=True).env == 1
    assert thread_plan(cfg, parallel=False).env == 16
    assert thread_plan(cfg, parallel=False, ranks_on_host=4).env == 4
    assert thread_plan(build_config(CARTPOLE, {}, ["env.env_threads=3"], parallel=True), parallel=True).env == 3


def test_mesa_draws_with_the_env_threads_unless_the_user_set_its_own(monkeypatch):
    monkeypatch.delenv("LP_NUM_THREADS", raising=False)
    monkeypatch.delenv(OWN_DRAW_THREADS, raising=False)
    draw_with_env_threads(16)  # a sequential run
    assert os.environ["LP_NUM_THREADS"] == "16"
    draw_with_env_threads(1)  # a worker started after it from the same Python inherits ours and replaces it
    assert os.environ["LP_NUM_THREADS"] == "1"
    monkeypatch.setenv("LP_NUM_THREADS", "3")  # the user's own
    draw_with_env_threads(1)
    assert os.environ["LP_NUM_THREADS"] == "3"
