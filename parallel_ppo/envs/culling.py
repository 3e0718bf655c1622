"""Hand MuJoCo's renderer only the geoms a camera can see.

MuJoCo puts every geom in the scene it draws, and Mesa's software renderer transforms every vertex of every mesh
before it clips: robosuite's Panda arm and its pedestal are 0.17M triangles, most of them behind a wrist camera,
and they made most of the cost of its frame. A geom whose bounding box or sphere lies wholly outside the camera's
view frustum adds no pixel to the frame (nor a shadow or a reflection, which `gym_envs.fast_scene` turns off), so
hiding it while the frame is drawn leaves the frame the same to the bit. MuJoCo leaves out a geom whose colour is
wholly transparent, so hiding is a zero alpha for the frame.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np


def outside_view(model: Any, data: Any, camera: int, aspect: float) -> np.ndarray:
    """Indices of the geoms whose bounding box (MuJoCo's `geom_aabb`, in each geom's frame) or bounding sphere
    lies wholly outside the view of `camera` (a perspective camera set by its vertical field of view; none for
    another kind) drawn at `aspect` (width / height): beyond a side of its frustum, before its near plane or past
    its far one. Planes, which have no bounds, are never among them."""
    if model.cam_orthographic[camera] or np.any(model.cam_sensorsize[camera]):
        return np.empty(0, dtype=np.int64)
    tan_up = np.tan(np.deg2rad(model.cam_fovy[camera]) / 2)
    tan_right = tan_up * aspect
    extent = model.stat.extent
    # outward normals in the camera's frame (x right, y up, z backwards: it looks along -z), and each plane's
    # offset from the camera along its normal
    normals = np.array([[1, 0, tan_right], [-1, 0, tan_right], [0, 1, tan_up], [0, -1, tan_up], [0, 0, 1], [0, 0, -1]])
    normals = normals / np.linalg.norm(normals, axis=1, keepdims=True) @ data.cam_xmat[camera].reshape(3, 3).T
    offsets = np.array([0, 0, 0, 0, -model.vis.map.znear * extent, model.vis.map.zfar * extent])

    def beyond(points: np.ndarray, reach: np.ndarray) -> np.ndarray:
        """Whether a volume about each point, reaching `reach` along each plane's normal, is wholly outside one."""
        return ((points - data.cam_xpos[camera]) @ normals.T - offsets > reach).any(axis=1)

    rotations = data.geom_xmat.reshape(-1, 3, 3)  # each geom's box: its centre and half-sizes in the geom's frame
    centers = data.geom_xpos + np.einsum("gij,gj->gi", rotations, model.geom_aabb[:, :3])
    box_reach = np.einsum("gjp,gj->gp", np.abs(np.einsum("gij,pi->gjp", rotations, normals)), model.geom_aabb[:, 3:])
    outside = beyond(centers, box_reach) | beyond(data.geom_xpos, model.geom_rbound[:, None])  # box or sphere
    return np.flatnonzero(outside & (model.geom_rbound > 0))


@contextlib.contextmanager
def only_in_view(model: Any, data: Any, camera: int, aspect: float) -> Iterator[None]:
    """While it lasts, the geoms `camera` cannot see are transparent (MuJoCo's scene leaves them out)."""
    hidden = outside_view(model, data, camera, aspect)
    alpha = model.geom_rgba[hidden, 3].copy()
    model.geom_rgba[hidden, 3] = 0.0
    try:
        yield
    finally:
        model.geom_rgba[hidden, 3] = alpha
