"""robosuite's arm tasks as gymnasium envs: a dict of the robot's and the objects' state and the frames of named
cameras, success in `info["is_success"]`, and the cameras' drawing timed apart from the physics; gymnasium-robotics'
tasks as they are (the same extra, `robot`)."""

from __future__ import annotations

import contextlib
import io
import logging
import sys
from typing import Any

import gymnasium
import numpy as np

from parallel_ppo.envs.config import EnvConfig
from parallel_ppo.envs.culling import only_in_view
from parallel_ppo.envs.families import split_id
from parallel_ppo.envs.gym_envs import RenderClock, draw_headless, fast_scene, make_plain
from parallel_ppo.errors import ConfigError

VIDEO_CAMERA, VIDEO_SIZE = "agentview", 256
"""What `render()` draws (videos of a policy): the camera facing the robot, at this size."""
BUILD_STREAM = 1
"""Spawns the seed robosuite builds from out of the env's seed, apart from the placements' stream (`reset`)."""


def import_robosuite() -> Any:
    """robosuite, imported without the notices it prints on import (no private macro file, optional robot models);
    its later warnings still print."""
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        import robosuite
    logger = logging.getLogger("robosuite_logs")
    for handler in logger.handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            handler.setStream(sys.stderr)
    logger.setLevel(logging.WARNING)
    return robosuite


def make_robotics(cfg: EnvConfig, options: dict[str, Any], render: bool, clock: RenderClock, seed: int) -> Any:
    """A gymnasium-robotics task (FetchReachDense-v4, ...) as it is, drawn as MuJoCo's are (`draw_headless`)."""
    if render:
        draw_headless()
    return make_plain(cfg, options, render, clock, seed)


def make_robosuite(cfg: EnvConfig, options: dict[str, Any], render: bool, clock: RenderClock,
                   seed: int) -> gymnasium.Env:
    """`robosuite/<Task>` with the family's options (`envs.families.ROBOSUITE`), built from `seed`."""
    return RobosuiteEnv(split_id(cfg.id)[0].partition("/")[2], options, cfg.frame_size, cfg.fast_render, clock,
                        render, seed)


