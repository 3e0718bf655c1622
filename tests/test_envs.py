"""Batched envs: every env seeded by its own index (any split plays the same levels), Procgen's exploration
mode, and episodes cut by a time limit reported for bootstrapping."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from parallel_ppo.core.buffer import RolloutBuffer
from parallel_ppo.core.collect import EnvRunner
from parallel_ppo.core.config import EnvConfig
from parallel_ppo.envs.batch import make_batch_env
from parallel_ppo.envs.procgen_envs import PROCGEN_EXPLORATION_GAMES, PROCGEN_GAMES, PROCGEN_LIBRARIES_HELP
from parallel_ppo.envs.spaces import ActionSpace


def test_procgen_game_lists_match_procgen():
    """The config's Procgen names (known without loading Procgen) are Procgen's own."""
    from procgen.env import ENV_NAMES, EXPLORATION_LEVEL_SEEDS

    assert PROCGEN_GAMES == tuple(ENV_NAMES)
    assert set(PROCGEN_EXPLORATION_GAMES) == set(EXPLORATION_LEVEL_SEEDS)


def test_a_procgen_library_that_cannot_load_is_one_line_naming_it_and_the_fix(tmp_path):
    """Where the system's libGL cannot load (here an empty libGL.so.1 found first), Procgen's native library fails as
    its first env is made: a ConfigError naming that library and the packages to install, not cffi's OSError."""
    (tmp_path / "libGL.so.1").touch()
    code = ("from parallel_ppo.envs.batch import make_batch_env\nfrom parallel_ppo.envs.config import EnvConfig\n"
            "from parallel_ppo.errors import ConfigError\ntry:\n"
            "    make_batch_env(EnvConfig(id='starpilot'), 0, 0, 1, 1)\nexcept ConfigError as e:\n    print(e)\n")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "LD_LIBRARY_PATH": str(tmp_path)},
                         cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Procgen cannot load library '") and "libenv.so': " in out.stdout, out.stdout
    assert f"{tmp_path}/libGL.so.1" in out.stdout and out.stdout.strip().endswith(PROCGEN_LIBRARIES_HELP), out.stdout


