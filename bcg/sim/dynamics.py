"""Articulated-body dynamics kernels: kinematics, mass matrix (CRBA), bias forces (RNEA), linear solve.

All spatial quantities are world-frame (angular, linear) pairs about a per-environment reference point
``p_ref`` = the first body's origin, which keeps the numbers small in float32 however far a robot
walks. Each stage writes its outputs once (no in-place updates), so Taichi's reverse mode can
differentiate it. Every stage is a per-item function (``_fk_body(s, e, b)``, ``_mass_entry(e, k)``,
...) and a parallel loop over (row, item) calling it: the forward substep calls the per-item
functions serially inside one loop over rows (:mod:`bcg.sim.substep`). The parallel loops (the tree
recursions one kernel per tree level, the subtree and ancestor sums over CSR lists built once from
the model) are what Taichi differentiates. The reverse pass uses hand-written adjoints instead:
those of :mod:`bcg.sim.adjoints` (kinematics and velocities, every tree level in one launch; body
inertias to mass matrix and bias forces) and :meth:`DynamicsKernels.solve_adjoint`. In each, one
thread owns an environment and adds every partial with a plain load and store, where the generated
adjoints add with atomics (a compare-and-swap loop per float on a CPU); the generated ones remain the
reference the tests compare them with.

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
    motion_cross,
    mv3,
    quat_axis_angle,
    quat_mul,
    quat_normalize,
    quat_to_mat,
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
        ti.loop_config(serialize=self._serial_rows)
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

    @ti.func
    def _dof_axes(self):
        """Motion subspace of every dof (cdof), about the reference point."""
        ti.loop_config(serialize=self._serial_rows)
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
        ti.loop_config(serialize=self._serial_rows)
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

    @ti.func
    def _world_motion(self):
        """The world body: at rest, accelerating upwards against gravity (gravity as base acceleration)."""
        ti.loop_config(serialize=self._serial_rows)
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
        ti.loop_config(serialize=self._serial_rows)
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
        ti.loop_config(serialize=self._serial_rows)
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
        ti.loop_config(serialize=self._serial_rows)
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
        ti.loop_config(serialize=self._serial_rows)
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
        ti.loop_config(serialize=self._serial_rows)
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
        ti.loop_config(serialize=self._serial_rows)
        for r_, b in ti.ndrange(self.n_active[None], (1, self.nbody)):
            e = self.rows[r_]
            for k in range(self.subtree_start[b], self.subtree_start[b + 1]):
                d = self.subtree_items[k]
                self.sub_frc_ang[e, b] += self.cfrc_ang[e, d]
                self.sub_frc_lin[e, b] += self.cfrc_lin[e, d]

    @ti.func
    def _bias(self):
        ti.loop_config(serialize=self._serial_rows)
        for r_, d in ti.ndrange(self.n_active[None], self.nv):
            e = self.rows[r_]
            self._bias_one(e, d)

    @ti.func
    def _bias_one(self, e: ti.template(), d: ti.template()):
        b = self.dof_bodyid[d]
        self.qfrc_bias[e, d] = dot3(self.cdof_ang[e, d], self.sub_frc_ang[e, b]) + dot3(
            self.cdof_lin[e, d], self.sub_frc_lin[e, b]
        )

    # ---------------------------------------------------------------- linear solve, hand adjoint
    @ti.kernel
    def _factor(self):
        """Dense Cholesky M = L L^T per environment (not differentiated: see solve_adjoint)."""
        ti.loop_config(serialize=self._serial_rows)
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
        ti.loop_config(serialize=self._serial_rows)
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
        M_bar -= r_bar qacc^T, formed at the mass matrix's tree pairs (i, j) alone with the partials of
        M[i, j] and M[j, i] summed there (the mass matrix's adjoint adds the two triangles)."""
        ti.loop_config(serialize=self._serial_row_loops)
        for i_ in range(self._row_items()):
            r_ = self._row_of(i_)
            if r_ < self.n_active[None]:
                e = self.rows[r_]
                for i in range(self.nv):
                    self.rhs[e, i] = self.qacc.grad[e, i]
                self._chol_solve(e, self.rhs, self.rhs_bar)
                for i in range(self.nv):
                    r = self.rhs_bar[e, i]
                    self.qfrc_total.grad[e, i] = self.qfrc_total.grad[e, i] + r
                    self.qfrc_bias.grad[e, i] = self.qfrc_bias.grad[e, i] - r
        # M_bar at the tree pairs alone, both triangles summed into (i, j) (see _mass_adjoint)
        ti.loop_config(serialize=self._serial_rows)
        for r_, k in ti.ndrange(self.n_active[None], self.npairs):
            e = self.rows[r_]
            i = self.pair_i[k]
            j = self.pair_j[k]
            g = self.rhs_bar[e, i] * self.qacc[e, j]
            if i != j:
                g += self.rhs_bar[e, j] * self.qacc[e, i]
            self.mass.grad[e, i, j] = self.mass.grad[e, i, j] - g
