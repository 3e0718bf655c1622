"""Reward normalization: the references' arithmetic, by hand; it travels in the checkpoint; it leaves the
time-limit bootstrap and the reported returns alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from parallel_ppo.core.checkpoint import load_checkpoint
from parallel_ppo.core.collect import SequentialCollector
from parallel_ppo.core.configure import build_config
from parallel_ppo.core.reward_scale import RewardScaler
from parallel_ppo.envs.batch import env_spaces
from parallel_ppo.runs.training import RunPlan, train_run

ROOT = Path(__file__).resolve().parents[1]


def _variance_with_prior(seen: list[float]) -> float:
    """The variance of every return seen so far, pooled with the references' prior (count 1e-4, mean 0, var 1),
    in closed form rather than by streaming updates."""
    x, c0 = np.asarray(seen), 1e-4
    n, mean = len(x), x.mean()
    total = c0 + n
    m2 = c0 * 1.0 + ((x - mean) ** 2).sum() + mean**2 * c0 * n / total
    return m2 / total


def test_normalization_by_hand():
    """One env, gamma 0.5: returns 1, 0.5 + 2 = 2.5, then the episode ends and the next return is 4 alone.
    Each reward is divided by the std of all returns so far (after that step's update)."""
    scaler = RewardScaler(num_envs=1, gamma=0.5, clip=10.0)
    rewards = torch.tensor([[1.0], [2.0], [4.0]])
    dones = torch.tensor([[0.0], [1.0], [0.0]])
    out = scaler(rewards, dones)
    returns = [1.0, 2.5, 4.0]  # reset after the step that ended the episode
    expected = [r / np.sqrt(_variance_with_prior(returns[:t + 1]) + 1e-8) for t, r in enumerate([1.0, 2.0, 4.0])]
    assert expected[0] > 10  # one return seen: the variance is nearly the prior's 1e-4 / (1 + 1e-4) ...
    expected[0] = 10.0  # ... so the first reward is clipped
    torch.testing.assert_close(out[:, 0], torch.tensor(expected, dtype=torch.float32))
    assert scaler.returns.tolist() == [4.0]


def test_normalization_over_envs_matches_the_closed_form_and_clips():
    rng = np.random.default_rng(0)
    rewards = torch.from_numpy(rng.exponential(3.0, size=(40, 3)).astype(np.float32))
    dones = torch.from_numpy((rng.random((40, 3)) < 0.1).astype(np.float32))
    gamma, clip = 0.9, 1.5
    out = RewardScaler(3, gamma, clip)(rewards, dones)
    ret, seen = np.zeros(3), []
    for t in range(40):
        ret = gamma * ret + rewards[t].double().numpy()
        seen += ret.tolist()
        expected = np.clip(rewards[t].double().numpy() / np.sqrt(_variance_with_prior(seen) + 1e-8), -clip, clip)
        np.testing.assert_allclose(out[t].numpy(), expected, rtol=1e-5)
        ret[dones[t].numpy() > 0.5] = 0.0
    assert (out.abs() <= clip).all() and (out.abs() == clip).any(), "the clip should bite on this data"


def test_a_restored_scaler_keeps_its_statistics_and_starts_new_episodes():
    """A resumed run's envs start new episodes: the restored scaler keeps the running variance, but its return
    accumulators start from 0, as a worker restart's fresh envs do (`start_episodes`)."""
    rng = np.random.default_rng(1)
    rewards = torch.from_numpy(rng.normal(size=(20, 2)).astype(np.float32))
    dones = torch.from_numpy((rng.random((20, 2)) < 0.2).astype(np.float32))
    first = RewardScaler(2, 0.99, 10.0)
    first(rewards[:10], dones[:10])
    assert (first.returns != 0).all(), "both episodes run on past step 10 in this data"
    second = RewardScaler(2, 0.99, 10.0)
    second.load_state_dict(first.state_dict())
    assert second.returns.tolist() == [0.0, 0.0]
    first.start_episodes([0, 1])
    torch.testing.assert_close(second(rewards[10:], dones[10:]), first(rewards[10:], dones[10:]))
    first.returns[:] = [1.0, 2.0]
    first.start_episodes([1])
    assert first.returns.tolist() == [1.0, 0.0]
    with pytest.raises(ValueError, match="for 2 envs"):
        RewardScaler(3, 0.99, 10.0).load_state_dict(first.state_dict())


def _cartpole(out: Path, total_steps: int):
    sets = ["training.normalize_reward=true", "logging.tensorboard=false", "run.limit_seconds=0",
            "training.precision=fp32", "training.n_steps=32", "training.batch_size=64"]
    return build_config(str(ROOT / "config" / "cartpole.yaml"),
                        {"run.output_dir": str(out), "run.total_steps": total_steps}, sets, False)


@pytest.mark.slow
def test_resume_restores_the_normalization_state(tmp_path):
    """The checkpoint holds the scaler; a resumed run continues its statistics rather than starting afresh."""
    cfg = _cartpole(tmp_path, 2 * 32 * 8)
    source = SequentialCollector(cfg, 1)
    train_run(RunPlan(cfg, env_spaces(cfg.env), tmp_path, "sequential", {}), source)
    saved = load_checkpoint(tmp_path / "checkpoint.pt")
    state = saved["reward_scaler"]
    assert state["count"] == pytest.approx(1e-4 + 2 * 32 * 8)  # 2 updates × 32 steps × 8 envs
    cfg = _cartpole(tmp_path, 3 * 32 * 8)
    source = SequentialCollector(cfg, 1, resumes=1)
    train_run(RunPlan(cfg, env_spaces(cfg.env), tmp_path, "sequential", {}, resume=saved), source)
    resumed = load_checkpoint(tmp_path / "checkpoint.pt")["reward_scaler"]
    assert resumed["count"] == pytest.approx(state["count"] + 32 * 8)
    assert resumed["var"] != state["var"]


def test_a_cut_rollout_scales_only_the_steps_taken_and_keeps_the_accumulators():
    """Env 1's rollout was cut after 2 of 4 steps (`parallel.sync_fraction`): its stale rows (an old episode end
    among them) neither feed the statistics nor reset its accumulator; the next rollout goes on from it. Env 0's
    steps and the pooled statistics are the closed form's over the steps taken."""
    gamma = 0.5
    rewards = torch.tensor([[1.0, 2.0], [3.0, 1.0], [2.0, 99.0], [1.0, 99.0]])
    dones = torch.tensor([[0.0, 0.0], [0.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    taken = torch.arange(4)[:, None] < torch.tensor([4, 2])
    scaler = RewardScaler(2, gamma, clip=100.0)
    out = scaler(rewards, dones, taken)
    seen = [1.0, 2.0, 3.5, 2.0, 3.75, 2.875]  # env 0: 1, 3.5, 3.75, 2.875; env 1: 2, 2 (2 × 0.5 + 1)
    assert scaler.returns.tolist() == [2.875, 2.0]
    assert scaler.stats.count == pytest.approx(1e-4 + len(seen))
    np.testing.assert_allclose(scaler.stats.var, _variance_with_prior(seen), rtol=1e-9)
    np.testing.assert_allclose(out[3, 0].item(), 1.0 / np.sqrt(_variance_with_prior(seen) + 1e-8), rtol=1e-5)
