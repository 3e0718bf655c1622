"""The progress display: its time left (the duration's, or the step budget's when that ends the run first), and
what it shows of the episodes."""

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


def test_the_progress_line_says_when_no_episode_has_finished_and_shows_the_success_rate():
    """A camera run may finish no 500-step episode for minutes: until one ends, the line says so and shows the mean
    reward per env step of the update's rollout; then the mean return, and the success rate where the env has one."""
    from parallel_ppo.runs.progress import describe

    nan = float("nan")
    row = {"update": 1, "env_steps": 64, "wall_time": 2.0, "sps": 32.0, "episodic_return_mean": nan, "episodes": 0,
           "success_rate": nan, "reward_per_step": -0.8594}
    assert describe(row, 3600, 0) == ("update 1 | 64 steps | 32 SPS | no episode finished yet (reward -0.859 per "
                                      "step) | 0:00:02 elapsed, 0:59:58 left")
    later = row | {"episodic_return_mean": 5.4, "episodes": 4}
    assert "| 32 SPS | return 5.40 | 0:00:02" in describe(later, 3600, 0)
    assert "| return 5.40 | success 45% | 0:00:02" in describe(later | {"success_rate": 0.45}, 3600, 0)
