"""The env families (`envs.families`): each id's family, its settings and options, what it needs installed, and
the robot families built, stepped and rendered (robosuite's Lift, gymnasium-robotics' Fetch)."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from parallel_ppo.core.config import EnvConfig
from parallel_ppo.core.configure import build_config
from parallel_ppo.envs import families
from parallel_ppo.envs.batch import make_batch_env, reported_success
from parallel_ppo.envs.families import (
    ATARI,
    FAMILIES,
    FAMILY_SETTINGS,
    GENESIS,
    GYMNASIUM,
    MUJOCO,
    PROCGEN,
    ROBOSUITE,
    ROBOTICS,
    check_family,
    family_of,
    options_of,
)
from parallel_ppo.envs.gym_envs import RenderClock
from parallel_ppo.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
LIFT_CAMERA = "robosuite/Lift?cameras=robot0_eye_in_hand&object_state=false&horizon=5"


@pytest.mark.parametrize("env_id, family", [
    ("starpilot", PROCGEN), ("ALE/Breakout-v5", ATARI), ("HalfCheetah-v5", MUJOCO), ("FetchReachDense-v4", ROBOTICS),
    ("robosuite/Lift", ROBOSUITE), ("robosuite/Lift?robot=Sawyer", ROBOSUITE), ("CartPole-v1", GYMNASIUM),
    ("toy_envs:CameraReach-v0", GYMNASIUM),
])
def test_each_id_belongs_to_its_family(env_id, family):
    assert family_of(env_id) is family


@pytest.mark.parametrize("family", FAMILIES, ids=[f.name for f in FAMILIES])
def test_each_family_has_its_config_maker_and_settings(family, genesis_taken_as_installed):
    """Its shipped config exists and names an env of this family, its maker imports, its settings are known (an
    extra outside dev, Genesis's, taken as installed: none of this imports it)."""
    assert set(family.settings) <= set(FAMILY_SETTINGS)
    assert callable(family.maker())
    cfg = build_config(str(ROOT / "config" / family.config), {}, [], parallel=False)
    assert check_family(cfg.env) is family


def test_procgen_is_asked_about_in_one_place():
    """The families decide: no module outside them tests an id against Procgen's games (issue 38, point 2)."""
    package = ROOT / "parallel_ppo"
    found = []
    for path in package.rglob("*.py"):
        if path.name in ("families.py", "procgen_envs.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.id] if isinstance(node, ast.Name) else [node.attr] if isinstance(node, ast.Attribute)
                     else [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else [])
            if "PROCGEN_GAMES" in names:
                found.append(f"{path.relative_to(package)}:{node.lineno}")
    assert found == []


def test_the_parallel_engine_names_no_family():
    """What a family loads once for the workers to share is its own `preload`: the engine asks the family for it and
    names no simulator in its code (comments and docstrings aside)."""
    simulators = ("procgen", "atari", "mujoco", "robosuite", "genesis")
    found = []
    for path in (ROOT / "parallel_ppo" / "engines").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.id] if isinstance(node, ast.Name) else [node.attr] if isinstance(node, ast.Attribute)
                     else [node.module or "", *(a.name for a in node.names)] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            found += [f"{path.name}:{node.lineno} {n}" for n in names if any(s in n.lower() for s in simulators)]
    assert found == []


def test_a_family_preloads_what_it_declares(monkeypatch):
    """`preload(id)` calls the id's family's hook with the id (Procgen's loads the game's assets), and nothing for a
    family that has none."""
    from parallel_ppo.envs.procgen_envs import preload_procgen

    assert PROCGEN.preload is preload_procgen
    assert [f.name for f in FAMILIES if f.preload is not None] == ["procgen"]
    called = []
    monkeypatch.setattr(families, "PROCGEN", dataclasses.replace(PROCGEN, preload=called.append))
    families.preload("starpilot")
    families.preload("CartPole-v1")
    assert called == ["starpilot"]


@pytest.mark.slow  # a Python that imports torch and, for starpilot, Procgen
@pytest.mark.parametrize("env_id", ["starpilot", None])
def test_the_forkserver_loads_what_the_family_preloads(env_id):
    """The module the forkserver imports at its start calls the family's preload for the env the coordinator names
    (Procgen's assets, loaded once for every worker to share); with none named, it loads no env."""
    from parallel_ppo.engines.parallel.worker import PRELOAD_ENV_VAR

    env = {k: v for k, v in os.environ.items() if k != PRELOAD_ENV_VAR} | ({PRELOAD_ENV_VAR: env_id} if env_id else {})
    code = "import sys, parallel_ppo.engines.parallel.preload; print('procgen' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(env_id is not None)


def test_options_come_from_the_config_then_the_query_typed_by_their_defaults():
    cfg = EnvConfig(id="robosuite/Lift?robot=Sawyer&horizon=200",
                    options=["object_state=false", "reward=sparse", "robot=Panda"])
    options = options_of(cfg)
    assert options == {"robot": "Sawyer", "cameras": "", "object_state": False, "reward": "sparse", "horizon": 200,
                       "control_freq": 20}, "the id's query overrides the config's options"


def test_the_options_table_in_the_docs_is_the_declared_one():
    from parallel_ppo.envs.families import options_table

    page = (ROOT / "docs" / "envs.md").read_text()
    for family in (f for f in FAMILIES if f.options):
        marker = f"<!-- options table of {family.name}: generated from envs/families.py -->\n"
        assert marker in page, f"docs/envs.md has no options table for {family.name}"
        assert page.split(marker)[1].split("\n<!-- /")[0] == options_table(family)


@pytest.mark.parametrize("cfg, words", [
    (EnvConfig(id="robosuite/Lift", options=["robot=Panda", "robot=Sawyer"]), "env.options: option 'robot' is given "
                                                                               "twice"),
    (EnvConfig(id="robosuite/Lift?gripper=none"), r"unknown option 'gripper' for a robosuite env \(its options: "),
    (EnvConfig(id="robosuite/Lift?horizon=long"), "horizon='long': expected an integer"),
    (EnvConfig(id="robosuite/Lift?horizon=0"), "horizon=0: must be positive"),
    (EnvConfig(id="robosuite/Lift?object_state=maybe"), "expected true or false"),
    (EnvConfig(id="robosuite/Lift?reward=shaped"), "expected one of dense, sparse"),
    (EnvConfig(id="robosuite/Lift?robot"), "'robot' is not key=value"),
    (EnvConfig(id="CartPole-v1", options=["robot=Panda"]), r"options: none"),
    (EnvConfig(id="CartPole-v1?robot=Panda"), "a gymnasium env takes no options"),
    (EnvConfig(id="starpilot?"), "a procgen env takes no options"),
    (EnvConfig(id="robosuite/Lift?"), "nothing after '\\?'"),
    (EnvConfig(id="robosuite/Lift", episodic_life=True), "applies to atari envs; robosuite/Lift is a robosuite env"),
    (EnvConfig(id="FetchReachDense-v4", pixels=True), "applies to mujoco envs; FetchReachDense-v4 is a "
                                                      "gymnasium-robotics env"),
    (EnvConfig(id="HalfCheetah-v5", num_levels=10), "applies to procgen envs"),
    (EnvConfig(id="starpilot", frame_stack=2), "starpilot is a procgen env"),
    (EnvConfig(id="robosuite/Lift?object_state=false"), "cameras and object_state are all off, so nothing observed"),
    (EnvConfig(id="genesis/FrankaLift", options=["wrist_camera=false"]), "wrist_camera and object_state are all off"),
    (EnvConfig(id="sim/Sleep?step_ms=abc"), "step_ms='abc': expected a number"),
    (EnvConfig(id="sim/Sleep?step_ms=inf"), "step_ms=inf: must be positive and finite"),
    (EnvConfig(id="sim/Walk"), "the sim family has one task, sim/Sleep"),
    (EnvConfig(id="sim/Sleep?slowest=0.5"), "slowest=0.5: a factor of step_ms, at least 1"),
], ids=["twice", "unknown", "not-int", "not-positive", "not-bool", "not-a-choice", "no-value", "no-options",
        "query-without-options", "procgen-query", "empty-query",
        "robosuite-lives", "fetch-pixels", "mujoco-levels", "procgen-stack", "robosuite-blind", "genesis-blind",
        "sim-not-a-number", "sim-infinite", "sim-task", "sim-faster"])
def test_settings_and_options_a_family_does_not_take_are_refused(cfg, words, genesis_taken_as_installed):
    with pytest.raises(ConfigError, match=words):
        check_family(cfg)


@pytest.mark.parametrize("env_id, missing, extra, what", [
    ("robosuite/Lift?robot=Panda", "robosuite", "robot", "robosuite/Lift is a robosuite env"),
    ("FetchSlideDense-v4", "gymnasium_robotics", "robot", "FetchSlideDense-v4 looks like a gymnasium-robotics env"),
    ("genesis/FrankaLift", "genesis", "genesis", "genesis/FrankaLift is a genesis env"),
])
def test_a_family_whose_extra_is_missing_says_how_to_install_it(monkeypatch, env_id, missing, extra, what):
    import gymnasium

    real = importlib.util.find_spec
    monkeypatch.setattr(families.importlib.util, "find_spec",
                        lambda name, *a: None if name == missing else real(name, *a))
    monkeypatch.setattr(gymnasium.envs, "registry", {k: v for k, v in gymnasium.envs.registry.items()
                                                     if not k.startswith("Fetch")})
    with pytest.raises(ConfigError, match=rf"^{what}, which needs the extra '{extra}': pip install -e '\.\[{extra}\]' "
                                          rf"\(make install EXTRAS={extra}\)$"):
        family_of(env_id)


SPACES_OF_EACH_ID = """
import sys
from parallel_ppo.envs.batch import env_spaces
from parallel_ppo.envs.config import EnvConfig
from parallel_ppo.errors import ConfigError
for env_id in sys.argv[1:]:
    try:
        env_spaces(EnvConfig(id=env_id))
    except ConfigError as e:
        print(e)
"""


def test_mujoco_that_cannot_set_up_the_opengl_of_mujoco_gl_is_one_line_naming_it():
    """MuJoCo sets up OpenGL as it is imported: under a MUJOCO_GL it cannot use, a gymnasium-robotics id (whose
    package imports it to register its ids) and a MuJoCo env from its state get one line naming MUJOCO_GL and the fix,
    and a mistyped id the usual one (before, a traceback ending in MuJoCo's error)."""
    ids = ["NoSuch-v0", "FetchReachDense-v4", "HalfCheetah-v5"]
    out = subprocess.run([sys.executable, "-c", SPACES_OF_EACH_ID, *ids], env={**os.environ, "MUJOCO_GL": "bogus"},
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    unknown, fetch, cheetah = out.stdout.splitlines()
    assert unknown.startswith("unknown game or env id 'NoSuch-v0': use a Procgen game")
    for line, needs in ((fetch, "FetchReachDense-v4 needs gymnasium_robotics"),
                        (cheetah, "HalfCheetah-v5 needs MuJoCo")):
        assert line.startswith(f"{needs}, which failed to import with MUJOCO_GL=bogus (RuntimeError: invalid value")
        assert line.endswith(families.RENDERER_HELP)


@pytest.mark.parametrize("env_id, words", [
    ("robosuite/NoSuchTask", "robosuite has no task 'NoSuchTask' (its tasks: "),
    ("robosuite/Lift?robot=R2D2", "robosuite has no robot 'R2D2'"),
    pytest.param("robosuite/Lift?cameras=nosecam", "robosuite Lift has no camera 'nosecam' (its cameras: ",
                 marks=pytest.mark.slow),  # builds the Lift simulator to list its cameras: seconds
])
def test_what_robosuite_does_not_have_is_refused_by_name(env_id, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(")):
        make_batch_env(EnvConfig(id=env_id), 0, 0, 1, 1)


def test_what_genesis_does_not_have_is_refused_by_name(genesis_taken_as_installed):
    assert family_of("genesis/FrankaLift?wrist_camera=false") is GENESIS
    with pytest.raises(ConfigError, match=r"^genesis has no task 'Stack' here \(its tasks: FrankaLift\)$"):
        make_batch_env(EnvConfig(id="genesis/Stack"), 0, 0, 1, 1)


def _maker_that_cannot_start(cfg, options, render, clock, seed):
    raise RuntimeError("no OpenGL context")


def _maker_that_misses_a_package(cfg, options, render, clock, seed):
    from gymnasium.error import DependencyNotInstalled

    raise DependencyNotInstalled("MuJoCo is not installed, run `pip install \"gymnasium[mujoco]\"`")


@pytest.mark.parametrize("maker, query, hint", [("_maker_that_cannot_start", "?eye=true", True),
                                                ("_maker_that_cannot_start", "?eye=false", False),
                                                ("_maker_that_misses_a_package", "?eye=true", False)])
def test_a_build_error_names_the_renderer_only_where_a_camera_option_draws_frames(monkeypatch, maker, query, hint):
    """...and not where a package is missing: gymnasium's own line names it."""
    from parallel_ppo.envs import gym_envs, views

    family = families.Family("cams", "cartpole.yaml", f"{__name__}:{maker}",
                                 options={"eye": families.Option(False, "a camera", camera=True)})
    monkeypatch.setattr(gym_envs, "check_family", lambda cfg: family)
    with pytest.raises(ConfigError, match="RuntimeError: no OpenGL context|MuJoCo is not installed") as refused:
        gym_envs.GymnasiumBatchEnv(EnvConfig(id="cams/Task" + query), [0])
    assert (views.RENDERER_HELP in str(refused.value)) is hint


def camera(layout, rows: np.ndarray) -> np.ndarray:
    """The wrist camera's frames in packed observation rows."""
    return layout.unpack(torch.from_numpy(rows))[0]["robot0_eye_in_hand_image"].numpy()


@pytest.mark.slow  # builds two robosuite simulators and draws their frames: seconds
def test_robosuite_lift_steps_from_its_camera_renders_and_reports_success():
    """The wrist camera's frames (uint8, upright, drawn on the CPU and timed as render) beside the proprioception; an
    episode of `horizon` steps ends as a time limit (bootstrapped) and says whether the cube was lifted. Each env
    draws in its own OpenGL context: closing another env (an evaluation's) leaves the frames as they were."""
    cfg = EnvConfig(id=LIFT_CAMERA, frame_size=16)
    env, twin = (make_batch_env(cfg, 3, 0, 1, 1, render=True) for _ in range(2))
    try:
        layout = env.spaces.layout
        assert [(p.key, p.shape, p.image) for p in layout.parts] == [
            ("robot0_proprio-state", (50,), False), ("robot0_eye_in_hand_image", (16, 16, 3), True)]
        assert env.actions.continuous and env.actions.n == 7
        first = env.reset()
        image = camera(layout, first)
        assert image.dtype == np.uint8 and image.std() > 0, "a drawn frame, not a blank one"
        twin.reset()
        still = np.zeros((1, 7), np.float32)
        twin_frames = [camera(layout, twin.step(still)[0]) for _ in range(2)]
        twin.close()
        for t in range(5):
            obs, rewards, dones, cut = env.step(still)
            if t < 2:
                assert np.array_equal(camera(layout, obs), twin_frames[t])
        assert dones.tolist() == [True] and list(cut) == [0], "the horizon is a time limit: the value bootstraps"
        assert reported_success(env, 0) == [0.0], "a still arm lifts nothing"
        assert env.render_seconds > 0
        assert env.frame(0).shape == (256, 256, 3)
    finally:
        env.close()


def test_a_robosuite_task_that_ends_before_its_horizon_is_terminated_not_cut():
    """robosuite says `done` at the horizon and where a task ends itself (Wipe: a collision, a joint limit, success):
    only the horizon is a time limit whose value bootstraps; Wipe's early ends were all reported as time limits."""
    from types import SimpleNamespace

    from parallel_ppo.envs.robot_envs import RobosuiteEnv

    def stepped(timestep: int, done: bool) -> tuple[bool, bool]:
        env = object.__new__(RobosuiteEnv)  # robosuite's task stood in for by what step reads of it
        env._env = SimpleNamespace(step=lambda action: ({}, 0.5, done, {}), _check_success=lambda: False,
                                   timestep=timestep, horizon=500)
        env._succeeded, env._observe = False, lambda obs: obs
        return env.step(np.zeros(7))[2:4]

    assert stepped(224, True) == (True, False), "an end of the task's own"
    assert stepped(500, True) == (False, True), "the horizon"
    assert stepped(224, False) == (False, False)


def test_a_camera_list_of_no_names_is_no_camera():
    """`cameras=+` passed the check that something shows the task's object, and trained blind; `a++a` is `a`."""
    with pytest.raises(ConfigError, match="cameras and object_state are all off"):
        check_family(EnvConfig(id="robosuite/Lift?object_state=false&cameras=+"))
    assert options_of(EnvConfig(id="robosuite/Lift?cameras=agentview++agentview+"))["cameras"] == "agentview"


@pytest.mark.slow  # builds three robosuite simulators: seconds
def test_robosuite_envs_built_from_one_seed_start_alike():
    """robosuite draws Lift's cube size while it builds the task: from the seed the env is built from, so that a run
    repeats from its seed (it drew from the OS's entropy before). Reset from one seed, the cube's state shows it."""
    cfg = EnvConfig(id="robosuite/Lift?horizon=5")
    starts = []
    for seed in (3, 3, 4):
        env = ROBOSUITE.maker()(cfg, options_of(cfg, ROBOSUITE), False, RenderClock(), seed)
        try:
            starts.append(env.reset(seed=0)[0]["object-state"])
        finally:
            env.close()
    assert np.array_equal(starts[0], starts[1])
    assert not np.array_equal(starts[0], starts[2]), "another cube: built from another seed"


@pytest.mark.slow  # builds a robosuite simulator and its OpenGL context twice: seconds
def test_robosuite_fast_render_draws_without_a_shadow_map_and_the_same_frames():
    """`env.fast_render` turns shadows off, so its offscreen context is made without the model's shadow map (4096²:
    64 MB of memory per env under llvmpipe): the frames are those drawn with one, to the bit."""
    env = make_batch_env(EnvConfig(id=LIFT_CAMERA, frame_size=32), 3, 0, 1, 1, render=True)
    try:
        suite_env = env._env.envs[0].unwrapped
        sim = suite_env._env.sim
        context = sim._render_context_offscreen
        assert context.con.shadowSize == 0
        env.reset()
        env.step(np.full((1, 7), 0.5, np.float32))

        def frames() -> list[np.ndarray]:
            return [sim.render(camera_name="robot0_eye_in_hand", width=32, height=32), suite_env.render()]

        without = frames()
        sim.model._model.vis.quality.shadowsize = 4096  # the model's own, as the default renderer makes it
        context.con.free()
        context._set_mujoco_context_and_buffers()
        assert context.con.shadowSize == 4096
        assert all(np.array_equal(a, b) for a, b in zip(without, frames(), strict=True))
    finally:
        env.close()


VIEW = """<mujoco><statistic extent="2"/><visual><map znear="0.5" zfar="25"/></visual>
  <asset><mesh name="wedge" vertex="0 0 0  4 0 0  0 .2 0  0 0 .2"/></asset><worldbody>
  <camera name="eye" pos="0 0 0" xyaxes="1 0 0 0 1 0" fovy="90"/>
  <geom name="floor" type="plane" size="5 5 .1" pos="0 0 -20"/>
  <geom name="ahead" type="sphere" size=".5" pos="0 0 -5"/>
  <geom name="behind" type="sphere" size=".5" pos="0 0 5"/>
  <geom name="grazing" type="sphere" size=".5" pos="5.6 0 -5"/>
  <geom name="beside" type="sphere" size=".5" pos="6 0 -5"/>
  <geom name="above" type="sphere" size=".5" pos="0 6 -5"/>
  <geom name="far" type="sphere" size=".5" pos="0 0 -60"/>
  <geom name="rod" type="box" size="4 .1 .1" pos="0 7 -5"/>
  <geom name="close" type="sphere" size=".1" pos="0 0 -.7"/>
  <geom name="mid" type="sphere" size=".5" pos="0 0 -40"/>
  <geom name="wedge" type="mesh" mesh="wedge" pos="5.4 0 -5"/>
</worldbody></mujoco>"""


@pytest.mark.parametrize("aspect, outside", [(1.0, ["behind", "beside", "above", "far", "rod", "close", "wedge"]),
                                             (2.0, ["behind", "above", "far", "rod", "close"])])
def test_a_geom_is_hidden_only_where_its_bounds_are_out_of_the_cameras_view(aspect, outside):
    """A 90° camera looking down -z: the frustum's side at depth 5 is 5 across (10 for a frame twice as wide); a
    sphere of radius 0.5 whose centre is 0.6 beyond it still reaches in (0.42 from the side), one 1.0 beyond does
    not (0.71: its bounding box would still reach, its sphere does not); behind the camera, before the near plane
    or past the far one (0.5 and 25 times the extent of 2), it is out; a long box, or a wedge whose box lies to one
    side of its centre of mass (its geom's origin), is out where its sides are, though its sphere reaches in; a
    plane never is."""
    import mujoco

    from parallel_ppo.envs.culling import outside_view

    model = mujoco.MjModel.from_xml_string(VIEW)
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    hidden = outside_view(model, data, 0, aspect)
    assert [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_GEOM, g) for g in hidden] == outside


def random_scene(rng: np.random.Generator) -> str:
    """Cameras and geoms placed and turned at random: boxes, capsules, ellipsoids, a mesh off its own origin, some
    coloured by a material; a scene extent of 3 (the near and far planes scale with it)."""
    def turn() -> str:
        q = rng.normal(size=4)
        return " ".join(f"{v:.4f}" for v in q / np.linalg.norm(q))

    def where(span: float) -> str:
        return " ".join(f"{v:.3f}" for v in rng.uniform(-span, span, 3))

    kinds = ['type="box"', 'type="capsule"', 'type="ellipsoid"', 'type="mesh" mesh="m"']
    def sizes() -> str:  # long and thin as often as not
        return " ".join(f"{v:.3f}" for v in rng.uniform(0.05, 1.5, 3) ** 2)

    geoms = "".join(f'<geom {kinds[i % 4]} size="{sizes()}" pos="{where(4)}" quat="{turn()}" '
                    + ('material="mat"/>' if i % 3 else f'rgba="{rng.uniform():.2f} .4 .6 1"/>') for i in range(64))
    cameras = "".join(f'<camera pos="{where(3)}" quat="{turn()}" fovy="{rng.uniform(20, 100):.1f}"/>'
                      for _ in range(8))
    mesh = " ".join(f"{v:.3f}" for v in rng.uniform(0.2, 1.0, (10, 3)).ravel())  # off its origin
    return (f'<mujoco><statistic extent="3"/><asset><mesh name="m" vertex="{mesh}"/><material name="mat" '
            f'rgba=".2 .7 .3 1"/></asset><worldbody><light pos="0 0 6"/>{cameras}{geoms}</worldbody></mujoco>')


@pytest.mark.slow  # draws frames on the CPU: a second
def test_the_frames_of_any_camera_are_the_same_without_the_geoms_out_of_its_view():
    """A random scene, its cameras turned every way, frames wider than tall: hiding what `outside_view` names
    (most of the geoms) changes no pixel, and every colour is as it was after each frame."""
    import mujoco
    from mujoco.egl import GLContext  # as robosuite draws, whatever MUJOCO_GL said when mujoco was imported

    from parallel_ppo.envs.culling import only_in_view, outside_view
    from parallel_ppo.envs.gym_envs import fast_scene

    model = mujoco.MjModel.from_xml_string(random_scene(np.random.default_rng(5)))
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    gl = GLContext(72, 48)
    gl.make_current()
    try:
        context = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_150)
    except BaseException:
        gl.free()
        raise
    mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, context)
    scene, view = mujoco.MjvScene(model, maxgeom=200), mujoco.MjrRect(0, 0, 72, 48)
    fast_scene(model, scene)

    def draw(camera: int) -> np.ndarray:
        eye = mujoco.MjvCamera()
        eye.type, eye.fixedcamid = mujoco.mjtCamera.mjCAMERA_FIXED, camera
        mujoco.mjv_updateScene(model, data, mujoco.MjvOption(), None, eye, mujoco.mjtCatBit.mjCAT_ALL, scene)
        mujoco.mjr_render(view, scene, context)
        pixels = np.empty((48, 72, 3), dtype=np.uint8)
        mujoco.mjr_readPixels(pixels, None, view, context)
        return pixels

    colours, hidden = model.geom_rgba.copy(), 0
    try:
        for camera in range(model.ncam):
            every = draw(camera)
            hidden += len(outside_view(model, data, camera, 72 / 48))
            with only_in_view(model, data, camera, 72 / 48):
                seen = draw(camera)
            assert np.array_equal(seen, every) and np.array_equal(model.geom_rgba, colours), f"camera {camera}"
            assert every.std() > 0, "a frame with something in it"
    finally:
        context.free()
        gl.free()
    assert hidden > model.ncam * model.ngeom / 2, "most geoms are out of a camera's view"


@pytest.mark.slow  # builds a robosuite simulator and draws its frames: seconds
def test_robosuite_cameras_are_handed_only_what_they_see_and_draw_the_same_frames(monkeypatch):
    """`env.fast_render`: each frame is drawn without the geoms out of its camera's view (the wrist camera does not
    see most of the arm), and every frame, the wrist camera's and the video's, is the frame drawn with them all."""
    import mujoco

    from parallel_ppo.envs import robot_envs
    from parallel_ppo.envs.culling import outside_view

    drawn_without = []
    culling = robot_envs.only_in_view

    def counted(model, data, camera, aspect):  # how many geoms each frame was drawn without
        drawn_without.append(len(outside_view(model, data, camera, aspect)))
        return culling(model, data, camera, aspect)

    monkeypatch.setattr(robot_envs, "only_in_view", counted)
    env = make_batch_env(EnvConfig(id=LIFT_CAMERA, frame_size=32), 3, 0, 1, 1, render=True)
    try:
        suite_env = env._env.envs[0].unwrapped
        sim, layout = suite_env._env.sim, env.spaces.layout
        colours = sim.model._model.geom_rgba.copy()
        rng = np.random.default_rng(0)
        obs = env.reset()
        for _ in range(3):
            wrist = sim.model.camera_name2id("robot0_eye_in_hand")
            hidden = outside_view(sim.model._model, sim.data._data, wrist, 1.0)
            names = [mujoco.mj_id2name(sim.model._model, mujoco.mjtObj.mjOBJ_GEOM, g) for g in hidden]
            assert any(name.startswith("robot0_g") for name in names), "the arm's links are out of the wrist's view"
            drawn = [camera(layout, obs)[0], env.frame(0)]
            every = [sim.render(camera_name=c, width=w, height=w)[::-1] for c, w in (("robot0_eye_in_hand", 32),
                                                                                    ("agentview", 256))]
            assert all(np.array_equal(a, b) for a, b in zip(drawn, every, strict=True))
            assert np.array_equal(sim.model._model.geom_rgba, colours), "the colours are back after each frame"
            obs = env.step(rng.uniform(-1, 1, (1, 7)).astype(np.float32))[0]
        assert len(drawn_without) == 7 and min(drawn_without[::2]) > 0, "each wrist frame was drawn without some"
    finally:
        env.close()


def test_fetch_observes_its_goals_as_a_dict_and_reports_success():
    env = make_batch_env(EnvConfig(id="FetchReachDense-v4"), 0, 0, 2, 1)
    try:
        assert [p.key for p in env.spaces.layout.parts] == ["achieved_goal", "desired_goal", "observation"]
        env.reset()
        for _ in range(50):  # Fetch's time limit
            _, rewards, dones, cut = env.step(np.zeros((2, 4), np.float32))
            assert (rewards <= 0).all(), "the dense reward is minus the distance to the goal"
        assert dones.all() and sorted(cut) == [0, 1]
        assert [len(s) for s in (reported_success(env, 0), reported_success(env, 1))] == [1, 1]
    finally:
        env.close()


@pytest.mark.parametrize("chosen", [None, "osmesa"])
def test_fetch_draws_headless_as_mujoco_does_unless_mujoco_gl_says(monkeypatch, chosen):
    """Without MUJOCO_GL, MuJoCo tries GLFW first: on a machine without a display, each video of Fetch printed the
    failed context's ignored AttributeError (8 lines) on stderr."""
    if chosen:
        monkeypatch.setenv("MUJOCO_GL", chosen)
    else:
        monkeypatch.delenv("MUJOCO_GL", raising=False)
    family_of("FetchReachDense-v4").maker()(EnvConfig(id="FetchReachDense-v4"), {}, True, RenderClock(), 0).close()
    assert os.environ.get("MUJOCO_GL") == (chosen or "egl")
