"""Motion clips for the learner, the evaluation and the robot.

Example::

    clip = MotionClip.load("run")                   # motions/run.h5 of this repository
    ref = clip.sample(np.array([0.0, 0.51]))        # MotionState, arrays (2, ...)
    fut = clip.sample_future(t, steps=(1, 2, 3))    # arrays (*t.shape, 3, ...)
    t0 = clip.random_phase(np.random.default_rng(0), 64)

Joints and bodies are resolved by name against the model, never by position: a file whose joint or
body order differs from the model's is reordered on loading, and a file that lacks one of the
model's names, or holds a name the model does not know, is refused.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import mujoco
import numpy as np

from bcg.core import g1
from bcg.core.rotations import quat_normalize, quat_slerp
from bcg.motion import io, kinematics
from bcg.motion.errors import MotionFileError

#: The folder of the clips shipped with the project; a bare name like "run" means MOTIONS_DIR/run.h5.
MOTIONS_DIR = Path(__file__).resolve().parents[2] / "motions"
KEY_BODY_NAMES: tuple[str, ...] = tuple(name for name, _, _ in g1.KEY_BODIES)


@dataclass(frozen=True)
class MotionState:
    """Reference state at a batch of times; every array has the batch shape ``*`` in front.

    Joints are in :data:`g1.JOINT_NAMES` order, bodies in the model's body-id order without the
    world body (:attr:`MotionClip.body_names`), key bodies in :data:`g1.KEY_BODIES` order.
    Quaternions are w, x, y, z (body to world).

    Attributes:
        root_pos: m (*, 3), world.
        root_quat: (*, 4).
        root_lin_vel_w: m/s (*, 3), world frame.
        root_ang_vel_w: rad/s (*, 3), world frame.
        root_ang_vel_b: rad/s (*, 3), root frame (MuJoCo free-joint qvel[3:6]).
        joint_pos: rad (*, 29).
        joint_vel: rad/s (*, 29).
        body_pos: m (*, B, 3), world.
        body_quat: (*, B, 4), world.
        body_lin_vel_w: m/s (*, B, 3), world frame.
        key_body_pos: m (*, 5, 3), world (the head is a fixed point on torso_link).
    """

    root_pos: np.ndarray
    root_quat: np.ndarray
    root_lin_vel_w: np.ndarray
    root_ang_vel_w: np.ndarray
    root_ang_vel_b: np.ndarray
    joint_pos: np.ndarray
    joint_vel: np.ndarray
    body_pos: np.ndarray
    body_quat: np.ndarray
    body_lin_vel_w: np.ndarray
    key_body_pos: np.ndarray


_SNAP = 1e-9  # frames; sample times this close to a frame time are taken as that frame
_QUATERNION_FIELDS = ("root_quat", "body_quat")
_STORED_FIELDS = tuple(f.name for f in dataclasses.fields(MotionState) if f.name != "key_body_pos")
_VELOCITY_FIELDS = tuple(name for name in _STORED_FIELDS if "_vel" in name)


class MotionClip:
    """A motion clip resolved against a G1 model; build it with :meth:`load`.

    Attributes:
        path: the file read.
        fps: frames per second; dt: s between frames.
        num_frames: T; duration: s, time of the last frame, (T - 1) / fps.
        joint_names: the model's joint order (= :data:`g1.JOINT_NAMES`).
        body_names: the model's body order, without the world body.
        frames: every stored frame as a :class:`MotionState` with batch shape (T,), in model order.
        attrs: the file's attributes (source, frame range, licence, ...).
        content_hash: sha256 of the stored arrays (:func:`bcg.motion.io.content_hash`).
        file_joint_order_matches / file_body_order_matches: whether the file already had the
            model's order (if not, it was reordered by name).
        lead_in: s of lead-in in front of the stored frames (:meth:`with_lead_in`), 0 for none.
    """

    def __init__(self, path: Path, datasets: dict, attrs: dict, model: mujoco.MjModel):
        self.path = path
        self.attrs = attrs
        self.fps = float(attrs["fps"])
        self.dt = 1.0 / self.fps
        self.content_hash = io.content_hash(datasets, self.fps)
        self.joint_names = g1.JOINT_NAMES
        self.body_names = kinematics.model_body_names(model)
        g1.joint_qpos_adr(model, self.joint_names)  # the model must hold every joint
        joint_index = _resolve(path, "joint", datasets["joint_names"], self.joint_names)
        body_index = _resolve(path, "body", datasets["body_names"], self.body_names)
        self.file_joint_order_matches = bool(np.array_equal(joint_index, np.arange(len(joint_index))))
        self.file_body_order_matches = bool(np.array_equal(body_index, np.arange(len(body_index))))
        fields = {}
        for name in _STORED_FIELDS:
            value = datasets[name]
            if name.startswith("joint_"):
                value = value[:, joint_index]
            elif name.startswith("body_"):
                value = value[:, body_index]
            fields[name] = value
        key_parent = np.array([self.body_names.index(body) for _, body, _ in g1.KEY_BODIES])
        self._key_parent = key_parent
        self._key_offset = np.array([offset for _, _, offset in g1.KEY_BODIES], dtype=float)
        fields["key_body_pos"] = self._key_positions(fields["body_pos"], fields["body_quat"])
        self.frames = MotionState(**fields)
        self.num_frames = len(fields["joint_pos"])
        self.duration = (self.num_frames - 1) * self.dt
        self._qpos_adr = g1.joint_qpos_adr(model)
        self._dof_adr = g1.joint_dof_adr(model)
        free = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, g1.FREE_JOINT)
        self._free_qpos = int(model.jnt_qposadr[free])
        self._free_dof = int(model.jnt_dofadr[free])
        self._qpos0 = model.qpos0.copy()
        self._nv = model.nv
        self.lead_in = 0.0  # s, see with_lead_in

    @classmethod
    def load(cls, path_or_name: str | Path, model: mujoco.MjModel | None = None) -> MotionClip:
        """Read a clip file and resolve it against ``model``.

        Args:
            path_or_name: a path to a .h5 file, or a bare name ("run") for ``motions/<name>.h5``.
            model: compiled G1 model; default ``g1.load_model(collisions="none", floor=False)``.

        Raises:
            MotionFileError: missing or malformed file, or names that do not match the model.
        """
        path = resolve_path(path_or_name)
        datasets, attrs = io.read_clip(path)
        model = model if model is not None else g1.load_model(collisions="none", floor=False)
        return cls(path, datasets, attrs, model)

    def with_lead_in(self, seconds: float) -> MotionClip:
        """This clip with a lead-in of ``seconds`` (rounded to an even number of frames) in front.

        The lead-in starts at rest on the first frame and plays the clip's beginning with a playback
        rate that ramps linearly from 0 to 1: clip time tau(t) = t^2 / (2 L) for t < L, every velocity
        scaled by the rate t / L, then the clip from tau = L / 2 on, frame for frame, so the result
        lasts ``L / 2`` longer. A robot that starts still (``bcg.robot.run``) then accelerates into
        a clip that leaves at speed (Run's first frame moves at 2 m/s) instead of chasing it. The
        content hash stays the source clip's: the lead-in is a training setting
        (``env.clip_lead_in``), stored with the policy, not another motion.
        """
        if not (np.isfinite(seconds) and seconds >= 0.0):
            raise ValueError(f"a lead-in must be finite seconds >= 0, got {seconds}")
        half = int(round(seconds * self.fps / 2.0))  # clip frames the lead-in plays
        if half == 0:
            return self
        if self.lead_in > 0.0:
            raise ValueError("this clip already has a lead-in")
        if half >= self.num_frames - 1:  # the ramp plays clip time [0, L / 2)
            raise ValueError(
                f"a {seconds:g} s lead-in plays {half * self.dt:.2f} s of the clip, "
                f"its whole {self.duration:.2f} s or more"
            )
        length = 2 * half * self.dt  # L, s
        t = np.arange(2 * half) * self.dt
        ramp = self.sample(t * t / (2.0 * length))
        rate = t / length
        fields = {}
        for name in _STORED_FIELDS + ("key_body_pos",):
            value = getattr(ramp, name)
            if name in _VELOCITY_FIELDS:
                value = value * rate.reshape((-1,) + (1,) * (value.ndim - 1))
            fields[name] = np.concatenate([value, getattr(self.frames, name)[half:]])
        out = copy.copy(self)
        out.frames = MotionState(**fields)
        out.num_frames = len(fields["joint_pos"])
        out.duration = (out.num_frames - 1) * self.dt
        out.lead_in = length
        return out

    def sample(self, times, still_after_end: bool = False) -> MotionState:
        """Reference state at arbitrary times (s), any shape ``*``.

        Linear interpolation between the two neighbouring frames (slerp for quaternions); times are
        clamped to [0, duration]. At a frame time (within 1e-9 frame) the stored frame is returned
        bit for bit. With ``still_after_end`` a time past the last frame gives the last frame held
        still (every velocity 0): a lead-out on which a policy learns to stop.
        """
        times = np.asarray(times, dtype=float)
        position = np.clip(times * self.fps, 0.0, self.num_frames - 1)
        # i / fps * fps can miss i by an ulp; snap so that frame times give the frames exactly
        nearest = np.round(position)
        position = np.where(np.abs(position - nearest) < _SNAP, nearest, position)
        index = np.minimum(np.floor(position).astype(np.int64), self.num_frames - 2)
        alpha = position - index
        fields = {}
        for name in _STORED_FIELDS:
            value = getattr(self.frames, name)
            v0, v1 = value[index], value[index + 1]
            a = alpha.reshape(alpha.shape + (1,) * (value.ndim - 1))
            if name in _QUATERNION_FIELDS:
                fields[name] = quat_slerp(v0, v1, a[..., 0])
            else:
                fields[name] = np.where(a == 0.0, v0, np.where(a == 1.0, v1, (1.0 - a) * v0 + a * v1))
        fields["key_body_pos"] = self._key_positions(fields["body_pos"], fields["body_quat"])
        if still_after_end:
            after = times * self.fps > self.num_frames - 1 + _SNAP
            for name in _VELOCITY_FIELDS:
                value = fields[name]
                mask = after.reshape(after.shape + (1,) * (value.ndim - after.ndim))
                fields[name] = np.where(mask, 0.0, value)
        return MotionState(**fields)

    def sample_future(
        self, times, steps=(1, 2, 3), dt: float = g1.CONTROL_DT, still_after_end: bool = False
    ) -> MotionState:
        """Reference states at ``times + k * dt`` for each k in ``steps``; arrays (*, len(steps), ...)."""
        times = np.asarray(times, dtype=float)
        offsets = np.asarray(steps, dtype=float) * dt
        return self.sample(times[..., None] + offsets, still_after_end)

    def random_phase(
        self, rng: np.random.Generator, n: int, horizon: float = 3 * g1.CONTROL_DT
    ) -> np.ndarray:
        """Start times (n,) in s, uniform on [0, duration - horizon], for reference state
        initialisation; ``horizon`` (s) leaves room for the future frames of the observation."""
        if horizon >= self.duration:
            raise ValueError(f"horizon {horizon} s leaves no room in a {self.duration:.3f} s clip")
        return rng.uniform(0.0, self.duration - horizon, size=n)

    def qpos(self, state: MotionState) -> np.ndarray:
        """MuJoCo qpos (*, nq) of a sampled state (root quaternion normalised)."""
        batch = state.joint_pos.shape[:-1]
        qpos = np.broadcast_to(self._qpos0, batch + self._qpos0.shape).copy()
        qpos[..., self._free_qpos : self._free_qpos + 3] = state.root_pos
        qpos[..., self._free_qpos + 3 : self._free_qpos + 7] = quat_normalize(state.root_quat)
        qpos[..., self._qpos_adr] = state.joint_pos
        return qpos

    def qvel(self, state: MotionState) -> np.ndarray:
        """MuJoCo qvel (*, nv) of a sampled state: root linear velocity in the world frame, root
        angular velocity in the root frame, joint velocities."""
        batch = state.joint_pos.shape[:-1]
        qvel = np.zeros(batch + (self._nv,))
        qvel[..., self._free_dof : self._free_dof + 3] = state.root_lin_vel_w
        qvel[..., self._free_dof + 3 : self._free_dof + 6] = state.root_ang_vel_b
        qvel[..., self._dof_adr] = state.joint_vel
        return qvel

    def _key_positions(self, body_pos: np.ndarray, body_quat: np.ndarray) -> np.ndarray:
        return kinematics.point_positions(body_pos, body_quat, self._key_parent, self._key_offset)


def resolve_path(path_or_name: str | Path) -> Path:
    """A bare name without suffix or folder ("run") means ``MOTIONS_DIR/<name>.h5``."""
    text = str(path_or_name)
    if "/" not in text and "\\" not in text and not text.endswith(".h5"):
        return MOTIONS_DIR / f"{text}.h5"
    return Path(path_or_name)


def _resolve(path: Path, kind: str, file_names: tuple[str, ...], model_names: tuple[str, ...]) -> np.ndarray:
    """Index into the file's axis for each model name; refuses unknown and missing names."""
    unknown = [n for n in file_names if n not in model_names]
    if unknown:
        raise MotionFileError(f"{path}: unknown {kind} name(s) {', '.join(unknown)} (not in the G1 model)")
    missing = [n for n in model_names if n not in file_names]
    if missing:
        raise MotionFileError(f"{path}: the file lacks the model's {kind}(s) {', '.join(missing)}")
    return np.array([file_names.index(n) for n in model_names])
