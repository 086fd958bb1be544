"""The joint-space solve qacc = M^-1 (qfrc_total - qfrc_bias) without contact, beside its adjoint.

A dense Cholesky factor per row, not differentiated: the adjoint :meth:`DynamicsKernels.solve_adjoint`
is written by hand from the stored factor (b_bar = M^-1 qacc_bar, M_bar -= b_bar qacc^T), which
compiles like a forward kernel and is the fastest at run time. The stages before the solve are in
:mod:`bcg.sim.kinematics` and :mod:`bcg.sim.inertia`; with contact, :mod:`bcg.sim.contact` solves
for several right-hand sides with the same factor. A mixin of :class:`bcg.sim.rollout.Simulator`.
"""

import taichi as ti

FACTOR_BLOCK = 8  # rows of the Cholesky factor computed side by side


class DynamicsKernels:
    """The factor, the solve and the solve's adjoint over the simulator's fields."""

    @ti.kernel
    def _factor(self):
        """Dense Cholesky M = L L^T per environment (not differentiated: see solve_adjoint)."""
        ti.loop_config(serialize=self._serial_rows)
        for r_ in range(self.active.n_active[None]):
            e = self.active.rows[r_]
            self._factor_env(e)

    @ti.func
    def _factor_env(self, e: ti.template()):
        for j in range(self.nv):
            sjj = self.dyn.mass[e, j, j]
            for k in range(j):
                sjj -= self.dyn.chol[e, j, k] * self.dyn.chol[e, j, k]
            ljj = ti.sqrt(ti.max(sjj, 1e-12))
            self.dyn.chol[e, j, j] = ljj
            # the rows below the diagonal FACTOR_BLOCK at a time: their sums are independent chains
            # of multiply-adds that run side by side (each summed in the same order as one at a time)
            for blk in range((self.nv - j - 1 + FACTOR_BLOCK - 1) // FACTOR_BLOCK):
                i0 = j + 1 + blk * FACTOR_BLOCK
                s = ti.Vector(
                    [self.dyn.mass[e, ti.min(i0 + c, self.nv - 1), j] for c in ti.static(range(FACTOR_BLOCK))]
                )
                for k in range(j):
                    ljk = self.dyn.chol[e, j, k]
                    for c in ti.static(range(FACTOR_BLOCK)):
                        s[c] -= self.dyn.chol[e, ti.min(i0 + c, self.nv - 1), k] * ljk
                for c in ti.static(range(FACTOR_BLOCK)):
                    if i0 + c < self.nv:
                        self.dyn.chol[e, i0 + c, j] = s[c] / ljj

    @ti.func
    def _chol_solve(self, e, rhs: ti.template(), out: ti.template()):
        """out[e] = (L L^T)^-1 rhs[e] with the stored factor (forward then backward substitution)."""
        for i in range(self.nv):
            v = rhs[e, i]
            for k in range(i):
                v -= self.dyn.chol[e, i, k] * out[e, k]
            out[e, i] = v / self.dyn.chol[e, i, i]
        for ii in range(self.nv):
            i = self.nv - 1 - ii
            v = out[e, i]
            for k in range(i + 1, self.nv):
                v -= self.dyn.chol[e, k, i] * out[e, k]
            out[e, i] = v / self.dyn.chol[e, i, i]

    @ti.kernel
    def _solve(self):
        """qacc = M^-1 (qfrc_total - qfrc_bias)."""
        ti.loop_config(serialize=self._serial_rows)
        for r_ in range(self.active.n_active[None]):
            e = self.active.rows[r_]
            self._solve_env(e)

    @ti.func
    def _solve_env(self, e: ti.template()):
        for i in range(self.nv):
            self.dyn.rhs[e, i] = self.dyn.qfrc_total[e, i] - self.dyn.qfrc_bias[e, i]
        self._chol_solve(e, self.dyn.rhs, self.dyn.qacc)

    @ti.kernel
    def solve_adjoint(self):
        """Adjoint of :meth:`_solve`: r_bar = M^-1 qacc_bar; force_bar += r_bar, bias_bar -= r_bar,
        M_bar -= r_bar qacc^T, formed at the mass matrix's tree pairs (i, j) alone with the partials of
        M[i, j] and M[j, i] summed there (the mass matrix's adjoint adds the two triangles)."""
        ti.loop_config(serialize=self._serial_row_loops)
        for i_ in range(self._row_items()):
            r_ = self._row_of(i_)
            if r_ < self.active.n_active[None]:
                e = self.active.rows[r_]
                for i in range(self.nv):
                    self.dyn.rhs[e, i] = self.dyn.qacc.grad[e, i]
                self._chol_solve(e, self.dyn.rhs, self.dyn.rhs_bar)
                for i in range(self.nv):
                    r = self.dyn.rhs_bar[e, i]
                    self.dyn.qfrc_total.grad[e, i] = self.dyn.qfrc_total.grad[e, i] + r
                    self.dyn.qfrc_bias.grad[e, i] = self.dyn.qfrc_bias.grad[e, i] - r
        # M_bar at the tree pairs alone, both triangles summed into (i, j) (see _mass_adjoint)
        ti.loop_config(serialize=self._serial_rows)
        for r_, k in ti.ndrange(self.active.n_active[None], self.mdl.npairs):
            e = self.active.rows[r_]
            i = self.mdl.pair_i[k]
            j = self.mdl.pair_j[k]
            g = self.dyn.rhs_bar[e, i] * self.dyn.qacc[e, j]
            if i != j:
                g += self.dyn.rhs_bar[e, j] * self.dyn.qacc[e, i]
            self.dyn.mass.grad[e, i, j] = self.dyn.mass.grad[e, i, j] - g
