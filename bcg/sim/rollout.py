"""The batched differentiable simulator: time-indexed state buffers, stepping, reverse pass, detach.

State has a time axis: substep ``s`` reads ``qpos[s], qvel[s]`` and writes ``qpos[s+1], qvel[s+1]``;
nothing is overwritten inside a window. The reverse pass is checkpointed per substep: for each substep,
from the last to the window start (or the last :meth:`Simulator.detach`), the substep's intermediate
quantities are recomputed from its stored input state and its kernels are differentiated in reverse
order (Taichi's ``kernel.grad`` for the nonlinear kernels, a hand-written adjoint for the linear
solve). Memory is therefore the state buffers only, whatever the window length.

The forward pass records a tape of typed entries (:mod:`bcg.sim.tape`), each with its forward and its
adjoint: substeps (with the simulator rows they ran on) and, with bundled contact gradients, the
copy-in, control copy and averaging of bundle rows, and holds of environments left out of a step. The
reverse pass (:mod:`bcg.sim.reverse`) runs the entries' adjoints backwards, one control step at a time.
"""

import dataclasses
import math
import warnings
from dataclasses import dataclass

import numpy as np
import taichi as ti

from bcg.sim import runtime
from bcg.sim.buffers import FieldsMixin
from bcg.sim.bundle import BundleConfig, BundleKernels, BundleSchedule
from bcg.sim.contact import ContactKernels
from bcg.sim.contact_config import ContactConfig, SelfContactConfig
from bcg.sim.dynamics import DynamicsKernels
from bcg.sim.inertia import InertiaKernels
from bcg.sim.integrator import IntegratorKernels
from bcg.sim.joint_limits import JointLimitConfig, limit_tables
from bcg.sim.kinematics import KinematicsKernels
from bcg.sim.model import (
    JNT_BALL,
    JNT_FREE,
    JNT_HINGE,
    JNT_SLIDE,
    Model,
    UnsupportedModelError,
    load_mjcf,
    unmodelled,
)
from bcg.sim.queries import QueriesMixin
from bcg.sim.reverse import ReversePassMixin
from bcg.sim.rows import RowScheduling
from bcg.sim.self_contact import SelfContactKernels, pair_tables
from bcg.sim.substep import SubstepKernels
from bcg.sim.tape import Hold, Substep, TapeEntry


@dataclass(frozen=True)
class SimConfig:
    """Simulator settings.

    Attributes:
        num_envs: parallel environments.
        dt: s, physics step (PD rate 1/dt).
        substeps: physics steps per control step.
        max_steps: control steps a window can hold before :meth:`Simulator.reset_window`.
        requires_grad: allocate gradient buffers and allow :meth:`Simulator.backward`.
        friction_velocity: rad/s, velocity scale of the smooth joint friction loss
            ``-frictionloss * tanh(qvel / friction_velocity)``.
        cpu_threads: on a CPU, how many of Taichi's pool threads share a loop over the rows
            (environments and bundle copies), each taking a block of consecutive rows. None (default):
            one per ``bcg.sim.rows.ROWS_PER_THREAD`` environments, at most the pool's
            ``cpu_max_num_threads``; fewer rows per thread lose more to the hand-over than they
            gain. 1: every loop runs on the launching thread, which is faster where another process
            keeps the other cores busy (training with its update worker). Ignored on a GPU.
    """

    num_envs: int = 1
    dt: float = 0.005
    substeps: int = 4
    max_steps: int = 32
    requires_grad: bool = True
    friction_velocity: float = 0.02
    cpu_threads: int | None = None

    def __post_init__(self):
        if self.cpu_threads is not None and (
            int(self.cpu_threads) != self.cpu_threads or self.cpu_threads < 1
        ):
            raise ValueError(
                f"SimConfig.cpu_threads must be None or a positive integer, got {self.cpu_threads!r}"
            )
        for name in ("num_envs", "substeps", "max_steps"):
            value = getattr(self, name)
            if int(value) != value or value < 1:
                raise ValueError(f"SimConfig.{name} must be a positive integer, got {value!r}")
        for name in ("dt", "friction_velocity"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"SimConfig.{name} must be a positive number, got {value!r}")


