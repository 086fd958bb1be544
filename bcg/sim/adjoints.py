"""Hand-written adjoints of the dynamics stages: forward kinematics, body velocities, and the stages
from body inertias to the mass matrix and bias forces (the linear solve's adjoint stays beside the
solve in :mod:`bcg.sim.dynamics`).

Taichi can differentiate every stage kernel, and those generated adjoints remain the reference the
tests compare these with (to 1e-11 in float64). The reverse pass uses these instead. Each is one
parallel loop over the active rows in which one thread owns an environment: the tree recursions walk
all levels in one launch, where the generated adjoints need a launch per level, and every partial is
accumulated with a plain load and store, where the generated adjoints add with atomics (a
compare-and-swap loop per float on a CPU). Consumed gradients of stored outputs are zeroed, as
Taichi's adjoints do. A mixin of :class:`bcg.sim.rollout.Simulator` beside
:class:`bcg.sim.dynamics.DynamicsKernels`, whose per-item functions define the forward maths.
"""

import taichi as ti

from bcg.sim.model import JNT_BALL, JNT_FREE, JNT_HINGE
from bcg.sim.spatial import (
    cross,
    dot3,
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


class DynamicsAdjoints:
    """Kernels over the fields declared by :class:`bcg.sim.rollout.Simulator`."""

    # ---------------------------------------------------------------- kinematics and velocities
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
            if r_ < self.n_active[None]:
                e = self.rows[r_]
                for k_ in range(self.nbody - 1):
                    b = self.level_bodies[self.nbody - 2 - k_]
                    p = self.body_parentid[b]
                    bq = self.body_quat[b]
                    q0 = quat_mul(self.xquat[e, p], bq)  # the joint's frame before its motion
                    g_pos = self.xpos.grad[e, b]
                    g_anchor = self.xanchor.grad[e, b]
                    g_axis = self.xaxis.grad[e, b]
                    g_quat = self.xquat.grad[e, b] + quat_to_mat_adjoint(
                        self.xquat[e, b], self.xmat.grad[e, b]
                    )
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
                            # anchor = pos0 + R(q0) jp; axis = R(q0) ja; quat = q0 qa(theta);
                            # pos = anchor - R(quat) jp
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
            if r_ < self.n_active[None]:
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
                        self.cdof_ang.grad[e, d] = (
                            self.cdof_ang.grad[e, d] + cross(g_ca, va) + cross(g_cl, vl)
                        )
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
        ti.loop_config(serialize=self._serial_row_loops)
        for i_ in range(self._row_items()):
            r_ = self._row_of(i_)
            if r_ < self.n_active[None]:
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
