"""What the robot sees: the policy's image observations as frames (the newest of a stack, a dict's image keys),
beside the env's render in `demo` and `eval` videos (`--views`) and in the video of each evaluation during training
(`eval.video`, to TensorBoard); an env with no image to show is one line and exit status 2. In-process and fast:
toy envs, checkpoints made without training."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from parallel_ppo.core.checkpoint import save_checkpoint
from parallel_ppo.core.config import EnvConfig
from parallel_ppo.core.configure import build_config
from parallel_ppo.core.evaluate import play_episodes
from parallel_ppo.core.train_state import TrainState
from parallel_ppo.envs.batch import env_spaces, make_batch_env
from parallel_ppo.envs.spaces import ActionSpace, EnvSpaces
from parallel_ppo.envs.views import MIN_HEIGHT, Views, image_views, side_by_side
from parallel_ppo.errors import ConfigError
from parallel_ppo.runs.directory import new_run_dir

CAMERA = "toy_envs:CameraReach-v0"
RENDERED = "toy_envs:RenderedCameraReach-v0"
TINY = ["training.precision=fp32", "model.kind=auto", "model.impala_depths=[4]", "model.hidden_size=16",
        "model.mlp_hidden=[8]", "env.num_envs=2", "training.n_steps=8", "training.batch_size=8"]


def test_the_newest_frame_of_a_stack_is_shown_in_colour():
    """Atari's stack of 4 grayscale frames (84, 84, 4): the last channel, repeated in R, G and B; MuJoCo's stack of
    3 RGB frames from pixels (.., 9): the last three channels."""
    atari = EnvConfig(id="ALE/Breakout-v5")
    frames = np.stack([np.full((84, 84), k, dtype=np.uint8) for k in (10, 20, 30, 40)], axis=-1)
    (view,) = image_views(EnvSpaces((84, 84, 4), np.dtype(np.uint8), ActionSpace(4)), atari)
    shown = view.frame(frames)
    assert shown.shape == (84, 84, 3) and shown.dtype == np.uint8 and (shown == 40).all()
    pixels = EnvConfig(id="HalfCheetah-v5", pixels=True)
    stack = np.random.default_rng(0).integers(0, 256, (64, 64, 9), dtype=np.uint8)
    (view,) = image_views(EnvSpaces((64, 64, 9), np.dtype(np.uint8), ActionSpace(6, (-1.0,) * 6, (1.0,) * 6)), pixels)
    assert np.array_equal(view.frame(stack), stack[..., 6:])
    assert image_views(EnvSpaces((4,), np.dtype(np.float32), ActionSpace(2)), EnvConfig(id="CartPole-v1")) == ()


def test_a_dict_observations_image_key_is_shown_as_the_policy_receives_it():
    """CameraReach's camera (red: 128 + 40 × the offset the state key holds), stacked 2 deep and packed in a row:
    the view is its newest frame, so its red matches the state of the same observation."""
    cfg = EnvConfig(id=CAMERA, frame_stack=2)
    env = make_batch_env(cfg, 0, 0, 2, 1)
    try:
        env.reset()
        for action in (3, 3, 0):
            obs, *_ = env.step(np.array([action, action]))
        (view,) = image_views(env.spaces, cfg)
        assert view.name == "camera" and view.shape == (8, 8, 6) and view.channels == 3
        _, vector = env.spaces.layout.unpack(torch.from_numpy(obs))
        shown = view.frame(obs[1])
        assert shown.shape == (8, 8, 3)
        assert shown[0, 0, 0] == np.uint8(np.clip(128 + 40 * float(vector[1, 0]), 0, 255))
    finally:
        env.close()


def test_views_are_chosen_by_name_and_refused_clearly():
    spaces = env_spaces(EnvConfig(id=CAMERA))
    env = EnvConfig(id=CAMERA)
    assert Views.chosen(["env", "agent"], spaces, env, "--views").names == ["env", "camera"]
    assert Views.chosen(["camera", "agent", "env"], spaces, env, "--views").names == ["camera", "env"]  # each once
    assert not Views.chosen(["agent"], spaces, env, "--views").renders
    with pytest.raises(ConfigError, match=r"--views: no view 'wrist' \(the views of .*: env, agent, camera\)"):
        Views.chosen(["wrist"], spaces, env, "--views")
    critic_only = Views.chosen(["camera"], spaces, env, "--views", actor_keys=["state"])  # the critic's camera
    assert critic_only.names == ["camera"]  # named, it is shown; the policy's images (`agent`) are none
    with pytest.raises(ConfigError, match=r"reads none of .*'s images \(model.actor_keys: state\); show the view env"):
        Views.chosen(["agent"], spaces, env, "--views", actor_keys=["state"])
    cartpole = EnvConfig(id="CartPole-v1")
    with pytest.raises(ConfigError) as err:
        Views.chosen(["env", "agent"], env_spaces(cartpole), cartpole, "eval.video")
    assert str(err.value) == ("eval.video: the view agent shows the images the policy observes, and CartPole-v1 "
                              "gives it none (it observes float32 values of shape (4,)); show the view env")


def test_views_side_by_side_take_the_renders_height_or_a_whole_multiple():
    small = np.arange(8 * 8 * 3, dtype=np.uint8).reshape(8, 8, 3)
    wide = side_by_side([np.zeros((48, 64, 3), np.uint8), small], 48)
    assert wide.shape == (48, 112, 3)
    assert np.array_equal(wide[::6, 64::6], small)  # nearest neighbour: each pixel a 6 × 6 block
    cfg = EnvConfig(id=RENDERED)
    env = make_batch_env(cfg, 0, 0, 1, 1, render=True)
    try:
        obs = env.reset()
        both = Views.chosen(["agent", "env"], env.spaces, cfg, "--views").frame(env, obs[0])
        assert both.shape == (48, 48 + 64, 3) and (both[:, 48:, 2] >= 200).all()  # the render on the right
        alone = Views.chosen(["agent"], env.spaces, cfg, "--views").frame(env, obs[0])
        assert alone.shape == (MIN_HEIGHT, MIN_HEIGHT, 3)  # 8 × 32
    finally:
        env.close()


def test_an_evaluation_records_the_chosen_views_until_the_sink_has_enough():
    """Only the policy's view: no render needed (the env has none); the sink's True stops the frames, not the
    episodes."""
    from parallel_ppo.runs.video import captioned

    cfg = build_config(None, {"env.id": CAMERA}, TINY, False)
    spaces = env_spaces(cfg.env)
    model = TrainState.new(cfg, spaces).model
    frames: list = []
    views = Views.chosen(["agent"], spaces, cfg.env, "--views")
    result = play_episodes(model, cfg, "train", 2, 1, False, 0, frames=captioned(frames, 25), views=views)
    assert len(result.returns) == 2 and len(frames) == 25  # of 40 steps
    assert frames[0].shape == (MIN_HEIGHT, MIN_HEIGHT, 3)


def make_run(path: Path, env_id: str, sets: tuple[str, ...] = ()) -> Path:
    """A run directory with a checkpoint of an untrained policy (no training: fast)."""
    cfg = build_config(None, {"env.id": env_id, "run.output_dir": str(path)}, [*TINY, *sets], False)
    with new_run_dir(path, cfg, overwrite=False):  # config.yaml, as a run starts
        pass
    with torch.random.fork_rng(devices=[]):
        state = TrainState.new(cfg, env_spaces(cfg.env))
    save_checkpoint(path / "checkpoint.pt", state.to_checkpoint(cfg, "sequential", 1.0))
    return path


def test_demo_shows_the_policys_camera_beside_the_render(tmp_path, capsys):
    import imageio.v3 as iio

    from parallel_ppo.cli.evaluation import demo_main, eval_main

    run = make_run(tmp_path / "run", RENDERED)
    gif = tmp_path / "demo.gif"
    assert demo_main(["--checkpoint", str(run), "--seconds", "1", "--fps", "10", "--views", "env,agent",
                      "--output", str(gif)]) == 0
    assert "(train levels; env | camera)" in capsys.readouterr().out
    frames = iio.imread(gif)
    assert frames.shape == (10, 48, 112, 3)
    mp4 = tmp_path / "eval.mp4"  # 48 × 112 from the render, 256 × 256 alone: H.264's sides are even either way
    assert eval_main(["--checkpoint", str(run), "--episodes", "1", "--views", "camera", "--video", str(mp4)]) == 0
    assert iio.imread(mp4, plugin="pyav").shape == (20, MIN_HEIGHT, MIN_HEIGHT, 3)
    assert demo_main(["--checkpoint", str(run), "--seconds", "1", "--output", str(tmp_path / "default.gif")]) == 0
    assert iio.imread(tmp_path / "default.gif").shape[1:] == (48, 64, 3)  # the default: the render alone, as before


@pytest.mark.filterwarnings("ignore:.*RGB-array rendering should return")  # gymnasium's checker on such a frame
def test_a_gray_or_rgba_render_is_shown_in_rgb():
    """As a user expects of them; before, PyAV failed on the frame with a traceback."""
    from parallel_ppo.core.evaluate import check_render

    rgb = first_render(RENDERED)
    assert np.array_equal(first_render("toy_envs:GrayRenderReach-v0"), np.repeat(rgb[..., 2:], 3, axis=-1))
    assert np.array_equal(first_render("toy_envs:RgbaRenderReach-v0"), rgb)
    cfg = build_config(None, {"env.id": "toy_envs:GrayRenderReach-v0"}, [*TINY, "eval.interval_seconds=60",
                                                                         "eval.video=env"], False)
    check_render(cfg, env_spaces(cfg.env))  # a training run's video takes it too


def first_render(env_id: str) -> np.ndarray:
    env = make_batch_env(EnvConfig(id=env_id), 0, 0, 1, 1, render=True)
    try:
        env.reset()
        return env.frame(0)
    finally:
        env.close()


@pytest.mark.filterwarnings("ignore:.*RGB-array rendering should return")  # gymnasium's checker, before our line
@pytest.mark.parametrize("command, env_id, words", [
    ("demo", "toy_envs:NoneRenderReach-v0", "error: toy_envs:NoneRenderReach-v0's render gave None, not an image a "
                                            "video can show: uint8 of shape (H, W, 3) (RGB), (H, W, 4) (RGBA) or "
                                            "(H, W) (gray)"),
    ("eval", "toy_envs:FloatRenderReach-v0", "render gave float32 values of shape (48, 64, 3), not an image"),
    ("eval", "toy_envs:UnrenderedReach-v0", "error: toy_envs:UnrenderedReach-v0 does not render: its metadata lists "
                                            "no rgb_array render mode (render_modes: []), so it has no view env"),
    ("demo", "toy_envs:Reach-v0", "error: toy_envs:Reach-v0 does not render"),  # nor takes a render_mode
])
def test_a_render_a_video_cannot_show_is_one_line_and_exit_2_before_anything_is_written(tmp_path, capsys, command,
                                                                                        env_id, words):
    """Before, a traceback (None, a float frame in TensorBoard's GIF), or a line that blamed OpenGL."""
    from parallel_ppo.cli.evaluation import demo_main, eval_main

    run = make_run(tmp_path / "run", env_id)
    video = tmp_path / "eval.mp4"
    status = (demo_main(["--checkpoint", str(run), "--seconds", "1"]) if command == "demo" else
              eval_main(["--checkpoint", str(run), "--episodes", "1", "--video", str(video)]))
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and words in err and "OpenGL" not in err, err
    assert not (run / "demo.mp4").exists() and not (run / "eval.json").exists() and not video.exists()


@pytest.mark.parametrize("command, args, words", [
    ("demo", ["--views", "agent"], "--views: the view agent shows the images the policy observes, and CartPole-v1 "
                                   "gives it none"),
    ("demo", ["--views", ","], "argument --views: name one view or more"),
    ("eval", ["--views", "env"], "--views chooses what the video shows; add --video"),
])
def test_asking_for_views_an_env_has_not_is_one_line_and_exit_2(tmp_path, capsys, command, args, words):
    from parallel_ppo.cli.evaluation import demo_main, eval_main

    run = make_run(tmp_path / "run", "CartPole-v1")
    try:
        status = (demo_main if command == "demo" else eval_main)(["--checkpoint", str(run), *args])
    except SystemExit as e:
        status = e.code
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and words in err, err
    assert not (run / "demo.mp4").exists() and not (run / "eval.json").exists()


def test_each_evaluation_during_training_adds_its_video_to_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from parallel_ppo.runs.training import EvalHook
    from parallel_ppo.runs.video import EVAL_VIDEO_TAG

    cfg = build_config(None, {"env.id": CAMERA}, [*TINY, "eval.interval_seconds=60", "eval.video=agent",
                                                  "eval.video_frames=12", "eval.episodes=2", "eval.num_envs=2"], False)
    spaces = env_spaces(cfg.env)
    (tmp_path / "logs").mkdir()
    state = TrainState.new(cfg, spaces)
    state.update, state.env_steps = 3, 48
    hook = EvalHook(cfg, tmp_path, spaces)
    assert len(hook.run(state).returns) == 2
    assert not list((tmp_path / "logs").glob("events.*")), "beside the run's scalars: a directory of their own"
    acc = EventAccumulator(str(tmp_path / "logs" / "eval_video"), size_guidance={"images": 0})
    acc.Reload()
    (image,) = acc.Images(EVAL_VIDEO_TAG)
    assert image.step == 48 and (image.height, image.width) == (MIN_HEIGHT, MIN_HEIGHT)
    assert image.encoded_image_string.startswith(b"GIF89a")
    (stale,) = (tmp_path / "logs" / "eval_video").glob("events.*")  # named as an earlier session names it
    stamp = stale.name.split(".")[3]
    stale.rename(stale.with_name(stale.name.replace(f".{stamp}.", f".{int(stamp) - 60}.")))
    state.env_steps = 40  # resumed from a checkpoint at 32 steps: the video logged after it (at 48) goes
    EvalHook(cfg, tmp_path, spaces, resume_after=(2, 32)).run(state)
    acc = EventAccumulator(str(tmp_path / "logs" / "eval_video"), size_guidance={"images": 0})
    acc.Reload()
    assert [image.step for image in acc.Images(EVAL_VIDEO_TAG)] == [40]
    quiet = build_config(None, {"env.id": CAMERA}, [*TINY, "eval.interval_seconds=60"], False)
    assert EvalHook(quiet, tmp_path, spaces).views is None  # the default: no video, no rendering


@pytest.mark.filterwarnings("ignore:.*RGB-array rendering should return")  # the render patched to give None
def test_a_training_run_refuses_eval_video_it_cannot_record_before_anything_is_written(tmp_path, monkeypatch, capsys):
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv
    from gymnasium.error import DependencyNotInstalled

    import parallel_ppo as ppo

    overrides = {"env.id": "CartPole-v1", "eval.interval_seconds": 60, "eval.video": "env,agent"}
    with pytest.raises(ConfigError, match="eval.video: the view agent shows the images"):
        ppo.train(None, output_dir=tmp_path / "run", overrides=overrides, verbose=False)
    assert not (tmp_path / "run").exists()
    monkeypatch.setattr(CartPoleEnv, "render", lambda self: (_ for _ in ()).throw(DependencyNotInstalled("no pygame")))
    with pytest.raises(ConfigError, match="^cannot render CartPole-v1: no pygame$"):
        ppo.train(None, output_dir=tmp_path / "run", overrides={**overrides, "eval.video": "env"}, verbose=False)
    assert not (tmp_path / "run").exists(), "a renderer missing stops the run before its first evaluation"
    from parallel_ppo.cli import main

    argv = ["train", "--env", "CartPole-v1", "--set", "eval.interval_seconds=60", "--set", "eval.video=env"]
    assert main([*argv, "--print-config"]) == 2  # checked as a run checks it
    assert "cannot render CartPole-v1: no pygame" in capsys.readouterr().err
    monkeypatch.setattr(CartPoleEnv, "render", lambda self: None)
    with pytest.raises(ConfigError, match=r"^CartPole-v1's render gave None, not an image a video can show: uint8 of "
                                          r"shape \(H, W, 3\)"):
        ppo.train(None, output_dir=tmp_path / "run", overrides={**overrides, "eval.video": "env"}, verbose=False)
    monkeypatch.setattr(CartPoleEnv, "render", lambda self: (_ for _ in ()).throw(RuntimeError("no screen")))
    with pytest.raises(ConfigError, match="^cannot render CartPole-v1: RuntimeError: no screen$"):  # no OpenGL: pygame
        ppo.train(None, output_dir=tmp_path / "run", overrides={**overrides, "eval.video": "env"}, verbose=False)
    with pytest.raises(ConfigError, match="^sim/Sleep has no render to draw"):
        ppo.train(None, output_dir=tmp_path / "run", verbose=False,
                  overrides={"env.id": "sim/Sleep", "eval.interval_seconds": 60, "eval.video": "env"})
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match="eval.video records each evaluation's video in TensorBoard"):
        build_config(None, {"env.id": CAMERA}, ["eval.interval_seconds=60", "eval.video=agent",
                                                "logging.tensorboard=false"], False)
    build_config(None, {"env.id": CAMERA}, ["eval.video=agent", "logging.tensorboard=false"], False)  # no evaluation
