"""Articulated-body dynamics kernels: kinematics, mass matrix (CRBA), bias forces (RNEA), linear solve.

All spatial quantities are world-frame (angular, linear) pairs about a per-environment reference point
``p_ref`` = the first body's origin, which keeps the numbers small in float32 however far a robot
walks. Each stage writes its outputs once (no in-place updates), so Taichi's reverse mode can
differentiate it. Every stage is a per-item function (``_fk_body(s, e, b)``, ``_mass_entry(e, k)``,
...) and a parallel loop over (row, item) calling it: the forward substep calls the per-item
functions serially inside one loop over rows (:mod:`bcg.sim.substep`). The parallel loops (the tree
recursions one kernel per tree level, the subtree and ancestor sums over CSR lists built once from
the model) are what Taichi differentiates. The reverse pass uses hand-written adjoints instead:
:meth:`DynamicsKernels.fk_adjoint` and :meth:`DynamicsKernels.velocity_adjoint` (every tree level
in one launch), :meth:`DynamicsKernels.mass_bias_adjoint` (body inertias to mass matrix and bias
forces) and :meth:`DynamicsKernels.solve_adjoint`. In each, one thread owns an environment and adds
every partial with a plain load and store, where the generated adjoints add with atomics (a
compare-and-swap loop per float on a CPU); the generated ones remain the reference the tests
compare them with.

These kernels are a mixin of :class:`bcg.sim.rollout.Simulator`, which owns the fields; each stage
takes the substep index ``s`` of the state it reads.
"""

import taichi as ti

