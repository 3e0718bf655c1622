"""`Dict` observations (an image and vectors, as a robot arm's wrist camera and joint state): packed into uint8 rows
by their layout, unpacked by the multi-input network, acted on by `predict`, and trained in every mode (the
parallel and distributed equality tests run `toy_envs:CameraReach-v0` too)."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import parallel_ppo as ppo
from parallel_ppo.core.config import Config, EnvConfig
from parallel_ppo.core.dict_networks import DictVectors, MultiInputActorCritic
from parallel_ppo.core.model import build_model, network
from parallel_ppo.core.networks import image_features
from parallel_ppo.core.policy import Policy
from parallel_ppo.envs.batch import env_spaces, make_batch_env, reported_success
from parallel_ppo.envs.observations import DictLayout
from parallel_ppo.envs.spaces import ActionSpace
from parallel_ppo.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
CAMERA = "toy_envs:CameraReach-v0"
LAYOUT = DictLayout.of({"wrist": ((4, 4, 3), True), "joints": ((3,), False), "cube": ((2,), False),
                        "top": ((2, 2, 1), True)})


def random_obs(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"wrist": rng.integers(0, 256, (n, 4, 4, 3), dtype=np.uint8), "joints": rng.normal(size=(n, 3)),
            "cube": rng.normal(size=(n, 2)).astype(np.float32), "top": rng.integers(0, 256, (n, 2, 2, 1), np.uint8)}


def test_a_packed_row_unpacks_to_the_same_values_and_floats_start_on_4_bytes():
    obs = random_obs(5)
    rows = LAYOUT.pack(obs)
    assert rows.dtype == np.uint8 and rows.shape == (5, LAYOUT.nbytes) and LAYOUT.nbytes % 4 == 0
    assert [p.key for p in LAYOUT.parts] == ["cube", "joints", "top", "wrist"]  # vectors first, then images
    assert all(p.offset % 4 == 0 for p in LAYOUT.vectors)
    picked = torch.from_numpy(rows)[torch.tensor([4, 1])]  # a minibatch's rows, as the update indexes them
    images, vector = LAYOUT.unpack(picked)
    assert torch.equal(images["wrist"], torch.from_numpy(obs["wrist"][[4, 1]]))
    assert torch.equal(images["top"], torch.from_numpy(obs["top"][[4, 1]]))
    expected = np.concatenate([obs["cube"], obs["joints"]], axis=1)[[4, 1]].astype(np.float32)
    assert torch.equal(vector, torch.from_numpy(expected))
    one = LAYOUT.pack({key: value[2] for key, value in obs.items()}, batched=False)
    assert np.array_equal(one, rows[2])
    with pytest.raises(ValueError, match="lacks the key"):
        LAYOUT.pack({"wrist": obs["wrist"]})
    with pytest.raises(ValueError, match="'joints' has shape"):
        LAYOUT.pack({**obs, "joints": obs["joints"][:, :2]})
    one = LAYOUT.pack({**{key: value[2] for key, value in obs.items()}, "cube": obs["cube"][2].reshape(2, 1)},
                      batched=False)  # a (2,) key given as (2, 1): size-1 dimensions aside, it fits
    assert np.array_equal(one, rows[2])
    grid = DictLayout.of({"grid": ((3, 4), False), "speed": ((), False)})  # a 2-D vector key, a scalar one
    assert grid.parts[0].shape == (12,) and grid.is_one({"grid": np.zeros((3, 4)), "speed": np.float32(1)})
    assert not grid.is_one({"grid": np.zeros((5, 3, 4)), "speed": np.zeros(5)})
    with pytest.raises(ValueError, match="'grid' has shape"):  # the same size, transposed
        grid.pack({"grid": np.zeros((5, 4, 3)), "speed": np.zeros(5)})


def test_a_checkpoint_for_other_observation_keys_is_refused(tmp_path):
    from parallel_ppo.core.checkpoint import check_layout
    from parallel_ppo.errors import RunDataError

    renamed = DictLayout.of({"wrist": ((4, 4, 3), True), "arm": ((3,), False), "cube": ((2,), False),
                             "top": ((2, 2, 1), True)})
    check_layout({"observation_layout": LAYOUT.to_dict()}, tmp_path, LAYOUT)
    check_layout({}, tmp_path, LAYOUT)  # made before layouts were recorded
    with pytest.raises(RunDataError, match="was made for the observation"):
        check_layout({"observation_layout": LAYOUT.to_dict()}, tmp_path, renamed)


def test_the_multi_input_network_is_its_parts_joined_as_written():
    """Each image key through its own CNN, the vector keys (normalized, clipped) through the MLP, the features
    concatenated in layout order into the dense layer, then the heads: computed here by hand from its parts."""
    cfg = Config().model
    cfg.impala_depths, cfg.hidden_size, cfg.mlp_hidden = [2], 6, [5]
    torch.manual_seed(0)
    net = build_model((LAYOUT.nbytes,), ActionSpace(3), cfg, obs_clip=1.5, layout=LAYOUT)
    assert isinstance(net, MultiInputActorCritic) and len(net.cnns) == 2
    net.obs_mean.copy_(torch.tensor([0.5, -0.5, 0.0, 1.0, 2.0]))
    net.obs_std.copy_(torch.tensor([2.0, 1.0, 0.5, 1.0, 4.0]))
    obs = random_obs(3, seed=1)
    rows = torch.from_numpy(LAYOUT.pack(obs))
    with torch.no_grad():
        logits, values = net(rows)
        top = image_features(net.cnns[0], torch.from_numpy(obs["top"]))  # layout.images: top, then wrist
        wrist = image_features(net.cnns[1], torch.from_numpy(obs["wrist"]))
        vector = torch.from_numpy(np.concatenate([obs["cube"], obs["joints"]], axis=1).astype(np.float32))
        vector = ((vector - net.obs_mean) / net.obs_std).clamp(-1.5, 1.5)
        hidden = torch.tanh(net.mlp[0](vector))
        x = torch.relu(net.dense(torch.cat([top, wrist, hidden], dim=1)))
        assert torch.allclose(logits, net.actor(x)) and torch.allclose(values, net.critic(x).squeeze(-1))
    assert top.shape == (3, 2 * 1 * 1) and wrist.shape == (3, 2 * 2 * 2)


def test_model_kind_nature_reads_each_image_key_with_the_nature_cnn():
    """`nature` swaps each image key's CNN for the Nature DQN's convolutions (as SB3's MultiInputPolicy reads
    images); the rest of the network is the same, and frames under 36×36 are refused."""
    layout = DictLayout.of({"wrist": ((44, 40, 3), True), "joints": ((3,), False)})
    cfg = Config().model
    cfg.kind, cfg.hidden_size, cfg.mlp_hidden = "nature", 6, [5]
    net = build_model((layout.nbytes,), ActionSpace(3), cfg, obs_clip=None, layout=layout)
    convs = [m for m in net.cnns[0] if isinstance(m, torch.nn.Conv2d)]
    assert [(c.kernel_size, c.stride, c.out_channels) for c in convs] == [((8, 8), (4, 4), 32), ((4, 4), (2, 2), 64),
                                                                          ((3, 3), (1, 1), 64)]
    frames = torch.zeros(2, 44, 40, 3, dtype=torch.uint8)
    assert image_features(net.cnns[0], frames).shape == (2, 64 * 2 * 1)  # (44 − 36) // 8 + 1 by (40 − 36) // 8 + 1
    assert net.dense.in_features == 64 * 2 * 1 + 5
    with pytest.raises(ConfigError, match="at least 36×36"):
        build_model((LAYOUT.nbytes,), ActionSpace(3), cfg, layout=LAYOUT)
    vectors = DictLayout.of({"joints": ((3,), False)})
    with pytest.raises(ConfigError, match="cannot read this env's dict observation .*: use model.kind auto or mlp$"):
        build_model((vectors.nbytes,), ActionSpace(3), cfg, layout=vectors)


def test_a_dict_of_vectors_is_the_mlp_over_its_keys_side_by_side():
    """Without an image key (Fetch's goals, robosuite's state), `auto` and `mlp` are the MLP's separate towers over
    the vector keys in layout order, normalized and clipped first."""
    layout = DictLayout.of({"joints": ((3,), False), "cube": ((2,), False)})
    cfg = Config().model
    cfg.mlp_hidden = [4]
    obs = {k: v for k, v in random_obs(3, seed=2).items() if k in ("joints", "cube")}
    for kind in ("auto", "mlp"):
        cfg.kind = kind
        torch.manual_seed(0)
        net = build_model((layout.nbytes,), ActionSpace(2, (-1.0, -1.0), (1.0, 1.0)), cfg, obs_clip=1.0,
                          layout=layout)
        assert isinstance(net, DictVectors)
        net.obs_mean.copy_(torch.tensor([0.5, -0.5, 0.0, 1.0, 2.0]))
        with torch.no_grad():
            params, values = net(torch.from_numpy(layout.pack(obs)))
            vector = torch.from_numpy(np.concatenate([obs["cube"], obs["joints"]], axis=1).astype(np.float32))
            by_hand = net.net(((vector - net.obs_mean) / net.obs_std).clamp(-1.0, 1.0))
        assert torch.allclose(params, by_hand[0]) and torch.allclose(values, by_hand[1])


def test_the_env_packs_each_key_and_stacks_the_image_keys():
    cfg = EnvConfig(id=CAMERA, frame_stack=2)
    spaces = env_spaces(cfg)
    assert spaces.layout is not None and spaces.obs_dtype == np.uint8
    assert spaces.layout.to_dict() == {"state": {"shape": [1], "kind": "vector"},
                                       "steps": {"shape": [], "kind": "vector"},
                                       "camera": {"shape": [8, 8, 6], "kind": "image"}}
    env = make_batch_env(cfg, 1, 0, 2, 1)
    try:
        first = env.reset()
        after, *_ = env.step(np.array([0, 3]))
    finally:
        env.close()
    images, vector = spaces.layout.unpack(torch.from_numpy(np.stack([first, after])).reshape(4, -1))
    camera = images["camera"].numpy()
    assert np.array_equal(camera[:2, :, :, :3], camera[:2, :, :, 3:])  # at reset: the first frame twice
    assert np.array_equal(camera[2:, :, :, :3], camera[:2, :, :, 3:])  # then the previous frame, then the new one
    assert vector[:2, 1].tolist() == [0.0, 0.0] and vector[2:, 1].tolist() == [1.0, 1.0]  # the step count


def test_predict_takes_one_dict_observation_or_a_batch(tmp_path):
    cfg = Config()
    cfg.env.id = CAMERA
    cfg.model.impala_depths, cfg.model.hidden_size = [4], 16
    cfg.training.precision = "fp32"
    spaces = env_spaces(cfg.env)
    torch.manual_seed(0)
    policy = Policy(cfg, network(cfg, spaces), tmp_path / "checkpoint.pt", {}, spaces=spaces)
    obs = {"camera": np.zeros((2, 8, 8, 3), np.uint8), "state": np.array([[0.5], [-0.5]], np.float32),
           "steps": np.array([1.0, 2.0], np.float32)}
    batch = policy.predict(obs, deterministic=True)
    assert batch.shape == (2,)
    one = policy.predict({key: value[1] for key, value in obs.items()}, deterministic=True)
    assert np.ndim(one) == 0 and one == batch[1]
    with pytest.raises(ConfigError, match="expects a dict observation"):
        policy.predict(np.zeros(3))
    scalars = policy.predict({"camera": obs["camera"][0], "state": 0.5, "steps": 1.0}, deterministic=True)
    assert np.ndim(scalars) == 0  # one observation, its (1,) key given as a plain number
    with pytest.raises(ConfigError, match="lacks the key"):
        policy.predict({"camera": obs["camera"]})


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_a_dict_policy_exports_with_one_input_per_key(tmp_path, fmt):
    """The exported file takes each key as its own input (a vector key flattened) and gives predict's actions."""
    import io

    cfg = Config()
    cfg.env.id = CAMERA
    cfg.model.impala_depths, cfg.model.hidden_size = [4], 16
    cfg.training.precision, cfg.training.normalize_obs = "fp32", True
    spaces = env_spaces(cfg.env)
    torch.manual_seed(0)
    policy = Policy(cfg, network(cfg, spaces), tmp_path / "checkpoint.pt", {}, spaces=spaces)
    policy.model.obs_mean.copy_(torch.tensor([0.5, 3.0]))  # statistics inside the file too
    from parallel_ppo.runs.export import export_policy

    done = export_policy(policy, fmt, tmp_path / f"policy.{fmt}")
    assert [spec["name"] for spec in done.metadata["inputs"]] == ["state", "steps", "camera"]
    assert done.metadata["obs_shape"] is None  # not one `obs` input: its keys are the inputs
    rng = np.random.default_rng(3)
    obs = {"camera": rng.integers(0, 256, (5, 8, 8, 3), dtype=np.uint8),
           "state": rng.normal(size=(5, 1)).astype(np.float32), "steps": rng.uniform(0, 20, 5).astype(np.float32)}
    inputs = [obs["state"], obs["steps"].reshape(5, 1), obs["camera"]]
    if fmt == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(done.path), providers=["CPUExecutionProvider"])
        action = session.run(None, dict(zip(["state", "steps", "camera"], inputs, strict=True)))[0]
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit is deprecated upstream, still complete
            module = torch.jit.load(io.BytesIO(done.path.read_bytes()))
        action = module(*map(torch.from_numpy, inputs))[0].numpy()
    assert np.array_equal(action, policy.predict(obs, deterministic=True))


