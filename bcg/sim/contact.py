"""Analytically smoothed compliant contact (Schwarke et al., 2025) between spheres and a ground plane.

One substep, per environment (semi-implicit Euler; Schwarke et al.'s step with the choices below):

1. At the substep's state q: sphere centres x_i from forward kinematics, contact points
   p_i = x_i - rho n (n = +z), gap phi_i = p_i.z - ground_height, depth d_i = -phi_i. A sphere is a
   candidate when phi_i <= phi_act.
2. Point Jacobians J_i (3 x nv) and, with one Cholesky factor of H (armature included),
   X = H^-1 [h f | J^T] where f = tau - bias. Free velocity v_free = v + X_0, contact velocities
   c_i = J_i v_free, Delassus blocks G_ij = J_i H^-1 J_j^T.
3. P_i = -G_ii^-1 c_i, then ``iterations`` projected block Gauss-Seidel sweeps:
   y = P_i - r_i (G_ii P_i + sum_{j != i} s_j G_ij P_j + c_i), P_i = Proj_mu(y), with the radial
   friction-cone projection (y_n <= 0 -> 0; |y_t| > mu y_n -> y_t scaled onto the cone) and
   r_i = 1 / (Gershgorin bound of lambda_max(G_ii)), which guarantees each block step is stable.
4. Applied impulses Lambda_i = s_kappa(d_i) P_i with s_kappa(d) = 1 / (1 + exp(-kappa d)),
   v' = v_free + H^-1 J^T Lambda, q' = q (+) h v'.

An optional position term, ours (``ContactConfig.depth_correction`` = beta; 0, the default, is the
paper's model): c_i,n - beta max(d_i, 0) / h replaces c_i,n in step 3.

Choices the paper leaves open, settled here by measurement: activation margin phi_act = 4.6 / kappa (s = 0.01
there, so a sphere enters the solver with a negligible impulse instead of a jump to s = 0.5); semi-implicit
Euler (the same integrator as the contact-free dynamics and as MuJoCo's Euler, so the two can be compared
directly); the Gershgorin step size above. Each solver sweep writes an iteration-indexed
field (reverse-mode safe: the reverse pass differentiates one sweep per launch); the
multi-right-hand-side solve, the Delassus products and the sweeps have hand-written adjoints,
which accumulate with plain loads and stores (one thread per environment; on the CPU a float
atomic add is a compare-and-swap loop, the cost of the generated adjoints).

A sphere out of the solver has a zero impulse and scale, so its terms are exact zeros: each row
lists its candidate spheres (``con_list``, ``con_count``), and the solve, the Delassus products, the
sweeps and their adjoints visit those alone: the forward solve and Delassus products four spheres
(12 columns side by side) at a time, the adjoints one sphere at a time with 13 dofs side by side.
Each unrolled block exists once per kernel (a block unrolled twice, or three times over a sphere's
axes, compiles that many times slower while running no faster). The dense, unrolled sweep, the
reference the adjoints are tested against, is in the tests (``tests/sim_reference.py``).
"""

import taichi as ti

from bcg.sim.spatial import cross, mtv3, mv3

SOLVE_BLOCK = 13  # dofs summed side by side in the adjoints of the solve and the Delassus products
GROUP = 4  # candidate spheres per block of the solve (3 columns each, with column 0: 13 side by side)


@ti.func
def _inv3(m):
    """Inverse of a 3x3 matrix by its adjugate (plain expressions)."""
    a = m[1, 1] * m[2, 2] - m[1, 2] * m[2, 1]
    b = m[1, 2] * m[2, 0] - m[1, 0] * m[2, 2]
    c = m[1, 0] * m[2, 1] - m[1, 1] * m[2, 0]
    det = m[0, 0] * a + m[0, 1] * b + m[0, 2] * c
    inv = ti.Matrix(
        [
            [a, m[0, 2] * m[2, 1] - m[0, 1] * m[2, 2], m[0, 1] * m[1, 2] - m[0, 2] * m[1, 1]],
            [b, m[0, 0] * m[2, 2] - m[0, 2] * m[2, 0], m[0, 2] * m[1, 0] - m[0, 0] * m[1, 2]],
            [c, m[0, 1] * m[2, 0] - m[0, 0] * m[2, 1], m[0, 0] * m[1, 1] - m[0, 1] * m[1, 0]],
        ]
    )
    return inv / det


