"""A user's own envs, registered with gymnasium when this module is imported (`--env toy_envs:Reach-v0`): a tiny
continuous-control task that PPO learns in seconds, and envs with spaces the trainer must refuse."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import gymnasium
import numpy as np
from gymnasium import spaces


def first_to_create(path: str) -> bool:
    """Create the file `path`; False where another process (an earlier worker) created it first."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


class Reach(gymnasium.Env):
    """A point on a line moves toward a random target: observation (target − position), action a velocity in
    [−1, 1] (× 0.2 per step), reward −|target − position| per step, 20 steps an episode (a time limit)."""

    observation_space = spaces.Box(-3.0, 3.0, (1,), np.float32)
    action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.target, self.position = float(self.np_random.uniform(-1.5, 1.5)), 0.0
        return self._obs(), {}

    def _obs(self) -> np.ndarray:
        return np.array([self.target - self.position], dtype=np.float32)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        assert self.action_space.contains(np.asarray(action, dtype=np.float32)), f"unclipped action {action}"
        self.position += 0.2 * float(action[0])
        return self._obs(), -abs(self.target - self.position), False, False, {}


class CameraReach(Reach):
    """Reach seen as a robot arm task is: a camera image (8×8 RGB, brighter the farther the target is to the right)
    and the state (the offset to the target, and the step count as a scalar), in a `Dict`; four discrete actions;
    `info["is_success"]` when the point is within 0.25 of the target, as gymnasium-robotics reports it, and in the
    final info (step 20) `distance_to_goal`, a user's own statistic."""

    observation_space = spaces.Dict({"camera": spaces.Box(0, 255, (8, 8, 3), np.uint8),
                                     "state": spaces.Box(-3.0, 3.0, (1,), np.float32),
                                     "steps": spaces.Box(0.0, 20.0, (), np.float32)})
    action_space = spaces.Discrete(4)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.steps = 0
        return super().reset(seed=seed, options=options)

    def _obs(self) -> dict:
        offset = self.target - self.position
        camera = np.full((8, 8, 3), np.clip(128 + 40 * offset, 0, 255), dtype=np.uint8)
        camera[:, :, 1] = self.np_random.integers(0, 256, (8, 8), dtype=np.uint8)  # noise the policy must ignore
        return {"camera": camera, "state": np.array([offset], dtype=np.float32),
                "steps": np.array(self.steps, dtype=np.float32)}

    def step(self, action: int) -> tuple[dict, float, bool, bool, dict]:
        self.steps += 1
        self.position += (-0.2, -0.05, 0.05, 0.2)[int(action)]
        distance = abs(self.target - self.position)
        final = {"distance_to_goal": distance} if self.steps == 20 else {}
        return self._obs(), -distance, False, False, {"is_success": float(distance < 0.25), **final}


class GoalReach(Reach):
    """Reach whose final info (step 20, where its time limit ends the episode) holds a user's own statistics:
    `distance_to_goal`, how far from the target the point ended, only where the target was right of 0, and `label`,
    a word (`near` or `far`: no number to log)."""

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        self.steps = 0
        return super().reset(seed=seed, options=options)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        obs, reward, terminated, truncated, _ = super().step(action)
        self.steps += 1
        info = {}
        if self.steps == 20:
            info = {"label": "near" if reward > -0.25 else "far"} | ({"distance_to_goal": -reward} if self.target > 0
                                                                      else {})
        return obs, reward, terminated, truncated, info