def test_each_ended_episode_says_whether_it_succeeded_where_the_env_reports_it():
    env = make_batch_env(EnvConfig(id=CAMERA), 1, 0, 3, 1)
    try:
        env.reset()
        for _ in range(19):
            env.step(np.array([1, 2, 3]))
            assert [reported_success(env, i) for i in range(3)] == [[], [], []]  # no episode ended
        _, _, dones, _ = env.step(np.array([1, 2, 3]))  # the 20th step: the time limit
        assert dones.all() and all(reported_success(env, i) in ([0.0], [1.0]) for i in range(3))
        env._final_info = {"is_success": np.array([2.0, None, 0.0, 1.0], dtype=object),  # as gymnasium gathers them:
                           "_is_success": np.array([1, 1, 1, 0], bool)}  # the values, and which envs had one
        assert [reported_success(env, i) for i in range(3)] == [[1.0], [], [0.0]]  # None: not reported
    finally:
        env.close()
    cartpole = make_batch_env(EnvConfig(id="CartPole-v1"), 1, 0, 2, 1)
    try:
        cartpole.reset()
        while not (dones := cartpole.step(np.array([0, 0]))[2]).any():
            pass
        assert [reported_success(cartpole, i) for i in np.flatnonzero(dones)] == [[]] * dones.sum()  # none reported
    finally:
        cartpole.close()


