"""RolloutBuffer: uint8 frames end to end, env slices that write through, shared-memory allocation."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from parallel_ppo.core.buffer import RolloutBuffer, minibatch_indices
from parallel_ppo.core.collect import EnvRunner, SequentialCollector
from parallel_ppo.core.config import EnvConfig, ModelConfig
from parallel_ppo.core.configure import build_config
from parallel_ppo.core.group import ALONE, AgreedRollout
from parallel_ppo.core.loop import ENV_STEPS, LEARNED_SHARE, LEARNER_THREADS, ROLLOUT_CUT, update
from parallel_ppo.core.model import build_model
from parallel_ppo.core.timing import PhaseTimer
from parallel_ppo.core.train_state import TrainState
from parallel_ppo.envs.batch import make_batch_env
from parallel_ppo.envs.procgen_envs import ProcgenBatchEnv
from parallel_ppo.tuning.compute_limit import threads_kept

ROOT = Path(__file__).resolve().parents[1]

FIELDS = ("obs", "actions", "logprobs", "values", "rewards", "dones", "last_values")


class RecordingEnv:
    """Wraps a BatchEnv and keeps a copy of every observation, reward and done it hands out."""

    def __init__(self, env) -> None:
        self.env = env
        self.num_envs, self.obs_shape = env.num_envs, env.obs_shape
        self.obs_dtype, self.actions = env.obs_dtype, env.actions
        self.observations: list[np.ndarray] = []
        self.rewards: list[np.ndarray] = []
        self.dones: list[np.ndarray] = []
        self.taken: list[np.ndarray] = []

    def reset(self) -> np.ndarray:
        obs = self.env.reset()
        self.observations.append(np.array(obs, copy=True))
        return obs

    def step(self, actions):
        self.taken.append(np.array(actions, copy=True))
        obs, rew, done, cut = self.env.step(actions)
        self.observations.append(np.array(obs, copy=True))
        self.rewards.append(np.array(rew, copy=True))
        self.dones.append(np.array(done, copy=True))
        return obs, rew, done, cut

    def close(self) -> None:
        self.env.close()


class DtypeSpy(nn.Module):
    """Passes through to a model and records the dtype of every observation batch it sees."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.seen: list[torch.dtype] = []

    def forward(self, obs):
        self.seen.append(obs.dtype)
        return self.model(obs)


def test_allocate_shapes_and_dtypes():
    """allocate gives (T, N, *obs) observations in the env's dtype and the documented per-field dtypes."""
    buf = RolloutBuffer.allocate(5, 3, (64, 64, 3), np.dtype(np.uint8))
    assert buf.obs.shape == (5, 3, 64, 64, 3) and buf.obs.dtype == torch.uint8
    assert buf.actions.dtype == torch.int64
    for name in ("logprobs", "values", "rewards", "dones"):
        assert getattr(buf, name).shape == (5, 3) and getattr(buf, name).dtype == torch.float32
    assert buf.last_values.shape == (3,)
    assert (buf.n_steps, buf.num_envs) == (5, 3)
    vec = RolloutBuffer.allocate(2, 4, (4,), np.dtype(np.float32))
    assert vec.obs.dtype == torch.float32 and vec.obs.shape == (2, 4, 4)


def test_procgen_frames_stay_uint8_end_to_end():
    """After collecting from 2 starpilot envs the buffer holds uint8 frames equal to what the env returned."""
    cfg = EnvConfig(id="starpilot", num_envs=2)
    env = make_batch_env(cfg, seed=3, first_env=0, num_envs=2, threads=1)
    assert isinstance(env, ProcgenBatchEnv)
    assert env.obs_dtype == np.uint8 and env.obs_shape == (64, 64, 3)
    rec = RecordingEnv(env)
    torch.manual_seed(0)
    model = DtypeSpy(build_model(env.obs_shape, env.actions,
                                 ModelConfig(kind="impala", impala_depths=[4, 4, 4], hidden_size=16)))
    n_steps = 6
    buf = RolloutBuffer.allocate(n_steps, 2, env.obs_shape, env.obs_dtype)
    runner = EnvRunner(rec, seed=3, first_env=0)
    try:
        runner.collect(model, buf)
    finally:
        runner.close()

    assert buf.obs.dtype == torch.uint8
    assert set(model.seen) == {torch.uint8}  # the network receives the uint8 frames themselves
    expected = torch.from_numpy(np.stack(rec.observations[:n_steps]))
    assert torch.equal(buf.obs, expected)
    assert buf.obs.float().std() > 0  # real frames, not an untouched zero buffer
    assert torch.equal(buf.actions, torch.from_numpy(np.stack(rec.taken)).long())
    assert torch.equal(buf.rewards, torch.from_numpy(np.stack(rec.rewards)))
    assert torch.equal(buf.dones, torch.from_numpy(np.stack(rec.dones)).float())
    # the runner keeps the last frame for the next rollout and bootstraps from it
    assert np.array_equal(runner.obs, rec.observations[-1])
    with torch.no_grad():
        _, last_values = model.model(torch.from_numpy(rec.observations[-1]))
    torch.testing.assert_close(buf.last_values, last_values)


