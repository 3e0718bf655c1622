"""Genesis (genesis-world, the extra `genesis`) on its CPU backend: the Genesis devlog's task, a Franka Panda lifting
a cube seen through a wrist camera, as a gymnasium env (`genesis/FrankaLift`)."""

from __future__ import annotations

import contextlib
import io
import logging
from typing import Any

import gymnasium
import numpy as np

from parallel_ppo.envs.config import EnvConfig
from parallel_ppo.envs.families import split_id
from parallel_ppo.envs.gym_envs import RenderClock
from parallel_ppo.errors import ConfigError

TASKS = ("FrankaLift",)
HOME = np.array([0.0, -0.3, 0.0, -2.2, 0.0, 2.0, 0.79, 0.04, 0.04])
"""The arm's joint angles and finger openings at the start of an episode: the hand above the table, open."""
HAND_DOWN = np.array([0.0, 1.0, 0.0, 0.0])
"""The hand's orientation (w, x, y, z) that the arm holds: pointing straight down."""
KP = np.array([4500, 4500, 3500, 3500, 2000, 2000, 2000, 100, 100])
KV = np.array([450, 450, 350, 350, 200, 200, 200, 10, 10])
FORCE = np.array([87, 87, 87, 87, 12, 12, 12, 100, 100])
"""Position-control gains and force limits of the Panda's 7 joints and 2 fingers (Genesis's grasping tutorial)."""
CUBE_HALF, LIFTED = 0.02, 0.04
"""The cube's half side, and the height its centre must pass for the task to succeed (m): robosuite Lift's test,
4 cm above the surface the cube rests on (here the ground)."""
HAND_TO_TIPS = 0.1034
"""From the hand's origin to the middle of the finger pads, along the hand's axis (m)."""
MOVE, SUBSTEPS = 0.02, 5
"""How far one action moves the hand's target at most (m), and physics steps of 0.01 s per action at 20 Hz."""
WORKSPACE = (np.array([0.25, -0.35, HAND_TO_TIPS + 0.005]), np.array([0.8, 0.35, 0.6]))
"""Where the hand's target is kept: above the ground, in front of the robot."""
CUBE_AREA = 0.10
"""The side of the square, centred 0.55 m in front of the robot, where each episode places the cube."""
VIDEO_SIZE = 256
FLOOR = (0.6, 0.6, 0.6)
"""The ground's plain colour: Genesis's default checkered floor, seen at a grazing angle from the wrist camera, took
Mesa's llvmpipe up to 2 s a frame (and a whole update of 131 s once), where a plain one draws in milliseconds."""


def import_genesis() -> Any:
    """genesis, initialized once per process on its CPU backend with its per-step notices off."""
    with contextlib.redirect_stdout(io.StringIO()):
        import genesis as gs
        if not gs._initialized:
            gs.init(backend=gs.cpu, logging_level="warning")
    logging.getLogger("genesis").setLevel(logging.WARNING)
    return gs


def make_genesis(cfg: EnvConfig, options: dict[str, Any], render: bool, clock: RenderClock,
                 seed: int) -> gymnasium.Env:
    """`genesis/<Task>` with the family's options (`envs.families.GENESIS`)."""
    task = split_id(cfg.id)[0].partition("/")[2]
    if task not in TASKS:
        raise ConfigError(f"genesis has no task {task!r} here (its tasks: {', '.join(TASKS)})")
    return FrankaLift(options, cfg.frame_size, clock, render)


