"""An actor and a critic that read different keys of a dict observation (the critic privileged state a real robot
does not have), and the random shift of frames in the update: the actor never reads a critic-only key, a policy acts
and exports without them, the shift moves whole frames by whole pixels from the update's seeded generator, and
settings that cannot work are refused in one line. Equality with an asymmetric critic and the shift: the parallel
and distributed equality tests run them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from parallel_ppo.cli.train import run as train_cli
from parallel_ppo.core.augment import RandomShift, _crop_padded, shift_frames
from parallel_ppo.core.config import Config, ModelConfig, TrainingConfig
from parallel_ppo.core.dict_networks import AsymmetricActorCritic, DictVectors, MultiInputActorCritic
from parallel_ppo.core.distributions import gaussian_log_prob, kl_divergence
from parallel_ppo.core.model import build_model, network
from parallel_ppo.core.policy import Policy
from parallel_ppo.core.ppo import TrainBatch, ppo_loss, ppo_update
from parallel_ppo.envs.batch import env_spaces
from parallel_ppo.envs.observations import DictLayout
from parallel_ppo.envs.spaces import ActionSpace
from parallel_ppo.errors import ConfigError

LAYOUT = DictLayout.of({"wrist": ((6, 6, 3), True), "joints": ((3,), False), "cube": ((2,), False),
                        "top": ((4, 4, 1), True)})
ACTOR = ["wrist", "joints"]
CONTINUOUS = ActionSpace(2, (-1.0, -1.0), (1.0, 1.0))


def rows(n: int, seed: int, layout: DictLayout = LAYOUT) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {p.key: (rng.integers(0, 256, (n, *p.shape), dtype=np.uint8) if p.image
                    else rng.normal(size=(n, p.size)).astype(np.float32)) for p in layout.parts}


def model_config(**changes: object) -> ModelConfig:
    return dataclasses.replace(ModelConfig(impala_depths=[4], hidden_size=16, mlp_hidden=[8]), **changes)


@pytest.mark.parametrize("share", [True, False], ids=["shared-cnn", "own-cnns"])
@pytest.mark.parametrize("layout", [LAYOUT, DictLayout.of({"joints": ((3,), False), "cube": ((2,), False)})],
                         ids=["images-and-vectors", "vectors"])
def test_the_actor_never_reads_a_critic_only_key(share, layout):
    """Changing only the critic's own keys (`cube`, `top`) changes the values and leaves the action distribution
    exactly as it was; the actor's own forward computes the same outputs from the actor's keys alone."""
    torch.manual_seed(0)
    actor = [k for k in ACTOR if k in {p.key for p in layout.parts}]
    net = build_model((layout.nbytes,), CONTINUOUS, model_config(actor_keys=actor, share_encoder=share), 5.0, layout)
    assert isinstance(net, AsymmetricActorCritic if layout.images else DictVectors)
    net.obs_mean.copy_(torch.linspace(-1, 1, layout.vector_size))
    obs = rows(5, 1, layout)
    other = {**obs, **{k: v for k, v in rows(5, 2, layout).items() if k not in actor}}
    params, values = net(torch.from_numpy(layout.pack(obs)))
    params_other, values_other = net(torch.from_numpy(layout.pack(other)))
    assert torch.equal(params, params_other)
    assert not torch.allclose(values, values_other), "the critic reads its own keys"
    images, vector = layout.unpack(torch.from_numpy(layout.pack(obs)))
    torch.testing.assert_close(net.forward_actor(images, vector), params)
    (params.sum() + values.sum()).backward()
    if layout.images:
        assert net.cnns[0][0].conv.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("share", [True, False], ids=["shared-cnn", "own-cnns"])
def test_a_critic_of_state_alone_leaves_the_actors_frame_to_the_actor(share):
    """A critic without the actor's frame: the frame has the actor's own CNN, which the value neither reads nor
    trains, and the actor still never reads the critic's own key."""
    torch.manual_seed(0)
    net = build_model((LAYOUT.nbytes,), CONTINUOUS, model_config(actor_keys=ACTOR, critic_keys=["joints", "cube"],
                                                                 share_encoder=share), 5.0, LAYOUT)
    assert len(net.cnns) == 0 and len(net.actor_cnns) == 1
    obs = rows(5, 1)
    params, values = net(torch.from_numpy(LAYOUT.pack(obs)))
    moved, _ = net(torch.from_numpy(LAYOUT.pack({**obs, "cube": obs["cube"] + 1})))
    assert torch.equal(moved, params)
    other_params, other_values = net(torch.from_numpy(LAYOUT.pack({**obs, "wrist": 255 - obs["wrist"]})))
    assert torch.equal(other_values, values) and not torch.equal(other_params, params)
    values.sum().backward()
    assert net.actor_cnns[0][0].conv.weight.grad is None