@ti.data_oriented
class Simulator(
    FieldsMixin,
    QueriesMixin,
    ReversePassMixin,
    SubstepKernels,
    KinematicsKernels,
    InertiaKernels,
    DynamicsKernels,
    IntegratorKernels,
    ContactKernels,
    SelfContactKernels,
    BundleKernels,
    BundleSchedule,
    RowScheduling,
):
    """Batched, differentiable reduced-coordinate simulator of a MuJoCo model.

    The class is assembled from one base per file, each the kernels of one part (kinematics, inertia,
    dynamics, integrator, contact, bundle, the substep, the reverse pass): the fused substep kernel
    calls every part's ``ti.func`` on one ``self``. The parts read the fields through the six groups of
    :mod:`bcg.sim.types`; the rest of ``self`` is sizes, settings and the tape.

    Args:
        source: MJCF path, XML string, or compiled ``mujoco.MjModel``.
        config: :class:`SimConfig`.
        actuated_joints: names of the hinge/slide joints driven by PD (default: all of them).
        kp, kd: PD gains per actuated joint (N m/rad, N m s/rad), default 0.
        effort_limit: torque limit per actuated joint (N m), default unlimited.
        contact: :class:`bcg.sim.contact_config.ContactConfig` for sphere-ground contact, or None.
        bundle: :class:`bcg.sim.bundle.BundleConfig` for bundled contact gradients (needs contact),
            or None.
        self_contact: :class:`bcg.sim.contact_config.SelfContactConfig` for penalty contact between
            two sets of the robot's capsules (e.g. its legs), or None.
        joint_limits: :class:`bcg.sim.joint_limits.JointLimitConfig` for the MJCF's joint ranges as
            a one-sided spring-damper, or None (the joints move past their ranges).
        warn_unmodelled: warn (``UserWarning``) about what of the MJCF the simulator leaves out by
            design: joint limits (without ``joint_limits``), actuators, the option timestep and integrator
            (:func:`bcg.sim.model.unmodelled`).
    """

    def __init__(
        self,
        source,
        config: SimConfig = SimConfig(),
        actuated_joints=None,
        kp=None,
        kd=None,
        effort_limit=None,
        contact: ContactConfig | None = None,
        bundle: BundleConfig | None = None,
        warn_unmodelled: bool = True,
        self_contact: SelfContactConfig | None = None,
        joint_limits: JointLimitConfig | None = None,
    ):
        if runtime.current() is None:
            runtime.init()
        self.fp = ti.f64 if runtime.current()[1] == "float64" else ti.f32
        self.np_fp = np.float64 if self.fp == ti.f64 else np.float32
        self._setup_rows(config)
        if isinstance(source, Model):
            raise TypeError(
                "pass an MJCF path, XML string or mujoco.MjModel (the simulator keeps MuJoCo's model)"
            )
        self.model, self.mjmodel = load_mjcf(source)
        m = self.model
        if m.nv == 0:
            raise UnsupportedModelError("the model has no joints (nv = 0): nothing to simulate")
        if warn_unmodelled and (notes := unmodelled(self.mjmodel, config.dt, joint_limits is not None)):
            warnings.warn("bcg.sim does not model " + "; ".join(notes), UserWarning, stacklevel=2)
        self.config = config
        self.num_envs, self.dt, self.substeps = config.num_envs, config.dt, config.substeps
        self.max_steps = config.max_steps
        self.nsub = config.max_steps * config.substeps
        self.nq, self.nv, self.nbody, self.njnt = m.nq, m.nv, m.nbody, m.njnt
        self.friction_velocity = config.friction_velocity
        self.ref_body = 1
        names = tuple(actuated_joints) if actuated_joints is not None else m.actuated_joints
        for name in names:
            if m.jnt_type[m.jnt_id(name)] not in (JNT_HINGE, JNT_SLIDE):
                raise ValueError(f"actuated joint {name!r} is not a hinge or slide joint (PD drives those)")
        if len(set(names)) != len(names):
            raise ValueError(f"actuated_joints lists a joint more than once: {names}")
        self.actuated_joints = names
        self.nu = len(names)
        self._setup_contact(contact, bundle)
        self._setup_self_contact(self_contact)
        self.joint_limits = joint_limits
        self._limit_tables = None if joint_limits is None else limit_tables(m, joint_limits)
        self._build_fields()
        self._upload_model(names, kp, kd, effort_limit)
        self._upload_limits()
        rowwise = [f for f in self._intermediates if f is not self.ground.impulse]
        self._grad_scalars = [f for f in rowwise if not isinstance(f, ti.MatrixField)]
        self._grad_vectors = [f for f in rowwise if isinstance(f, ti.MatrixField) and f.m == 1]
        self._grad_matrices = [f for f in rowwise if isinstance(f, ti.MatrixField) and f.m > 1]
        self._levels = []
        order = np.argsort(m.body_level[1:], kind="stable") + 1
        self.mdl.level_bodies.from_numpy(order.astype(np.int32))
        off = 0
        for lvl in range(1, int(m.body_level.max()) + 1):
            cnt = int(np.sum(m.body_level == lvl))
            self._levels.append((off, cnt))
            off += cnt
        self._quat_slices = [
            (j, int(m.jnt_qposadr[j]) + (3 if m.jnt_type[j] == JNT_FREE else 0))
            for j in range(m.njnt)
            if m.jnt_type[j] in (JNT_FREE, JNT_BALL)
        ]
        self._main_rows = np.arange(self.num_envs, dtype=np.int32)
        self._active_key = None
        self._row_params = [*self._params.values(), self.ground.friction]  # copied to a bundle's copies
        self._grad_params = list(self._params.values())
        self.reset_stats()
        qpos0 = np.broadcast_to(m.qpos0, (self.num_envs, self.nq))
        self.set_state(qpos0, np.zeros((self.num_envs, self.nv)))

    def _setup_contact(self, contact, bundle):
        self.contact, self.bundle = contact, bundle
        if bundle is not None and contact is None:
            raise ValueError("bundled contact gradients need contact (pass a ContactConfig)")
        if contact is not None:
            missing = [name for name in ("spheres", "radius") if getattr(contact, name) is None]
            if missing:
                raise ValueError(
                    f"ContactConfig.{' and '.join(missing)} not given: the simulator knows no robot's feet; "
                    "give spheres=((body, (x, y, z)), ...) and radius= (bcg.g1sim.make_g1 gives the G1's)"
                )
            self.spheres = contact.spheres
            self.sphere_radius = contact.radius
            for body, _ in self.spheres:
                self.model.body_id(body)  # raises a clear KeyError for an unknown body
            self.ncon = len(self.spheres)
            self.ncol = 3 * self.ncon
            self.nrhs = 1 + self.ncol
            self.iterations = contact.iterations
        else:
            self.ncon = self.ncol = self.nrhs = self.iterations = 0
        self._setup_bundles(bundle)
        self.num_rows = self.num_envs + self.pool_rows

    def _setup_self_contact(self, config):
        self.self_contact = config
        self.npair = self.nbp = 0
        if config is None:
            return
        if config.capsules_a is None or config.capsules_b is None:
            raise ValueError(
                "SelfContactConfig.capsules_a and capsules_b not given: the simulator knows no robot's "
                "legs (bcg.sim.self_contact.capsules_of reads an MJCF's; bcg.g1sim.make_g1 gives the G1's)"
            )
        for body, *_ in (*config.capsules_a, *config.capsules_b):
            self.model.body_id(body)  # raises a clear KeyError for an unknown body
        self._self_tables = pair_tables(self.model, config)
        self.npair, self.nbp = len(self._self_tables["pair_radius"]), len(self._self_tables["bp_reach"])

    def self_contact_force(self) -> np.ndarray:
        """The largest capsule-pair force of the last control step, N (N,): 0 where no pair touched;
        inside a bundle, the mean over its copies. Read it right after :meth:`step`: the reverse pass
        and :meth:`forward` recompute substeps and raise it to their forces."""
        if self.self_contact is None:
            raise RuntimeError("this simulator has no self-contact")
        f = self.selfc.force_max.to_numpy()
        out = f[: self.num_envs].copy()
        for b in self._bundles + self._closed:  # bundles open after the step or closed by it
            out[b["env"]] = f[b["first"] : b["first"] + self.bundle_size].mean()
        return out

    #: the SelfContactConfig fields that :meth:`set_self_contact` changes in place
    IN_PLACE_SELF_CONTACT = ("stiffness", "damping", "force_limit")

    def set_self_contact(self, **changes):
        """Change ``stiffness``, ``damping`` or ``force_limit`` of the self-contact in place between
        windows (a reverse pass recomputes its window's substeps with the settings of the moment;
        validated as :class:`SelfContactConfig` does; no recompilation): a simulator built with
        stiffness 0 computes the pairs without a force until a run's stage turns it on."""
        if self.self_contact is None:
            raise RuntimeError("this simulator has no self-contact: build it with self_contact=...")
        _check_in_place("set_self_contact", changes, self.IN_PLACE_SELF_CONTACT)
        self.self_contact = c = dataclasses.replace(self.self_contact, **changes)
        self.selfc.sc_stiffness[None], self.selfc.sc_damping[None] = c.stiffness, c.damping
        self.selfc.sc_limit[None] = c.force_limit

    def _upload_limits(self):
        if self.joint_limits is None:
            return
        t = self._limit_tables
        self.limits.lim_qadr.from_numpy(t["qadr"])
        for name in ("lo", "hi", "stiffness", "damping"):
            getattr(self.limits, "lim_" + name).from_numpy(t[name].astype(self.np_fp))

    def set_joint_limits(self, **changes):
        """Change the joint limits' ``stiffness`` or ``damping`` in place between windows (validated
        as :class:`JointLimitConfig` does; no recompilation): a simulator built with stiffness 0
        computes the limits without a force until a run's stage turns them on."""
        if self.joint_limits is None:
            raise RuntimeError("this simulator has no joint limits: build it with joint_limits=...")
        _check_in_place("set_joint_limits", changes, ("stiffness", "damping"))
        self.joint_limits = dataclasses.replace(self.joint_limits, **changes)
        self._limit_tables = limit_tables(self.model, self.joint_limits)
        self._upload_limits()

    def set_kappa(self, kappa: float):
        """Change the contact stiffness (and the default activation margin 4.6 / kappa) in place."""
        self.set_contact(kappa=float(kappa))

    #: the ContactConfig fields that :meth:`set_contact` changes in place (the others size the kernels)
    IN_PLACE_CONTACT = ("kappa", "activation_margin", "depth_correction", "ground_height")

    def set_contact(self, **changes):
        """Change ``kappa``, ``activation_margin``, ``depth_correction`` or ``ground_height`` of the
        contact settings in place (validated as :class:`ContactConfig` does; no recompilation)."""
        if self.contact is None:
            raise RuntimeError("this simulator has no contact")
        _check_in_place("set_contact", changes, self.IN_PLACE_CONTACT)
        self.contact = dataclasses.replace(self.contact, **changes)
        self.ground.con_kappa[None] = self.contact.kappa
        self.ground.con_margin[None] = self.contact.margin
        self.ground.con_dcorr[None] = self.contact.depth_correction
        self.ground.con_ground[None] = self.contact.ground_height

    def set_gravity(self, gravity):
        """Gravity vector, m/s^2 (3,) (a tilted gravity stands in for a slope)."""
        self.mdl.gravity[None] = [float(x) for x in gravity]

    # ------------------------------------------------------------------ state
    def set_state(self, qpos, qvel):
        """Start a new window from (qpos (N, nq), qvel (N, nv)); clears the window, the cut and any
        open bundle."""
        qpos = self._broadcast(qpos, self.nq, "set_state: qpos")
        qvel = self._broadcast(qvel, self.nv, "set_state: qvel")
        if not (np.all(np.isfinite(qpos)) and np.all(np.isfinite(qvel))):
            raise ValueError("set_state: qpos/qvel hold non-finite values")
        for j, start in self._quat_slices:
            norm = np.linalg.norm(qpos[:, start : start + 4], axis=1)
            if np.any(norm < 0.5):  # near zero: no rotation (finite differences move off unit norm)
                raise ValueError(
                    f"set_state: the quaternion of joint {self.model.jnt_names[j]!r} "
                    f"(qpos[{start}:{start + 4}]) "
                    f"has norm {norm.min():.4g}; give unit quaternions (w, x, y, z)"
                )
        self._write_rows(self.state.qpos, 0, qpos)
        self._write_rows(self.state.qvel, 0, qvel)
        self._t, self._cut = 0, 0
        self._tape = []
        self._clear_bundles()

    def _broadcast(self, values, width: int, what: str) -> np.ndarray:
        """``values`` as (num_envs, width) (one row for all environments or one per environment);
        ValueError naming ``what`` for another shape."""
        arr = np.asarray(values, dtype=self.np_fp)
        try:
            return np.broadcast_to(arr, (self.num_envs, width))
        except ValueError:
            raise ValueError(
                f"{what}: expected shape ({self.num_envs}, {width}) or ({width},), got {arr.shape}"
            ) from None

    def _write_rows(self, fld, t, values):
        """Write values (N, width) into the environments' rows of time slice t of a field."""
        width = fld.shape[2]
        arr = np.broadcast_to(np.asarray(values, self.np_fp), (self.num_envs, width))
        self._set_slice(fld, t, np.ascontiguousarray(arr))

    # Slices move between numpy and the (time, row, item) fields through small kernels: a whole
    # field's to_numpy() copies every substep of every row (megabytes) to read one slice.
    def _read_rows(self, fld, t, grad=False) -> np.ndarray:
        """Time slice t of a field (or of its gradient) for the environments' rows, (N, width)."""
        out = np.empty((self.num_envs, fld.shape[2]), self.np_fp)
        (self._get_grad_slice if grad else self._get_slice)(fld, t, out)
        return out

    def _read_block(self, fld, t0, t1, grad=False) -> np.ndarray:
        """Time slices t0 <= t < t1 of a field (or of its gradient), (t1 - t0, N, width)."""
        out = np.empty((max(t1 - t0, 0), self.num_envs, fld.shape[2]), self.np_fp)
        if len(out):
            self._get_block(fld, t0, out, grad)
        return out

    def _rows_to_numpy(self, fld) -> np.ndarray:
        """The environments' rows of a per-row field (row first: (rows, ...), scalar or vector)."""
        tail = tuple(fld.shape[1:]) + ((fld.n,) if isinstance(fld, ti.MatrixField) else ())
        out = np.empty((self.num_envs, *tail), self.np_fp)
        self._get_rows(fld, out)
        return out

    @ti.kernel
    def _get_rows(self, fld: ti.template(), out: ti.types.ndarray()):
        if ti.static(isinstance(fld, ti.MatrixField)):
            ti.loop_config(serialize=self._serial)
            for e, a in ti.ndrange(out.shape[0], out.shape[1]):
                v = fld[e, a]
                for k in ti.static(range(fld.n)):
                    out[e, a, k] = v[k]
        elif ti.static(len(fld.shape) == 2):
            ti.loop_config(serialize=self._serial)
            for e, a in ti.ndrange(out.shape[0], out.shape[1]):
                out[e, a] = fld[e, a]
        else:
            ti.loop_config(serialize=self._serial)
            for e, a, b in ti.ndrange(out.shape[0], out.shape[1], out.shape[2]):
                out[e, a, b] = fld[e, a, b]

    @ti.kernel
    def _get_slice(self, fld: ti.template(), t: ti.i32, out: ti.types.ndarray()):
        ti.loop_config(serialize=self._serial)
        for e, i in ti.ndrange(out.shape[0], out.shape[1]):
            out[e, i] = fld[t, e, i]

    @ti.kernel
    def _get_grad_slice(self, fld: ti.template(), t: ti.i32, out: ti.types.ndarray()):
        ti.loop_config(serialize=self._serial)
        for e, i in ti.ndrange(out.shape[0], out.shape[1]):
            out[e, i] = fld.grad[t, e, i]

    @ti.kernel
    def _set_grad_slice(self, fld: ti.template(), t: ti.i32, values: ti.types.ndarray()):
        ti.loop_config(serialize=self._serial)
        for e, i in ti.ndrange(values.shape[0], values.shape[1]):
            fld.grad[t, e, i] = values[e, i]

    @ti.kernel
    def _get_block(self, fld: ti.template(), t0: ti.i32, out: ti.types.ndarray(), grad: ti.template()):
        ti.loop_config(serialize=self._serial)
        for k, e, i in ti.ndrange(out.shape[0], out.shape[1], out.shape[2]):
            if ti.static(grad):
                out[k, e, i] = fld.grad[t0 + k, e, i]
            else:
                out[k, e, i] = fld[t0 + k, e, i]

    @ti.kernel
    def _copy_state(self, src: ti.i32, dst: ti.i32):
        ti.loop_config(serialize=self._serial)
        for e, i in ti.ndrange(self.num_rows, self.nq):
            self.state.qpos[dst, e, i] = self.state.qpos[src, e, i]
        ti.loop_config(serialize=self._serial)
        for e, i in ti.ndrange(self.num_rows, self.nv):
            self.state.qvel[dst, e, i] = self.state.qvel[src, e, i]

    @property
    def substep(self) -> int:
        """Substeps taken in the current window."""
        return self._t

    @property
    def qpos_now(self) -> np.ndarray:
        """Joint positions (N, nq) at the current substep (a copy)."""
        return self._read_rows(self.state.qpos, self._t)

    @property
    def qvel_now(self) -> np.ndarray:
        """Joint velocities (N, nv) at the current substep (a copy)."""
        return self._read_rows(self.state.qvel, self._t)

    def trajectory(self) -> tuple[np.ndarray, np.ndarray]:
        """(qpos (S+1, N, nq), qvel (S+1, N, nv)) of the window so far. Inside a bundle, only the
        control-step boundaries hold the bundle mean."""
        return self._read_block(self.state.qpos, 0, self._t + 1), self._read_block(
            self.state.qvel, 0, self._t + 1
        )

    def detach(self):
        """Cut the gradient here: the reverse pass stops at the current substep."""
        self._cut = self._t

    def reset_window(self):
        """Move the current state (bundle copies included) to the start of the buffers: a new window,
        gradients cut."""
        if self._t:
            self._copy_state(self._t, 0)
        shift = self._t
        self._t, self._cut = 0, 0
        self._tape = []
        self._shift_bundles(shift)

    # ------------------------------------------------------------------ stepping
    def _substep_ops_cached(self, s: int, c: int):
        """:meth:`_substep_ops` for (s, c), built once: looking up ~50 bound kernels costs about a
        sixth of a forward substep at 64 environments."""
        cache = self.__dict__.setdefault("_ops_cache", {})
        ops = cache.get((s, c))
        if ops is None:
            ops = cache[(s, c)] = self._substep_ops(s, c)
        return ops

    def _run(self, stages):
        for op, args, _ in stages:
            op(*args)

    def _run_adjoint(self, stages):
        for _op, _args, parts in reversed(stages):
            for kernel, kargs in reversed(parts):
                kernel.grad(*kargs)

    @ti.kernel
    def _set_slice(self, fld: ti.template(), c: ti.i32, values: ti.types.ndarray()):
        ti.loop_config(serialize=self._serial)
        for e, i in ti.ndrange(values.shape[0], values.shape[1]):
            fld[c, e, i] = values[e, i]

    def _write_control(self, fld, c, values, width, what):
        arr = self._broadcast(values, width, what)
        if not np.all(np.isfinite(arr)):
            bad = np.flatnonzero(~np.all(np.isfinite(arr), axis=1))
            raise ValueError(f"{what} holds non-finite values (environments {bad[:8].tolist()})")
        self._set_slice(fld, c, np.ascontiguousarray(arr))

    def step(self, ctrl=None, qfrc_applied=None, hold=None):
        """Advance one control step (``substeps`` physics steps) with PD targets ``ctrl`` (N, nu)
        held over the step, and optional applied joint forces (N, nv).

        ``hold`` (N,) bool: environments to leave out of this step. Their state stays where it is
        (every substep of the step holds it, and the reverse pass carries a gradient straight
        through), they take no contact and open no bundle, so they cost no simulation. For
        environments whose result nobody reads, e.g. an episode that has ended inside a window.
        An environment inside an open bundle is stepped all the same (its copies carry it)."""
        c = self._t // self.substeps
        if c >= self.max_steps:
            raise RuntimeError(
                f"the window holds {self.max_steps} control steps; call reset_window() or raise max_steps"
            )
        if ctrl is not None:
            self._write_control(self.state.ctrl, c, ctrl, max(self.nu, 1), "step: ctrl")
        if qfrc_applied is not None:
            self._write_control(self.state.qfrc_applied, c, qfrc_applied, self.nv, "step: qfrc_applied")
        s0 = self._t
        if self.contact is not None:
            self._clear_contact_stats()
        if self.npair:
            self._clear_self_contact_stats()
        in_bundle = {b["env"] for b in self._bundles}
        held = set()
        if hold is not None:
            hold = np.asarray(hold, bool).reshape(-1)
            if hold.shape != (self.num_envs,):
                raise ValueError(f"hold must be ({self.num_envs},) bool, got shape {hold.shape}")
            held = {int(e) for e in np.flatnonzero(hold)} - in_bundle
        nominal = np.array(
            [e for e in range(self.num_envs) if e not in in_bundle and e not in held], dtype=np.int32
        )
        if held:
            self._record(Hold(c=c, s=s0, envs=np.array(sorted(held), dtype=np.int32)))
        branch_rows = self._record_bundle_controls(c)
        rows = np.concatenate([nominal, branch_rows]).astype(np.int32)
        subs = [self._record(Substep(c=c, s=s0 + k, rows=rows, grad_rows=rows)) for k in range(self.substeps)]
        self._record_bundle_means(c, s0 + self.substeps)
        self._t = s0 + self.substeps
        self._close_bundles()
        if self.contact is not None:
            self._after_contact_step(c, s0, nominal, subs)
        self._noise_step += 1

    def _record(self, entry: TapeEntry):
        self._tape.append(entry)
        entry.forward(self)
        return entry

    def rollout(self, ctrl):
        """Run ``len(ctrl)`` control steps from the current state; ctrl is (T, N, nu).
        Returns (qpos (T+1, N, nq), qvel (T+1, N, nv)) at control-step boundaries."""
        start = self._t
        for c in ctrl:
            self.step(c)
        qpos, qvel = self.trajectory()
        return qpos[start :: self.substeps], qvel[start :: self.substeps]

    @ti.kernel
    def _hold_rows(self, s: ti.i32, n: ti.i32, envs: ti.types.ndarray()):
        # the held environments' state at substeps s + 1 .. s + n is their state at s
        ti.loop_config(serialize=self._serial)
        for k, i in ti.ndrange(envs.shape[0], self.nq):
            for j in range(1, n + 1):
                self.state.qpos[s + j, envs[k], i] = self.state.qpos[s, envs[k], i]
        ti.loop_config(serialize=self._serial)
        for k, i in ti.ndrange(envs.shape[0], self.nv):
            for j in range(1, n + 1):
                self.state.qvel[s + j, envs[k], i] = self.state.qvel[s, envs[k], i]


def _check_in_place(method: str, changes: dict, allowed: tuple) -> None:
    """ValueError unless ``changes`` names only the ``allowed`` fields, which ``method`` changes in
    place (the others size the compiled kernels)."""
    other = sorted(set(changes) - set(allowed))
    if other:
        raise ValueError(
            f"{method} changes {', '.join(allowed)} in place, not {', '.join(other)}: "
            "build a new simulator for those"
        )
