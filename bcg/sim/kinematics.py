"""Forward kinematics, dof axes and body velocities, each forward beside its hand-written adjoint.

All spatial quantities are world-frame (angular, linear) pairs about a per-row reference point
``p_ref`` = the first body's origin, which keeps the numbers small in float32 however far a robot
walks. Each stage writes its outputs once (no in-place updates), so Taichi's reverse mode can
differentiate it. Every stage is a per-item function (``_fk_body(s, e, b)``, ``_dof_axis(e, d)``, ...)
and a parallel loop over (row, item) calling it: the forward substep calls the per-item functions
serially inside one loop over rows (:mod:`bcg.sim.substep`); the parallel loops, one kernel per tree
level, are what Taichi differentiates, the reference the tests compare the hand-written adjoints
with (to 1e-11 in float64).

The reverse pass uses the hand-written adjoints (:meth:`KinematicsKernels.fk_adjoint`,
:meth:`KinematicsKernels.velocity_adjoint`): one parallel loop over the active rows in which one
thread owns a row and walks every tree level in one launch, where the generated adjoints need a
launch per level, accumulating every partial with a plain load and store, where the generated
adjoints add with atomics (a compare-and-swap loop per float on a CPU). Consumed gradients of stored
outputs are zeroed, as Taichi's adjoints do.

A mixin of :class:`bcg.sim.rollout.Simulator`, which owns the fields (:mod:`bcg.sim.types`); each
stage takes the substep index ``s`` of the state it reads.
"""

import taichi as ti

from bcg.sim.model import JNT_BALL, JNT_FREE, JNT_HINGE
from bcg.sim.spatial import (
    cross,
    motion_cross,
    mv3,
    outer3,
    quat_axis_angle,
    quat_conj,
    quat_mul,
    quat_mul_adjoint,
    quat_normalize,
    quat_normalize_adjoint,
    quat_to_mat,
    quat_to_mat_adjoint,
)


@ti.func
def _unit(i):
    """Unit vector e_i without indexing a vector by a runtime index."""
    return ti.Vector([ti.select(i == 0, 1.0, 0.0), ti.select(i == 1, 1.0, 0.0), ti.select(i == 2, 1.0, 0.0)])


@ti.func
def _column(m, i):
    """Column i of a 3x3 matrix (runtime i) as a select, not a runtime index."""
    return ti.select(
        i == 0,
        ti.Vector([m[0, 0], m[1, 0], m[2, 0]]),
        ti.select(i == 1, ti.Vector([m[0, 1], m[1, 1], m[2, 1]]), ti.Vector([m[0, 2], m[1, 2], m[2, 2]])),
    )