def test_one_key_list_for_both_heads_is_the_multi_input_network_over_those_keys():
    net = build_model((LAYOUT.nbytes,), CONTINUOUS, model_config(actor_keys=ACTOR, critic_keys=ACTOR), None, LAYOUT)
    assert isinstance(net, MultiInputActorCritic) and len(net.cnns) == 1
    obs = rows(3, 1)
    changed = {**obs, "cube": obs["cube"] + 1, "top": 255 - obs["top"]}
    assert all(torch.equal(a, b) for a, b in zip(net(torch.from_numpy(LAYOUT.pack(obs))),
                                                 net(torch.from_numpy(LAYOUT.pack(changed))), strict=True))


@pytest.mark.parametrize("changes, words", [
    ({"actor_keys": ["wrist", "gripper"]}, "model.actor_keys: gripper is not a key"),
    ({"critic_keys": ["joints", "lid"]}, "model.critic_keys: lid is not a key"),
])
def test_key_lists_that_cannot_work_are_refused(changes, words):
    with pytest.raises(ConfigError, match=words):
        build_model((LAYOUT.nbytes,), CONTINUOUS, model_config(**changes), None, LAYOUT)


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_a_policy_acts_and_exports_without_the_critics_own_keys(tmp_path, fmt):
    """`predict` and the exported file take the actor's keys alone (the file has no `value`: the critic reads
    more); a missing actor key is named."""
    from parallel_ppo.runs.export import export_policy, run_exported

    cfg = Config()
    cfg.env.id, cfg.model.actor_keys = "toy_envs:CameraReach-v0", ["camera", "state"]
    cfg.model.impala_depths, cfg.model.hidden_size = [4], 16
    cfg.training.precision, cfg.training.normalize_obs = "fp32", True
    spaces = env_spaces(cfg.env)
    torch.manual_seed(0)
    policy = Policy(cfg, network(cfg, spaces), tmp_path / "checkpoint.pt", {}, spaces=spaces)
    policy.model.obs_mean.copy_(torch.tensor([0.5, 3.0]))
    rng = np.random.default_rng(3)
    obs = {"camera": rng.integers(0, 256, (5, 8, 8, 3), dtype=np.uint8),
           "state": rng.normal(size=(5, 1)).astype(np.float32)}
    actions = policy.predict(obs, deterministic=True)
    assert np.array_equal(actions, policy.predict({**obs, "steps": np.full(5, 7.0, np.float32)}, deterministic=True))
    assert policy.predict({k: v[0] for k, v in obs.items()}, deterministic=True) == actions[0]
    with pytest.raises(ConfigError, match=r"lacks the key\(s\) state"):
        policy.predict({"camera": obs["camera"]})
    done = export_policy(policy, fmt, tmp_path / f"policy.{fmt}")
    specs = done.metadata["inputs"]
    assert [spec["name"] for spec in specs] == ["state", "camera"] and done.metadata["outputs"] == ["action", "logits"]
    outputs = run_exported(done.path.read_bytes(), fmt, (obs["state"], obs["camera"]), specs)
    assert len(outputs) == 2 and np.array_equal(outputs[0], actions)


@pytest.mark.parametrize("host", [True, False], ids=["numpy", "padded"])
def test_a_shifted_frame_is_the_padded_frame_cropped_at_the_shift(host):
    """Against numpy's edge padding and a crop: each frame its own shift (some past the frame's edge), channels
    moved together, uint8 kept; through numpy (frames in host memory) and through the padding any device takes."""
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (8, 7, 5, 3), dtype=np.uint8)
    shifts = np.array([[0, 0], [2, -2], [-2, 1], [1, 2], [-1, -1], [2, 2], [9, -6], [-7, 5]], dtype=np.int8)
    shift = shift_frames if host else lambda f, s: _crop_padded(f, s, torch.empty_like(f))
    out = shift(torch.from_numpy(frames), torch.from_numpy(shifts))
    assert out.dtype == torch.uint8 and out.shape == frames.shape
    for frame, (dy, dx), moved in zip(frames, shifts, out.numpy(), strict=True):
        padded = np.pad(frame, ((9, 9), (9, 9), (0, 0)), mode="edge")
        assert np.array_equal(moved, padded[9 + dy:9 + dy + 7, 9 + dx:9 + dx + 5])


