"""The progress display's time left: the duration's, or the step budget's when that ends the run first."""

from __future__ import annotations

import pytest

from parallel_ppo.runs.progress import time_left


def test_time_left_follows_the_duration_without_a_step_budget():
    assert time_left(elapsed=600, env_steps=10_000, budget_seconds=3600, total_steps=0) == 3000


def test_time_left_follows_the_step_budget_when_it_ends_the_run_first():
    # 10k of 40k steps in 100 s: 300 s more at the same rate, well inside the hour
    assert time_left(elapsed=100, env_steps=10_000, budget_seconds=3600, total_steps=40_000) == pytest.approx(300)
    # a step budget beyond the duration: the duration ends the run
    assert time_left(elapsed=100, env_steps=10_000, budget_seconds=200, total_steps=10**9) == pytest.approx(100)


def test_time_left_is_never_negative_and_needs_a_rate():
    assert time_left(elapsed=4000, env_steps=10_000, budget_seconds=3600, total_steps=0) == 0
    assert time_left(elapsed=0, env_steps=0, budget_seconds=3600, total_steps=50_000) == 3600