@pytest.mark.parametrize("sets, words", [
    (["model.kind=mlp"], "cannot read this env's dict observation .*: use model.kind auto or impala or nature or "
                         "spatial$"),
])
def test_networks_that_cannot_read_a_dict_are_refused(sets, words):
    from parallel_ppo.core.configure import build_config

    cfg = build_config(str(ROOT / "config" / "cartpole.yaml"), {"env.id": CAMERA}, sets, parallel=False)
    with pytest.raises(ConfigError, match=words):
        network(cfg, env_spaces(cfg.env))


CAMERA_OBSERVATION = {"obs_shape": [200], "dtype": "uint8", "keys": {
    "state": {"shape": [1], "dtype": "float32"}, "steps": {"shape": [], "dtype": "float32"},
    "camera": {"shape": [8, 8, 3], "dtype": "uint8"}}}
"""summary.json's `observation` for CameraReach: 2 float32s then the 8×8×3 frame packed in 200 bytes, and each key."""


def test_summary_records_a_dict_observations_keys_beside_its_packed_row():
    from parallel_ppo.runs.summary import observation_record

    record = observation_record(env_spaces(EnvConfig(id=CAMERA)))
    assert record == CAMERA_OBSERVATION and list(record["keys"]) == ["state", "steps", "camera"]  # the row's order
    assert observation_record(env_spaces(EnvConfig(id="CartPole-v1"))) == {"obs_shape": [4], "dtype": "float32",
                                                                           "keys": None}