def test_the_shift_moves_only_the_chosen_image_keys_by_their_draws():
    layout = DictLayout.of({"wrist": ((6, 6, 3), True), "joints": ((3,), False), "top": ((3, 3, 1), True)})
    assert layout.nbytes > sum(p.nbytes for p in layout.parts), "a row ends in padding bytes"
    obs = torch.from_numpy(layout.pack(rows(64, 3, layout)))
    obs[:, -1] = 7  # the padding, kept as it was
    shift = RandomShift(2, layout, ["wrist"])
    draws = shift.draw(8, 8, 3, torch.Generator().manual_seed(5))
    assert draws.shape == (8, 8, 3, 1, 2) and draws.abs().max() == 2
    assert torch.equal(draws, shift.draw(8, 8, 3, torch.Generator().manual_seed(5))), "seeded: the same shifts"
    first = shift(obs, draws.flatten(0, 1)[:, 0])
    assert torch.equal(first, shift(obs, draws.flatten(0, 1)[:, 0])) and not torch.equal(
        first, shift(obs, draws.flatten(0, 1)[:, 1])), "each epoch its own draws"
    before, after = layout.unpack(obs), layout.unpack(first)
    assert torch.equal(after[0]["wrist"], shift_frames(before[0]["wrist"], draws.flatten(0, 1)[:, 0, 0]))
    assert torch.equal(before[1], after[1]) and torch.equal(before[0]["top"], after[0]["top"])
    assert torch.equal(first[:, -1], obs[:, -1])
    snapshot = obs.clone()
    shift(obs, draws.flatten(0, 1)[:, 0])
    assert torch.equal(obs, snapshot), "the rollout's rows are left alone"


def test_the_update_learns_from_shifted_frames(monkeypatch, tmp_path):
    """A run with `augment_shift` hands every minibatch of every epoch to the shift, and learns something else
    than the same run without it, and than one that weighs the shifted frames in a regularizer instead."""
    import parallel_ppo as ppo

    calls = []
    original = RandomShift.__call__
    monkeypatch.setattr(RandomShift, "__call__", lambda self, obs, draws: calls.append(len(obs)) or original(
        self, obs, draws))
    overrides = {"env.id": "toy_envs:CameraReach-v0", "env.num_envs": 4, "training.n_steps": 16,
                 "training.batch_size": 32, "training.n_epochs": 2, "run.total_steps": 64, "run.limit_seconds": 0,
                 "training.precision": "fp32", "training.microbatch_size": 0, "model.impala_depths": [4],
                 "model.hidden_size": 16, "logging.tensorboard": False, "model.kind": "auto"}
    params = {}
    for shift, regularizer in ((0, 0.0), (2, 0.0), (2, 0.1)):  # off, in the loss, in a regularizer beside it
        run = ppo.train(str(Path(__file__).parents[1] / "config" / "cartpole.yaml"),
                        output_dir=tmp_path / f"{shift}-{regularizer}", verbose=False,
                        overrides={**overrides, "training.augment_shift": shift,
                                   "training.augment_regularizer": regularizer})
        params[shift, regularizer] = torch.load(run.path / "checkpoint.pt", weights_only=True)["model"]
    assert calls == [32] * 2 * 2 * 2, "2 minibatches × 2 epochs of the one update, in each run with the setting"
    for a, b in ((0, 0.0), (2, 0.0)), ((0, 0.0), (2, 0.1)), ((2, 0.0), (2, 0.1)):
        assert any(not torch.equal(params[a][k], params[b][k]) for k in params[a]), (a, b)


