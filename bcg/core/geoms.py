"""MuJoCo geometry helpers that know no robot (the simulator may use them)."""

import mujoco
import numpy as np


def geom_capsule(model: mujoco.MjModel, gid: int) -> tuple[np.ndarray, np.ndarray, float]:
    """A capsule or sphere geom as (axis end, axis end, radius) in its body's frame (m; a sphere's
    two ends coincide). Any other geom type is refused with a ValueError that names it."""
    kind = model.geom_type[gid]
    if kind == mujoco.mjtGeom.mjGEOM_CAPSULE:
        half = float(model.geom_size[gid, 1])
    elif kind == mujoco.mjtGeom.mjGEOM_SPHERE:
        half = 0.0
    else:
        raise ValueError(
            f"capsules and spheres only: geom {model.geom(gid).name!r} is a {mujoco.mjtGeom(kind).name}"
        )
    rot = np.zeros(9)
    mujoco.mju_quat2Mat(rot, model.geom_quat[gid].astype(np.float64))
    axis, centre = rot.reshape(3, 3)[:, 2], model.geom_pos[gid].astype(np.float64)
    return centre - half * axis, centre + half * axis, float(model.geom_size[gid, 0])