@pytest.mark.slow  # trains
def test_a_dict_env_trains_and_its_policy_loads(tmp_path):
    overrides = {"env.id": CAMERA, "env.num_envs": 4, "training.n_steps": 16, "training.batch_size": 32,
                 "run.total_steps": 2 * 64, "run.limit_seconds": 0, "training.precision": "fp32",
                 "training.microbatch_size": 0, "model.impala_depths": [4], "model.hidden_size": 16,
                 "training.normalize_obs": True, "logging.tensorboard": False, "model.kind": "auto"}
    run = ppo.train(str(ROOT / "config" / "cartpole.yaml"), output_dir=tmp_path / "run", overrides=overrides,
                    verbose=False)
    assert run.summary.updates == 2 and run.summary.episodes >= 4
    rates = run.metrics["success_rate"]  # the env reports info["is_success"] at each episode's end (step 20)
    assert np.isnan(rates[0]) and 0 <= rates[1] <= 1  # none ended in the first 16 steps; 4 in the next
    assert run.summary.final_metrics["success_rate"] == pytest.approx(rates[-1], abs=1e-6)
    assert run.summary.observation == CAMERA_OBSERVATION  # summary.json's layout by key, read back
    policy = ppo.load_policy(run)
    assert policy.layout == env_spaces(EnvConfig(id=CAMERA)).layout
    assert float(policy.model.obs_std[0]) != 1.0  # the vector keys' statistics were learned and saved
    result = ppo.evaluate(run, episodes=4, num_envs=2)
    assert len(result.returns) == 4 and len(result.successes) == 4 and 0 <= result.success_rate <= 1
    twin = shutil.copytree(run.path, tmp_path / "twin")  # one run under two labels is refused: a copy is another
    comparison = ppo.compare({"a": run.path, "b": twin})
    assert [s.success_rate for s in comparison.stats] == [run.summary.final_metrics["success_rate"]] * 2