class ContactKernels:
    """Kernels over the contact fields declared by :class:`bcg.sim.rollout.Simulator`."""

    @ti.func
    def _contact_geometry(self):
        ti.loop_config(serialize=self._serial_rows)
        for r_, i in ti.ndrange(self.active.n_active[None], self.ncon):
            e = self.active.rows[r_]
            self._contact_geometry_one(e, i)

    @ti.func
    def _contact_geometry_one(self, e: ti.template(), i: ti.template()):
        b = self.ground.sphere_body[i]
        centre = self.dyn.xpos[e, b] + mv3(self.dyn.xmat[e, b], self.ground.sphere_pos[i])
        point = centre - ti.Vector([0.0, 0.0, self.ground.con_radius[None]])
        gap = point[2] - self.ground.con_ground[None]
        depth = -gap
        x = ti.min(
            ti.max(self.ground.con_kappa[None] * depth, -30.0), 30.0
        )  # exp(30)^2 stays finite in float32
        self.ground.con_point[e, i] = point
        self.ground.con_depth[e, i] = depth
        self.ground.con_scale[e, i] = ti.select(
            gap <= self.ground.con_margin[None], 1.0 / (1.0 + ti.exp(-x)), 0.0
        )
        self.ground.con_active[e, i] = ti.select(gap <= self.ground.con_margin[None], 1.0, 0.0)

    @ti.func
    def _contact_rhs(self, s: ti.template()):
        """Right-hand sides [h f | J^T] of the multi-column solve; J_i columns from the dof axes."""
        ti.loop_config(serialize=self._serial_rows)
        for r_, d in ti.ndrange(self.active.n_active[None], self.nv):
            e = self.active.rows[r_]
            self._contact_rhs_one(s, e, d)

    @ti.func
    def _contact_rhs_one(self, s: ti.template(), e: ti.template(), d: ti.template()):
        self.ground.rhs_m[e, 0, d] = self.dt * (self.dyn.qfrc_total[e, d] - self.dyn.qfrc_bias[e, d])
        pref = self.dyn.xpos[e, self.ref_body]
        for i in ti.static(range(self.ncon)):
            anc = self.ground.body_dof_anc[self.ground.sphere_body[i], d]
            col = self.dyn.cdof_lin[e, d] + cross(self.dyn.cdof_ang[e, d], self.ground.con_point[e, i] - pref)
            for a in ti.static(range(3)):
                self.ground.jac[e, 3 * i + a, d] = anc * col[a]
                self.ground.rhs_m[e, 1 + 3 * i + a, d] = anc * col[a]

    @ti.func
    def _contact_list(self, e):
        """con_list[e, :n]: the row's candidate spheres (con_active = 1) in ascending order,
        n = con_count[e]. The solve, the Delassus products, the sweeps and their adjoints visit these
        alone: a sphere out of the solver has a zero impulse and scale, so every term of the others is
        an exact zero (the dense formulas stay as the references the adjoints are tested against)."""
        n = 0
        for i in range(self.ncon):
            if self.ground.con_active[e, i] > 0.0:
                self.ground.con_list[e, n] = i
                n += 1
        self.ground.con_count[e] = n

    @ti.func
    def _active_column(self, e, p):
        """Right-hand side p of [h f | J^T of the candidate spheres]: 0, then 1 + 3 i + a."""
        col = 0
        if p > 0:
            col = 1 + 3 * self.ground.con_list[e, (p - 1) // 3] + (p - 1) % 3
        return col

    @ti.func
    def _group(self, e, g):
        """The spheres of candidates g * GROUP .. (g + 1) * GROUP - 1; slots past the last candidate
        repeat it (its columns computed twice, with the same result; the adjoints mask such slots),
        and with no candidate they hold a sphere whose columns nothing reads."""
        n = self.ground.con_count[e]
        return ti.Vector(
            [
                self.ground.con_list[e, ti.max(ti.min(g * GROUP + q, n - 1), 0)]
                for q in ti.static(range(GROUP))
            ]
        )

    @ti.func
    def _chol_solve_group(self, e, src: ti.template(), dst: ti.template(), sph):
        """dst[e, k] = M^-1 src[e, k] for column 0 and the three columns 1 + 3 i + a of
        each sphere i of ``sph``, with the stored Cholesky factor M = L L^T (forward then backward
        substitution, the solve of :meth:`bcg.sim.dynamics.DynamicsKernels._chol_solve`), each column
        summed in that order. The columns' independent chains of multiply-adds run side by side
        (13 of them: one column at a time waits on each previous result), addressed from one base per
        sphere so that the block keeps its addresses in registers."""
        for i in range(self.nv):
            v = ti.Vector([src[e, self._col(sph, c, True), i] for c in ti.static(range(self._ncols(True)))])
            for j in range(i):
                lij = self.dyn.chol[e, i, j]
                for c in ti.static(range(self._ncols(True))):
                    v[c] -= lij * dst[e, self._col(sph, c, True), j]
            for c in ti.static(range(self._ncols(True))):
                dst[e, self._col(sph, c, True), i] = v[c] / self.dyn.chol[e, i, i]
        for ii in range(self.nv):
            i = self.nv - 1 - ii
            v = ti.Vector([dst[e, self._col(sph, c, True), i] for c in ti.static(range(self._ncols(True)))])
            for j in range(i + 1, self.nv):
                lji = self.dyn.chol[e, j, i]
                for c in ti.static(range(self._ncols(True))):
                    v[c] -= lji * dst[e, self._col(sph, c, True), j]
            for c in ti.static(range(self._ncols(True))):
                dst[e, self._col(sph, c, True), i] = v[c] / self.dyn.chol[e, i, i]

    @staticmethod
    def _ncols(first) -> int:
        """Columns of a block: three per sphere, and column 0 with ``first`` (the solve's blocks)."""
        return 3 * GROUP + (1 if first else 0)

    @ti.func
    def _col(self, sph, c: ti.template(), first: ti.template()):
        """Right-hand side of a group's column c: 0, or 1 + 3 i + a for its sphere slot q and axis a."""
        col = 0
        if ti.static(not (first and c == 0)):
            col = 1 + 3 * sph[ti.static((c - int(first)) // 3)] + ti.static((c - int(first)) % 3)
        return col

    @ti.func
    def _solve_active(self, e, src: ti.template(), dst: ti.template()):
        """dst[e, k] = M^-1 src[e, k] for column 0 and the candidate spheres' columns, GROUP candidates
        at a time with column 0 (one block with up to four of the eight feet spheres in the solver,
        two otherwise)."""
        for g in range(ti.max((self.ground.con_count[e] + GROUP - 1) // GROUP, 1)):
            # column 0 goes with every block (a second block solves it again, to the same values):
            # one copy of the unrolled block instead of two halves the compile time
            self._chol_solve_group(e, src, dst, self._group(e, g))

    @ti.func
    def _delassus_active(self, s, e):
        """G = J M^-1 J^T and c = J v_free for the candidate spheres' rows and columns (the others are
        not read), each entry summed over the dofs in order, a group's 12 columns side by side. (Summing
        over the dofs that move the row's sphere alone, 12 of the G1's 35, measured slower here: the
        dense loop streams the rows.)"""
        n = self.ground.con_count[e]
        for ka in range(n):
            base = 3 * self.ground.con_list[e, ka]
            for aa in range(3):  # a loop, not unrolled: one copy of the block compiles three times faster
                a = base + aa
                for g in range((n + GROUP - 1) // GROUP):
                    sph = self._group(e, g)
                    acc = ti.Vector([0.0 for _ in ti.static(range(3 * GROUP))])
                    for d in range(self.nv):
                        j = self.ground.jac[e, a, d]
                        for c in ti.static(range(3 * GROUP)):
                            acc[c] += j * self.ground.sol_m[e, self._col(sph, c, False), d]
                    for c in ti.static(range(3 * GROUP)):
                        self.ground.delassus[e, a, self._col(sph, c, False) - 1] = acc[c]
                acc0 = 0.0
                for d in range(self.nv):
                    acc0 += self.ground.jac[e, a, d] * (self.state.qvel[s, e, d] + self.ground.sol_m[e, 0, d])
                # the position term (ContactConfig.depth_correction): a normal target velocity
                # beta max(d, 0) / h, i.e. c_n - beta max(d, 0) / h in the solver's equations
                if aa == 2:
                    acc0 -= (
                        self.ground.con_dcorr[None] / self.dt * ti.max(self.ground.con_depth[e, a // 3], 0.0)
                    )
                self.ground.con_vel[e, a] = acc0

    @ti.kernel
    def solve_multi_adjoint(self):
        """Adjoint of X = M^-1 B: B_bar += M^-1 X_bar, M_bar -= sum_k (M^-1 X_bar)_k X_k^T (each entry
        of M_bar summed by one thread: no atomics), over column 0 and the candidate spheres' columns
        (the others' X_bar is zero): the solve GROUP spheres at a time (:meth:`_solve_active`); M_bar
        at the mass matrix's tree pairs alone (647 of the G1's 1,225 entries), each pair's entry (i, j)
        holding the partials of both M[i, j] and M[j, i] (the mass matrix's adjoint adds the two)."""
        ti.loop_config(serialize=self._serial_row_loops)
        for i_ in range(self._row_items()):
            r_ = self._row_of(i_)
            if r_ < self.active.n_active[None]:
                self._solve_active(self.active.rows[r_], self.ground.sol_m.grad, self.ground.tmp_m)
        ti.loop_config(serialize=ti.static(self._serial_items(self.nv)))
        for r_, i in ti.ndrange(self.active.n_active[None], self.nv):
            e = self.active.rows[r_]
            n = self.ground.con_count[e]
            self.ground.rhs_m.grad[e, 0, i] = self.ground.rhs_m.grad[e, 0, i] + self.ground.tmp_m[e, 0, i]
            for kk in range(n):
                base = 1 + 3 * self.ground.con_list[e, kk]
                for a in ti.static(range(3)):
                    self.ground.rhs_m.grad[e, base + a, i] = (
                        self.ground.rhs_m.grad[e, base + a, i] + self.ground.tmp_m[e, base + a, i]
                    )
        # M_bar at the mass matrix's nonzeros alone (a dof and an ancestor: the pairs the mass
        # matrix's adjoint reads), both triangles' partials summed into the pair's entry (i, j)
        ti.loop_config(serialize=ti.static(self._serial_items(self.mdl.npairs)))
        for r_, k in ti.ndrange(self.active.n_active[None], self.mdl.npairs):
            e = self.active.rows[r_]
            i = self.mdl.pair_i[k]
            j = self.mdl.pair_j[k]
            off = ti.select(i != j, 1.0, 0.0)
            acc = (
                self.ground.tmp_m[e, 0, i] * self.ground.sol_m[e, 0, j]
                + off * self.ground.tmp_m[e, 0, j] * self.ground.sol_m[e, 0, i]
            )
            for kk in range(self.ground.con_count[e]):
                base = 1 + 3 * self.ground.con_list[e, kk]
                for a in ti.static(range(3)):
                    acc += self.ground.tmp_m[e, base + a, i] * self.ground.sol_m[e, base + a, j]
                    acc += off * self.ground.tmp_m[e, base + a, j] * self.ground.sol_m[e, base + a, i]
            self.dyn.mass.grad[e, i, j] = self.dyn.mass.grad[e, i, j] - acc

    @ti.kernel
    def delassus_adjoint(self, s: ti.i32):
        """Adjoint of the Delassus stage (G = J X_J and c = J (v + X_0), X = H^-1 [h f | J^T]):
        J_bar += G_bar X_J^T + c_bar (v + X_0)^T, X_J_bar += G_bar^T J, X_0_bar = v_bar += J^T c_bar.
        Written by hand because the generated adjoint accumulates every product atomically; the dofs
        go SOLVE_BLOCK at a time, as independent sums side by side. J_bar is formed at the dofs that
        move each row's sphere alone (J is zero elsewhere, and so is what the Jacobian's own adjoint
        reads there), and a sphere adds to J^T products only in the blocks of dofs that move it."""
        ti.loop_config(serialize=ti.static(self._serial_items(self.ncol)))
        for r_, pa in ti.ndrange(self.active.n_active[None], self.ncol):
            e = self.active.rows[r_]
            n3 = 3 * self.ground.con_count[e]
            if pa < n3:
                a = self._active_column(e, 1 + pa) - 1
                q0 = self.ground.sphere_dof_start[a // 3]
                q1 = self.ground.sphere_dof_start[a // 3 + 1]
                gc = self.ground.con_vel.grad[e, a]
                if a % 3 == 2 and self.ground.con_depth[e, a // 3] > 0.0:  # the position term's partial
                    self.ground.con_depth.grad[e, a // 3] = (
                        self.ground.con_depth.grad[e, a // 3] - self.ground.con_dcorr[None] / self.dt * gc
                    )
                # the row's nonzero dofs SOLVE_BLOCK at a time (slots past the last repeat it, unwritten)
                for blk in range((q1 - q0 + SOLVE_BLOCK - 1) // SOLVE_BLOCK):
                    dd = ti.Vector(
                        [
                            self.ground.sphere_dof_items[ti.min(q0 + blk * SOLVE_BLOCK + c, q1 - 1)]
                            for c in ti.static(range(SOLVE_BLOCK))
                        ]
                    )
                    acc = ti.Vector(
                        [
                            gc * (self.state.qvel[s, e, dd[c]] + self.ground.sol_m[e, 0, dd[c]])
                            for c in ti.static(range(SOLVE_BLOCK))
                        ]
                    )
                    for kk in range(self.ground.con_count[e]):
                        base = 3 * self.ground.con_list[e, kk]
                        for bb in ti.static(range(3)):
                            g = self.ground.delassus.grad[e, a, base + bb]
                            for c in ti.static(range(SOLVE_BLOCK)):
                                acc[c] += g * self.ground.sol_m[e, 1 + base + bb, dd[c]]
                    for c in ti.static(range(SOLVE_BLOCK)):
                        if q0 + blk * SOLVE_BLOCK + c < q1:
                            self.ground.jac.grad[e, a, dd[c]] = self.ground.jac.grad[e, a, dd[c]] + acc[c]
        ti.loop_config(serialize=ti.static(self._serial_items(self.nrhs)))
        for r_, p in ti.ndrange(self.active.n_active[None], self.nrhs):
            e = self.active.rows[r_]
            n3 = 3 * self.ground.con_count[e]
            if p < 1 + n3:
                self._delassus_adjoint_column(s, e, self._active_column(e, p))

    @ti.func
    def _delassus_adjoint_column(self, s, e, k):
        """Right-hand side k's part of :meth:`delassus_adjoint` (k = 0: the free velocity, whose
        gradient also goes to v), over the candidate spheres' rows, one sphere per loop iteration."""
        n = self.ground.con_count[e]
        for d0 in ti.static(range(0, self.nv, SOLVE_BLOCK)):
            w = ti.static(min(SOLVE_BLOCK, self.nv - d0))
            acc = ti.Vector([0.0 for _ in ti.static(range(w))])
            for kk in range(n):
                if self.ground.sphere_block_hit[self.ground.con_list[e, kk], d0 // SOLVE_BLOCK]:
                    base = 3 * self.ground.con_list[e, kk]
                    for aa in ti.static(range(3)):
                        a = base + aa
                        g = ti.select(
                            k == 0,
                            self.ground.con_vel.grad[e, a],
                            self.ground.delassus.grad[e, a, ti.max(k - 1, 0)],
                        )
                        for c in ti.static(range(w)):
                            acc[c] += g * self.ground.jac[e, a, d0 + c]
            for c in ti.static(range(w)):
                self.ground.sol_m.grad[e, k, d0 + c] = self.ground.sol_m.grad[e, k, d0 + c] + acc[c]
            if k == 0:
                for c in ti.static(range(w)):
                    self.state.qvel.grad[s, e, d0 + c] = self.state.qvel.grad[s, e, d0 + c] + acc[c]

    @ti.func
    def _block(self, e, i, j):
        return ti.Matrix(
            [
                [self.ground.delassus[e, 3 * i + a, 3 * j + b] for b in ti.static(range(3))]
                for a in ti.static(range(3))
            ]
        )

    @ti.func
    def _cvel(self, e, i):
        return ti.Vector(
            [
                self.ground.con_vel[e, 3 * i],
                self.ground.con_vel[e, 3 * i + 1],
                self.ground.con_vel[e, 3 * i + 2],
            ]
        )

    @ti.func
    def _pgs_init(self):
        ti.loop_config(serialize=self._serial_rows)
        for r_, i in ti.ndrange(self.active.n_active[None], self.ncon):
            e = self.active.rows[r_]
            self._pgs_init_one(e, i)

    @ti.func
    def _pgs_init_one(self, e: ti.template(), i: ti.template()):
        # a sphere out of the solver has no G_ii or c_i (not computed): it reads an identity block and a
        # zero velocity, so its impulse is an exact, finite zero and so are its partials
        act = self.ground.con_active[e, i] > 0.0
        eye = ti.Matrix.identity(self.fp, 3)
        gii = ti.Matrix(
            [
                [
                    ti.select(act, self.ground.delassus[e, 3 * i + a, 3 * i + b], eye[a, b])
                    for b in ti.static(range(3))
                ]
                for a in ti.static(range(3))
            ]
        )
        cvel = ti.Vector(
            [ti.select(act, self.ground.con_vel[e, 3 * i + a], 0.0) for a in ti.static(range(3))]
        )
        # Gershgorin bound of the largest eigenvalue of the (symmetric positive) block
        lam = ti.max(
            ti.abs(gii[0, 0]) + ti.abs(gii[0, 1]) + ti.abs(gii[0, 2]),
            ti.max(
                ti.abs(gii[1, 0]) + ti.abs(gii[1, 1]) + ti.abs(gii[1, 2]),
                ti.abs(gii[2, 0]) + ti.abs(gii[2, 1]) + ti.abs(gii[2, 2]),
            ),
        )
        self.ground.con_step[e, i] = 1.0 / lam
        p0 = -mv3(_inv3(gii), cvel)
        self.ground.impulse[0, e, i] = p0 * self.ground.con_active[e, i]

    @ti.func
    def _project(self, y, mu):
        tn = ti.sqrt(y[0] * y[0] + y[1] * y[1] + 1e-20)
        scale = ti.select(tn > mu * y[2], mu * y[2] / tn, 1.0)
        return ti.select(
            y[2] > 0.0, ti.Vector([y[0] * scale, y[1] * scale, y[2]]), ti.Vector([0.0, 0.0, 0.0])
        )

    @ti.func
    def _pgs_sweep_rolled(self, it, e):
        """One Gauss-Seidel sweep of row e, impulse[it] -> impulse[it + 1], with its loops over contacts
        at run time: the iterate is updated in place in impulse[it + 1], so contact j reads its new
        value for j < i and its old one for j >= i, and every sum runs in the same order (the same
        numbers up to round-off: Taichi's fast math lets LLVM contract the products differently,
        1e-12 relative over two stiff control steps in float64). Unrolled over the 8 x 8 contact
        pairs, the fused step kernel took about a minute to compile; that dense sweep stays in the
        tests (``tests/sim_reference.py``), the differentiable reference that the hand-written adjoint
        is checked against."""
        mu = self.ground.friction[e]
        n = self.ground.con_count[e]
        for i in range(self.ncon):
            self.ground.impulse[it + 1, e, i] = self.ground.impulse[it, e, i]
        for ki in range(n):
            i = self.ground.con_list[e, ki]
            acc = self._cvel(e, i) + mv3(self._block(e, i, i), self.ground.impulse[it + 1, e, i])
            for kj in range(n):
                j = self.ground.con_list[e, kj]
                if j != i:
                    acc += self.ground.con_scale[e, j] * mv3(
                        self._block(e, i, j), self.ground.impulse[it + 1, e, j]
                    )
            y = self.ground.impulse[it + 1, e, i] - self.ground.con_step[e, i] * acc
            self.ground.impulse[it + 1, e, i] = self._project(y, mu) * self.ground.con_active[e, i]

    @ti.kernel
    def pgs_adjoint(self):
        """Adjoint of all sweeps, the last first, in one launch: one thread per row runs
        :meth:`_pgs_sweep_adjoint_one` for it = iterations - 1, ..., 0 (every launch costs tens of
        microseconds from Python, and the sweeps of one row depend on that row alone)."""
        ti.loop_config(serialize=self._serial_row_loops)
        for i_ in range(self._row_items()):
            r_ = self._row_of(i_)
            if r_ < self.active.n_active[None]:
                e = self.active.rows[r_]
                for k in range(self.iterations):
                    self._pgs_sweep_adjoint_one(self.iterations - 1 - k, e)

    @ti.func
    def _pgs_sweep_adjoint_one(self, it, e):
        """Adjoint of the sweep impulse[it] -> impulse[it + 1] of row e (:meth:`_pgs_sweep_rolled`), by hand.

        Within a sweep contact j's impulse is read at its old value (impulse[it]) before its own update
        and at its new value (impulse[it + 1]) after it, so every y_i and acc_i is recomputed from the
        two stored iterates without a tape. The contacts are then reversed from the last to the first,
        carrying the adjoint of each contact's current impulse, and the partials of G, c, s, r and
        the activity mask are summed per environment by the one thread that owns it (no atomics).
        Same partials as Taichi's generated adjoint of the sweep (the friction coefficient is not
        differentiated; the projection's branch is taken as in the forward).

        The loops over contacts run at run time, with the impulses as read (``pgs_cur``) and their
        adjoints (``pgs_gnew``) kept in per-row fields: unrolled over the 8 x 8 contact pairs this
        function took about 7.5 minutes to compile (LLVM, float64, 2-core CPU) for one simulator."""
        mu = self.ground.friction[e]
        n = self.ground.con_count[e]
        for j in range(self.ncon):
            # cur[j]: contact j's impulse as update i read it (new for j < i, old for j >= i)
            self.ground.pgs_cur[e, j] = self.ground.impulse[it + 1, e, j]
            self.ground.pgs_gnew[e, j] = self.ground.impulse.grad[it + 1, e, j]
        for k in range(n):
            i = self.ground.con_list[e, n - 1 - k]
            ci = self.ground.impulse[it, e, i]
            self.ground.pgs_cur[e, i] = ci
            gii = self._block(e, i, i)
            acc = self._cvel(e, i) + mv3(gii, ci)
            for kj in range(n):
                j = self.ground.con_list[e, kj]
                if j != i:
                    acc += self.ground.con_scale[e, j] * mv3(self._block(e, i, j), self.ground.pgs_cur[e, j])
            step = self.ground.con_step[e, i]
            y = ci - step * acc
            g_out = self.ground.pgs_gnew[e, i]
            self.ground.con_active.grad[e, i] = self.ground.con_active.grad[e, i] + g_out.dot(
                self._project(y, mu)
            )
            g_y = self._project_adjoint(y, mu, g_out * self.ground.con_active[e, i])
            self.ground.con_step.grad[e, i] = self.ground.con_step.grad[e, i] - g_y.dot(acc)
            g_acc = -step * g_y
            for a in ti.static(range(3)):
                self.ground.con_vel.grad[e, 3 * i + a] = self.ground.con_vel.grad[e, 3 * i + a] + g_acc[a]
            # the old value of contact i enters y directly and through G_ii
            self.ground.pgs_gnew[e, i] = g_y + mtv3(gii, g_acc)
            for a, b in ti.static(ti.ndrange(3, 3)):
                self.ground.delassus.grad[e, 3 * i + a, 3 * i + b] = (
                    self.ground.delassus.grad[e, 3 * i + a, 3 * i + b] + g_acc[a] * ci[b]
                )
            for kj in range(n):
                j = self.ground.con_list[e, kj]
                if j != i:
                    sj = self.ground.con_scale[e, j]
                    gij = self._block(e, i, j)
                    cj = self.ground.pgs_cur[e, j]
                    self.ground.con_scale.grad[e, j] = self.ground.con_scale.grad[e, j] + g_acc.dot(
                        mv3(gij, cj)
                    )
                    for a, b in ti.static(ti.ndrange(3, 3)):
                        self.ground.delassus.grad[e, 3 * i + a, 3 * j + b] = (
                            self.ground.delassus.grad[e, 3 * i + a, 3 * j + b] + sj * g_acc[a] * cj[b]
                        )
                    self.ground.pgs_gnew[e, j] = self.ground.pgs_gnew[e, j] + sj * mtv3(gij, g_acc)
        for i in range(self.ncon):
            self.ground.impulse.grad[it, e, i] = (
                self.ground.impulse.grad[it, e, i] + self.ground.pgs_gnew[e, i]
            )
            self.ground.impulse.grad[it + 1, e, i] = ti.Vector([0.0, 0.0, 0.0])  # consumed, as Taichi does

    @ti.func
    def _project_adjoint(self, y, mu, g):
        """y_bar of :meth:`_project` for out_bar = g (mu held fixed), on the forward's branch."""
        tn = ti.sqrt(y[0] * y[0] + y[1] * y[1] + 1e-20)
        out = ti.Vector([0.0, 0.0, 0.0])
        if y[2] > 0.0:
            if tn > mu * y[2]:
                scale = mu * y[2] / tn
                g_scale = g[0] * y[0] + g[1] * y[1]
                g_tn = -g_scale * scale / tn
                out = ti.Vector(
                    [
                        g[0] * scale + g_tn * y[0] / tn,
                        g[1] * scale + g_tn * y[1] / tn,
                        g[2] + g_scale * mu / tn,
                    ]
                )
            else:
                out = g
        return out

    @ti.func
    def _contact_velocity(self, s: ti.template()):
        """v' = v + h H^-1 f + H^-1 J^T (s P), the impulse of every sphere scaled by s_kappa(d)."""
        ti.loop_config(serialize=self._serial_rows)
        for r_, d in ti.ndrange(self.active.n_active[None], self.nv):
            e = self.active.rows[r_]
            self._contact_velocity_one(s, e, d)

    @ti.func
    def _contact_velocity_one(self, s: ti.template(), e: ti.template(), d: ti.template()):
        v = self.state.qvel[s, e, d] + self.ground.sol_m[e, 0, d]
        for i in ti.static(range(self.ncon)):
            act = self.ground.con_active[e, i] > 0.0
            lam = self.ground.impulse[self.iterations, e, i] * self.ground.con_scale[e, i]
            for a in ti.static(range(3)):
                # out of the solver: an exact zero (H^-1 J^T's column is not computed, Lambda_i = 0)
                v += ti.select(act, self.ground.sol_m[e, 1 + 3 * i + a, d] * lam[a], 0.0)
        self.state.qvel[s + 1, e, d] = v

    @ti.kernel
    def contact_velocity_adjoint(self, s: ti.i32):
        """Adjoint of :meth:`_contact_velocity`, by hand: one thread per environment sums each sphere's
        impulse partial over the dofs with plain loads and stores (the generated adjoint adds it with
        an atomic per dof). Same partials; the consumed gradient of v' is zeroed, as Taichi does."""
        ti.loop_config(serialize=self._serial_row_loops)
        for i_ in range(self._row_items()):
            r_ = self._row_of(i_)
            if r_ < self.active.n_active[None]:
                e = self.active.rows[r_]
                for d in range(self.nv):
                    g = self.state.qvel.grad[s + 1, e, d]
                    self.state.qvel.grad[s, e, d] = self.state.qvel.grad[s, e, d] + g
                    self.ground.sol_m.grad[e, 0, d] = self.ground.sol_m.grad[e, 0, d] + g
                for kk in range(self.ground.con_count[e]):
                    i = self.ground.con_list[e, kk]
                    imp = self.ground.impulse[self.iterations, e, i]
                    sc = self.ground.con_scale[e, i]
                    lam = imp * sc
                    g_lam = ti.Vector([0.0, 0.0, 0.0])
                    for d in range(self.nv):
                        g = self.state.qvel.grad[s + 1, e, d]
                        for a in ti.static(range(3)):
                            k = 1 + 3 * i + a
                            self.ground.sol_m.grad[e, k, d] = self.ground.sol_m.grad[e, k, d] + g * lam[a]
                            g_lam[a] += g * self.ground.sol_m[e, k, d]
                    self.ground.impulse.grad[self.iterations, e, i] = (
                        self.ground.impulse.grad[self.iterations, e, i] + g_lam * sc
                    )
                    self.ground.con_scale.grad[e, i] = self.ground.con_scale.grad[e, i] + g_lam.dot(imp)
                for d in range(self.nv):
                    self.state.qvel.grad[s + 1, e, d] = 0.0

    @ti.kernel
    def contact_rhs_adjoint(self, s: ti.i32):
        """Adjoint of :meth:`_contact_rhs`, by hand (see :meth:`contact_velocity_adjoint`): the contact
        points' and the reference point's partials are summed over the dofs by one thread per
        environment. Same partials as the generated adjoint; consumed gradients zeroed."""
        ti.loop_config(serialize=self._serial_row_loops)
        for i_ in range(self._row_items()):
            r_ = self._row_of(i_)
            if r_ < self.active.n_active[None]:
                e = self.active.rows[r_]
                pref = self.dyn.xpos[e, self.ref_body]
                g_pref = ti.Vector([0.0, 0.0, 0.0])
                for d in range(self.nv):
                    g0 = self.dt * self.ground.rhs_m.grad[e, 0, d]
                    self.dyn.qfrc_total.grad[e, d] = self.dyn.qfrc_total.grad[e, d] + g0
                    self.dyn.qfrc_bias.grad[e, d] = self.dyn.qfrc_bias.grad[e, d] - g0
                    self.ground.rhs_m.grad[e, 0, d] = 0.0
                for i in ti.static(range(self.ncon)):
                    r = self.ground.con_point[e, i] - pref
                    g_r = ti.Vector([0.0, 0.0, 0.0])
                    for d in range(self.nv):
                        anc = self.ground.body_dof_anc[self.ground.sphere_body[i], d]
                        g_col = ti.Vector([0.0, 0.0, 0.0])
                        for a in ti.static(range(3)):
                            k = 3 * i + a
                            g_col[a] = anc * (
                                self.ground.jac.grad[e, k, d] + self.ground.rhs_m.grad[e, 1 + k, d]
                            )
                            self.ground.jac.grad[e, k, d] = 0.0
                            self.ground.rhs_m.grad[e, 1 + k, d] = 0.0
                        ang = self.dyn.cdof_ang[e, d]
                        self.dyn.cdof_lin.grad[e, d] = self.dyn.cdof_lin.grad[e, d] + g_col
                        self.dyn.cdof_ang.grad[e, d] = self.dyn.cdof_ang.grad[e, d] + cross(r, g_col)
                        g_r += cross(g_col, ang)
                    self.ground.con_point.grad[e, i] = self.ground.con_point.grad[e, i] + g_r
                    g_pref -= g_r
                self.dyn.xpos.grad[e, self.ref_body] = self.dyn.xpos.grad[e, self.ref_body] + g_pref

    @ti.kernel
    def _clear_contact_stats(self):
        """Zero every row's per-sphere force and the step's maximum (a step's statistics start here;
        one serial loop: the field's ``fill`` cost ~1 ms per call through Taichi's Python scope)."""
        ti.loop_config(serialize=self._serial)
        for e in range(self.num_rows):
            self.ground.con_force_max[e] = 0.0
            for i in range(self.ncon):
                self.ground.con_force[e, i] = 0.0

    @ti.func
    def _contact_stats_one(self, e: ti.template(), i: ti.template()):
        """Sphere i's contact force |Lambda_i| / h and the step's running maximum (not differentiated)."""
        lam = self.ground.impulse[self.iterations, e, i] * self.ground.con_scale[e, i]
        f = ti.sqrt(lam[0] * lam[0] + lam[1] * lam[1] + lam[2] * lam[2]) / self.dt
        self.ground.con_force[e, i] = ti.max(self.ground.con_force[e, i], f)
        ti.atomic_max(self.ground.con_force_max[e], f)
