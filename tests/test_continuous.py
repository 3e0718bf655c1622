"""Continuous actions, observation normalization and the env families: the Gaussian head against
torch.distributions, clipping at the env, statistics that split and resume, every family building, every
unsupported space refused in one line, and a continuous task learned in seconds."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import ROOT, toy_envs_environ

from parallel_ppo.core.checkpoint import load_checkpoint
from parallel_ppo.core.config import EnvConfig, ModelConfig
from parallel_ppo.core.distributions import log_prob_entropy, most_likely, sample
from parallel_ppo.core.model import build_model
from parallel_ppo.core.normalization import ObsNormalizer, RunningMeanStd
from parallel_ppo.envs.batch import env_spaces, make_batch_env
from parallel_ppo.envs.spaces import ActionSpace, EnvSpaces
from parallel_ppo.envs.views import RENDERER_HELP
from parallel_ppo.errors import ConfigError

BOX = ActionSpace(3, (-1.0,) * 3, (1.0,) * 3)
REACH = ["--config", "config/mujoco.yaml", "--env", "toy_envs:Reach-v0", "--set",
         "training.n_steps=64", "--set", "training.batch_size=128", "--set", "training.n_epochs=4", "--set",
         "training.learning_rate=0.001", "--set", "run.limit_seconds=0", "--set", "logging.tensorboard=false",
         "--set", "logging.return_window=50"]
"""A toy continuous task of tests/toy_envs.py, registered by a module the trainer imports in every process."""


def trainer(script: str, *args: str) -> subprocess.CompletedProcess:
    """A trainer run with tests/ on PYTHONPATH, as a user's own env module would be importable."""
    return subprocess.run([sys.executable, script, *args], cwd=ROOT, env=toy_envs_environ(), capture_output=True,
                          text=True, timeout=240)


def test_gaussian_log_prob_and_entropy_match_torch_distributions():
    torch.manual_seed(0)
    mean, log_std = torch.randn(5, 3), torch.randn(3) * 0.5
    params = torch.cat([mean, log_std.expand(5, 3)], dim=-1)
    actions = torch.randn(5, 3) * 2
    reference = torch.distributions.Normal(mean, log_std.exp())
    log_prob, entropy = log_prob_entropy(params, actions)
    torch.testing.assert_close(log_prob, reference.log_prob(actions).sum(-1))
    torch.testing.assert_close(entropy, reference.entropy().sum(-1))
    assert torch.equal(most_likely(BOX, params), mean)


def test_gaussian_samples_are_unclipped_and_do_not_depend_on_the_batch_split():
    params = torch.cat([torch.full((6, 3), 0.9), torch.zeros(6, 3)], dim=-1)  # mean 0.9, std 1
    noise = np.random.default_rng(0).standard_normal((6, 3)).astype(np.float32)
    actions, log_prob = sample(BOX, params, noise)
    assert actions.abs().max() > 1, "samples beyond the bounds stay unclipped (the env clips them)"
    torch.testing.assert_close(actions, 0.9 + torch.from_numpy(noise))
    torch.testing.assert_close(log_prob, log_prob_entropy(params, actions)[0])
    parts = [sample(BOX, params[a:b], noise[a:b])[0] for a, b in ((0, 1), (1, 6))]
    assert torch.equal(torch.cat(parts), actions)


def test_every_network_has_a_gaussian_head_for_box_actions():
    for obs_shape, kind in (((4,), "mlp"), ((64, 64, 3), "impala"), ((84, 84, 4), "nature")):
        model = build_model(obs_shape, BOX, ModelConfig(kind=kind, hidden_size=32))
        obs = torch.zeros(2, *obs_shape, dtype=torch.uint8 if len(obs_shape) == 3 else torch.float32)
        params, values = model(obs)
        assert params.shape == (2, 6) and values.shape == (2,), kind
        assert torch.equal(params[:, 3:], torch.zeros(2, 3)), "log-std starts at 0, the same for every state"
        assert sum(p.numel() for n, p in model.named_parameters() if n == "log_std") == 3


def test_box_actions_are_clipped_to_the_bounds_at_the_env():
    env = make_batch_env(EnvConfig(id="toy_envs:Reach-v0"), 1, 0, 2, 1)
    try:
        start = env.reset()
        assert env.actions == ActionSpace(1, (-1.0,), (1.0,))
        obs, *_ = env.step(np.array([[5.0], [-5.0]], dtype=np.float32))  # Reach asserts the action is in bounds
    finally:
        env.close()
    np.testing.assert_allclose(obs - start, [[-0.2], [0.2]], atol=1e-6)  # moved by the bounds, ±1 × 0.2


