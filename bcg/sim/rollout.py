"""The batched differentiable simulator: time-indexed state buffers, stepping, reverse pass, detach.

State has a time axis: substep ``s`` reads ``qpos[s], qvel[s]`` and writes ``qpos[s+1], qvel[s+1]``;
nothing is overwritten inside a window. The reverse pass is checkpointed per substep: for each substep,
from the last to the window start (or the last :meth:`Simulator.detach`), the substep's intermediate
quantities are recomputed from its stored input state and its kernels are differentiated in reverse
order (Taichi's ``kernel.grad`` for the nonlinear kernels, a hand-written adjoint for the linear
solve). Memory is therefore the state buffers only, whatever the window length.
"""

from dataclasses import dataclass, field
from pathlib import Path

import mujoco
import numpy as np
import taichi as ti

from bcg.sim import runtime
from bcg.sim.dynamics import DynamicsKernels
from bcg.sim.integrator import IntegratorKernels
from bcg.sim.model import JNT_FREE, Model, dof_ancestor_lists, load_mjcf, subtree_lists


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
    """

    num_envs: int = 1
    dt: float = 0.005
    substeps: int = 4
    max_steps: int = 32
    requires_grad: bool = True
    friction_velocity: float = 0.02


@dataclass
class Gradients:
    """Gradients of a loss with respect to the window's inputs (numpy arrays).

    Attributes:
        qpos: (N, nq) at the window start (or the last detach).
        qvel: (N, nv) likewise.
        ctrl: (T, N, nu) PD targets of each control step of the window.
        qfrc_applied: (T, N, nv) applied joint forces of each control step.
        params: model parameters by name, e.g. ``body_mass (N, nbody)``, ``kp (N, nu)``.
    """

    qpos: np.ndarray
    qvel: np.ndarray
    ctrl: np.ndarray
    qfrc_applied: np.ndarray
    params: dict = field(default_factory=dict)


_RANDOMISED = (
    "body_mass",
    "body_ipos",
    "body_inertia",
    "dof_armature",
    "dof_damping",
    "dof_frictionloss",
    "kp",
    "kd",
)


@ti.data_oriented
class Simulator(DynamicsKernels, IntegratorKernels):
    """Batched, differentiable reduced-coordinate simulator of a MuJoCo model.

    Args:
        source: MJCF path, XML string, compiled ``mujoco.MjModel`` or :class:`Model`.
        config: :class:`SimConfig`.
        actuated_joints: names of the hinge/slide joints driven by PD (default: all of them).
        kp, kd: PD gains per actuated joint (N m/rad, N m s/rad), default 0.
        effort_limit: torque limit per actuated joint (N m), default unlimited.
    """

    def __init__(
        self,
        source,
        config: SimConfig = SimConfig(),
        actuated_joints=None,
        kp=None,
        kd=None,
        effort_limit=None,
    ):
        if runtime.current() is None:
            runtime.init()
        self.fp = ti.f64 if runtime.current()[1] == "float64" else ti.f32
        self.np_fp = np.float64 if self.fp == ti.f64 else np.float32
        if isinstance(source, Model):
            self.model, self.mjmodel = source, None
        else:
            self.model, self.mjmodel = load_mjcf(source)
        m = self.model
        self.config = config
        self.num_envs, self.dt, self.substeps = config.num_envs, config.dt, config.substeps
        self.max_steps = config.max_steps
        self.nsub = config.max_steps * config.substeps
        self.nq, self.nv, self.nbody, self.njnt = m.nq, m.nv, m.nbody, m.njnt
        self.friction_velocity = config.friction_velocity
        self.ref_body = 1
        names = tuple(actuated_joints) if actuated_joints is not None else m.actuated_joints
        self.actuated_joints = names
        self.nu = len(names)
        self._build_fields()
        self._upload_model(names, kp, kd, effort_limit)
        self._t = 0  # current substep in the window
        self._cut = 0  # backward stops here
        self._levels = []
        order = np.argsort(m.body_level[1:], kind="stable") + 1
        self.level_bodies.from_numpy(order.astype(np.int32))
        off = 0
        for lvl in range(1, int(m.body_level.max()) + 1):
            cnt = int(np.sum(m.body_level == lvl))
            self._levels.append((off, cnt))
            off += cnt
        qpos0 = np.broadcast_to(m.qpos0, (self.num_envs, self.nq))
        self.set_state(qpos0, np.zeros((self.num_envs, self.nv)))

    # ------------------------------------------------------------------ construction
    def _build_fields(self):
        n, nb, nv, nq, nj, fp = self.num_envs, self.nbody, self.nv, self.nq, self.njnt, self.fp
        grad = self.config.requires_grad
        nu = max(self.nu, 1)
        sub_s, ctl = self.nsub + 2, self.max_steps  # the last slot is scratch for kinematics queries
        v3 = lambda shape, g=grad: ti.Vector.field(3, fp, shape=shape, needs_grad=g)  # noqa: E731
        sc = lambda shape, g=grad: ti.field(fp, shape=shape, needs_grad=g)  # noqa: E731
        i32 = lambda shape: ti.field(ti.i32, shape=shape)  # noqa: E731
        # model (static)
        self.body_parentid, self.body_jntadr = i32(nb), i32(nb)
        self.body_dofadr, self.body_dofnum = i32(nb), i32(nb)
        self.body_pos = v3(nb, False)
        self.body_quat = ti.Vector.field(4, fp, shape=nb)
        self.body_iquat = ti.Vector.field(4, fp, shape=nb)
        self.jnt_type, self.jnt_qposadr, self.jnt_dofadr = i32(nj), i32(nj), i32(nj)
        self.jnt_axis, self.jnt_pos = v3(nj, False), v3(nj, False)
        self.dof_bodyid, self.dof_jntid, self.dof_act = i32(nv), i32(nv), i32(nv)
        self.dof_sdot = sc(nv, False)
        self.qpos0 = sc(nq, False)
        self.gravity = ti.Vector.field(3, fp, shape=(), needs_grad=grad)
        self.level_bodies = i32(nb - 1)
        sub_start, sub_items = subtree_lists(self.model)
        anc_start, anc_items = dof_ancestor_lists(self.model)
        self.subtree_start, self.subtree_items = i32(len(sub_start)), i32(len(sub_items))
        self.subtree_start.from_numpy(sub_start)
        self.subtree_items.from_numpy(sub_items)
        pi = np.repeat(np.arange(nv), np.diff(anc_start)).astype(np.int32)
        pj = anc_items.astype(np.int32)
        self.npairs = len(pi)
        self.pair_i, self.pair_j = i32(self.npairs), i32(self.npairs)
        self.pair_i.from_numpy(pi)
        self.pair_j.from_numpy(pj)
        self.act_dof, self.act_qadr = i32(nu), i32(nu)
        self.effort_limit = sc(nu, False)
        # model (per environment: domain randomisation)
        self.body_mass = sc((n, nb))
        self.body_ipos, self.body_inertia = v3((n, nb)), v3((n, nb))
        self.dof_armature, self.dof_damping, self.dof_frictionloss = sc((n, nv)), sc((n, nv)), sc((n, nv))
        self.kp, self.kd = sc((n, nu)), sc((n, nu))
        # state and control (time-indexed)
        self.qpos, self.qvel = sc((sub_s, n, nq)), sc((sub_s, n, nv))
        self.ctrl, self.qfrc_applied = sc((ctl, n, nu)), sc((ctl, n, nv))
        # intermediates (recomputed per substep)
        self.xpos, self.xanchor, self.xaxis = v3((n, nb)), v3((n, nb)), v3((n, nb))
        self.xquat = ti.Vector.field(4, fp, shape=(n, nb), needs_grad=grad)
        self.xmat = ti.Matrix.field(3, 3, fp, shape=(n, nb), needs_grad=grad)
        self.cdof_ang, self.cdof_lin = v3((n, nv)), v3((n, nv))
        self.cvel_ang, self.cvel_lin, self.cacc_ang, self.cacc_lin = (v3((n, nb)) for _ in range(4))
        self.body_m, self.crb_m = sc((n, nb)), sc((n, nb))
        self.body_h, self.crb_h = v3((n, nb)), v3((n, nb))
        self.body_rot_inertia = ti.Matrix.field(3, 3, fp, shape=(n, nb), needs_grad=grad)
        self.crb_rot_inertia = ti.Matrix.field(3, 3, fp, shape=(n, nb), needs_grad=grad)
        self.dof_f_ang, self.dof_f_lin = v3((n, nv)), v3((n, nv))
        self.mass = sc((n, nv, nv))
        self.cfrc_ang, self.cfrc_lin, self.sub_frc_ang, self.sub_frc_lin = (v3((n, nb)) for _ in range(4))
        self.qfrc_bias, self.qfrc_total, self.qacc = sc((n, nv)), sc((n, nv)), sc((n, nv))
        self.act_force = sc((n, nu))
        self.chol = sc((n, nv, nv), False)
        self.rhs, self.rhs_bar = sc((n, nv), False), sc((n, nv), False)
        self._intermediates = [
            self.xpos, self.xanchor, self.xaxis, self.xquat, self.xmat, self.cdof_ang, self.cdof_lin,
            self.cvel_ang, self.cvel_lin, self.cacc_ang, self.cacc_lin, self.body_m, self.crb_m, self.body_h,
            self.crb_h, self.body_rot_inertia, self.crb_rot_inertia, self.dof_f_ang, self.dof_f_lin, self.mass,
            self.cfrc_ang, self.cfrc_lin, self.sub_frc_ang, self.sub_frc_lin, self.qfrc_bias, self.qfrc_total,
            self.qacc, self.act_force,
        ]  # fmt: skip
        self._params = {
            "body_mass": self.body_mass, "body_ipos": self.body_ipos, "body_inertia": self.body_inertia,
            "dof_armature": self.dof_armature, "dof_damping": self.dof_damping,
            "dof_frictionloss": self.dof_frictionloss, "kp": self.kp, "kd": self.kd,
        }  # fmt: skip

    def _upload_model(self, names, kp, kd, effort_limit):
        m = self.model
        f = self.np_fp
        self.body_parentid.from_numpy(m.body_parentid)
        self.body_jntadr.from_numpy(m.body_jntadr)
        self.body_dofadr.from_numpy(np.maximum(m.body_dofadr, 0).astype(np.int32))
        self.body_dofnum.from_numpy(m.body_dofnum)
        self.body_pos.from_numpy(m.body_pos.astype(f))
        self.body_quat.from_numpy(m.body_quat.astype(f))
        self.body_iquat.from_numpy(m.body_iquat.astype(f))
        self.jnt_type.from_numpy(m.jnt_type)
        self.jnt_qposadr.from_numpy(m.jnt_qposadr)
        self.jnt_dofadr.from_numpy(m.jnt_dofadr)
        self.jnt_axis.from_numpy(m.jnt_axis.astype(f))
        self.jnt_pos.from_numpy(m.jnt_pos.astype(f))
        self.dof_bodyid.from_numpy(m.dof_bodyid)
        self.dof_jntid.from_numpy(m.dof_jntid)
        jt = m.jnt_type[m.dof_jntid]
        local = np.arange(m.nv) - m.jnt_dofadr[m.dof_jntid]
        self.dof_sdot.from_numpy(np.where((jt == JNT_FREE) & (local < 3), 0.0, 1.0).astype(f))
        self.qpos0.from_numpy(m.qpos0.astype(f))
        self.gravity[None] = m.gravity.tolist()
        jid = [m.jnt_id(j) for j in names]
        act_dof = np.array([m.jnt_dofadr[j] for j in jid] or [0], dtype=np.int32)
        self.act_dof.from_numpy(act_dof)
        self.act_qadr.from_numpy(np.array([m.jnt_qposadr[j] for j in jid] or [0], dtype=np.int32))
        dof_act = -np.ones(m.nv, dtype=np.int32)
        dof_act[act_dof[: self.nu]] = np.arange(self.nu)
        self.dof_act.from_numpy(dof_act)
        nu = max(self.nu, 1)
        lim = np.full(nu, 1e30) if effort_limit is None else np.broadcast_to(effort_limit, (nu,))
        self.effort_limit.from_numpy(np.asarray(lim, dtype=f))
        self.set_params(
            body_mass=m.body_mass,
            body_ipos=m.body_ipos,
            body_inertia=m.body_inertia,
            dof_armature=m.dof_armature,
            dof_damping=m.dof_damping,
            dof_frictionloss=m.dof_frictionloss,
            kp=np.zeros(nu) if kp is None else kp,
            kd=np.zeros(nu) if kd is None else kd,
        )
        self.ctrl.fill(0)
        self.qfrc_applied.fill(0)

    # ------------------------------------------------------------------ parameters and state
    def set_params(self, **values):
        """Set model parameters, one value for all environments or one per environment.

        Names: body_mass (*, nbody), body_ipos (*, nbody, 3), body_inertia (*, nbody, 3),
        dof_armature (*, nv), dof_damping (*, nv), dof_frictionloss (*, nv), kp (*, nu), kd (*, nu).
        """
        for name, value in values.items():
            if name not in self._params:
                raise KeyError(f"unknown parameter {name!r}; one of {', '.join(self._params)}")
            fld = self._params[name]
            arr = np.asarray(value, dtype=self.np_fp)
            if name in ("kp", "kd") and self.nu == 0:
                arr = np.zeros(1, dtype=self.np_fp)
            shape = fld.shape + ((3,) if name in ("body_ipos", "body_inertia") else ())
            fld.from_numpy(np.ascontiguousarray(np.broadcast_to(arr, shape)))

    def get_param(self, name: str) -> np.ndarray:
        return self._params[name].to_numpy()

    def set_state(self, qpos, qvel):
        """Start a new window from (qpos (N, nq), qvel (N, nv)); clears the window and the cut."""
        qpos = np.broadcast_to(np.asarray(qpos, dtype=self.np_fp), (self.num_envs, self.nq))
        qvel = np.broadcast_to(np.asarray(qvel, dtype=self.np_fp), (self.num_envs, self.nv))
        if not (np.all(np.isfinite(qpos)) and np.all(np.isfinite(qvel))):
            raise ValueError("set_state: qpos/qvel hold non-finite values")
        self._write_time_slice(self.qpos, 0, qpos)
        self._write_time_slice(self.qvel, 0, qvel)
        self._t, self._cut = 0, 0

    @ti.kernel
    def _copy_state(self, src: ti.i32, dst: ti.i32):
        for e, i in ti.ndrange(self.num_envs, self.nq):
            self.qpos[dst, e, i] = self.qpos[src, e, i]
        for e, i in ti.ndrange(self.num_envs, self.nv):
            self.qvel[dst, e, i] = self.qvel[src, e, i]

    def _write_time_slice(self, fld, t, values):
        full = fld.to_numpy()
        full[t] = values
        fld.from_numpy(full)

    @property
    def substep(self) -> int:
        """Substeps taken in the current window."""
        return self._t

    @property
    def qpos_now(self) -> np.ndarray:
        return self.qpos.to_numpy()[self._t]

    @property
    def qvel_now(self) -> np.ndarray:
        return self.qvel.to_numpy()[self._t]

    def trajectory(self) -> tuple[np.ndarray, np.ndarray]:
        """(qpos (S+1, N, nq), qvel (S+1, N, nv)) of the window so far."""
        return self.qpos.to_numpy()[: self._t + 1], self.qvel.to_numpy()[: self._t + 1]

    def detach(self):
        """Cut the gradient here: :meth:`backward` stops at the current substep."""
        self._cut = self._t

    def reset_window(self):
        """Move the current state to the start of the buffers (a new window, gradients cut)."""
        if self._t:
            self._copy_state(self._t, 0)
        self._t, self._cut = 0, 0

    # ------------------------------------------------------------------ stepping
    def _substep_ops(self, s: int, c: int):
        ops = [(self._world_motion, ())]
        ops += [(self._fk_level, (s, off, cnt)) for off, cnt in self._levels]
        ops += [(self._dof_axes, ())]
        ops += [(self._velocity_level, (s, off, cnt)) for off, cnt in self._levels]
        ops += [
            (self._body_inertia, ()),
            ("zero", (self.crb_m, self.crb_h, self.crb_rot_inertia)),
            (self._composite_inertia, ()),
            (self._dof_forces, ()),
            (self._mass_matrix, ()),
            (self._body_forces, ()),
            ("zero", (self.sub_frc_ang, self.sub_frc_lin)),
            (self._subtree_forces, ()),
            (self._bias, ()),
            (self._actuation, (s, c)),
            (self._total_force, (s, c)),
            ("factor", ()),
            ("solve", ()),
            (self._integrate_velocity, (s,)),
            (self._integrate_position, (s,)),
        ]
        return ops

    def _run(self, ops):
        for op, args in ops:
            if op == "zero":
                for f in args:
                    f.fill(0)
            elif op == "factor":
                self._factor()
            elif op == "solve":
                self._solve()
            else:
                op(*args)

    def _run_adjoint(self, ops):
        for op, args in reversed(ops):
            if op == "solve":
                self.solve_adjoint()
            elif op in ("zero", "factor"):
                continue
            else:
                op.grad(*args)

    def step(self, ctrl=None, qfrc_applied=None):
        """Advance one control step (``substeps`` physics steps) with PD targets ``ctrl`` (N, nu)
        held over the step, and optional applied joint forces (N, nv)."""
        c = self._t // self.substeps
        if self._t % self.substeps:
            raise RuntimeError("step() called in the middle of a control step")
        if c >= self.max_steps:
            raise RuntimeError(
                f"the window holds {self.max_steps} control steps; call reset_window() or raise max_steps"
            )
        if ctrl is not None:
            self._write_time_slice(
                self.ctrl, c, np.broadcast_to(np.asarray(ctrl, self.np_fp), (self.num_envs, max(self.nu, 1)))
            )
        if qfrc_applied is not None:
            self._write_time_slice(
                self.qfrc_applied,
                c,
                np.broadcast_to(np.asarray(qfrc_applied, self.np_fp), (self.num_envs, self.nv)),
            )
        for _ in range(self.substeps):
            self._run(self._substep_ops(self._t, c))
            self._t += 1

    def rollout(self, ctrl):
        """Run ``len(ctrl)`` control steps from the current state; ctrl is (T, N, nu).
        Returns (qpos (T+1, N, nq), qvel (T+1, N, nv)) at control-step boundaries."""
        start = self._t
        for c in ctrl:
            self.step(c)
        qpos, qvel = self.trajectory()
        return qpos[start :: self.substeps], qvel[start :: self.substeps]

    # ------------------------------------------------------------------ kinematics and dynamics queries
    def forward(self, qpos=None, qvel=None, qfrc_applied=None):
        """Kinematics and dynamics at the current state (or the one given, which starts a new window).

        Returns a dict of numpy arrays: xpos (N, nbody, 3), xquat (N, nbody, 4), qM (N, nv, nv) with
        armature, qfrc_bias (N, nv), qacc (N, nv) under the PD targets of the current control step
        and the applied forces ``qfrc_applied`` (N, nv), if given.
        """
        if qpos is not None:
            self.set_state(qpos, np.zeros((self.num_envs, self.nv)) if qvel is None else qvel)
        c = min(self._t // self.substeps, self.max_steps - 1)
        if qfrc_applied is not None:
            self._write_time_slice(
                self.qfrc_applied, c, np.broadcast_to(np.asarray(qfrc_applied, self.np_fp), (self.num_envs, self.nv))
            )
        ops = self._substep_ops(self._t, c)
        self._run(ops[:-3])  # everything up to, not including, solve and integration
        self._solve()
        return {
            "xpos": self.xpos.to_numpy(),
            "xquat": self.xquat.to_numpy(),
            "qM": self.mass.to_numpy(),
            "qfrc_bias": self.qfrc_bias.to_numpy(),
            "qacc": self.qacc.to_numpy(),
        }

    def _kinematics_ops(self, s):
        return [(self._world_motion, ())] + [(self._fk_level, (s, off, cnt)) for off, cnt in self._levels]

    def kinematics(self, qpos=None):
        """Forward kinematics: body origins xpos (N, nbody, 3) m and orientations xquat (N, nbody, 4)
        at ``qpos`` (N, nq), or at the current state when None. Does not touch the window."""
        s = self._t
        if qpos is not None:
            s = self.nsub + 1
            self._write_time_slice(self.qpos, s, np.broadcast_to(np.asarray(qpos, self.np_fp), (self.num_envs, self.nq)))
        self._run(self._kinematics_ops(s))
        return self.xpos.to_numpy(), self.xquat.to_numpy()

    def kinematics_vjp(self, qpos, xpos_grad, xquat_grad=None) -> np.ndarray:
        """Vector-Jacobian product of :meth:`kinematics`: dL/dqpos (N, nq) from dL/dxpos (N, nbody, 3)
        and dL/dxquat (N, nbody, 4). Use it to carry gradients of body-position losses (observations,
        rewards) into :meth:`backward`'s ``qpos_grad``."""
        s = self.nsub + 1
        self._write_time_slice(self.qpos, s, np.broadcast_to(np.asarray(qpos, self.np_fp), (self.num_envs, self.nq)))
        ops = self._kinematics_ops(s)
        self._run(ops)
        for f in (self.xpos, self.xquat, self.xmat, self.xanchor, self.xaxis, self.qpos):
            f.grad.fill(0)
        self.xpos.grad.from_numpy(np.asarray(xpos_grad, self.np_fp))
        if xquat_grad is not None:
            self.xquat.grad.from_numpy(np.asarray(xquat_grad, self.np_fp))
        self._run_adjoint(ops)
        return self.qpos.grad.to_numpy()[s]

    # ------------------------------------------------------------------ reverse pass
    def zero_grad(self):
        for f in [self.qpos, self.qvel, self.ctrl, self.qfrc_applied, self.gravity, *self._params.values()]:
            f.grad.fill(0)

    def backward(self, qpos_grad=None, qvel_grad=None) -> Gradients:
        """Reverse pass of the window from the current substep down to the cut.

        Args:
            qpos_grad: dL/dqpos, either (S+1, N, nq) over the window's substeps or a dict
                {substep: (N, nq)}.
            qvel_grad: the same for qvel.

        Returns:
            :class:`Gradients` at the cut (the window start unless :meth:`detach` was called).

        For losses whose gradient at a state depends on the gradient of later states (a policy
        acting on observations of the state), drive the pass one control step at a time with
        :meth:`backward_begin`, :meth:`backward_step`, :meth:`state_grad`, :meth:`add_state_grad`
        and :meth:`backward_end`.
        """
        self.backward_begin(qpos_grad, qvel_grad)
        while self.backward_pending():
            self.backward_step()
        return self.backward_end()

    def backward_begin(self, qpos_grad=None, qvel_grad=None):
        """Zero every gradient and seed dL/dqpos, dL/dqvel (same forms as :meth:`backward`)."""
        if not self.config.requires_grad:
            raise RuntimeError("this simulator was built with requires_grad=False")
        self.zero_grad()
        for fld, g, width in ((self.qpos, qpos_grad, self.nq), (self.qvel, qvel_grad, self.nv)):
            if g is None:
                continue
            full = np.zeros((self.nsub + 2, self.num_envs, width), dtype=self.np_fp)
            if isinstance(g, dict):
                for s, v in g.items():
                    full[s] = v
            else:
                g = np.asarray(g)
                full[: len(g)] = g
            fld.grad.from_numpy(full)
        self._bwd = self._t

    def backward_pending(self) -> bool:
        """True while control steps above the cut remain to be reversed."""
        return self._bwd > self._cut

    def backward_step(self) -> int:
        """Reverse the substeps of the last control step not yet reversed; returns its index c.
        Afterwards :meth:`state_grad` (c) holds dL/d(state at the start of step c)."""
        c = (self._bwd - 1) // self.substeps
        lo = max(c * self.substeps, self._cut)
        for s in range(self._bwd - 1, lo - 1, -1):
            ops = self._substep_ops(s, c)
            for f in self._intermediates:
                f.grad.fill(0)
            self._run(ops)
            self._run_adjoint(ops)
        self._bwd = lo
        return c

    def state_grad(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        """(dL/dqpos (N, nq), dL/dqvel (N, nv)) at the start of control step c so far."""
        s = c * self.substeps
        return self.qpos.grad.to_numpy()[s], self.qvel.grad.to_numpy()[s]

    def ctrl_grad(self, c: int) -> np.ndarray:
        """dL/dctrl (N, nu) of control step c (complete once step c has been reversed)."""
        return self.ctrl.grad.to_numpy()[c]

    @ti.kernel
    def _add_grad(self, s: ti.i32, gq: ti.types.ndarray(), gv: ti.types.ndarray()):
        for e, i in ti.ndrange(self.num_envs, self.nq):
            self.qpos.grad[s, e, i] += gq[e, i]
        for e, i in ti.ndrange(self.num_envs, self.nv):
            self.qvel.grad[s, e, i] += gv[e, i]

    def add_state_grad(self, c: int, qpos_grad=None, qvel_grad=None):
        """Add gradient to the state at the start of control step c (before reversing step c-1)."""
        gq = np.zeros((self.num_envs, self.nq), self.np_fp) if qpos_grad is None else np.asarray(qpos_grad, self.np_fp)
        gv = np.zeros((self.num_envs, self.nv), self.np_fp) if qvel_grad is None else np.asarray(qvel_grad, self.np_fp)
        self._add_grad(c * self.substeps, np.ascontiguousarray(gq), np.ascontiguousarray(gv))

    def backward_end(self) -> Gradients:
        qg, vg = self.qpos.grad.to_numpy(), self.qvel.grad.to_numpy()
        c0, c1 = self._cut // self.substeps, -(-self._t // self.substeps)
        return Gradients(
            qpos=qg[self._cut],
            qvel=vg[self._cut],
            ctrl=self.ctrl.grad.to_numpy()[c0:c1],
            qfrc_applied=self.qfrc_applied.grad.to_numpy()[c0:c1],
            params={k: f.grad.to_numpy() for k, f in self._params.items()},
        )


def mjmodel_of(source) -> mujoco.MjModel:
    """Compiled MuJoCo model of an MJCF path or XML string (helper for comparisons)."""
    return load_mjcf(source if not isinstance(source, Path) else str(source))[1]
