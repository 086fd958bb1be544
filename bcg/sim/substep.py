"""One physics substep: two fused kernels forward, per-stage kernels in reverse.

Forward, a substep is two kernels (dynamics, then solve and time step), each one loop over the active
rows (environments and bundle copies) with each row's work serial inside it: every launch costs tens of
microseconds from Python, so few launches is what makes the forward fast; two kernels rather than one
because a kernel's compile time grows faster than its size. On a GPU the loop over rows is parallel; on
a CPU it runs on the launching thread (see :mod:`bcg.sim.rows`), or on ``SimConfig.cpu_threads`` of
Taichi's threads, a block of consecutive rows each (:meth:`bcg.sim.rows.RowScheduling._row_of`).
Reverse-mode compile time grows with the square of a kernel's size, so the reverse pass does not
differentiate the fused kernels: each stage also exists as its own small kernel, and the reverse pass
calls each stage's adjoint in reverse order after the fused forward has recomputed the substep's
intermediates: mostly hand-written ones (kinematics, velocities, mass matrix and bias, contact Jacobian,
solves, Delassus products, solver sweeps, post-contact velocity; each beside its forward in
:mod:`bcg.sim.kinematics`, :mod:`bcg.sim.inertia`, :mod:`bcg.sim.dynamics` and :mod:`bcg.sim.contact`),
otherwise the stage kernel's generated ``.grad``. The per-level and per-stage kernels of kinematics,
velocities, mass matrix and bias, whose generated adjoints the hand-written ones are checked against, are
in the tests (``tests/sim_reference.py``): only the tests run them. The values are the same: the per-item
bodies are shared ``ti.func`` s of :mod:`bcg.sim.kinematics`, :mod:`bcg.sim.inertia`,
:mod:`bcg.sim.dynamics`, :mod:`bcg.sim.integrator` and :mod:`bcg.sim.contact`. A mixin of
:class:`bcg.sim.rollout.Simulator`.
"""

import taichi as ti


class _HandAdjoint:
    """A stage whose adjoint is written by hand: the reverse pass calls ``.grad`` like a kernel's."""

    def __init__(self, adjoint):
        self.grad = adjoint


class _Written:
    """A stage kernel whose adjoint is written by hand: calling it runs the kernel (what a
    ``ti.ad.Tape`` records); ``.grad`` is the hand-written adjoint, with the same arguments."""

    def __init__(self, kernel, adjoint):
        self.kernel, self.grad = kernel, adjoint

    def __call__(self, *args):
        self.kernel(*args)