class KinematicsKernels:
    """Kinematics and velocity kernels over the simulator's fields."""

    # ---------------------------------------------------------------- world body
    @ti.func
    def _world_motion(self):
        """The world body: at rest, accelerating upwards against gravity (gravity as base acceleration)."""
        ti.loop_config(serialize=self._serial_rows)
        for r_ in range(self.active.n_active[None]):
            e = self.active.rows[r_]
            self._world_body(e)

    @ti.func
    def _world_body(self, e: ti.template()):
        self.dyn.xpos[e, 0] = ti.Vector([0.0, 0.0, 0.0])
        self.dyn.xquat[e, 0] = ti.Vector([1.0, 0.0, 0.0, 0.0])
        self.dyn.xmat[e, 0] = ti.Matrix([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
        self.dyn.cvel_ang[e, 0] = ti.Vector([0.0, 0.0, 0.0])
        self.dyn.cvel_lin[e, 0] = ti.Vector([0.0, 0.0, 0.0])
        self.dyn.cacc_ang[e, 0] = ti.Vector([0.0, 0.0, 0.0])
        self.dyn.cacc_lin[e, 0] = -self.mdl.gravity[None]

    # ---------------------------------------------------------------- forward kinematics
    @ti.func
    def _fk_body(self, s: ti.template(), e: ti.template(), b: ti.template()):
        p = self.mdl.body_parentid[b]
        rp = self.dyn.xmat[e, p]
        pos = self.dyn.xpos[e, p] + mv3(rp, self.mdl.body_pos[b])
        quat = quat_mul(self.dyn.xquat[e, p], self.mdl.body_quat[b])
        anchor = pos
        axis = ti.Vector([0.0, 0.0, 0.0])
        j = self.mdl.body_jntadr[b]
        if j >= 0:
            jt = self.mdl.jnt_type[j]
            a = self.mdl.jnt_qposadr[j]
            if jt == JNT_FREE:
                pos = ti.Vector(
                    [self.state.qpos[s, e, a], self.state.qpos[s, e, a + 1], self.state.qpos[s, e, a + 2]]
                )
                quat = quat_normalize(
                    ti.Vector(
                        [
                            self.state.qpos[s, e, a + 3],
                            self.state.qpos[s, e, a + 4],
                            self.state.qpos[s, e, a + 5],
                            self.state.qpos[s, e, a + 6],
                        ]
                    )
                )
                anchor = pos
            elif jt == JNT_BALL:
                anchor = pos + mv3(quat_to_mat(quat), self.mdl.jnt_pos[j])
                qb = quat_normalize(
                    ti.Vector(
                        [
                            self.state.qpos[s, e, a],
                            self.state.qpos[s, e, a + 1],
                            self.state.qpos[s, e, a + 2],
                            self.state.qpos[s, e, a + 3],
                        ]
                    )
                )
                quat = quat_mul(quat, qb)
                pos = anchor - mv3(quat_to_mat(quat), self.mdl.jnt_pos[j])
            elif jt == JNT_HINGE:
                anchor = pos + mv3(quat_to_mat(quat), self.mdl.jnt_pos[j])
                axis = mv3(quat_to_mat(quat), self.mdl.jnt_axis[j])
                quat = quat_mul(
                    quat, quat_axis_angle(self.mdl.jnt_axis[j], self.state.qpos[s, e, a] - self.mdl.qpos0[a])
                )
                pos = anchor - mv3(quat_to_mat(quat), self.mdl.jnt_pos[j])
            else:  # slide
                axis = mv3(quat_to_mat(quat), self.mdl.jnt_axis[j])
                pos = pos + axis * (self.state.qpos[s, e, a] - self.mdl.qpos0[a])
                anchor = pos + mv3(quat_to_mat(quat), self.mdl.jnt_pos[j])
        self.dyn.xpos[e, b] = pos
        self.dyn.xquat[e, b] = quat
        self.dyn.xmat[e, b] = quat_to_mat(quat)
        self.dyn.xanchor[e, b] = anchor
        self.dyn.xaxis[e, b] = axis

    @ti.kernel
    def fk_adjoint(self, s: ti.i32):
        """Adjoint of every tree level of :meth:`_fk_body`, by hand, in one launch (see
        :meth:`velocity_adjoint` for why): each body's output gradients (position, quaternion, rotation
        matrix, joint anchor and axis) go to its joint's coordinates and to its parent's outputs, the
        deepest bodies first. Same partials as Taichi's generated adjoint; the model's frames are
        constants."""
        ti.loop_config(serialize=self._serial_row_loops)
        for i_ in range(self._row_items()):
            r_ = self._row_of(i_)
            if r_ < self.active.n_active[None]:
                e = self.active.rows[r_]
                for k_ in range(self.nbody - 1):
                    b = self.mdl.level_bodies[self.nbody - 2 - k_]
                    p = self.mdl.body_parentid[b]
                    bq = self.mdl.body_quat[b]
                    q0 = quat_mul(self.dyn.xquat[e, p], bq)  # the joint's frame before its motion
                    g_pos = self.dyn.xpos.grad[e, b]
                    g_anchor = self.dyn.xanchor.grad[e, b]
                    g_axis = self.dyn.xaxis.grad[e, b]
                    g_quat = self.dyn.xquat.grad[e, b] + quat_to_mat_adjoint(
                        self.dyn.xquat[e, b], self.dyn.xmat.grad[e, b]
                    )
                    g_pos0 = g_pos + g_anchor
                    g_q0 = g_quat
                    j = self.mdl.body_jntadr[b]
                    if j >= 0:
                        jt = self.mdl.jnt_type[j]
                        a = self.mdl.jnt_qposadr[j]
                        jp = self.mdl.jnt_pos[j]
                        if jt == JNT_FREE:
                            qraw = ti.Vector([self.state.qpos[s, e, a + 3 + i] for i in ti.static(range(4))])
                            g_raw = quat_normalize_adjoint(qraw, g_quat)
                            for i in ti.static(range(3)):
                                self.state.qpos.grad[s, e, a + i] = (
                                    self.state.qpos.grad[s, e, a + i] + g_pos0[i]
                                )
                            for i in ti.static(range(4)):
                                self.state.qpos.grad[s, e, a + 3 + i] = (
                                    self.state.qpos.grad[s, e, a + 3 + i] + g_raw[i]
                                )
                            g_pos0 = ti.Vector([0.0, 0.0, 0.0])
                            g_q0 = ti.Vector([0.0, 0.0, 0.0, 0.0])
                        elif jt == JNT_BALL:
                            # anchor = pos0 + R(q0) jp; quat = q0 qb; pos = anchor - R(quat) jp
                            qraw = ti.Vector([self.state.qpos[s, e, a + i] for i in ti.static(range(4))])
                            qb = quat_normalize(qraw)
                            g_quat = g_quat + quat_to_mat_adjoint(self.dyn.xquat[e, b], outer3(-g_pos, jp))
                            g_q0, g_qb = quat_mul_adjoint(q0, qb, g_quat)
                            g_raw = quat_normalize_adjoint(qraw, g_qb)
                            for i in ti.static(range(4)):
                                self.state.qpos.grad[s, e, a + i] = (
                                    self.state.qpos.grad[s, e, a + i] + g_raw[i]
                                )
                            g_q0 = g_q0 + quat_to_mat_adjoint(q0, outer3(g_pos0, jp))
                        elif jt == JNT_HINGE:
                            # anchor = pos0 + R(q0) jp; axis = R(q0) ja; quat = q0 qa(theta);
                            # pos = anchor - R(quat) jp
                            ja = self.mdl.jnt_axis[j]
                            half = 0.5 * (self.state.qpos[s, e, a] - self.mdl.qpos0[a])
                            qa = quat_axis_angle(ja, 2.0 * half)
                            g_quat = g_quat + quat_to_mat_adjoint(self.dyn.xquat[e, b], outer3(-g_pos, jp))
                            g_q0, g_qa = quat_mul_adjoint(q0, qa, g_quat)
                            g_theta = 0.5 * (
                                -ti.sin(half) * g_qa[0]
                                + ti.cos(half) * (ja[0] * g_qa[1] + ja[1] * g_qa[2] + ja[2] * g_qa[3])
                            )
                            self.state.qpos.grad[s, e, a] = self.state.qpos.grad[s, e, a] + g_theta
                            g_q0 = g_q0 + quat_to_mat_adjoint(q0, outer3(g_pos0, jp) + outer3(g_axis, ja))
                        else:  # slide: axis = R(q0) ja; pos = pos0 + axis theta; anchor = pos + R(q0) jp
                            ja = self.mdl.jnt_axis[j]
                            theta = self.state.qpos[s, e, a] - self.mdl.qpos0[a]
                            g_ax = g_axis + g_pos0 * theta
                            self.state.qpos.grad[s, e, a] = self.state.qpos.grad[s, e, a] + g_pos0.dot(
                                self.dyn.xaxis[e, b]
                            )
                            g_q0 = g_q0 + quat_to_mat_adjoint(q0, outer3(g_ax, ja) + outer3(g_anchor, jp))
                    # pos0 = xpos_p + R_p body_pos; q0 = xquat_p body_quat
                    self.dyn.xpos.grad[e, p] = self.dyn.xpos.grad[e, p] + g_pos0
                    self.dyn.xmat.grad[e, p] = self.dyn.xmat.grad[e, p] + outer3(g_pos0, self.mdl.body_pos[b])
                    self.dyn.xquat.grad[e, p] = self.dyn.xquat.grad[e, p] + quat_mul(g_q0, quat_conj(bq))
                    zero = ti.Vector([0.0, 0.0, 0.0])
                    self.dyn.xpos.grad[e, b] = zero
                    self.dyn.xanchor.grad[e, b] = zero
                    self.dyn.xaxis.grad[e, b] = zero
                    self.dyn.xquat.grad[e, b] = ti.Vector([0.0, 0.0, 0.0, 0.0])
                    self.dyn.xmat.grad[e, b] = ti.Matrix.zero(self.fp, 3, 3)

    # ---------------------------------------------------------------- dof axes
    @ti.func
    def _dof_axes(self):
        """Motion subspace of every dof (cdof), about the reference point."""
        ti.loop_config(serialize=self._serial_rows)
        for r_, d in ti.ndrange(self.active.n_active[None], self.nv):
            e = self.active.rows[r_]
            self._dof_axis(e, d)

    @ti.func
    def _dof_axis(self, e: ti.template(), d: ti.template()):
        b = self.mdl.dof_bodyid[d]
        j = self.mdl.dof_jntid[d]
        jt = self.mdl.jnt_type[j]
        i = d - self.mdl.jnt_dofadr[j]
        pref = self.dyn.xpos[e, self.ref_body]
        ang = ti.Vector([0.0, 0.0, 0.0])
        lin = ti.Vector([0.0, 0.0, 0.0])
        if jt == JNT_FREE:
            if i < 3:
                lin = _unit(i)
            else:
                ang = _column(self.dyn.xmat[e, b], i - 3)
                lin = cross(self.dyn.xpos[e, b] - pref, ang)
        elif jt == JNT_BALL:
            ang = _column(self.dyn.xmat[e, b], i)
            lin = cross(self.dyn.xanchor[e, b] - pref, ang)
        elif jt == JNT_HINGE:
            ang = self.dyn.xaxis[e, b]
            lin = cross(self.dyn.xanchor[e, b] - pref, ang)
        else:
            lin = self.dyn.xaxis[e, b]
        self.dyn.cdof_ang[e, d] = ang
        self.dyn.cdof_lin[e, d] = lin

    # ---------------------------------------------------------------- body velocities
    @ti.func
    def _velocity_body(self, s: ti.template(), e: ti.template(), b: ti.template()):
        p = self.mdl.body_parentid[b]
        va = self.dyn.cvel_ang[e, p]
        vl = self.dyn.cvel_lin[e, p]
        n = self.mdl.body_dofnum[b]
        a0 = self.mdl.body_dofadr[b]
        for i in ti.static(range(6)):
            d = ti.min(a0 + i, self.nv - 1)
            w = ti.select(i < n, self.state.qvel[s, e, d], 0.0)
            va += self.dyn.cdof_ang[e, d] * w
            vl += self.dyn.cdof_lin[e, d] * w
        aa = self.dyn.cacc_ang[e, p]
        al = self.dyn.cacc_lin[e, p]
        for i in ti.static(range(6)):
            d = ti.min(a0 + i, self.nv - 1)
            w = ti.select(i < n, self.state.qvel[s, e, d] * self.mdl.dof_sdot[d], 0.0)
            ca, cl = motion_cross(va, vl, self.dyn.cdof_ang[e, d], self.dyn.cdof_lin[e, d])
            aa += ca * w
            al += cl * w
        self.dyn.cvel_ang[e, b] = va
        self.dyn.cvel_lin[e, b] = vl
        self.dyn.cacc_ang[e, b] = aa
        self.dyn.cacc_lin[e, b] = al

    @ti.kernel
    def velocity_adjoint(self, s: ti.i32):
        """Adjoint of every tree level of :meth:`_velocity_body`, by hand, in one launch.

        One thread owns an environment and walks its bodies from the deepest level up, so each body's
        adjoint is complete (its children have added theirs) before it passes its share to its parent.
        Every partial is accumulated with a plain load and store: Taichi's generated adjoint of a level
        adds to the parent's and the dofs' gradients with atomics, a compare-and-swap loop per float on
        a CPU, and needs one launch per level. Same partials as the generated adjoint; the consumed
        output gradients are zeroed, as Taichi does."""
        ti.loop_config(serialize=self._serial_row_loops)
        for i_ in range(self._row_items()):
            r_ = self._row_of(i_)
            if r_ < self.active.n_active[None]:
                e = self.active.rows[r_]
                for k_ in range(self.nbody - 1):
                    b = self.mdl.level_bodies[self.nbody - 2 - k_]
                    p = self.mdl.body_parentid[b]
                    n = self.mdl.body_dofnum[b]
                    a0 = self.mdl.body_dofadr[b]
                    va = self.dyn.cvel_ang[e, b]
                    vl = self.dyn.cvel_lin[e, b]
                    g_va = self.dyn.cvel_ang.grad[e, b]
                    g_vl = self.dyn.cvel_lin.grad[e, b]
                    g_aa = self.dyn.cacc_ang.grad[e, b]
                    g_al = self.dyn.cacc_lin.grad[e, b]
                    # a_b = a_p + sum_i (v_b x S_i) qdot_i sdot_i
                    for i in range(n):
                        d = a0 + i
                        wq = self.state.qvel[s, e, d] * self.mdl.dof_sdot[d]
                        sa = self.dyn.cdof_ang[e, d]
                        sl = self.dyn.cdof_lin[e, d]
                        ca, cl = motion_cross(va, vl, sa, sl)
                        g_ca = g_aa * wq
                        g_cl = g_al * wq
                        g_va += cross(sa, g_ca) + cross(sl, g_cl)
                        g_vl += cross(sa, g_cl)
                        self.dyn.cdof_ang.grad[e, d] = (
                            self.dyn.cdof_ang.grad[e, d] + cross(g_ca, va) + cross(g_cl, vl)
                        )
                        self.dyn.cdof_lin.grad[e, d] = self.dyn.cdof_lin.grad[e, d] + cross(g_cl, va)
                        g_w = (g_aa.dot(ca) + g_al.dot(cl)) * self.mdl.dof_sdot[d]
                        self.state.qvel.grad[s, e, d] = self.state.qvel.grad[s, e, d] + g_w
                    # v_b = v_p + sum_i S_i qdot_i
                    for i in range(n):
                        d = a0 + i
                        w = self.state.qvel[s, e, d]
                        g_w = g_va.dot(self.dyn.cdof_ang[e, d]) + g_vl.dot(self.dyn.cdof_lin[e, d])
                        self.state.qvel.grad[s, e, d] = self.state.qvel.grad[s, e, d] + g_w
                        self.dyn.cdof_ang.grad[e, d] = self.dyn.cdof_ang.grad[e, d] + g_va * w
                        self.dyn.cdof_lin.grad[e, d] = self.dyn.cdof_lin.grad[e, d] + g_vl * w
                    self.dyn.cvel_ang.grad[e, p] = self.dyn.cvel_ang.grad[e, p] + g_va
                    self.dyn.cvel_lin.grad[e, p] = self.dyn.cvel_lin.grad[e, p] + g_vl
                    self.dyn.cacc_ang.grad[e, p] = self.dyn.cacc_ang.grad[e, p] + g_aa
                    self.dyn.cacc_lin.grad[e, p] = self.dyn.cacc_lin.grad[e, p] + g_al
                    zero = ti.Vector([0.0, 0.0, 0.0])
                    self.dyn.cvel_ang.grad[e, b] = zero
                    self.dyn.cvel_lin.grad[e, b] = zero
                    self.dyn.cacc_ang.grad[e, b] = zero
                    self.dyn.cacc_lin.grad[e, b] = zero