class FrankaLift(gymnasium.Env):
    """A Franka Panda lifts a 4 cm cube placed at random in front of it. Actions: the hand's target moves by up to
    2 cm along x, y, z (inverse kinematics holds the hand pointing down), and the fourth value closes the fingers
    where positive. Observations: `proprio` (7 joint angles and velocities, 2 finger openings, the fingertips'
    position), `wrist_image` (uint8, `env.frame_size`) unless `wrist_camera` is off, `object` (the cube's position,
    orientation and offset from the fingertips) with `object_state`. Reward `dense`, robosuite Lift's staged one:
    (1 − tanh(10 × distance) from the fingertips to the cube, + 0.25 while both fingers grasp it) / 2.25 until the
    cube is lifted, then 1; `sparse`: 1 while lifted. An episode lasts `horizon` steps (truncated); `is_success` says
    whether the cube was lifted at any step."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, options: dict[str, Any], size: int, clock: RenderClock, render: bool = False) -> None:
        gs = import_genesis()
        import genesis.utils.geom as geom

        self._geom = geom
        self.size, self.clock = size, clock
        self.horizon, self.dense = options["horizon"], options["reward"] == "dense"
        self.render_mode = "rgb_array" if render else None
        self.scene = gs.Scene(show_viewer=False, sim_options=gs.options.SimOptions(dt=1 / options["control_freq"]
                                                                                  / SUBSTEPS),
                              rigid_options=gs.options.RigidOptions(enable_self_collision=False,
                                                                    box_box_detection=True))
        self.scene.add_entity(gs.morphs.Plane(), surface=gs.surfaces.Default(color=FLOOR))
        self.cube = self.scene.add_entity(gs.morphs.Box(size=(2 * CUBE_HALF,) * 3, pos=(0.55, 0.0, CUBE_HALF)),
                                          surface=gs.surfaces.Default(color=(0.9, 0.15, 0.15)))
        self.robot = self.scene.add_entity(gs.morphs.MJCF(file="xml/franka_emika_panda/panda.xml"))
        self.wrist = (self.scene.add_camera(res=(size, size), pos=(1.0, 0.0, 1.0), lookat=(0.5, 0.0, 0.0), fov=70,
                                            GUI=False) if options["wrist_camera"] else None)
        self.video = (self.scene.add_camera(res=(VIDEO_SIZE, VIDEO_SIZE), pos=(1.5, -1.1, 1.0),
                                            lookat=(0.35, 0.0, 0.25), fov=50, GUI=False) if render else None)
        self.scene.build()
        self.hand = self.robot.get_link("hand")
        self.fingers = (self.robot.get_link("left_finger"), self.robot.get_link("right_finger"))
        self.robot.set_dofs_kp(KP)
        self.robot.set_dofs_kv(KV)
        self.robot.set_dofs_force_range(-FORCE, FORCE)
        if self.wrist is not None:  # beside the hand, looking past the fingertips: the fingers at the frame's bottom
            self.wrist.attach(self.hand, geom.pos_lookat_up_to_T(np.array([0.08, 0.0, -0.03]),
                                                                 np.array([0.0, 0.0, HAND_TO_TIPS + 0.10]),
                                                                 np.array([1.0, 0.0, 0.0])))
        box = gymnasium.spaces.Box
        spaces = {"proprio": box(-np.inf, np.inf, (19,), np.float32)}
        if self.wrist is not None:
            spaces["wrist_image"] = box(0, 255, (size, size, 3), np.uint8)
        self.object_state = options["object_state"]
        if self.object_state:
            spaces["object"] = box(-np.inf, np.inf, (10,), np.float32)
        self.observation_space = gymnasium.spaces.Dict(spaces)
        self.action_space = box(-1.0, 1.0, (4,), np.float32)
        self._steps, self._succeeded = 0, False
        self._joints, self._target = HOME.copy(), np.zeros(3)

    def _tips(self) -> np.ndarray:
        """The point between the finger pads."""
        return _array(self.hand.get_pos()) + self._geom.quat_to_R(_array(self.hand.get_quat()))[:, 2] * HAND_TO_TIPS

    def _observe(self, tips: np.ndarray, cube: np.ndarray) -> dict[str, np.ndarray]:
        """The observation, given the fingertips' point (`_tips`) and the cube's position now."""
        q, dq = _array(self.robot.get_dofs_position()), _array(self.robot.get_dofs_velocity())
        out = {"proprio": np.concatenate([q[:7], dq[:7], q[7:9], tips]).astype(np.float32)}
        if self.wrist is not None:  # forced: after a reset no step has moved the camera to the hand yet
            out["wrist_image"] = np.ascontiguousarray(
                self.clock.time(self.wrist.render, rgb=True, force_render=True)[0], dtype=np.uint8)
        if self.object_state:
            out["object"] = np.concatenate([cube, _array(self.cube.get_quat()), cube - tips]).astype(np.float32)
        return out

    def _grasped(self, cube: np.ndarray) -> bool:
        """Both fingers touch the cube (at `cube`), and it lies between them."""
        contacts = self.robot.get_contacts(with_entity=self.cube)
        touched = set(_array(contacts["link_a"]).astype(int)) | set(_array(contacts["link_b"]).astype(int))
        if not {f.idx for f in self.fingers} <= touched:
            return False
        middle = (_array(self.fingers[0].get_pos()) + _array(self.fingers[1].get_pos())) / 2
        return bool(np.linalg.norm(cube[:2] - middle[:2]) < 0.03)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        self.robot.set_qpos(HOME, zero_velocity=True)
        self.robot.control_dofs_position(HOME)
        x, y = np.array([0.55, 0.0]) + self.np_random.uniform(-CUBE_AREA / 2, CUBE_AREA / 2, size=2)
        self.cube.set_pos(np.array([x, y, CUBE_HALF]), zero_velocity=True)
        self.cube.set_quat(np.array([1.0, 0.0, 0.0, 0.0]), zero_velocity=True)
        self._joints, self._target = HOME.copy(), _array(self.hand.get_pos())
        self._steps, self._succeeded = 0, False
        return self._observe(self._tips(), _array(self.cube.get_pos())), {}

    def step(self, action: np.ndarray) -> tuple[dict, float, bool, bool, dict]:
        action = np.clip(np.asarray(action, dtype=np.float64), -1.0, 1.0)
        self._target = np.clip(self._target + action[:3] * MOVE, *WORKSPACE)
        joints = _array(self.robot.inverse_kinematics(link=self.hand, pos=self._target, quat=HAND_DOWN,
                                                      init_qpos=self._joints, max_samples=1,
                                                      max_solver_iters=20)).copy()
        joints[7:9] = 0.0 if action[3] > 0 else 0.04
        self._joints = joints
        self.robot.control_dofs_position(joints)
        for _ in range(SUBSTEPS):
            self.scene.step()
        self._steps += 1
        tips, cube = self._tips(), _array(self.cube.get_pos())
        obs = self._observe(tips, cube)
        lifted = cube[2] > LIFTED
        self._succeeded = self._succeeded or lifted
        if not self.dense:
            reward = float(lifted)
        elif lifted:
            reward = 1.0
        else:
            distance = np.linalg.norm(tips - cube)
            reward = (1.0 - np.tanh(10.0 * distance) + (0.25 if self._grasped(cube) else 0.0)) / 2.25
        return obs, float(reward), False, self._steps >= self.horizon, {"is_success": float(self._succeeded)}

    def render(self) -> np.ndarray | None:
        if self.video is None:
            return None
        return np.ascontiguousarray(self.video.render(rgb=True, force_render=True)[0], dtype=np.uint8)

    def close(self) -> None:
        if self.scene is not None:
            self.scene.destroy()
            self.scene = None


def _array(x: Any) -> np.ndarray:
    """A Genesis tensor (torch, on the CPU) or array as a flat float64 numpy array."""
    return np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x, dtype=np.float64).reshape(-1)