class RenderedCameraReach(CameraReach):
    """CameraReach with a third-person render (`render_mode="rgb_array"`): a 48×64 frame, blue, its width's
    first columns white up to the point's position, for the videos of `demo` and evaluation."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 15}

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = render_mode

    def render(self) -> np.ndarray:
        frame = np.zeros((48, 64, 3), dtype=np.uint8)
        frame[..., 2] = 200
        frame[:, :int(np.clip(32 + 10 * self.position, 0, 64))] = 255
        return frame


class OddRenderReach(RenderedCameraReach):
    """RenderedCameraReach whose render gives its frame as `render_as` says, as users' envs have: `gray` (its blue
    channel, (H, W)), `rgba` (H, W, 4, opaque), `float` (RGB in [0, 1]) or `none` (None)."""

    def __init__(self, render_mode: str | None = None, render_as: str = "gray") -> None:
        super().__init__(render_mode)
        self.render_as = render_as

    def render(self) -> np.ndarray | None:
        rgb = super().render()
        return {"gray": rgb[..., 2], "rgba": np.dstack([rgb, np.full(rgb.shape[:2], 255, np.uint8)]),
                "float": rgb / np.float32(255), "none": None}[self.render_as]


class UnrenderedReach(Reach):
    """Reach that takes gymnasium's `render_mode` but declares no render mode (gymnasium's default metadata): it does
    not render. (Reach itself does not even take the argument.)"""

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = render_mode


class NestedDictObs(Reach):
    observation_space = spaces.Dict({"x": spaces.Box(-1.0, 1.0, (1,), np.float32), "mode": spaces.Discrete(3)})


class MultiDiscreteActions(Reach):
    action_space = spaces.MultiDiscrete([2, 3])


class FloatImages(Reach):
    observation_space = spaces.Box(0.0, 1.0, (8, 8, 3), np.float32)


class ChannelsFirstImages(Reach):
    observation_space = spaces.Box(0, 255, (3, 64, 64), np.uint8)


class ChannelsFirstCamera(Reach):
    observation_space = spaces.Dict({"camera": spaces.Box(0, 255, (3, 8, 8), np.uint8),
                                     "state": spaces.Box(-3.0, 3.0, (1,), np.float32)})


class IntegerBoxActions(Reach):
    action_space = spaces.Box(0, 5, (2,), np.int64)


class EmptyObservations(Reach):
    observation_space = spaces.Box(-1.0, 1.0, (0,), np.float32)


class EmptyActions(Reach):
    action_space = spaces.Box(-1.0, 1.0, (0,), np.float32)


class SlowResetReach(Reach):
    """Reach whose every reset after the first computes for RESET_SECONDS (as a robosuite reset or a first JIT
    compilation does): a worker that takes no step for that long, yet is alive. Such a reset first creates the file
    named by $SLOW_RESET_FLAG, if set."""

    RESET_SECONDS = 5.0  # over the watchdog test's 4 s bound even where the cores are free

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        self.resets = getattr(self, "resets", 0) + 1
        if self.resets > 1:
            if "SLOW_RESET_FLAG" in os.environ:
                Path(os.environ["SLOW_RESET_FLAG"]).touch()
            end = time.thread_time() + self.RESET_SECONDS  # CPU time: however busy the machine, this much work
            while time.thread_time() < end:
                pass
        return super().reset(seed=seed, options=options)


class SlowStartReach(Reach):
    """Reach whose envs take a minute to build in a worker process (a simulator loading its assets), not in the
    process that reads its spaces, where $SLOW_START_FLAG names a file, and once the file $SLOW_START_AFTER names
    exists where it is set: each such build first writes its process id into the first file."""

    def __init__(self) -> None:
        super().__init__()
        after = os.environ.get("SLOW_START_AFTER")
        if (multiprocessing.parent_process() is not None and "SLOW_START_FLAG" in os.environ
                and (after is None or os.path.exists(after))):
            with open(os.environ["SLOW_START_FLAG"], "a") as flag:
                flag.write(f"{os.getpid()}\n")
            time.sleep(60)


class CrashThenSlowStartReach(SlowStartReach):
    """SlowStartReach whose first env to take its 40th step ends its process at once (a simulator's segfault),
    first creating the file $SLOW_START_AFTER names: the worker's restart then builds its envs for a minute."""

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.steps = getattr(self, "steps", 0) + 1
        if self.steps == 40 and first_to_create(os.environ["SLOW_START_AFTER"]):
            os._exit(139)
        return super().step(action)


class StragglingReach(Reach):
    """Reach whose every step sleeps STEP_SECONDS in the distributed rank named by $STRAGGLING_RANK (torchrun's
    RANK), and none in the others: one slow rank among fast ones."""

    STEP_SECONDS = 0.05

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        if os.environ.get("RANK") == os.environ.get("STRAGGLING_RANK", ""):
            time.sleep(self.STEP_SECONDS)
        return super().step(action)


class HangingReach(Reach):
    """Reach whose 30th step hangs for good (sleeps: no step, no CPU), once: the first process to get there
    creates the file named by $HANGING_REACH_FLAG and hangs; every later one (the restarted worker) runs on."""

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.steps = getattr(self, "steps", 0) + 1
        if self.steps == 30 and first_to_create(os.environ["HANGING_REACH_FLAG"]):
            time.sleep(3600)
        return super().step(action)


class FailingReach(Reach):
    """Reach whose simulator fails on each env's 40th step: an error of the user's env, not of the trainer."""

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.steps = getattr(self, "steps", 0) + 1
        if self.steps == 40:
            raise RuntimeError("the simulator lost its state:\n  contact solver diverged")  # a message of lines
        return super().step(action)


class NotFiniteReach(Reach):
    """Reach whose reward is NaN on each env's 40th step: a simulator that broke without saying so."""

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.steps = getattr(self, "steps", 0) + 1
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, float("nan") if self.steps == 40 else reward, terminated, truncated, info


class UnreachableReach(Reach):
    """Reach whose simulator cannot be reached: `reset` fails."""

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        raise ConnectionError("cannot connect to the simulator")


class WrongShapeReach(Reach):
    """Reach whose `step` returns an observation of another shape than its observation space's."""

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        _, reward, terminated, truncated, info = super().step(action)
        return np.zeros(3, dtype=np.float32), reward, terminated, truncated, info


gymnasium.register("Reach-v0", entry_point=Reach, max_episode_steps=20)
gymnasium.register("CameraReach-v0", entry_point=CameraReach, max_episode_steps=20)
gymnasium.register("GoalReach-v0", entry_point=GoalReach, max_episode_steps=20)
gymnasium.register("RenderedCameraReach-v0", entry_point=RenderedCameraReach, max_episode_steps=20)
for kind in ("Gray", "Rgba", "Float", "None"):
    gymnasium.register(f"{kind}RenderReach-v0", entry_point=OddRenderReach, max_episode_steps=20,
                       kwargs={"render_as": kind.lower()})
gymnasium.register("UnrenderedReach-v0", entry_point=UnrenderedReach, max_episode_steps=20)
gymnasium.register("NestedDictObs-v0", entry_point=NestedDictObs, max_episode_steps=20)
gymnasium.register("MultiDiscreteActions-v0", entry_point=MultiDiscreteActions, max_episode_steps=20)
gymnasium.register("FloatImages-v0", entry_point=FloatImages, max_episode_steps=20)
for refused in (ChannelsFirstImages, ChannelsFirstCamera, IntegerBoxActions, EmptyObservations, EmptyActions):
    gymnasium.register(f"{refused.__name__}-v0", entry_point=refused, max_episode_steps=20)
gymnasium.register("SlowResetReach-v0", entry_point=SlowResetReach, max_episode_steps=20)
gymnasium.register("SlowStartReach-v0", entry_point=SlowStartReach, max_episode_steps=20)
gymnasium.register("CrashThenSlowStartReach-v0", entry_point=CrashThenSlowStartReach, max_episode_steps=20)
gymnasium.register("StragglingReach-v0", entry_point=StragglingReach, max_episode_steps=20)
gymnasium.register("HangingReach-v0", entry_point=HangingReach, max_episode_steps=20)
gymnasium.register("FailingReach-v0", entry_point=FailingReach, max_episode_steps=20)
gymnasium.register("NotFiniteReach-v0", entry_point=NotFiniteReach, max_episode_steps=20)
gymnasium.register("UnreachableReach-v0", entry_point=UnreachableReach, max_episode_steps=20)
gymnasium.register("WrongShapeReach-v0", entry_point=WrongShapeReach, max_episode_steps=20)