@pytest.mark.parametrize("continuous", [True, False], ids=["gaussian", "categorical"])
def test_the_kl_of_two_outputs_is_torchs(continuous):
    g = torch.Generator().manual_seed(0)
    p, q = torch.randn(64, 6, generator=g), torch.randn(64, 6, generator=g)
    if continuous:
        def dist(x: torch.Tensor) -> torch.distributions.Distribution:
            return torch.distributions.Independent(torch.distributions.Normal(x[:, :3], x[:, 3:].exp()), 1)
    else:
        def dist(x: torch.Tensor) -> torch.distributions.Distribution:
            return torch.distributions.Categorical(logits=x)
    expected = torch.distributions.kl_divergence(dist(p), dist(q))
    torch.testing.assert_close(kl_divergence(p, q, continuous), expected, rtol=1e-5, atol=1e-6)
    assert kl_divergence(p, p, continuous).abs().max() < 1e-6


def test_the_regularizer_keeps_the_loss_on_the_frames_as_collected_and_adds_dracs_penalty():
    """With `augment_regularizer`, the PPO loss reads the frames as collected (its ratio starts at 1, its statistics
    are those of the loss alone, the penalty's its own) and adds the weight times KL(π(s) ‖ π(shift(s))) +
    ½(V(shift(s)) − V(s))², whose gradient flows through the shifted frames' pass only (π(s) and V(s) held
    fixed); frames the shift left as they were add nothing."""
    torch.manual_seed(0)
    model = build_model((LAYOUT.nbytes,), CONTINUOUS, model_config(actor_keys=ACTOR), 5.0, LAYOUT)
    obs = torch.from_numpy(LAYOUT.pack(rows(8, 0)))
    shift = RandomShift(2, LAYOUT, [])
    shifted = shift(obs, shift.draw(8, 1, 1, torch.Generator().manual_seed(1))[:, 0, 0])
    with torch.no_grad():
        params, values = model(obs)
    actions = params[:, :2] + 0.1
    batch = TrainBatch(obs, actions, gaussian_log_prob(params, actions)[0], values, torch.randn(8), values + 1)
    cfg = dataclasses.replace(TrainingConfig(), augment_shift=2, augment_regularizer=0.25, precision="fp32")
    weights = list(model.parameters())
    plain, plain_stats = ppo_loss(model, batch, cfg)
    plain_grads = torch.autograd.grad(plain, weights, allow_unused=True)
    regularized, stats = ppo_loss(model, dataclasses.replace(batch, shifted=shifted), cfg)
    grads = torch.autograd.grad(regularized, weights, allow_unused=True)
    assert float(stats["losses/ratio_mean"]) == pytest.approx(1.0) and float(stats["losses/approx_kl"]) == 0
    moved_params, moved_values = model(shifted)  # the penalty by hand, with π(s) and V(s) as constants
    penalty = (kl_divergence(params, moved_params, True) + 0.5 * (moved_values - values) ** 2).mean()
    assert float(stats.pop("losses/augment_penalty")) == pytest.approx(float(penalty.detach()))
    assert {k: float(v) for k, v in stats.items()} == {k: float(v) for k, v in plain_stats.items()}
    penalty_grads = torch.autograd.grad(0.25 * penalty, weights, allow_unused=True)

    def flat(gradients: tuple[torch.Tensor | None, ...]) -> torch.Tensor:
        return torch.cat([(torch.zeros_like(w) if g is None else g).reshape(-1) for g, w in zip(gradients, weights,
                                                                                                  strict=True)])
    assert float(penalty.detach()) > 0
    torch.testing.assert_close(regularized.detach(), plain.detach() + 0.25 * penalty.detach())
    torch.testing.assert_close(flat(grads), flat(plain_grads) + flat(penalty_grads), rtol=1e-4, atol=1e-6)
    unmoved, _ = ppo_loss(model, dataclasses.replace(batch, shifted=obs), cfg)
    torch.testing.assert_close(unmoved, plain)