class RobosuiteEnv(gymnasium.Env):
    """One robosuite task. Observations: `<robot>proprio-state`, `object-state` (unless `object_state` is off)
    and `<camera>_image` for each camera (uint8, upright). An episode lasts `horizon` steps, a time limit
    (truncated), unless the task ends it sooner (terminated: Wipe on a collision, a joint limit or success);
    `is_success` says whether the task was done at any step of it."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, task: str, options: dict[str, Any], size: int, fast: bool, clock: RenderClock,
                 render: bool, seed: int) -> None:
        """`seed`: what robosuite draws while it builds the task (Lift's cube size, fixed for the env's life) comes
        from it, so that an env built from the same seed is the same in any process; `reset(seed=...)` reseeds the
        rest (the placements)."""
        self.cameras = options["cameras"].split("+") if options["cameras"] else []  # each once (`options_of`)
        self.size, self.clock = size, clock
        self.render_mode = "rgb_array" if render else None
        suite = import_robosuite()  # it sets MUJOCO_GL=egl (headless) unless osmesa or glx is asked for
        if task not in suite.ALL_ENVIRONMENTS:
            raise ConfigError(f"robosuite has no task {task!r} (its tasks: "
                              f"{', '.join(sorted(suite.ALL_ENVIRONMENTS))})")
        if options["robot"] not in suite.ALL_ROBOTS:
            raise ConfigError(f"robosuite has no robot {options['robot']!r} (its robots: "
                              f"{', '.join(sorted(suite.ALL_ROBOTS))})")
        self._env = suite.make(
            task, robots=options["robot"], has_renderer=False, has_offscreen_renderer=bool(self.cameras) or render,
            use_camera_obs=False, use_object_obs=options["object_state"],
            reward_shaping=options["reward"] == "dense", control_freq=options["control_freq"],
            horizon=options["horizon"], ignore_done=False, hard_reset=False,
            seed=int(np.random.SeedSequence([seed, BUILD_STREAM]).generate_state(1)[0]))
        known = set(self._env.sim.model.camera_names)
        missing = [c for c in self.cameras if c not in known]
        if missing:
            self._env.close()
            raise ConfigError(f"robosuite {task} has no camera {missing[0]!r} (its cameras: "
                              f"{', '.join(sorted(known))})")
        self._fast = fast and bool(self.cameras or render)
        if self._fast:
            fast_robosuite_render(self._env.sim)
        sample = self._env.observation_spec()
        self.state_keys = [f"{self._env.robots[0].robot_model.naming_prefix}proprio-state"]
        if options["object_state"]:
            self.state_keys.append("object-state")
        spaces = {k: gymnasium.spaces.Box(-np.inf, np.inf, np.shape(sample[k]), np.float32) for k in self.state_keys}
        spaces |= {f"{c}_image": gymnasium.spaces.Box(0, 255, (size, size, 3), np.uint8) for c in self.cameras}
        self.observation_space = gymnasium.spaces.Dict(spaces)
        low, high = self._env.action_spec
        self.action_space = gymnasium.spaces.Box(low.astype(np.float32), high.astype(np.float32), dtype=np.float32)
        self._succeeded = False

    def _draw_here(self) -> None:
        """Make this env's OpenGL context current: robosuite draws with whichever is, and closing another env
        leaves none."""
        self._env.sim._render_context_offscreen.gl_ctx.make_current()

    def _observe(self, obs: dict[str, Any]) -> dict[str, np.ndarray]:
        out = {k: np.asarray(obs[k], dtype=np.float32) for k in self.state_keys}
        if self.cameras:
            self._draw_here()
        for c in self.cameras:
            out[f"{c}_image"] = self.clock.time(self._draw, c, self.size)
        return out

    def _draw(self, camera: str, size: int) -> np.ndarray:
        """`camera`'s frame, upright (OpenGL's rows run bottom-up); with `fast_render`, the renderer is handed only
        the geoms the camera can see (`envs.culling`: the same frame)."""
        sim = self._env.sim
        view = (only_in_view(sim.model._model, sim.data._data, sim.model.camera_name2id(camera), 1.0) if self._fast
                else contextlib.nullcontext())
        with view:
            return sim.render(camera_name=camera, width=size, height=size)[::-1]

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        if seed is not None:  # robosuite's generator, shared with its object placement: reseeded in place
            self._env.rng.bit_generator.state = np.random.default_rng(seed).bit_generator.state
        self._succeeded = False
        return self._observe(self._env.reset()), {}

    def step(self, action: np.ndarray) -> tuple[dict, float, bool, bool, dict]:
        obs, reward, done, _ = self._env.step(action)
        self._succeeded = self._succeeded or bool(self._env._check_success())
        truncated = bool(done) and self._env.timestep >= self._env.horizon  # the time limit, bootstrapped
        return (self._observe(obs), float(reward), bool(done) and not truncated, truncated,
                {"is_success": float(self._succeeded)})

    def render(self) -> np.ndarray:
        self._draw_here()
        return self._draw(VIDEO_CAMERA, VIDEO_SIZE)

    def close(self) -> None:
        self._env.close()


def fast_robosuite_render(sim: Any) -> None:
    """`envs.gym_envs.fast_scene` for robosuite's offscreen context, whose buffer is then made again without
    multisampling, and without the shadow map that shadows off leave unused (the model's 4096² one: 64 MB of
    memory per env under Mesa's llvmpipe; the frames are the same to the bit)."""
    context = sim._render_context_offscreen
    fast_scene(sim.model._model, context.scn)
    sim.model._model.vis.quality.shadowsize = 0
    context.con.free()
    context._set_mujoco_context_and_buffers()
