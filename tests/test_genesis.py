"""Genesis's FrankaLift (`envs.genesis_envs`), where the extra `genesis` is installed (it is outside dev: gigabytes):
built, stepped from its wrist camera, seeded, rendered, and its success reported."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from parallel_ppo.core.config import EnvConfig
from parallel_ppo.envs.batch import make_batch_env, reported_success

pytestmark = pytest.mark.skipif(importlib.util.find_spec("genesis") is None,
                                reason="the extra 'genesis' is not installed")
LIFT = "genesis/FrankaLift?horizon=4"


@pytest.mark.slow
@pytest.mark.timeout(900)  # a machine's first scene compiles Genesis's kernels
def test_franka_lift_steps_from_its_wrist_camera_and_reports_success():
    """Proprioception and the wrist camera's frames (uint8, drawn on the CPU, timed as render); the same seed places
    the cube alike, another elsewhere; a 4-step episode ends as a time limit and says the cube was not lifted."""
    env = make_batch_env(EnvConfig(id=LIFT, frame_size=40), 3, 0, 2, 1, render=True)
    try:
        layout = env.spaces.layout
        assert [(p.key, p.shape, p.image) for p in layout.parts] == [("proprio", (19,), False),
                                                                     ("wrist_image", (40, 40, 3), True)]
        assert env.actions.continuous and env.actions.n == 4
        first = env.reset()
        images, vector = layout.unpack(torch.from_numpy(first))
        frames = images["wrist_image"].numpy()
        assert frames.dtype == np.uint8 and frames.std() > 0, "drawn frames, not blank ones"
        cubes = [e.unwrapped.cube.get_pos().numpy() for e in env._env.envs]
        assert not np.allclose(cubes[0], cubes[1]), "each env's seed places its cube"
        for _ in range(4):
            obs, rewards, dones, cut = env.step(np.zeros((2, 4), np.float32))
            assert ((rewards > 0) & (rewards < 1 / 2.25)).all(), "a still, open hand above the cube: reaching only"
        assert dones.tolist() == [True, True] and sorted(cut) == [0, 1], "the horizon is a time limit"
        assert reported_success(env, 0) + reported_success(env, 1) == [0.0, 0.0]
        assert env.render_seconds > 0
        assert env.frame(0).shape == (256, 256, 3)
    finally:
        env.close()
    twin = make_batch_env(EnvConfig(id=LIFT, frame_size=40), 3, 0, 1, 1)
    try:
        twin.reset()
        assert np.allclose(twin._env.envs[0].unwrapped.cube.get_pos().numpy(), cubes[0]), "the same seed, the same cube"
    finally:
        twin.close()