def test_an_anchored_ratio_starts_at_1_on_the_shifted_frames_and_weighs_each_sample():
    """With `augment_anchor`, the ratio on shifted frames is taken against the policy the update started from on
    the same frames: the first minibatch's KL and clip fraction are 0 (without it, the shift alone moves them), and
    the surrogate weighs each sample by that policy's probability over the one it was collected with."""
    torch.manual_seed(0)
    model = build_model((LAYOUT.nbytes,), CONTINUOUS, model_config(actor_keys=ACTOR), 5.0, LAYOUT)
    obs = torch.from_numpy(LAYOUT.pack(rows(8, 0)))
    shift = RandomShift(2, LAYOUT, [])
    draws = shift.draw(8, 1, 1, torch.Generator().manual_seed(1)).flatten(0, 1)
    with torch.no_grad():
        for tensor in model.parameters():  # a network that reads its frames closely, as a trained one does
            tensor.mul_(4.0)
        params, values = model(obs)
    actions = params[:, :2] + 0.3
    data = TrainBatch(obs, actions, gaussian_log_prob(params, actions)[0], values, torch.randn(8), values + 1)
    stats = {}
    for anchor in (False, True):  # one epoch of one minibatch: the update's statistics are its first step's
        cfg = dataclasses.replace(TrainingConfig(), augment_shift=2, augment_anchor=anchor, precision="fp32",
                                  batch_size=8, n_epochs=1, microbatch_size=0)
        copy = build_model((LAYOUT.nbytes,), CONTINUOUS, model_config(actor_keys=ACTOR), 5.0, LAYOUT)
        copy.load_state_dict(model.state_dict())
        optimizer = torch.optim.Adam(copy.parameters(), lr=1e-3)
        stats[anchor] = ppo_update(copy, optimizer, data, cfg, torch.Generator().manual_seed(0), augment=shift,
                                   draws=draws)
    assert stats[False]["losses/approx_kl"] > 1e-4, "the shift alone moves the collected policy's ratio"
    assert stats[True]["losses/approx_kl"] == 0 and stats[True]["losses/clipfrac"] == 0
    assert stats[True]["losses/ratio_mean"] == pytest.approx(1.0)
    cfg = dataclasses.replace(cfg, batch_size=4, n_epochs=3)  # later steps: the anchor is the policy as it started
    moving = build_model((LAYOUT.nbytes,), CONTINUOUS, model_config(actor_keys=ACTOR), 5.0, LAYOUT)
    moving.load_state_dict(model.state_dict())
    later = ppo_update(moving, torch.optim.Adam(moving.parameters(), lr=1e-2), data, cfg,
                       torch.Generator().manual_seed(0), augment=shift,
                       draws=shift.draw(8, 1, 3, torch.Generator().manual_seed(1)).flatten(0, 1))
    assert later["losses/approx_kl"] > 1e-6, "steps after the first move away from the anchor"
    shifted = shift(obs, draws[:, 0])
    with torch.no_grad():
        proximal = gaussian_log_prob(model(shifted)[0], actions)[0]
    cfg = dataclasses.replace(TrainingConfig(), norm_adv=False, precision="fp32", ent_coef=0.0, clip_vloss=False,
                              vf_coef=0.5)
    batch = dataclasses.replace(data, obs=shifted, proximal=proximal)
    loss, batch_stats = ppo_loss(model, batch, cfg)
    weight = (proximal - data.logprobs).exp()
    assert not torch.allclose(weight, torch.ones(8)), "the shift moves the policy: the weights differ from 1"
    value_loss = 0.5 * ((model(shifted)[1] - data.returns) ** 2).mean()
    torch.testing.assert_close(loss, -(weight * data.advantages).mean() + 0.5 * value_loss)
    assert float(batch_stats["losses/policy_loss"]) == pytest.approx(float(-(weight * data.advantages).mean()))


