"""HDF5 schema of a bcg motion clip (schema version 1).

One clip is one HDF5 file; every dataset sits at the root, with gzip compression (level 9, byte
shuffle) and float64 values, so the source frames round-trip bit for bit. ``T`` is the number of
frames, ``J`` the number of joints (29 for the G1), ``B`` the number of bodies (30: every body of the
model but the world body). Frame ``i`` is at time ``i / fps`` seconds.

Datasets (all frames in the world frame unless the name ends in ``_b``; z is up; quaternions are
``(w, x, y, z)``, scalar FIRST, as MuJoCo, mapping body-frame vectors to the world frame):

====================  ==========  =======  ============================================================
name                  shape       unit     content
====================  ==========  =======  ============================================================
joint_names           (J,)        -        UTF-8 joint names, the order of the joint axes below
body_names            (B,)        -        UTF-8 body names, the order of the body axes below
joint_pos             (T, J)      rad      hinge angles (source frames, verbatim)
joint_vel             (T, J)      rad/s    central finite differences of joint_pos
root_pos              (T, 3)      m        pelvis origin, world (source frames, verbatim)
root_quat             (T, 4)      -        pelvis orientation w, x, y, z (source values, verbatim)
root_lin_vel_w        (T, 3)      m/s      pelvis origin velocity, world frame
root_ang_vel_w        (T, 3)      rad/s    pelvis angular velocity, world frame
root_ang_vel_b        (T, 3)      rad/s    the same in the pelvis frame (MuJoCo free-joint qvel[3:6])
body_pos              (T, B, 3)   m        body origins, world (MuJoCo xpos)
body_quat             (T, B, 4)   -        body orientations w, x, y, z, world (MuJoCo xquat)
body_lin_vel_w        (T, B, 3)   m/s      body origin velocities, world frame
====================  ==========  =======  ============================================================

Velocities are central finite differences over ``1 / fps`` (second-order one-sided differences at
the source's first and last frame only: a window cut from a longer take uses the neighbouring source
frames). Angular velocity comes from the log map of the relative rotation between the neighbouring
frames, ``w_w(t) = log(q(t+1) q(t-1)*) / (2 dt)``, and ``w_b = R(q(t))^T w_w``. So MuJoCo's
``qvel`` of a frame is ``[root_lin_vel_w, root_ang_vel_b, joint_vel]``. Body poses are MuJoCo's
forward kinematics (``mj_kinematics``) of the G1 model in ``bcg/assets/unitree_g1/g1.xml``.

The root quaternion is the source's, only reordered from x, y, z, w to w, x, y, z; its norm differs
from 1 by the source's rounding (about 1e-6), and readers normalise it where they need a rotation.

Root attributes:

====================  ========  ==============================================================
name                  type      content
====================  ========  ==============================================================
schema_version        int       1
fps                   float     frames per second (30.0 for LAFAN1)
quat_convention       str       "wxyz" (scalar first, body to world)
source_file           str       file name of the source take
source_sha256         str       sha256 of the whole source file
source_frame_start    int       first source frame kept (0-based, inclusive)
source_frame_end      int       end of the kept range (exclusive): T = end - start
spikes_fixed          int (n,2) (source frame, joint index) of each repaired spike; (0, 2) if none
spikes_original       float(n,) the source values that the repair replaced, rad
spike_threshold       float     rad, the detector's threshold (see :mod:`bcg.motion.spikes`)
velocity_method       str       how the velocities were computed (one line)
licence               str       licence of the motion content
attribution           str       who made the motion content
====================  ========  ==============================================================

Readers resolve joints and bodies by their names, never by position.
"""

from __future__ import annotations

SCHEMA_VERSION = 1
QUAT_CONVENTION = "wxyz"

#: name -> (shape with symbolic axes T, J, B, description with unit)
DATASETS: dict[str, tuple[tuple, str]] = {
    "joint_pos": (("T", "J"), "hinge angles, rad"),
    "joint_vel": (("T", "J"), "hinge velocities, rad/s"),
    "root_pos": (("T", 3), "root position, m, world"),
    "root_quat": (("T", 4), "root orientation, w x y z"),
    "root_lin_vel_w": (("T", 3), "root linear velocity, m/s, world"),
    "root_ang_vel_w": (("T", 3), "root angular velocity, rad/s, world"),
    "root_ang_vel_b": (("T", 3), "root angular velocity, rad/s, root frame"),
    "body_pos": (("T", "B", 3), "body positions, m, world"),
    "body_quat": (("T", "B", 4), "body orientations, w x y z, world"),
    "body_lin_vel_w": (("T", "B", 3), "body linear velocities, m/s, world"),
}
NAME_DATASETS = ("joint_names", "body_names")

#: name -> python type (after conversion from HDF5)
ATTRIBUTES: dict[str, type] = {
    "schema_version": int,
    "fps": float,
    "quat_convention": str,
    "source_file": str,
    "source_sha256": str,
    "source_frame_start": int,
    "source_frame_end": int,
    "spike_threshold": float,
    "velocity_method": str,
    "licence": str,
    "attribution": str,
}
ARRAY_ATTRIBUTES = ("spikes_fixed", "spikes_original")

VELOCITY_METHOD = (
    "central finite differences over 1/fps (one-sided second order at the source's first and last "
    "frame); angular velocity from log(q(t+1) q(t-1)*)/(2 dt), body frame = R(q)^T world"
)

MIN_FRAMES = 3  # the fewest frames that central differences and interpolation need