from bcg.sim.model import JNT_BALL, JNT_FREE, JNT_HINGE
from bcg.sim.spatial import (
    cross,
    dot3,
    force_cross,
    inertia_apply,
    inertia_apply_adjoint,
    motion_cross,
    mtv3,
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

FACTOR_BLOCK = 8  # rows of the Cholesky factor computed side by side


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


class DynamicsKernels:
    """Kernels over the fields declared by :class:`bcg.sim.rollout.Simulator`."""

    # ---------------------------------------------------------------- kinematics
    @ti.func
    def _fk_level(self, s: ti.template(), off: ti.template(), cnt: ti.template()):
        for r_, k in ti.ndrange(self.n_active[None], cnt):
            e = self.rows[r_]
            b = self.level_bodies[off + k]
            self._fk_body(s, e, b)

    @ti.func
    def _fk_body(self, s: ti.template(), e: ti.template(), b: ti.template()):
        p = self.body_parentid[b]
        rp = self.xmat[e, p]
        pos = self.xpos[e, p] + mv3(rp, self.body_pos[b])
        quat = quat_mul(self.xquat[e, p], self.body_quat[b])
        anchor = pos
        axis = ti.Vector([0.0, 0.0, 0.0])
        j = self.body_jntadr[b]
        if j >= 0:
            jt = self.jnt_type[j]
            a = self.jnt_qposadr[j]
            if jt == JNT_FREE:
                pos = ti.Vector([self.qpos[s, e, a], self.qpos[s, e, a + 1], self.qpos[s, e, a + 2]])
                quat = quat_normalize(
                    ti.Vector(
                        [
                            self.qpos[s, e, a + 3],
                            self.qpos[s, e, a + 4],
                            self.qpos[s, e, a + 5],
                            self.qpos[s, e, a + 6],
                        ]
                    )
                )
                anchor = pos
            elif jt == JNT_BALL:
                anchor = pos + mv3(quat_to_mat(quat), self.jnt_pos[j])
                qb = quat_normalize(
                    ti.Vector(
                        [
                            self.qpos[s, e, a],
                            self.qpos[s, e, a + 1],
                            self.qpos[s, e, a + 2],
                            self.qpos[s, e, a + 3],
                        ]
                    )
                )
                quat = quat_mul(quat, qb)
                pos = anchor - mv3(quat_to_mat(quat), self.jnt_pos[j])
            elif jt == JNT_HINGE:
                anchor = pos + mv3(quat_to_mat(quat), self.jnt_pos[j])
                axis = mv3(quat_to_mat(quat), self.jnt_axis[j])
                quat = quat_mul(quat, quat_axis_angle(self.jnt_axis[j], self.qpos[s, e, a] - self.qpos0[a]))
                pos = anchor - mv3(quat_to_mat(quat), self.jnt_pos[j])
            else:  # slide
                axis = mv3(quat_to_mat(quat), self.jnt_axis[j])
                pos = pos + axis * (self.qpos[s, e, a] - self.qpos0[a])
                anchor = pos + mv3(quat_to_mat(quat), self.jnt_pos[j])
        self.xpos[e, b] = pos
        self.xquat[e, b] = quat
        self.xmat[e, b] = quat_to_mat(quat)
        self.xanchor[e, b] = anchor
        self.xaxis[e, b] = axis

    @ti.kernel
    def fk_adjoint(self, s: ti.i32):
        """Adjoint of every tree level of :meth:`_fk_body`, by hand, in one launch (see
        :meth:`velocity_adjoint` for why): each body's output gradients (position, quaternion, rotation
        matrix, joint anchor and axis) go to its joint's coordinates and to its parent's outputs, the
        deepest bodies first. Same partials as Taichi's generated adjoint; the model's frames are
        constants."""
        for r_ in range(self.n_active[None]):
            e = self.rows[r_]
            for k_ in range(self.nbody - 1):
                b = self.level_bodies[self.nbody - 2 - k_]
                p = self.body_parentid[b]
                bq = self.body_quat[b]
                q0 = quat_mul(self.xquat[e, p], bq)  # the joint's frame before its motion
                g_pos = self.xpos.grad[e, b]
                g_anchor = self.xanchor.grad[e, b]
                g_axis = self.xaxis.grad[e, b]
                g_quat = self.xquat.grad[e, b] + quat_to_mat_adjoint(self.xquat[e, b], self.xmat.grad[e, b])
                g_pos0 = g_pos + g_anchor
                g_q0 = g_quat
                j = self.body_jntadr[b]
                if j >= 0:
                    jt = self.jnt_type[j]
                    a = self.jnt_qposadr[j]
                    jp = self.jnt_pos[j]
                    if jt == JNT_FREE:
                        qraw = ti.Vector([self.qpos[s, e, a + 3 + i] for i in ti.static(range(4))])
                        g_raw = quat_normalize_adjoint(qraw, g_quat)
                        for i in ti.static(range(3)):
                            self.qpos.grad[s, e, a + i] = self.qpos.grad[s, e, a + i] + g_pos0[i]
                        for i in ti.static(range(4)):
                            self.qpos.grad[s, e, a + 3 + i] = self.qpos.grad[s, e, a + 3 + i] + g_raw[i]
                        g_pos0 = ti.Vector([0.0, 0.0, 0.0])
                        g_q0 = ti.Vector([0.0, 0.0, 0.0, 0.0])
                    elif jt == JNT_BALL:
                        # anchor = pos0 + R(q0) jp; quat = q0 qb; pos = anchor - R(quat) jp
                        qraw = ti.Vector([self.qpos[s, e, a + i] for i in ti.static(range(4))])
                        qb = quat_normalize(qraw)
                        g_quat = g_quat + quat_to_mat_adjoint(self.xquat[e, b], outer3(-g_pos, jp))
                        g_q0, g_qb = quat_mul_adjoint(q0, qb, g_quat)
                        g_raw = quat_normalize_adjoint(qraw, g_qb)
                        for i in ti.static(range(4)):
                            self.qpos.grad[s, e, a + i] = self.qpos.grad[s, e, a + i] + g_raw[i]
                        g_q0 = g_q0 + quat_to_mat_adjoint(q0, outer3(g_pos0, jp))
                    elif jt == JNT_HINGE:
                        # anchor = pos0 + R(q0) jp; axis = R(q0) ja; quat = q0 qa(theta); pos = anchor - R(quat) jp
                        ja = self.jnt_axis[j]
                        half = 0.5 * (self.qpos[s, e, a] - self.qpos0[a])
                        qa = quat_axis_angle(ja, 2.0 * half)
                        g_quat = g_quat + quat_to_mat_adjoint(self.xquat[e, b], outer3(-g_pos, jp))
                        g_q0, g_qa = quat_mul_adjoint(q0, qa, g_quat)
                        g_theta = 0.5 * (
                            -ti.sin(half) * g_qa[0]
                            + ti.cos(half) * (ja[0] * g_qa[1] + ja[1] * g_qa[2] + ja[2] * g_qa[3])
                        )
                        self.qpos.grad[s, e, a] = self.qpos.grad[s, e, a] + g_theta
                        g_q0 = g_q0 + quat_to_mat_adjoint(q0, outer3(g_pos0, jp) + outer3(g_axis, ja))
                    else:  # slide: axis = R(q0) ja; pos = pos0 + axis theta; anchor = pos + R(q0) jp
                        ja = self.jnt_axis[j]
                        theta = self.qpos[s, e, a] - self.qpos0[a]
                        g_ax = g_axis + g_pos0 * theta
                        self.qpos.grad[s, e, a] = self.qpos.grad[s, e, a] + g_pos0.dot(self.xaxis[e, b])
                        g_q0 = g_q0 + quat_to_mat_adjoint(q0, outer3(g_ax, ja) + outer3(g_anchor, jp))
                # pos0 = xpos_p + R_p body_pos; q0 = xquat_p body_quat
                self.xpos.grad[e, p] = self.xpos.grad[e, p] + g_pos0
                self.xmat.grad[e, p] = self.xmat.grad[e, p] + outer3(g_pos0, self.body_pos[b])
                self.xquat.grad[e, p] = self.xquat.grad[e, p] + quat_mul(g_q0, quat_conj(bq))
                zero = ti.Vector([0.0, 0.0, 0.0])
                self.xpos.grad[e, b] = zero
                self.xanchor.grad[e, b] = zero
                self.xaxis.grad[e, b] = zero
                self.xquat.grad[e, b] = ti.Vector([0.0, 0.0, 0.0, 0.0])
                self.xmat.grad[e, b] = ti.Matrix.zero(self.fp, 3, 3)

    @ti.func
    def _dof_axes(self):
        """Motion subspace of every dof (cdof), about the reference point."""
        for r_, d in ti.ndrange(self.n_active[None], self.nv):
            e = self.rows[r_]
            self._dof_axis(e, d)

    @ti.func
    def _dof_axis(self, e: ti.template(), d: ti.template()):
        b = self.dof_bodyid[d]
        j = self.dof_jntid[d]
        jt = self.jnt_type[j]
        i = d - self.jnt_dofadr[j]
        pref = self.xpos[e, self.ref_body]
        ang = ti.Vector([0.0, 0.0, 0.0])
        lin = ti.Vector([0.0, 0.0, 0.0])
        if jt == JNT_FREE:
            if i < 3:
                lin = _unit(i)
            else:
                ang = _column(self.xmat[e, b], i - 3)
                lin = cross(self.xpos[e, b] - pref, ang)
        elif jt == JNT_BALL:
            ang = _column(self.xmat[e, b], i)
            lin = cross(self.xanchor[e, b] - pref, ang)
        elif jt == JNT_HINGE:
            ang = self.xaxis[e, b]
            lin = cross(self.xanchor[e, b] - pref, ang)
        else:
            lin = self.xaxis[e, b]
        self.cdof_ang[e, d] = ang
        self.cdof_lin[e, d] = lin

    @ti.func
    def _velocity_level(self, s: ti.template(), off: ti.template(), cnt: ti.template()):
        """Body spatial velocities and velocity-product accelerations (plus gravity), one tree level."""
        for r_, k in ti.ndrange(self.n_active[None], cnt):
            e = self.rows[r_]
            b = self.level_bodies[off + k]
            self._velocity_body(s, e, b)

    @ti.func
    def _velocity_body(self, s: ti.template(), e: ti.template(), b: ti.template()):
        p = self.body_parentid[b]
        va = self.cvel_ang[e, p]
        vl = self.cvel_lin[e, p]
        n = self.body_dofnum[b]
        a0 = self.body_dofadr[b]
        for i in ti.static(range(6)):
            d = ti.min(a0 + i, self.nv - 1)
            w = ti.select(i < n, self.qvel[s, e, d], 0.0)
            va += self.cdof_ang[e, d] * w
            vl += self.cdof_lin[e, d] * w
        aa = self.cacc_ang[e, p]
        al = self.cacc_lin[e, p]
        for i in ti.static(range(6)):
            d = ti.min(a0 + i, self.nv - 1)
            w = ti.select(i < n, self.qvel[s, e, d] * self.dof_sdot[d], 0.0)
            ca, cl = motion_cross(va, vl, self.cdof_ang[e, d], self.cdof_lin[e, d])
            aa += ca * w
            al += cl * w
        self.cvel_ang[e, b] = va
        self.cvel_lin[e, b] = vl
        self.cacc_ang[e, b] = aa
        self.cacc_lin[e, b] = al

    @ti.kernel
    def velocity_adjoint(self, s: ti.i32):
        """Adjoint of every tree level of :meth:`_velocity_body`, by hand, in one launch.

        One thread owns an environment and walks its bodies from the deepest level up, so each body's
        adjoint is complete (its children have added theirs) before it passes its share to its parent.
        Every partial is accumulated with a plain load and store: Taichi's generated adjoint of a level
        adds to the parent's and the dofs' gradients with atomics, a compare-and-swap loop per float on
        a CPU, and needs one launch per level. Same partials as the generated adjoint; the consumed
        output gradients are zeroed, as Taichi does."""
        for r_ in range(self.n_active[None]):
            e = self.rows[r_]
            for k_ in range(self.nbody - 1):
                b = self.level_bodies[self.nbody - 2 - k_]
                p = self.body_parentid[b]
                n = self.body_dofnum[b]
                a0 = self.body_dofadr[b]
                va = self.cvel_ang[e, b]
                vl = self.cvel_lin[e, b]
                g_va = self.cvel_ang.grad[e, b]
                g_vl = self.cvel_lin.grad[e, b]
                g_aa = self.cacc_ang.grad[e, b]
                g_al = self.cacc_lin.grad[e, b]
                # a_b = a_p + sum_i (v_b x S_i) qdot_i sdot_i
                for i in range(n):
                    d = a0 + i
                    wq = self.qvel[s, e, d] * self.dof_sdot[d]
                    sa = self.cdof_ang[e, d]
                    sl = self.cdof_lin[e, d]
                    ca, cl = motion_cross(va, vl, sa, sl)
                    g_ca = g_aa * wq
                    g_cl = g_al * wq
                    g_va += cross(sa, g_ca) + cross(sl, g_cl)
                    g_vl += cross(sa, g_cl)
                    self.cdof_ang.grad[e, d] = self.cdof_ang.grad[e, d] + cross(g_ca, va) + cross(g_cl, vl)
                    self.cdof_lin.grad[e, d] = self.cdof_lin.grad[e, d] + cross(g_cl, va)
                    g_w = (g_aa.dot(ca) + g_al.dot(cl)) * self.dof_sdot[d]
                    self.qvel.grad[s, e, d] = self.qvel.grad[s, e, d] + g_w
                # v_b = v_p + sum_i S_i qdot_i
                for i in range(n):
                    d = a0 + i
                    w = self.qvel[s, e, d]
                    g_w = g_va.dot(self.cdof_ang[e, d]) + g_vl.dot(self.cdof_lin[e, d])
                    self.qvel.grad[s, e, d] = self.qvel.grad[s, e, d] + g_w
                    self.cdof_ang.grad[e, d] = self.cdof_ang.grad[e, d] + g_va * w
                    self.cdof_lin.grad[e, d] = self.cdof_lin.grad[e, d] + g_vl * w
                self.cvel_ang.grad[e, p] = self.cvel_ang.grad[e, p] + g_va
                self.cvel_lin.grad[e, p] = self.cvel_lin.grad[e, p] + g_vl
                self.cacc_ang.grad[e, p] = self.cacc_ang.grad[e, p] + g_aa
                self.cacc_lin.grad[e, p] = self.cacc_lin.grad[e, p] + g_al
                zero = ti.Vector([0.0, 0.0, 0.0])
                self.cvel_ang.grad[e, b] = zero
                self.cvel_lin.grad[e, b] = zero
                self.cacc_ang.grad[e, b] = zero
                self.cacc_lin.grad[e, b] = zero

    @ti.func
    def _world_motion(self):
        """The world body: at rest, accelerating upwards against gravity (gravity as base acceleration)."""
        for r_ in range(self.n_active[None]):
            e = self.rows[r_]
            self._world_body(e)

    @ti.func
    def _world_body(self, e: ti.template()):
        self.xpos[e, 0] = ti.Vector([0.0, 0.0, 0.0])
        self.xquat[e, 0] = ti.Vector([1.0, 0.0, 0.0, 0.0])
        self.xmat[e, 0] = ti.Matrix([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
        self.cvel_ang[e, 0] = ti.Vector([0.0, 0.0, 0.0])
        self.cvel_lin[e, 0] = ti.Vector([0.0, 0.0, 0.0])
        self.cacc_ang[e, 0] = ti.Vector([0.0, 0.0, 0.0])
        self.cacc_lin[e, 0] = -self.gravity[None]

    # ---------------------------------------------------------------- inertia
    @ti.func
    def _body_inertia(self):
        """Each body's spatial inertia about the reference point: mass, first moment, rotational."""
        for r_, b in ti.ndrange(self.n_active[None], (1, self.nbody)):
            e = self.rows[r_]
            self._body_inertia_one(e, b)

    @ti.func
    def _body_inertia_one(self, e: ti.template(), b: ti.template()):
        r_w = self.xmat[e, b]
        ri = quat_to_mat(self.body_iquat[b])
        m = self.body_mass[e, b]
        c = self.xpos[e, b] + mv3(r_w, self.body_ipos[e, b]) - self.xpos[e, self.ref_body]
        # principal axes in world: columns of R_w R_i
        ax = ti.Matrix(
            [
                [
                    r_w[i, 0] * ri[0, k] + r_w[i, 1] * ri[1, k] + r_w[i, 2] * ri[2, k]
                    for k in ti.static(range(3))
                ]
                for i in ti.static(range(3))
            ]
        )
        diag = self.body_inertia[e, b]
        cc = dot3(c, c)
        inertia = ti.Matrix(
            [
                [
                    ax[i, 0] * diag[0] * ax[j, 0]
                    + ax[i, 1] * diag[1] * ax[j, 1]
                    + ax[i, 2] * diag[2] * ax[j, 2]
                    + m * ((cc if i == j else 0.0) - c[i] * c[j])
                    for j in ti.static(range(3))
                ]
                for i in ti.static(range(3))
            ]
        )
        self.body_m[e, b] = m
        self.body_h[e, b] = m * c
        self.body_rot_inertia[e, b] = inertia

    @ti.func
    def _composite_inertia(self):
        for r_, b in ti.ndrange(self.n_active[None], (1, self.nbody)):
            e = self.rows[r_]
            for k in range(self.subtree_start[b], self.subtree_start[b + 1]):
                d = self.subtree_items[k]
                self.crb_m[e, b] += self.body_m[e, d]
                self.crb_h[e, b] += self.body_h[e, d]
                self.crb_rot_inertia[e, b] += self.body_rot_inertia[e, d]

    @ti.func
    def _dof_forces(self):
        """F_i = I_composite(body(i)) S_i."""
        for r_, d in ti.ndrange(self.n_active[None], self.nv):
            e = self.rows[r_]
            self._dof_force(e, d)

    @ti.func
    def _dof_force(self, e: ti.template(), d: ti.template()):
        b = self.dof_bodyid[d]
        fa, fl = inertia_apply(
            self.crb_m[e, b],
            self.crb_h[e, b],
            self.crb_rot_inertia[e, b],
            self.cdof_ang[e, d],
            self.cdof_lin[e, d],
        )
        self.dof_f_ang[e, d] = fa
        self.dof_f_lin[e, d] = fl

    @ti.func
    def _mass_matrix(self):
        """M[i, j] = S_j . F_i for every dof i and ancestor dof j (both triangles), plus armature."""
        for r_, k in ti.ndrange(self.n_active[None], self.npairs):
            e = self.rows[r_]
            self._mass_entry(e, k)

    @ti.func
    def _mass_entry(self, e: ti.template(), k: ti.template()):
        i = self.pair_i[k]
        j = self.pair_j[k]
        v = dot3(self.cdof_ang[e, j], self.dof_f_ang[e, i]) + dot3(self.cdof_lin[e, j], self.dof_f_lin[e, i])
        if i == j:
            self.mass[e, i, i] = v + self.dof_armature[e, i]
        else:
            self.mass[e, i, j] = v
            self.mass[e, j, i] = v

    # ---------------------------------------------------------------- bias forces (RNEA)
    @ti.func
    def _body_forces(self):
        for r_, b in ti.ndrange(self.n_active[None], (1, self.nbody)):
            e = self.rows[r_]
            self._body_force(e, b)

    @ti.func
    def _body_force(self, e: ti.template(), b: ti.template()):
        m = self.body_m[e, b]
        h = self.body_h[e, b]
        inertia = self.body_rot_inertia[e, b]
        va = self.cvel_ang[e, b]
        vl = self.cvel_lin[e, b]
        fa, fl = inertia_apply(m, h, inertia, self.cacc_ang[e, b], self.cacc_lin[e, b])
        pa, pl = inertia_apply(m, h, inertia, va, vl)
        xa, xl = force_cross(va, vl, pa, pl)
        self.cfrc_ang[e, b] = fa + xa
        self.cfrc_lin[e, b] = fl + xl

    @ti.func
    def _subtree_forces(self):
        for r_, b in ti.ndrange(self.n_active[None], (1, self.nbody)):
            e = self.rows[r_]
            for k in range(self.subtree_start[b], self.subtree_start[b + 1]):
                d = self.subtree_items[k]
                self.sub_frc_ang[e, b] += self.cfrc_ang[e, d]
                self.sub_frc_lin[e, b] += self.cfrc_lin[e, d]

    @ti.func
    def _bias(self):
        for r_, d in ti.ndrange(self.n_active[None], self.nv):
            e = self.rows[r_]
            self._bias_one(e, d)

    @ti.func
    def _bias_one(self, e: ti.template(), d: ti.template()):
        b = self.dof_bodyid[d]
        self.qfrc_bias[e, d] = dot3(self.cdof_ang[e, d], self.sub_frc_ang[e, b]) + dot3(
            self.cdof_lin[e, d], self.sub_frc_lin[e, b]
        )

    # ---------------------------------------------------------------- mass matrix and bias, hand adjoint
    @ti.kernel
    def mass_bias_adjoint(self):
        """Adjoint of the stages from the body inertias to the mass matrix and the bias forces
        (:meth:`_body_inertia`, :meth:`_composite_inertia`, :meth:`_dof_forces`, :meth:`_mass_matrix`,
        :meth:`_body_forces`, :meth:`_subtree_forces`, :meth:`_bias`), by hand, in one launch: one
        thread per environment accumulates every partial with plain loads and stores (see
        :meth:`velocity_adjoint`). Same partials as Taichi's generated adjoints of those stages,
        taken in reverse order; the consumed gradients of outputs that are stored (not summed into)
        are zeroed, as Taichi does."""
        for r_ in range(self.n_active[None]):
            e = self.rows[r_]
            self._bias_adjoint(e)
            self._subtree_adjoint(e)
            self._body_forces_adjoint(e)
            self._mass_adjoint(e)
            self._dof_forces_adjoint(e)
            self._composite_adjoint(e)
            self._body_inertia_adjoint(e)

    @ti.func
    def _bias_adjoint(self, e):
        for d in range(self.nv):
            b = self.dof_bodyid[d]
            g = self.qfrc_bias.grad[e, d]
            self.cdof_ang.grad[e, d] = self.cdof_ang.grad[e, d] + g * self.sub_frc_ang[e, b]
            self.cdof_lin.grad[e, d] = self.cdof_lin.grad[e, d] + g * self.sub_frc_lin[e, b]
            self.sub_frc_ang.grad[e, b] = self.sub_frc_ang.grad[e, b] + g * self.cdof_ang[e, d]
            self.sub_frc_lin.grad[e, b] = self.sub_frc_lin.grad[e, b] + g * self.cdof_lin[e, d]
            self.qfrc_bias.grad[e, d] = 0.0

    @ti.func
    def _subtree_adjoint(self, e):
        for b in range(1, self.nbody):
            ga = self.sub_frc_ang.grad[e, b]
            gl = self.sub_frc_lin.grad[e, b]
            for k in range(self.subtree_start[b], self.subtree_start[b + 1]):
                d = self.subtree_items[k]
                self.cfrc_ang.grad[e, d] = self.cfrc_ang.grad[e, d] + ga
                self.cfrc_lin.grad[e, d] = self.cfrc_lin.grad[e, d] + gl

    @ti.func
    def _body_forces_adjoint(self, e):
        for b in range(1, self.nbody):
            m = self.body_m[e, b]
            h = self.body_h[e, b]
            inertia = self.body_rot_inertia[e, b]
            va = self.cvel_ang[e, b]
            vl = self.cvel_lin[e, b]
            pa, pl = inertia_apply(m, h, inertia, va, vl)
            g_ca = self.cfrc_ang.grad[e, b]
            g_cl = self.cfrc_lin.grad[e, b]
            # force_cross: (va x pa + vl x pl, va x pl)
            g_va = cross(pa, g_ca) + cross(pl, g_cl)
            g_vl = cross(pl, g_ca)
            g_pa = cross(g_ca, va)
            g_pl = cross(g_ca, vl) + cross(g_cl, va)
            m1, h1, i1, a1, l1 = inertia_apply_adjoint(m, h, inertia, va, vl, g_pa, g_pl)
            m2, h2, i2, a2, l2 = inertia_apply_adjoint(
                m, h, inertia, self.cacc_ang[e, b], self.cacc_lin[e, b], g_ca, g_cl
            )
            self.body_m.grad[e, b] = self.body_m.grad[e, b] + m1 + m2
            self.body_h.grad[e, b] = self.body_h.grad[e, b] + h1 + h2
            self.body_rot_inertia.grad[e, b] = self.body_rot_inertia.grad[e, b] + i1 + i2
            self.cvel_ang.grad[e, b] = self.cvel_ang.grad[e, b] + g_va + a1
            self.cvel_lin.grad[e, b] = self.cvel_lin.grad[e, b] + g_vl + l1
            self.cacc_ang.grad[e, b] = self.cacc_ang.grad[e, b] + a2
            self.cacc_lin.grad[e, b] = self.cacc_lin.grad[e, b] + l2
            self.cfrc_ang.grad[e, b] = ti.Vector([0.0, 0.0, 0.0])
            self.cfrc_lin.grad[e, b] = ti.Vector([0.0, 0.0, 0.0])

    @ti.func
    def _mass_adjoint(self, e):
        for k in range(self.npairs):
            i = self.pair_i[k]
            j = self.pair_j[k]
            g = self.mass.grad[e, i, j]
            if i == j:
                self.dof_armature.grad[e, i] = self.dof_armature.grad[e, i] + g
            else:
                g += self.mass.grad[e, j, i]
                self.mass.grad[e, j, i] = 0.0
            self.mass.grad[e, i, j] = 0.0
            self.cdof_ang.grad[e, j] = self.cdof_ang.grad[e, j] + g * self.dof_f_ang[e, i]
            self.cdof_lin.grad[e, j] = self.cdof_lin.grad[e, j] + g * self.dof_f_lin[e, i]
            self.dof_f_ang.grad[e, i] = self.dof_f_ang.grad[e, i] + g * self.cdof_ang[e, j]
            self.dof_f_lin.grad[e, i] = self.dof_f_lin.grad[e, i] + g * self.cdof_lin[e, j]

    @ti.func
    def _dof_forces_adjoint(self, e):
        for d in range(self.nv):
            b = self.dof_bodyid[d]
            g_m, g_h, g_i, g_a, g_l = inertia_apply_adjoint(
                self.crb_m[e, b],
                self.crb_h[e, b],
                self.crb_rot_inertia[e, b],
                self.cdof_ang[e, d],
                self.cdof_lin[e, d],
                self.dof_f_ang.grad[e, d],
                self.dof_f_lin.grad[e, d],
            )
            self.crb_m.grad[e, b] = self.crb_m.grad[e, b] + g_m
            self.crb_h.grad[e, b] = self.crb_h.grad[e, b] + g_h
            self.crb_rot_inertia.grad[e, b] = self.crb_rot_inertia.grad[e, b] + g_i
            self.cdof_ang.grad[e, d] = self.cdof_ang.grad[e, d] + g_a
            self.cdof_lin.grad[e, d] = self.cdof_lin.grad[e, d] + g_l
            self.dof_f_ang.grad[e, d] = ti.Vector([0.0, 0.0, 0.0])
            self.dof_f_lin.grad[e, d] = ti.Vector([0.0, 0.0, 0.0])

    @ti.func
    def _composite_adjoint(self, e):
        for b in range(1, self.nbody):
            g_m = self.crb_m.grad[e, b]
            g_h = self.crb_h.grad[e, b]
            g_i = self.crb_rot_inertia.grad[e, b]
            for k in range(self.subtree_start[b], self.subtree_start[b + 1]):
                d = self.subtree_items[k]
                self.body_m.grad[e, d] = self.body_m.grad[e, d] + g_m
                self.body_h.grad[e, d] = self.body_h.grad[e, d] + g_h
                self.body_rot_inertia.grad[e, d] = self.body_rot_inertia.grad[e, d] + g_i

    @ti.func
    def _body_inertia_adjoint(self, e):
        for b in range(1, self.nbody):
            r_w = self.xmat[e, b]
            ri = quat_to_mat(self.body_iquat[b])
            m = self.body_mass[e, b]
            ipos = self.body_ipos[e, b]
            c = self.xpos[e, b] + mv3(r_w, ipos) - self.xpos[e, self.ref_body]
            diag = self.body_inertia[e, b]
            g_bm = self.body_m.grad[e, b]
            g_bh = self.body_h.grad[e, b]
            g_i = self.body_rot_inertia.grad[e, b]
            g_sym = g_i + g_i.transpose()
            trace = g_i[0, 0] + g_i[1, 1] + g_i[2, 2]
            g_m = g_bm + dot3(g_bh, c) + trace * dot3(c, c) - dot3(c, mv3(g_i, c))
            g_c = m * g_bh + m * (2.0 * trace * c - mv3(g_sym, c))
            g_rw = outer3(g_c, ipos)
            g_diag = ti.Vector([0.0, 0.0, 0.0])
            for k in ti.static(range(3)):
                # principal axis k in world: column k of R_w R_i
                axk = mv3(r_w, ti.Vector([ri[0, k], ri[1, k], ri[2, k]]))
                g_diag[k] = dot3(axk, mv3(g_i, axk))
                g_rw += outer3(diag[k] * mv3(g_sym, axk), ti.Vector([ri[0, k], ri[1, k], ri[2, k]]))
            self.xmat.grad[e, b] = self.xmat.grad[e, b] + g_rw
            self.xpos.grad[e, b] = self.xpos.grad[e, b] + g_c
            self.xpos.grad[e, self.ref_body] = self.xpos.grad[e, self.ref_body] - g_c
            self.body_mass.grad[e, b] = self.body_mass.grad[e, b] + g_m
            self.body_ipos.grad[e, b] = self.body_ipos.grad[e, b] + mtv3(r_w, g_c)
            self.body_inertia.grad[e, b] = self.body_inertia.grad[e, b] + g_diag
            self.body_m.grad[e, b] = 0.0
            self.body_h.grad[e, b] = ti.Vector([0.0, 0.0, 0.0])
            self.body_rot_inertia.grad[e, b] = ti.Matrix.zero(self.fp, 3, 3)

    # ---------------------------------------------------------------- linear solve, hand adjoint
    @ti.kernel
    def _factor(self):
        """Dense Cholesky M = L L^T per environment (not differentiated: see solve_adjoint)."""
        for r_ in range(self.n_active[None]):
            e = self.rows[r_]
            self._factor_env(e)

    @ti.func
    def _factor_env(self, e: ti.template()):
        for j in range(self.nv):
            sjj = self.mass[e, j, j]
            for k in range(j):
                sjj -= self.chol[e, j, k] * self.chol[e, j, k]
            ljj = ti.sqrt(ti.max(sjj, 1e-12))
            self.chol[e, j, j] = ljj
            # the rows below the diagonal FACTOR_BLOCK at a time: their sums are independent chains
            # of multiply-adds that run side by side (each summed in the same order as one at a time)
            for blk in range((self.nv - j - 1 + FACTOR_BLOCK - 1) // FACTOR_BLOCK):
                i0 = j + 1 + blk * FACTOR_BLOCK
                s = ti.Vector(
                    [self.mass[e, ti.min(i0 + c, self.nv - 1), j] for c in ti.static(range(FACTOR_BLOCK))]
                )
                for k in range(j):
                    ljk = self.chol[e, j, k]
                    for c in ti.static(range(FACTOR_BLOCK)):
                        s[c] -= self.chol[e, ti.min(i0 + c, self.nv - 1), k] * ljk
                for c in ti.static(range(FACTOR_BLOCK)):
                    if i0 + c < self.nv:
                        self.chol[e, i0 + c, j] = s[c] / ljj

    @ti.func
    def _chol_solve(self, e, rhs: ti.template(), out: ti.template()):
        """out[e] = (L L^T)^-1 rhs[e] with the stored factor (forward then backward substitution)."""
        for i in range(self.nv):
            v = rhs[e, i]
            for k in range(i):
                v -= self.chol[e, i, k] * out[e, k]
            out[e, i] = v / self.chol[e, i, i]
        for ii in range(self.nv):
            i = self.nv - 1 - ii
            v = out[e, i]
            for k in range(i + 1, self.nv):
                v -= self.chol[e, k, i] * out[e, k]
            out[e, i] = v / self.chol[e, i, i]

    @ti.kernel
    def _solve(self):
        """qacc = M^-1 (qfrc_total - qfrc_bias)."""
        for r_ in range(self.n_active[None]):
            e = self.rows[r_]
            self._solve_env(e)

    @ti.func
    def _solve_env(self, e: ti.template()):
        for i in range(self.nv):
            self.rhs[e, i] = self.qfrc_total[e, i] - self.qfrc_bias[e, i]
        self._chol_solve(e, self.rhs, self.qacc)

    @ti.kernel
    def solve_adjoint(self):
        """Adjoint of :meth:`_solve`: r_bar = M^-1 qacc_bar; force_bar += r_bar, bias_bar -= r_bar,
        M_bar -= r_bar qacc^T."""
        for r_ in range(self.n_active[None]):
            e = self.rows[r_]
            for i in range(self.nv):
                self.rhs[e, i] = self.qacc.grad[e, i]
            self._chol_solve(e, self.rhs, self.rhs_bar)
            for i in range(self.nv):
                r = self.rhs_bar[e, i]
                self.qfrc_total.grad[e, i] = self.qfrc_total.grad[e, i] + r
                self.qfrc_bias.grad[e, i] = self.qfrc_bias.grad[e, i] - r
                for j in range(self.nv):
                    self.mass.grad[e, i, j] = self.mass.grad[e, i, j] - r * self.qacc[e, j]