@pytest.mark.slow
def test_the_parallel_trainer_says_a_procgen_library_that_cannot_load_in_one_line(tmp_path):
    """The forkserver preloads the game (its first Procgen env) for the workers to share: where the library cannot
    load, that was its traceback and a second of the coordinator's; now the worker's one line, nothing written."""
    (tmp_path / "libGL.so.1").touch()
    root, out = Path(__file__).resolve().parents[1], tmp_path / "run"
    proc = subprocess.run([sys.executable, "train_parallel_timed.py", "--duration", "5s", "--num-workers", "1",
                           "--num-envs-per-worker", "2", "--set", "run.limit_seconds=0", "--output-dir", str(out)],
                          env={**os.environ, "LD_LIBRARY_PATH": str(tmp_path)}, cwd=root, capture_output=True,
                          text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert "worker 0 failed to start: ConfigError: Procgen cannot load library '" in lines[0], proc.stderr
    assert lines[0].endswith(PROCGEN_LIBRARIES_HELP) and not out.exists()


def _play(envs, actions: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Step each batch of `envs` (together covering the actions' columns, in order); concatenate per step."""
    first = [np.array(e.reset(), copy=True) for e in envs]
    steps = [(np.concatenate(first), np.zeros(0), np.zeros(0))]
    for row in actions:
        parts, col = [], 0
        for e in envs:
            obs, rew, done, _ = e.step(row[col:col + e.num_envs])
            parts.append((np.array(obs, copy=True), rew.copy(), done.copy()))
            col += e.num_envs
        steps.append(tuple(np.concatenate([p[i] for p in parts]) for i in range(3)))
    return steps


def test_procgen_envs_play_the_same_levels_however_they_are_split():
    """4 starpilot envs in one batch, or as 2 + 2 in two batches (two workers), step identically,
    across episode ends; a run seeded otherwise plays other levels."""
    cfg = EnvConfig(id="starpilot")
    actions = np.random.default_rng(0).integers(0, 15, size=(150, 4))
    whole = [make_batch_env(cfg, 7, 0, 4, threads=1)]
    split = [make_batch_env(cfg, 7, 0, 2, threads=1), make_batch_env(cfg, 7, 2, 2, threads=1)]
    other = [make_batch_env(cfg, 8, 0, 4, threads=1)]
    try:
        a, b, c = _play(whole, actions), _play(split, actions), _play(other, actions)
    finally:
        for e in whole + split + other:
            e.close()
    assert sum(step[2].sum() for step in a[1:]) > 0, "the steps should cross an episode end"
    for x, y in zip(a, b, strict=True):
        for i in range(3):
            assert np.array_equal(x[i], y[i])
    assert not np.array_equal(a[0][0], c[0][0])


def test_exploration_mode_plays():
    """Procgen's exploration mode (one fixed level) builds and steps: it takes no num_levels/start_level."""
    env = make_batch_env(EnvConfig(id="maze", distribution_mode="exploration"), 1, 0, 2, threads=1)
    try:
        first = env.reset()
        for _ in range(5):
            obs, rew, done, cut = env.step(np.zeros(2, dtype=np.int64))
        assert obs.shape == first.shape == (2, 64, 64, 3) and cut == {}
        assert np.array_equal(first[0], first[1])  # one level for every env
    finally:
        env.close()


def test_time_limit_cuts_are_reported_with_their_last_observation():
    """MountainCar never reaches its goal by chance in 200 steps: every episode is cut by the time limit,
    which the env reports as done, with the last observation of each cut episode."""
    env = make_batch_env(EnvConfig(id="MountainCar-v0"), 1, 0, 3, threads=1)
    try:
        env.reset()
        for t in range(200):
            obs, _, done, cut = env.step(np.zeros(3, dtype=np.int64))
            if t < 199:
                assert not done.any() and cut == {}
        assert done.all() and sorted(cut) == [0, 1, 2]
        for i, last in cut.items():
            assert last.shape == obs[i].shape and not np.array_equal(last, obs[i])  # obs[i]: the next episode
    finally:
        env.close()


class CutEnv:
    """Two envs; env 1's episode is cut by a time limit at every step, env 0 runs on."""

    num_envs, obs_shape, obs_dtype, actions = 2, (1,), np.dtype(np.float32), ActionSpace(2)

    def reset(self) -> np.ndarray:
        return np.zeros((2, 1), dtype=np.float32)

    def step(self, actions):
        cut = {1: np.array([3.0], dtype=np.float32)}
        return np.zeros((2, 1), np.float32), np.ones(2, np.float32), np.array([False, True]), cut


class ValueIsObs(nn.Module):
    """Uniform policy; the value of an observation is the observation."""

    def forward(self, obs):
        return torch.zeros(obs.shape[0], 2), obs[:, 0].float()


def test_a_cut_episode_bootstraps_the_value_of_its_last_state():
    """gamma × V(last state) is bootstrapped where a time limit ended the episode, kept apart from the raw
    rewards (which normalization may scale) and out of the episode returns; no bootstrap when gamma is 0."""
    for gamma, expected in ((0.9, 0.9 * 3.0), (0.0, 0.0)):
        runner = EnvRunner(CutEnv(), seed=0, first_env=0, gamma=gamma)
        buf = RolloutBuffer.allocate(4, 2, (1,), np.dtype(np.float32))
        result = runner.collect(ValueIsObs(), buf)
        assert torch.all(buf.rewards == 1.0)
        assert torch.all(buf.bootstrap[:, 0] == 0.0)
        torch.testing.assert_close(buf.bootstrap[:, 1], torch.full((4,), expected))
        assert result.episode_returns == [1.0] * 4  # env 1: four one-step episodes, raw returns