def test_env_slice_writes_land_in_parent():
    """Every field of env_slice(a, b) is a view: writes appear in columns a..b-1 of the parent only."""
    buf = RolloutBuffer.allocate(4, 6, (3,), np.dtype(np.float32))
    view = buf.env_slice(2, 5)
    assert (view.n_steps, view.num_envs) == (4, 3)
    for name in FIELDS:
        getattr(view, name).fill_(7)
    for name in FIELDS:
        parent = getattr(buf, name)
        if name == "last_values":
            inside, outside = parent[2:5], torch.cat([parent[:2], parent[5:]])
        else:
            inside, outside = parent[:, 2:5], torch.cat([parent[:, :2], parent[:, 5:]], dim=1)
        assert torch.all(inside == 7), name
        assert torch.all(outside == 0), name


def test_collect_into_env_slice():
    """A runner collecting into a slice fills exactly that slice of the parent buffer, consistently."""
    env = make_batch_env(EnvConfig(id="CartPole-v1"), seed=0, first_env=1, num_envs=2, threads=1)
    torch.manual_seed(0)
    model = build_model(env.obs_shape, env.actions, ModelConfig(kind="mlp", mlp_hidden=[8]))
    buf = RolloutBuffer.allocate(5, 4, env.obs_shape, env.obs_dtype)
    runner = EnvRunner(env, seed=0, first_env=1)
    try:
        runner.collect(model, buf.env_slice(1, 3))
    finally:
        runner.close()
    for name in ("obs", "values", "rewards", "logprobs"):
        t = getattr(buf, name)
        assert torch.all(t[:, 0] == 0) and torch.all(t[:, 3] == 0), name
    assert torch.all(buf.rewards[:, 1:3] == 1.0)  # CartPole pays 1 per step
    assert torch.all(buf.obs[:, 1:3].abs().sum(-1) > 0)
    assert torch.all(buf.logprobs[:, 1:3] < 0)
    # stored log-probs and values are the model's on the stored observations
    with torch.no_grad():
        logits, values = model(buf.obs[:, 1:3].flatten(0, 1))
    lp = torch.log_softmax(logits, -1).gather(1, buf.actions[:, 1:3].flatten().unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(lp, buf.logprobs[:, 1:3].flatten())
    torch.testing.assert_close(values, buf.values[:, 1:3].flatten())


def _child_writes(buf: RolloutBuffer, start: int, stop: int) -> None:
    view = buf.env_slice(start, stop)
    view.obs.fill_(200)
    view.actions.fill_(3)
    view.rewards.fill_(1.5)
    view.last_values.fill_(-2.0)


def test_shared_allocation_is_visible_across_processes():
    """With shared=True every tensor lives in shared memory and a child's writes reach the parent."""
    buf = RolloutBuffer.allocate(3, 4, (8, 8, 3), np.dtype(np.uint8), shared=True)
    for name in FIELDS:
        assert getattr(buf, name).is_shared(), name
    assert buf.obs.dtype == torch.uint8
    assert not RolloutBuffer.allocate(3, 4, (2,), np.dtype(np.float32)).obs.is_shared()

    proc = mp.get_context("fork").Process(target=_child_writes, args=(buf, 2, 4))
    proc.start()
    proc.join(timeout=60)
    assert proc.exitcode == 0
    assert torch.all(buf.obs[:, 2:4] == 200) and torch.all(buf.obs[:, :2] == 0)
    assert torch.all(buf.actions[:, 2:4] == 3) and torch.all(buf.actions[:, :2] == 0)
    assert torch.all(buf.rewards[:, 2:4] == 1.5)
    assert buf.last_values.tolist() == [0.0, 0.0, -2.0, -2.0]


@pytest.mark.parametrize("rows,count,sizes", [(torch.arange(16), 4, [4] * 4), (torch.arange(12), 1, [12]),
                                              (torch.tensor([0, 2, 3, 5, 7, 8, 9, 11, 13, 14]), 4, [3, 3, 2, 2])])
def test_minibatch_indices_cover_a_permutation_of_the_rows(rows, count, sizes):
    """`count` disjoint minibatches of equal sizes (or sizes one apart, a cut rollout's) that cover every row given
    once."""
    parts = list(minibatch_indices(rows, count, torch.Generator().manual_seed(0)))
    assert [len(p) for p in parts] == sizes
    flat = torch.cat(parts)
    assert sorted(flat.tolist()) == rows.tolist()
    assert not torch.equal(flat, rows)  # shuffled


def test_taken_marks_the_steps_of_a_cut_rollout():
    """`taken` is None while every env took every step, else each env's first `lengths` steps."""
    buf = RolloutBuffer.allocate(4, 3, (2,), np.float32)
    assert buf.lengths.tolist() == [4] * 3 and buf.taken() is None  # whole, as allocated
    buf.env_slice(1, 3).lengths.copy_(torch.tensor([1, 3]))  # a worker's slice writes through
    assert buf.taken().T.tolist() == [[True] * 4, [True, False, False, False], [True, True, True, False]]


def test_an_update_on_a_cut_rollout_learns_from_the_steps_taken(monkeypatch):
    """`loop.update` on a rollout whose envs 2 and 3 stopped after 5 of 16 steps (`parallel.sync_fraction`): it
    counts the 42 steps taken, records the share cut, takes as many optimizer steps as on a whole rollout (smaller
    minibatches), and feeds the observation statistics the steps taken only. A dict observation whose frames are
    shifted, its rewards and vector keys normalized: every per-sample path of the update."""
    monkeypatch.chdir(ROOT)
    cfg = build_config("config/cartpole.yaml", {"env.id": "toy_envs:CameraReach-v0", "run.seed": 1}, [
        "env.num_envs=4", "training.n_steps=16", "training.batch_size=16", "training.n_epochs=2",
        "training.target_kl=0", "model.kind=auto", "model.impala_depths=[4, 8]", "model.hidden_size=32",
        "training.normalize_obs=true", "training.normalize_reward=true", "training.augment_shift=2",
        "training.precision=fp32", "training.microbatch_size=0"], parallel=False)
    source = SequentialCollector(cfg, 1)
    try:
        state = TrainState.new(cfg, source.spaces)
        result = source.collect(state.model, PhaseTimer())
        source.buffer.lengths[2:] = 5
        agreed = AgreedRollout(result, None, None, 0.0, source.buffer.lengths.clone())
        row = update(cfg, source, state, agreed, PhaseTimer(), ALONE)
    finally:
        source.close()
    assert row[ENV_STEPS] == state.env_steps == 42
    assert row[ROLLOUT_CUT] == pytest.approx(1 - 42 / 64)
    first = next(state.model.parameters())
    assert int(state.optimizer.state[first]["step"]) == 2 * 64 // 16  # n_epochs × the whole rollout's minibatches
    assert state.obs_normalizer.stats.count == pytest.approx(42 + 1e-4)
    assert state.reward_scaler.stats.count == pytest.approx(42 + 1e-4)


@pytest.mark.parametrize("lagging", [4, 9])
def test_an_update_that_drops_lagged_steps_learns_from_the_others(monkeypatch, lagging):
    """With `parallel.drop_lagged`, `loop.update` on a rollout whose first `lagging` of 16 steps lag: at most half
    (4), their log-probs and values made NaN, it learns from the others (its parameters stay numbers) in as many
    optimizer steps as on a whole rollout, counts every step, and leaves the dropped steps' values unrevalued
    (`parallel.fresh_values` is on); more than half (9), it learns from all of them, valued again."""
    monkeypatch.chdir(ROOT)
    cfg = build_config("config/cartpole.yaml", {"env.id": "CartPole-v1", "run.seed": 1}, [
        "env.num_envs=4", "training.n_steps=16", "training.batch_size=16", "training.n_epochs=2",
        "training.target_kl=0", "parallel.drop_lagged=true", "training.precision=fp32"], parallel=False)
    source = SequentialCollector(cfg, 1)
    try:
        state = TrainState.new(cfg, source.spaces)
        result = source.collect(state.model, PhaseTimer())
        source.lagged = torch.arange(16)[:, None].expand(16, 4) < lagging
        source.lagged_share = lagging / 16
        if lagging <= 8:
            source.buffer.logprobs[:lagging] = float("nan")
        source.buffer.values[:lagging] = float("nan")
        source.during_update = lambda: torch.set_num_threads(3)  # as an overlapped learner takes idle cores
        with threads_kept():
            torch.set_num_threads(1)
            row = update(cfg, source, state, AgreedRollout(result, None, None, 0.0, source.buffer.lengths.clone()),
                         PhaseTimer(), ALONE)
    finally:
        source.close()
    assert row[ENV_STEPS] == state.env_steps == 64
    assert row[LEARNED_SHARE] == (1 - lagging / 16 if lagging <= 8 else 1.0)
    assert row[LEARNER_THREADS] == 3, "the count the update ended on"
    first = next(state.model.parameters())
    assert int(state.optimizer.state[first]["step"]) == 2 * 64 // 16
    assert all(torch.isfinite(p).all() for p in state.model.parameters())
    stale = source.buffer.values[:lagging].isnan()
    assert stale.all() if lagging <= 8 else not stale.any(), "dropped steps are not valued again; kept ones all are"