@pytest.mark.parametrize("share", [True, False], ids=["shared-cnn", "own-cnns"])
def test_the_actor_learns_to_predict_the_critics_own_keys(share):
    """`training.predict_privileged`: a layer over the actor's features predicts the critic-only vector keys as the
    critic reads them (normalized); its error joins the loss, weighted, and trains the actor's CNN, not the critic's
    head; the policy and the values are the network's without it."""
    torch.manual_seed(0)
    config = model_config(actor_keys=ACTOR, share_encoder=share)
    net = build_model((LAYOUT.nbytes,), CONTINUOUS, config, 5.0, LAYOUT, predict_privileged=True)
    plain = build_model((LAYOUT.nbytes,), CONTINUOUS, config, 5.0, LAYOUT)
    net.obs_mean.copy_(torch.linspace(-1, 1, LAYOUT.vector_size))
    net.obs_std.copy_(torch.linspace(0.5, 2, LAYOUT.vector_size))
    plain.load_state_dict({k: v for k, v in net.state_dict().items() if not k.startswith("predictor.")})
    obs = torch.from_numpy(LAYOUT.pack(rows(6, 1)))
    with torch.no_grad():
        net.predictor.weight.zero_()
        net.predictor.bias.copy_(torch.tensor([0.5, -2.0]))
    params, values, error = net.forward_privileged(obs)
    for mine, theirs in zip((params, values), plain(obs), strict=True):
        torch.testing.assert_close(mine, theirs)
    cube = LAYOUT.unpack(obs)[1][:, :2]  # the vector keys in name order: cube (2), then joints (3)
    normalized = ((cube - net.obs_mean[:2]) / net.obs_std[:2]).clamp(-5, 5)
    torch.testing.assert_close(error, ((torch.tensor([0.5, -2.0]) - normalized) ** 2).mean(dim=1))
    data = TrainBatch(obs, params.detach()[:, :2], torch.zeros(6), values.detach(), torch.randn(6), values.detach())
    cfg = dataclasses.replace(TrainingConfig(), precision="fp32", microbatch_size=0)
    without, _ = ppo_loss(plain, data, cfg)
    loss, stats = ppo_loss(net, data, dataclasses.replace(cfg, predict_privileged=0.25))
    torch.testing.assert_close(loss, without + 0.25 * error.mean())
    assert float(stats["losses/privileged_prediction"]) == pytest.approx(float(error.detach().mean()))
    torch.nn.init.normal_(net.predictor.weight)
    net.zero_grad()
    net.forward_privileged(obs)[2].mean().backward()
    actor_cnn = net.cnns[net.critic_images.index("wrist")] if share else net.actor_cnns[0]
    assert actor_cnn[0].conv.weight.grad.abs().sum() > 0, "the prediction trains the actor's encoder"
    assert net.critic_dense.weight.grad is None and net.critic.weight.grad is None


CARTPOLE = ["--env", "CartPole-v1", "--total-steps", "1"]
CAMERA = ["--env", "toy_envs:CameraReach-v0", "--total-steps", "1"]


@pytest.mark.parametrize("argv, words", [
    ([*CAMERA, "--set", "model.actor_keys=[camera,gripper]"], "model.actor_keys: gripper is not a key"),
    ([*CARTPOLE, "--set", "model.critic_keys=[x]"], "name keys of a dict observation"),
    ([*CAMERA, "--set", "training.augment_shift=4", "--set", "training.augment_keys=[state]"],
     "state is not one (image keys: camera)"),
    ([*CARTPOLE, "--set", "training.augment_shift=4"], "moves image observations"),
    ([*CAMERA, "--set", "training.augment_regularizer=0.1"], "augment_regularizer weighs the shifted frames"),
    ([*CAMERA, "--set", "training.augment_anchor=true"], "augment_anchor anchors the ratio on the shifted frames"),
    ([*CAMERA, "--set", "training.augment_shift=2", "--set", "training.augment_anchor=true", "--set",
      "training.augment_regularizer=0.1"], "set one of them"),
    ([*CAMERA, "--set", "training.predict_privileged=1"], "names no vector key that model.actor_keys leaves out"),
    ([*CARTPOLE, "--set", "training.predict_privileged=1"], "this env's observation is one array"),
])
def test_settings_that_cannot_work_are_refused_in_one_line(argv, words, tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # toy_envs
    status = train_cli([*argv, "--output-dir", str(tmp_path / "run")], parallel=False, prog="train_timed.py")
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and words in err, err
    assert not (tmp_path / "run").exists()


def test_the_spatial_softmax_gives_where_each_keypoint_is():
    """One hot spot per map: its keypoint is that spot's position in [0, 1]; the spatial CNN reads a dict's images."""
    from parallel_ppo.core.networks import SpatialSoftmax

    maps = torch.full((1, 2, 5, 9), -1e4)
    maps[0, 0, 4, 0] = maps[0, 1, 1, 6] = 0.0
    assert SpatialSoftmax()(maps)[0].tolist() == pytest.approx([0.0, 0.75, 1.0, 0.25])  # x of each, then y
    layout = DictLayout.of({"wrist": ((20, 20, 3), True), "joints": ((3,), False)})
    net = build_model((layout.nbytes,), CONTINUOUS, model_config(kind="spatial", keypoints=4), None, layout)
    params, values = net(torch.from_numpy(layout.pack(rows(2, 0, layout))))
    assert params.shape == (2, 4) and values.shape == (2,) and net.dense.in_features == 8 + 8