def test_running_statistics_of_a_split_stream_equal_those_of_the_whole():
    data = np.random.default_rng(1).normal(3.0, 2.0, size=(300, 4))
    whole, parts = RunningMeanStd((4,)), RunningMeanStd((4,))
    whole.update(data)
    for chunk in np.array_split(data, 7):
        parts.update(chunk)
    np.testing.assert_allclose(parts.mean, whole.mean, rtol=1e-9)
    np.testing.assert_allclose(parts.var, whole.var, rtol=1e-9)
    np.testing.assert_allclose(whole.mean, data.mean(0), rtol=1e-5)
    np.testing.assert_allclose(whole.var, data.var(0), rtol=1e-3)


def test_observation_statistics_are_published_into_the_network_and_survive_a_checkpoint():
    model = build_model((2,), BOX, ModelConfig(kind="mlp", mlp_hidden=[8]), obs_clip=5.0)
    spaces = EnvSpaces((2,), np.dtype(np.float32), BOX)
    normalizer = ObsNormalizer(spaces)
    obs = torch.tensor([[[1.0, 10.0], [3.0, 30.0]], [[5.0, 50.0], [7.0, 70.0]]])  # (T, N, 2)
    normalizer.update(obs, model)
    torch.testing.assert_close(model.obs_mean, torch.tensor([4.0, 40.0]), rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(model.obs_std, torch.tensor([math.sqrt(5.0), math.sqrt(500.0)]), rtol=1e-3, atol=0)
    restored = ObsNormalizer(spaces)
    restored.load_state_dict(normalizer.state_dict())
    assert np.array_equal(restored.stats.mean, normalizer.stats.mean) and restored.stats.count == normalizer.stats.count
    seen = []
    model.net.register_forward_pre_hook(lambda _, args: seen.append(args[0]))
    model(torch.tensor([[4.0, 1000.0]]))
    torch.testing.assert_close(seen[0], torch.tensor([[0.0, 5.0]]), atol=1e-3, rtol=0)  # centred; clipped at 5


def _renderer_or_skip(cfg: EnvConfig) -> None:
    try:
        env_spaces(cfg)
    except ConfigError as e:
        if RENDERER_HELP in str(e):
            pytest.skip(f"no OpenGL renderer on this machine: {e}")
        raise


@pytest.mark.parametrize("cfg, obs_shape, obs_dtype, actions", [
    (EnvConfig(id="HalfCheetah-v5"), (17,), np.float32, ActionSpace(6, (-1.0,) * 6, (1.0,) * 6)),
    (EnvConfig(id="HalfCheetah-v5", pixels=True, frame_size=32), (32, 32, 9), np.uint8, ActionSpace(6, (-1.0,) * 6,
                                                                                                    (1.0,) * 6)),
    (EnvConfig(id="ALE/Breakout-v5"), (84, 84, 4), np.uint8, ActionSpace(4)),
    (EnvConfig(id="toy_envs:Reach-v0"), (1,), np.float32, ActionSpace(1, (-1.0,), (1.0,))),
], ids=["mujoco", "mujoco-pixels", "atari", "module:EnvId"])
def test_each_env_family_builds_and_steps(cfg, obs_shape, obs_dtype, actions):
    if cfg.pixels:
        _renderer_or_skip(cfg)
    env = make_batch_env(cfg, 1, 0, 2, 1)
    try:
        obs = env.reset()
        assert (env.obs_shape, env.obs_dtype, env.actions) == (obs_shape, np.dtype(obs_dtype), actions)
        for _ in range(3):
            obs, rewards, dones, _ = env.step(actions.sample_uniform(np.random.default_rng(0), 2))
        assert obs.shape == (2, *obs_shape) and obs.dtype == obs_dtype and rewards.dtype == np.float32
        if cfg.pixels:
            assert obs.std() > 0, "the frames show something"
    finally:
        env.close()


def test_episodic_life_ends_learning_episodes_at_each_life_and_counts_whole_games():
    """Breakout from a random policy: every life lost sets `dones` while the game plays on (the lives left fall one
    at a time, never back to 5), and only the last life ends a game as the metrics and evaluation count it."""
    from parallel_ppo.envs.batch import episodes_ended

    env = make_batch_env(EnvConfig(id="BreakoutNoFrameskip-v4", episodic_life=True, fire_reset=True), 1, 0, 1, 1)
    ale = env._env.envs[0].unwrapped.ale
    rng = np.random.default_rng(0)
    lives_at_ends, steps, games = [], 0, 0
    try:
        env.reset()
        while not games and steps < 5000:
            lives = ale.lives()
            _, _, dones, _ = env.step(env.actions.sample_uniform(rng, 1))
            steps += 1
            games = int(episodes_ended(env, dones)[0])
            if dones[0]:
                lives_at_ends.append(lives)
    finally:
        env.close()
    assert games == 1 and lives_at_ends == [5, 4, 3, 2, 1], "each of Breakout's 5 lives ends a learning episode"
    assert steps > 5 * 10, "five balls played, not five resets"


class _TwoLives(gym.Env):
    """A stand-in for an ALE env: two lives, the first lost at step 2; the game ends (time limit) at step 3."""

    observation_space = gym.spaces.Box(0, 1, (1,))
    action_space = gym.spaces.Discrete(3)

    def __init__(self) -> None:
        self.ale, self.resets, self.t = self, 0, 0

    def lives(self) -> int:
        return 2 - (self.t >= 2)

    def reset(self, **kwargs):
        self.resets, self.t = self.resets + 1, 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(1, np.float32), 0.0, False, self.t >= 3, {}


def test_a_game_that_ends_in_the_step_after_a_life_lost_is_reset_and_counted():
    """The no-op step that follows a life lost can end the game itself (a time limit): then the wrapper resets
    for real and counts the game, instead of handing back a finished game's frame."""
    from parallel_ppo.envs.gym_envs import EpisodicLife

    env = EpisodicLife(_TwoLives())
    env.reset()
    assert env.step(0)[2:4] == (False, False)
    assert env.step(0)[2:4] == (True, False), "the first life lost ends the episode for learning"
    env.reset()  # its no-op step is the game's last
    assert (env.games, env.unwrapped.resets, env.unwrapped.t, env.lives) == (1, 2, 0, 2)


@pytest.mark.parametrize("cfg, words", [
    (EnvConfig(id="CartPole-v1", episodic_life=True), "applies to atari envs; CartPole-v1 is a gymnasium env"),
    (EnvConfig(id="ALE/Pong-v5", fire_reset=True, frame_size=84), None),
    (EnvConfig(id="ALE/Freeway-v5", fire_reset=True), None),
    (EnvConfig(id="starpilot", episodic_life=True), "starpilot is a procgen env"),
], ids=["not-atari", "pong-fires", "freeway-has-no-fire", "procgen"])
def test_life_and_fire_settings_where_they_do_not_apply_are_refused(cfg, words):
    """Outside Atari they are refused; an Atari game without FIRE (Freeway) starts by itself and is left as it is."""
    from parallel_ppo.envs.families import check_family
    from parallel_ppo.envs.gym_envs import FireReset, _wrapper
    from parallel_ppo.envs.procgen_envs import PROCGEN_GAMES

    if words is None:
        env = make_batch_env(cfg, 0, 0, 1, 1)
        env.close()
        assert (_wrapper(env._env.envs[0], FireReset) is not None) == cfg.id.endswith("Pong-v5"), \
            "FIRE pressed where there is one"
        return
    with pytest.raises(ConfigError, match=words):
        check_family(cfg)  # up front, as a benchmark checks every run's config before the first one starts
    if cfg.id not in PROCGEN_GAMES:  # and where a gymnasium env is built
        with pytest.raises(ConfigError, match=words):
            env_spaces(cfg)


@pytest.mark.parametrize("env_id, words", [
    ("toy_envs:NestedDictObs-v0", "key 'mode' is Discrete"),
    ("toy_envs:MultiDiscreteActions-v0", "action space MultiDiscrete"),
    ("toy_envs:FloatImages-v0", "float32 images"),
    ("toy_envs:ChannelsFirstImages-v0", r"image \(3, 64, 64\) laid out channels first, whose rows would be read as 64 "
                                         r"channels; an image must be H×W×C, channels last"),
    ("toy_envs:ChannelsFirstCamera-v0", r"key 'camera' is an image \(3, 8, 8\) laid out channels first"),
    ("toy_envs:IntegerBoxActions-v0", r"int64 actions .* \(integer choices: Discrete\)"),
    ("toy_envs:EmptyObservations-v0", r"observation space Box\(.*\(0,\), float32\), which holds no value"),
    ("toy_envs:EmptyActions-v0", r"action space Box\(.*\(0,\), float32\); supported: .* n ≥ 1"),
    ("toy_envs:Nope-v0", "is it registered by toy_envs?"),
    ("no_such_module:Env-v0", "cannot import module 'no_such_module' .*; its folder must be on PYTHONPATH"),
])
def test_spaces_and_ids_the_trainer_cannot_use_are_refused(env_id, words):
    with pytest.raises(ConfigError, match=words.replace("?", r"\?")):
        env_spaces(EnvConfig(id=env_id))


def test_images_channels_last_and_uint8_vectors_are_taken():
    """The spaces beside those refused above: an image channels last (4 stacked gray frames, or 4 RGB frames an env
    stacked itself), and a uint8 Box of one or two dimensions, read as numbers."""
    from parallel_ppo.envs.spaces import check_channels, observation_dtype

    for shape in ((84, 84, 3), (84, 84, 12), (8, 8, 4), (64, 96, 3)):
        check_channels(shape, "x")
    for shape in ((12, 84, 84), (1, 64, 64)):  # stacked or gray frames channels first
        with pytest.raises(ConfigError, match="laid out channels first"):
            check_channels(shape, "x")

    assert observation_dtype(gym.spaces.Box(0, 255, (84, 84, 4), np.uint8), "x") == np.uint8
    assert env_spaces(EnvConfig(id="toy_envs:CameraReach-v0", frame_stack=4)).layout.images[0].shape == (8, 8, 12)
    for shape in ((7,), (3, 64)):
        assert observation_dtype(gym.spaces.Box(0, 255, shape, np.uint8), "x") == np.float32


@pytest.mark.parametrize("sets, words", [
    (["env.id=starpilot", "training.normalize_obs=true"], "normalizes vector observations"),
    (["env.id=Pendulum-v1", "env.frame_stack=4"], "stacks image frames"),
    (["env.id=starpilot", "env.pixels=true"], "starpilot is a procgen env"),
    (["env.id=CartPole-v1", "env.pixels=true"], "applies to mujoco envs; CartPole-v1 is a gymnasium env"),
    (["env.id=MountainCarContinuous-v0", "model.kind=nature"], "needs image observations"),
])
def test_settings_that_do_not_fit_the_env_are_refused(sets, words):
    from parallel_ppo.core.configure import build_config
    from parallel_ppo.envs.batch import env_spaces
    from parallel_ppo.launch import check_network_and_memory

    with pytest.raises(ConfigError, match=words):
        cfg = build_config(str(ROOT / "config" / "cartpole.yaml"), {}, sets, parallel=False)
        check_network_and_memory(cfg, env_spaces(cfg.env))


@pytest.mark.slow  # starts a trainer
def test_a_refusal_is_one_line_and_exit_2_before_the_run_directory(train_timed, tmp_path):
    out = tmp_path / "run"
    proc = train_timed("--config", "config/cartpole.yaml", "--env", "starpilot", "--set", "training.normalize_obs=true",
                       "--output-dir", str(out), timeout=120)
    assert proc.returncode == 2 and "normalizes vector observations" in proc.stderr, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and not out.exists()


@pytest.mark.slow
def test_a_continuous_task_is_learned_in_seconds_and_its_policy_predicts_in_bounds(tmp_path):
    """Reach (a toy task of a module the user names) from about −17 (the initial policy) to better than −6
    in 20k steps (about −3 reached on 3 seeds, ~6 s); then the policy loads and acts within the bounds."""
    import parallel_ppo

    out = tmp_path / "reach"
    proc = trainer("train_timed.py", *REACH, "--num-envs", "8", "--total-steps", "20000", "--output-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodic_return_mean"] > -6.0, summary["episodic_return_mean"]
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        policy = parallel_ppo.load_policy(out)
        actions = policy.predict(np.array([[5.0], [-5.0], [0.0]], dtype=np.float32))
        assert actions.shape == (3, 1) and actions.dtype == np.float32 and np.all(np.abs(actions) <= 1.0)
        assert actions[0, 0] > 0.5 > -0.5 > actions[1, 0], "it moves toward the target"
        assert policy.predict(np.array([2.0], dtype=np.float32), deterministic=True).shape == (1,)
        assert policy.predict(np.zeros((0, 1), np.float32)).shape == (0, 1)  # an empty batch (was a ValueError)
    finally:
        sys.path.remove(str(ROOT / "tests"))


@pytest.mark.slow
def test_workers_import_the_users_module_and_resume_keeps_the_observation_statistics(tmp_path):
    """A parallel run of `module:EnvId` (2 workers: each imports the module), resumed: the statistics continue
    from the checkpoint's (their count is every observation of both sessions) and sit in the network."""
    out = tmp_path / "run"
    first = trainer("train_parallel_timed.py", *REACH, "--total-steps", "256", "--output-dir", str(out))  # 2 × 2 envs
    assert first.returncode == 0, first.stderr
    second = trainer("train_parallel_timed.py", "--resume", str(out), "--total-steps", "512")
    assert second.returncode == 0, second.stderr
    state = load_checkpoint(out / "checkpoint.pt")
    stats = state["obs_normalizer"]
    assert state["update"] == 2 and stats["count"] == pytest.approx(512 + 1e-4)
    torch.testing.assert_close(state["model"]["obs_mean"], stats["mean"].float())
    torch.testing.assert_close(state["model"]["obs_std"], (stats["var"] + 1e-8).sqrt().float())


def test_sign_rewards_learns_from_the_signs_of_the_rewards_only():
    from parallel_ppo.core.buffer import RolloutBuffer
    from parallel_ppo.core.config import Config
    from parallel_ppo.core.loop import rollout_batch

    buf = RolloutBuffer.allocate(3, 2, (1,), np.dtype(np.float32))
    buf.rewards.copy_(torch.tensor([[4.0, -0.5], [0.0, 2.0], [-7.0, 1.0]]))
    cfg = Config()
    cfg.training.gamma, cfg.training.gae_lambda = 1.0, 1.0
    raw = rollout_batch(buf, cfg).returns.view(3, 2)
    cfg.training.sign_rewards = True
    signs = rollout_batch(buf, cfg).returns.view(3, 2)
    assert torch.equal(raw[0], torch.tensor([-3.0, 2.5])) and torch.equal(signs[0], torch.tensor([0.0, 1.0]))
    assert torch.equal(buf.rewards[0], torch.tensor([4.0, -0.5])), "the buffer (and so the metrics) keep raw rewards"


def test_resume_takes_checkpoints_made_before_new_env_fields_and_refuses_another_network(tmp_path):
    from parallel_ppo.core.config import Config
    from parallel_ppo.launch import check_resume_config

    cfg = Config()
    older = cfg.to_dict()
    for key in ("pixels", "frame_size", "frame_stack", "fast_render"):  # fields this checkpoint's version lacked
        del older["env"][key]
    check_resume_config(cfg, {"config": older}, tmp_path)
    cfg.training.normalize_obs = True  # another network: NormalizedObs around it
    with pytest.raises(ConfigError, match="training.normalize_obs=False, not True"):
        check_resume_config(cfg, {"config": older}, tmp_path)
    cfg.training.normalize_obs, cfg.training.predict_privileged = False, 0.5  # a layer the checkpoint lacks
    with pytest.raises(ConfigError, match=r"predict_privileged=0.0 \(its network without the layer that predicts\)"):
        check_resume_config(cfg, {"config": older}, tmp_path)
    older["training"]["predict_privileged"] = 1.0  # its weight may change
    check_resume_config(cfg, {"config": older}, tmp_path)


def test_the_random_policy_and_small_frames_with_the_nature_cnn():
    model = build_model((3,), BOX, ModelConfig(kind="random"), obs_clip=10.0)
    assert hasattr(model, "obs_mean"), "the statistics have somewhere to go whatever the network"
    with pytest.raises(ConfigError, match="at least 36×36"):
        build_model((32, 32, 4), ActionSpace(4), ModelConfig(kind="nature"))


@pytest.mark.parametrize("other", ["collected", "closed-beside"])
def test_frames_stay_drawn_when_another_env_is_freed_or_closed(other):
    """MuJoCo frees a render context's GL objects into whichever OpenGL context is current: a closed env that the
    collector freed later, or another env closed beside the live ones, once turned every later frame black."""
    import gc

    cfg = EnvConfig(id="HalfCheetah-v5", pixels=True, frame_size=32)
    _renderer_or_skip(cfg)
    collecting = gc.isenabled()
    gc.disable()
    try:
        probe = make_batch_env(cfg, 1, 0, 1, 1)
        probe.reset()
        if other == "collected":
            probe.close()
            del probe
        env = make_batch_env(cfg, 1, 0, 2, 1)
        env.reset()
        if other == "collected":
            gc.collect()
        else:
            probe.close()
        for _ in range(3):  # past the frames stacked before
            obs, _, _, _ = env.step(env.actions.sample_uniform(np.random.default_rng(0), 2))
        assert obs[..., -3:].std() > 0, "the newest frames show something"
        env.close()
    finally:
        if collecting:
            gc.enable()
