"""Body inertias, mass matrix (CRBA) and bias forces (RNEA), each forward beside its hand-written adjoint.

Spatial quantities about ``p_ref`` as in :mod:`bcg.sim.kinematics`. Every stage is a per-item function
(``_body_inertia_one(e, b)``, ``_mass_entry(e, k)``, ...) and a parallel loop over (row, item)
calling it; the subtree and ancestor sums run over CSR lists built once from the model. The forward
substep calls the per-item functions serially inside one loop over rows (:mod:`bcg.sim.substep`);
the parallel loops are what Taichi differentiates, the reference of the tests.

The reverse pass uses :meth:`InertiaKernels.mass_bias_adjoint`: the adjoints of all these stages, in
reverse order, in one launch, one thread per row accumulating every partial with plain loads and
stores (each stage's adjoint ``_*_adjoint(e)`` follows its forward below). A mixin of
:class:`bcg.sim.rollout.Simulator`.
"""

import taichi as ti

from bcg.sim.spatial import (
    cross,
    dot3,
    force_cross,
    inertia_apply,
    inertia_apply_adjoint,
    mtv3,
    mv3,
    outer3,
    quat_to_mat,
)


class InertiaKernels:
    """Inertia, mass-matrix and bias-force kernels over the simulator's fields."""

    # ---------------------------------------------------------------- body inertias
    @ti.func
    def _body_inertia(self):
        """Each body's spatial inertia about the reference point: mass, first moment, rotational."""
        ti.loop_config(serialize=self._serial_rows)
        for r_, b in ti.ndrange(self.active.n_active[None], (1, self.nbody)):
            e = self.active.rows[r_]
            self._body_inertia_one(e, b)

    @ti.func
    def _body_inertia_one(self, e: ti.template(), b: ti.template()):
        r_w = self.dyn.xmat[e, b]
        ri = quat_to_mat(self.mdl.body_iquat[b])
        m = self.mdl.body_mass[e, b]
        c = self.dyn.xpos[e, b] + mv3(r_w, self.mdl.body_ipos[e, b]) - self.dyn.xpos[e, self.ref_body]
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
        diag = self.mdl.body_inertia[e, b]
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
        self.dyn.body_m[e, b] = m
        self.dyn.body_h[e, b] = m * c
        self.dyn.body_rot_inertia[e, b] = inertia

    @ti.func
    def _body_inertia_adjoint(self, e):
        for b in range(1, self.nbody):
            r_w = self.dyn.xmat[e, b]
            ri = quat_to_mat(self.mdl.body_iquat[b])
            m = self.mdl.body_mass[e, b]
            ipos = self.mdl.body_ipos[e, b]
            c = self.dyn.xpos[e, b] + mv3(r_w, ipos) - self.dyn.xpos[e, self.ref_body]
            diag = self.mdl.body_inertia[e, b]
            g_bm = self.dyn.body_m.grad[e, b]
            g_bh = self.dyn.body_h.grad[e, b]
            g_i = self.dyn.body_rot_inertia.grad[e, b]
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
            self.dyn.xmat.grad[e, b] = self.dyn.xmat.grad[e, b] + g_rw
            self.dyn.xpos.grad[e, b] = self.dyn.xpos.grad[e, b] + g_c
            self.dyn.xpos.grad[e, self.ref_body] = self.dyn.xpos.grad[e, self.ref_body] - g_c
            self.mdl.body_mass.grad[e, b] = self.mdl.body_mass.grad[e, b] + g_m
            self.mdl.body_ipos.grad[e, b] = self.mdl.body_ipos.grad[e, b] + mtv3(r_w, g_c)
            self.mdl.body_inertia.grad[e, b] = self.mdl.body_inertia.grad[e, b] + g_diag
            self.dyn.body_m.grad[e, b] = 0.0
            self.dyn.body_h.grad[e, b] = ti.Vector([0.0, 0.0, 0.0])
            self.dyn.body_rot_inertia.grad[e, b] = ti.Matrix.zero(self.fp, 3, 3)

    # ---------------------------------------------------------------- composite inertias
    @ti.func
    def _composite_inertia(self):
        ti.loop_config(serialize=self._serial_rows)
        for r_, b in ti.ndrange(self.active.n_active[None], (1, self.nbody)):
            e = self.active.rows[r_]
            for k in range(self.mdl.subtree_start[b], self.mdl.subtree_start[b + 1]):
                d = self.mdl.subtree_items[k]
                self.dyn.crb_m[e, b] += self.dyn.body_m[e, d]
                self.dyn.crb_h[e, b] += self.dyn.body_h[e, d]
                self.dyn.crb_rot_inertia[e, b] += self.dyn.body_rot_inertia[e, d]

    @ti.func
    def _composite_adjoint(self, e):
        for b in range(1, self.nbody):
            g_m = self.dyn.crb_m.grad[e, b]
            g_h = self.dyn.crb_h.grad[e, b]
            g_i = self.dyn.crb_rot_inertia.grad[e, b]
            for k in range(self.mdl.subtree_start[b], self.mdl.subtree_start[b + 1]):
                d = self.mdl.subtree_items[k]
                self.dyn.body_m.grad[e, d] = self.dyn.body_m.grad[e, d] + g_m
                self.dyn.body_h.grad[e, d] = self.dyn.body_h.grad[e, d] + g_h
                self.dyn.body_rot_inertia.grad[e, d] = self.dyn.body_rot_inertia.grad[e, d] + g_i

    # ---------------------------------------------------------------- dof forces F_i = I_c S_i
    @ti.func
    def _dof_forces(self):
        """F_i = I_composite(body(i)) S_i."""
        ti.loop_config(serialize=self._serial_rows)
        for r_, d in ti.ndrange(self.active.n_active[None], self.nv):
            e = self.active.rows[r_]
            self._dof_force(e, d)

    @ti.func
    def _dof_force(self, e: ti.template(), d: ti.template()):
        b = self.mdl.dof_bodyid[d]
        fa, fl = inertia_apply(
            self.dyn.crb_m[e, b],
            self.dyn.crb_h[e, b],
            self.dyn.crb_rot_inertia[e, b],
            self.dyn.cdof_ang[e, d],
            self.dyn.cdof_lin[e, d],
        )
        self.dyn.dof_f_ang[e, d] = fa
        self.dyn.dof_f_lin[e, d] = fl

    @ti.func
    def _dof_forces_adjoint(self, e):
        for d in range(self.nv):
            b = self.mdl.dof_bodyid[d]
            g_m, g_h, g_i, g_a, g_l = inertia_apply_adjoint(
                self.dyn.crb_m[e, b],
                self.dyn.crb_h[e, b],
                self.dyn.crb_rot_inertia[e, b],
                self.dyn.cdof_ang[e, d],
                self.dyn.cdof_lin[e, d],
                self.dyn.dof_f_ang.grad[e, d],
                self.dyn.dof_f_lin.grad[e, d],
            )
            self.dyn.crb_m.grad[e, b] = self.dyn.crb_m.grad[e, b] + g_m
            self.dyn.crb_h.grad[e, b] = self.dyn.crb_h.grad[e, b] + g_h
            self.dyn.crb_rot_inertia.grad[e, b] = self.dyn.crb_rot_inertia.grad[e, b] + g_i
            self.dyn.cdof_ang.grad[e, d] = self.dyn.cdof_ang.grad[e, d] + g_a
            self.dyn.cdof_lin.grad[e, d] = self.dyn.cdof_lin.grad[e, d] + g_l
            self.dyn.dof_f_ang.grad[e, d] = ti.Vector([0.0, 0.0, 0.0])
            self.dyn.dof_f_lin.grad[e, d] = ti.Vector([0.0, 0.0, 0.0])

    # ---------------------------------------------------------------- mass matrix
    @ti.func
    def _mass_matrix(self):
        """M[i, j] = S_j . F_i for every dof i and ancestor dof j (both triangles), plus armature."""
        ti.loop_config(serialize=self._serial_rows)
        for r_, k in ti.ndrange(self.active.n_active[None], self.mdl.npairs):
            e = self.active.rows[r_]
            self._mass_entry(e, k)

    @ti.func
    def _mass_entry(self, e: ti.template(), k: ti.template()):
        i = self.mdl.pair_i[k]
        j = self.mdl.pair_j[k]
        v = dot3(self.dyn.cdof_ang[e, j], self.dyn.dof_f_ang[e, i]) + dot3(
            self.dyn.cdof_lin[e, j], self.dyn.dof_f_lin[e, i]
        )
        if i == j:
            self.dyn.mass[e, i, i] = v + self.mdl.dof_armature[e, i]
        else:
            self.dyn.mass[e, i, j] = v
            self.dyn.mass[e, j, i] = v

    @ti.func
    def _mass_adjoint(self, e):
        for k in range(self.mdl.npairs):
            i = self.mdl.pair_i[k]
            j = self.mdl.pair_j[k]
            g = self.dyn.mass.grad[e, i, j]
            if i == j:
                self.mdl.dof_armature.grad[e, i] = self.mdl.dof_armature.grad[e, i] + g
            else:
                g += self.dyn.mass.grad[e, j, i]
                self.dyn.mass.grad[e, j, i] = 0.0
            self.dyn.mass.grad[e, i, j] = 0.0
            self.dyn.cdof_ang.grad[e, j] = self.dyn.cdof_ang.grad[e, j] + g * self.dyn.dof_f_ang[e, i]
            self.dyn.cdof_lin.grad[e, j] = self.dyn.cdof_lin.grad[e, j] + g * self.dyn.dof_f_lin[e, i]
            self.dyn.dof_f_ang.grad[e, i] = self.dyn.dof_f_ang.grad[e, i] + g * self.dyn.cdof_ang[e, j]
            self.dyn.dof_f_lin.grad[e, i] = self.dyn.dof_f_lin.grad[e, i] + g * self.dyn.cdof_lin[e, j]

    # ---------------------------------------------------------------- body forces (RNEA)
    @ti.func
    def _body_forces(self):
        ti.loop_config(serialize=self._serial_rows)
        for r_, b in ti.ndrange(self.active.n_active[None], (1, self.nbody)):
            e = self.active.rows[r_]
            self._body_force(e, b)

    @ti.func
    def _body_force(self, e: ti.template(), b: ti.template()):
        m = self.dyn.body_m[e, b]
        h = self.dyn.body_h[e, b]
        inertia = self.dyn.body_rot_inertia[e, b]
        va = self.dyn.cvel_ang[e, b]
        vl = self.dyn.cvel_lin[e, b]
        fa, fl = inertia_apply(m, h, inertia, self.dyn.cacc_ang[e, b], self.dyn.cacc_lin[e, b])
        pa, pl = inertia_apply(m, h, inertia, va, vl)
        xa, xl = force_cross(va, vl, pa, pl)
        self.dyn.cfrc_ang[e, b] = fa + xa
        self.dyn.cfrc_lin[e, b] = fl + xl

    @ti.func
    def _body_forces_adjoint(self, e):
        for b in range(1, self.nbody):
            m = self.dyn.body_m[e, b]
            h = self.dyn.body_h[e, b]
            inertia = self.dyn.body_rot_inertia[e, b]
            va = self.dyn.cvel_ang[e, b]
            vl = self.dyn.cvel_lin[e, b]
            pa, pl = inertia_apply(m, h, inertia, va, vl)
            g_ca = self.dyn.cfrc_ang.grad[e, b]
            g_cl = self.dyn.cfrc_lin.grad[e, b]
            # force_cross: (va x pa + vl x pl, va x pl)
            g_va = cross(pa, g_ca) + cross(pl, g_cl)
            g_vl = cross(pl, g_ca)
            g_pa = cross(g_ca, va)
            g_pl = cross(g_ca, vl) + cross(g_cl, va)
            m1, h1, i1, a1, l1 = inertia_apply_adjoint(m, h, inertia, va, vl, g_pa, g_pl)
            m2, h2, i2, a2, l2 = inertia_apply_adjoint(
                m, h, inertia, self.dyn.cacc_ang[e, b], self.dyn.cacc_lin[e, b], g_ca, g_cl
            )
            self.dyn.body_m.grad[e, b] = self.dyn.body_m.grad[e, b] + m1 + m2
            self.dyn.body_h.grad[e, b] = self.dyn.body_h.grad[e, b] + h1 + h2
            self.dyn.body_rot_inertia.grad[e, b] = self.dyn.body_rot_inertia.grad[e, b] + i1 + i2
            self.dyn.cvel_ang.grad[e, b] = self.dyn.cvel_ang.grad[e, b] + g_va + a1
            self.dyn.cvel_lin.grad[e, b] = self.dyn.cvel_lin.grad[e, b] + g_vl + l1
            self.dyn.cacc_ang.grad[e, b] = self.dyn.cacc_ang.grad[e, b] + a2
            self.dyn.cacc_lin.grad[e, b] = self.dyn.cacc_lin.grad[e, b] + l2
            self.dyn.cfrc_ang.grad[e, b] = ti.Vector([0.0, 0.0, 0.0])
            self.dyn.cfrc_lin.grad[e, b] = ti.Vector([0.0, 0.0, 0.0])

    # ---------------------------------------------------------------- subtree forces
    @ti.func
    def _subtree_forces(self):
        ti.loop_config(serialize=self._serial_rows)
        for r_, b in ti.ndrange(self.active.n_active[None], (1, self.nbody)):
            e = self.active.rows[r_]
            for k in range(self.mdl.subtree_start[b], self.mdl.subtree_start[b + 1]):
                d = self.mdl.subtree_items[k]
                self.dyn.sub_frc_ang[e, b] += self.dyn.cfrc_ang[e, d]
                self.dyn.sub_frc_lin[e, b] += self.dyn.cfrc_lin[e, d]

    @ti.func
    def _subtree_adjoint(self, e):
        for b in range(1, self.nbody):
            ga = self.dyn.sub_frc_ang.grad[e, b]
            gl = self.dyn.sub_frc_lin.grad[e, b]
            for k in range(self.mdl.subtree_start[b], self.mdl.subtree_start[b + 1]):
                d = self.mdl.subtree_items[k]
                self.dyn.cfrc_ang.grad[e, d] = self.dyn.cfrc_ang.grad[e, d] + ga
                self.dyn.cfrc_lin.grad[e, d] = self.dyn.cfrc_lin.grad[e, d] + gl

    # ---------------------------------------------------------------- bias forces
    @ti.func
    def _bias(self):
        ti.loop_config(serialize=self._serial_rows)
        for r_, d in ti.ndrange(self.active.n_active[None], self.nv):
            e = self.active.rows[r_]
            self._bias_one(e, d)

    @ti.func
    def _bias_one(self, e: ti.template(), d: ti.template()):
        b = self.mdl.dof_bodyid[d]
        self.dyn.qfrc_bias[e, d] = dot3(self.dyn.cdof_ang[e, d], self.dyn.sub_frc_ang[e, b]) + dot3(
            self.dyn.cdof_lin[e, d], self.dyn.sub_frc_lin[e, b]
        )

    @ti.func
    def _bias_adjoint(self, e):
        for d in range(self.nv):
            b = self.mdl.dof_bodyid[d]
            g = self.dyn.qfrc_bias.grad[e, d]
            self.dyn.cdof_ang.grad[e, d] = self.dyn.cdof_ang.grad[e, d] + g * self.dyn.sub_frc_ang[e, b]
            self.dyn.cdof_lin.grad[e, d] = self.dyn.cdof_lin.grad[e, d] + g * self.dyn.sub_frc_lin[e, b]
            self.dyn.sub_frc_ang.grad[e, b] = self.dyn.sub_frc_ang.grad[e, b] + g * self.dyn.cdof_ang[e, d]
            self.dyn.sub_frc_lin.grad[e, b] = self.dyn.sub_frc_lin.grad[e, b] + g * self.dyn.cdof_lin[e, d]
            self.dyn.qfrc_bias.grad[e, d] = 0.0

    # ---------------------------------------------------------------- all the stages' adjoints in one launch
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
            if r_ < self.active.n_active[None]:
                e = self.active.rows[r_]
                self._bias_adjoint(e)
                self._subtree_adjoint(e)
                self._body_forces_adjoint(e)
                self._mass_adjoint(e)
                self._dof_forces_adjoint(e)
                self._composite_adjoint(e)
                self._body_inertia_adjoint(e)