class SubstepKernels:
    # ------------------------------------------------------------------ shared zeroing
    @ti.func
    def _composite_gather(self, e: ti.template(), b: ti.template()):
        """Body b's composite inertia and subtree force: its own plus its direct children's."""
        m = self.dyn.body_m[e, b]
        h = self.dyn.body_h[e, b]
        inertia = self.dyn.body_rot_inertia[e, b]
        fa = self.dyn.cfrc_ang[e, b]
        fl = self.dyn.cfrc_lin[e, b]
        for q in range(self.mdl.child_start[b], self.mdl.child_start[b + 1]):
            ch = self.mdl.child_items[q]
            m += self.dyn.crb_m[e, ch]
            h += self.dyn.crb_h[e, ch]
            inertia += self.dyn.crb_rot_inertia[e, ch]
            fa += self.dyn.sub_frc_ang[e, ch]
            fl += self.dyn.sub_frc_lin[e, ch]
        self.dyn.crb_m[e, b] = m
        self.dyn.crb_h[e, b] = h
        self.dyn.crb_rot_inertia[e, b] = inertia
        self.dyn.sub_frc_ang[e, b] = fa
        self.dyn.sub_frc_lin[e, b] = fl

    @ti.func
    def _zero_row_grad(self, f: ti.template(), e: ti.template(), zero: ti.template()):
        if ti.static(len(f.shape) == 2):
            for a in range(f.shape[1]):
                f.grad[e, a] = zero
        else:
            for a, b in ti.ndrange(f.shape[1], f.shape[2]):
                f.grad[e, a, b] = zero

    @ti.kernel
    def _zero_intermediate_grads(self):
        """Zero the active rows' gradients of every intermediate in one loop over rows (the
        reverse stages touch active rows only)."""
        ti.loop_config(serialize=self._serial_row_loops)
        for i_ in range(self._row_items()):
            r_ = self._row_of(i_)
            if r_ < self.active.n_active[None]:
                e = self.active.rows[r_]
                for f in ti.static(self._grad_scalars):
                    self._zero_row_grad(f, e, 0.0)
                for f in ti.static(self._grad_vectors):
                    self._zero_row_grad(f, e, ti.Vector.zero(self.fp, f.n))
                for f in ti.static(self._grad_matrices):
                    self._zero_row_grad(f, e, ti.Matrix.zero(self.fp, f.n, f.m))
                if ti.static(self.ncon > 0):
                    for it, i in ti.ndrange(self.iterations + 1, self.ncon):
                        self.ground.impulse.grad[it, e, i] = ti.Vector.zero(self.fp, 3)

    # ------------------------------------------------------------------ forward kernels
    # One loop over the rows, each row's substep run serially inside it: a substep is one launch.
    @ti.func
    def _kinematics_env(self, s: ti.template(), e: ti.template()):
        """World body, forward kinematics (MuJoCo orders parents before children), dof axes."""
        self._world_body(e)
        for b in range(1, self.nbody):
            self._fk_body(s, e, b)
        for d in range(self.nv):
            self._dof_axis(e, d)

    @ti.func
    def _velocity_env(self, s: ti.template(), e: ti.template()):
        for b in range(1, self.nbody):
            self._velocity_body(s, e, b)

    @ti.func
    def _mass_bias_env(self, e: ti.template()):
        """Body inertias and forces, composites (children before parents), mass matrix, bias."""
        for b in range(1, self.nbody):
            self._body_inertia_one(e, b)
            self._body_force(e, b)
        for k in range(1, self.nbody):
            self._composite_gather(e, self.nbody - k)
        for d in range(self.nv):
            self._dof_force(e, d)
        for k in range(self.mdl.npairs):
            self._mass_entry(e, k)
        for d in range(self.nv):
            self._bias_one(e, d)

    @ti.func
    def _forces_env(self, s: ti.template(), c: ti.template(), e: ti.template()):
        for k in range(self.nu):
            self._actuation_one(s, c, e, k)
        if ti.static(self.npair > 0):
            self._self_contact_env(e)
        for d in range(self.nv):
            self._total_force_one(s, c, e, d)

    @ti.func
    def _free_step_env(self, s: ti.template(), e: ti.template()):
        self._factor_env(e)
        self._solve_env(e)
        for d in range(self.nv):
            self._integrate_velocity_one(s, e, d)
        for j in range(self.njnt):
            self._integrate_position_one(s, e, j)

    @ti.func
    def _contact_step_env(self, s: ti.template(), e: ti.template()):
        for i in range(self.ncon):
            self._contact_geometry_one(e, i)
        self._contact_list(e)
        for d in range(self.nv):
            self._contact_rhs_one(s, e, d)
        self._factor_env(e)
        # the solve and G, c for column 0 and the candidate spheres alone (see _contact_list)
        self._solve_active(e, self.ground.rhs_m, self.ground.sol_m)
        self._delassus_active(s, e)
        for i in range(self.ncon):
            self._pgs_init_one(e, i)
        for it in range(self.iterations):
            self._pgs_sweep_rolled(it, e)
        for d in range(self.nv):
            self._contact_velocity_one(s, e, d)
        for j in range(self.njnt):
            self._integrate_position_one(s, e, j)
        for i in range(self.ncon):
            self._contact_stats_one(e, i)

    @ti.kernel
    def _k_dynamics(self, s: ti.i32, c: ti.i32):
        """Kinematics, velocities, mass matrix, bias and joint forces, one row per thread."""
        ti.loop_config(serialize=self._serial_row_loops)
        for i_ in range(self._row_items()):
            r_ = self._row_of(i_)
            if r_ < self.active.n_active[None]:
                e = self.active.rows[r_]
                self._kinematics_env(s, e)
                self._velocity_env(s, e)
                self._mass_bias_env(e)
                self._forces_env(s, c, e)

    @ti.kernel
    def _k_advance(self, s: ti.i32):
        """The solve (with the contact solver and its statistics) and the time step, one row per thread.
        (Two kernels rather than one: a kernel's compile time grows faster than its size.)"""
        ti.loop_config(serialize=self._serial_row_loops)
        for i_ in range(self._row_items()):
            r_ = self._row_of(i_)
            if r_ < self.active.n_active[None]:
                e = self.active.rows[r_]
                if ti.static(self.ncon == 0):
                    self._free_step_env(s, e)
                else:
                    self._contact_step_env(s, e)

    @ti.kernel
    def _k_kinematics(self, s: ti.i32):
        ti.loop_config(serialize=self._serial_rows)
        for r_ in range(self.active.n_active[None]):
            e = self.active.rows[r_]
            self._kinematics_env(s, e)

    @ti.kernel
    def _k_velocity(self, s: ti.i32):
        ti.loop_config(serialize=self._serial_rows)
        for r_ in range(self.active.n_active[None]):
            e = self.active.rows[r_]
            self._velocity_env(s, e)

    @ti.kernel
    def _k_mass_bias(self):
        ti.loop_config(serialize=self._serial_rows)
        for r_ in range(self.active.n_active[None]):
            e = self.active.rows[r_]
            self._mass_bias_env(e)

    @ti.kernel
    def _k_forces(self, s: ti.i32, c: ti.i32):
        ti.loop_config(serialize=self._serial_rows)
        for r_ in range(self.active.n_active[None]):
            e = self.active.rows[r_]
            self._forces_env(s, c, e)

    # ------------------------------------------------------------------ per-stage kernels (reverse)
    @ti.kernel
    def _g_world(self):
        self._world_motion()

    @ti.kernel
    def _g_dof_axes(self):
        self._dof_axes()

    @ti.kernel
    def _g_actuation(self, s: ti.i32, c: ti.i32):
        self._actuation(s, c)

    @ti.kernel
    def _g_total_force(self, s: ti.i32, c: ti.i32):
        self._total_force(s, c)

    @ti.kernel
    def _g_integrate_velocity(self, s: ti.i32):
        self._integrate_velocity(s)

    @ti.kernel
    def _g_integrate_position(self, s: ti.i32):
        self._integrate_position(s)

    @ti.kernel
    def _g_contact_geometry(self):
        self._contact_geometry()

    @ti.kernel
    def _g_contact_rhs(self, s: ti.i32):
        self._contact_rhs(s)

    @ti.kernel
    def _g_pgs_init(self):
        self._pgs_init()

    @ti.kernel
    def _g_contact_velocity(self, s: ti.i32):
        self._contact_velocity(s)

    # ------------------------------------------------------------------ the substep as stages
    def _dynamics_stages(self, s: int, c: int):
        """[(forward kernel, args, [(stage kernel, args), ...] in forward order)] for kinematics,
        velocities, mass matrix and bias, and joint forces: what the queries run on their own."""
        return [
            (
                self._k_kinematics,
                (s,),
                [(self._g_world, ()), (_HandAdjoint(self.fk_adjoint), (s,)), (self._g_dof_axes, ())],
            ),
            (self._k_velocity, (s,), [(_HandAdjoint(self.velocity_adjoint), (s,))]),
            (self._k_mass_bias, (), [(_HandAdjoint(self.mass_bias_adjoint), ())]),
            (self._k_forces, (s, c), self._force_stages(s, c)),
        ]

    def _force_stages(self, s: int, c: int):
        """The joint forces' stages: actuation, the self-contact's pairs and generalised force (where
        the simulator has self-contact), the total."""
        own = [(self._g_self_pairs, ()), (_HandAdjoint(self.self_qfrc_adjoint), ())] if self.npair else []
        return [(self._g_actuation, (s, c)), *own, (self._g_total_force, (s, c))]

    def _substep_ops(self, s: int, c: int):
        """The substep as [(forward kernel, args, adjoint parts)]: two fused forward launches, and the
        stages whose adjoints (generated ``.grad`` or written by hand) the reverse pass calls in
        reverse order after the forward has recomputed the intermediates."""
        parts = [p for _, _, ps in self._dynamics_stages(s, c) for p in ps]
        if self.contact is None:
            parts += [
                (_HandAdjoint(self.solve_adjoint), ()),
                (self._g_integrate_velocity, (s,)),
                (self._g_integrate_position, (s,)),
            ]
        else:
            parts += [
                (self._g_contact_geometry, ()),
                (_Written(self._g_contact_rhs, self.contact_rhs_adjoint), (s,)),
                (_HandAdjoint(self.solve_multi_adjoint), ()),
                (_HandAdjoint(self.delassus_adjoint), (s,)),
                (self._g_pgs_init, ()),
                (_HandAdjoint(self.pgs_adjoint), ()),
                (_Written(self._g_contact_velocity, self.contact_velocity_adjoint), (s,)),
                (self._g_integrate_position, (s,)),
            ]
        return [(self._k_dynamics, (s, c), []), (self._k_advance, (s,), parts)]
