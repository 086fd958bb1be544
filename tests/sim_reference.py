"""Reference kernels of the simulator that only the tests run.

The forward step runs the solver sweep with its loops over contacts at run time
(``ContactKernels._pgs_sweep_rolled``) and the reverse pass every sweep's hand-written adjoint in one
launch (``pgs_adjoint``). The tests check those against the dense sweep unrolled over every pair of
spheres, which Taichi can differentiate, and against the hand-written adjoint of one sweep at a time.

The reverse pass also runs hand-written adjoints of the kinematics and velocity recursions (all tree
levels in one launch) and of the stages from body inertias to mass matrix and bias (one launch). The
tests check those against Taichi's generated adjoints of one kernel per tree level and per stage.
"""

import taichi as ti

from bcg.sim.spatial import mv3


@ti.data_oriented
class ContactReference:
    """The reference kernels over the fields of ``sim``, a simulator with contact."""

    def __init__(self, sim):
        self.sim = sim

    @ti.kernel
    def pgs_sweep(self, it: ti.i32):
        """One Gauss-Seidel sweep over all contacts: reads impulse[it], writes impulse[it + 1]. Its
        generated ``.grad`` is the reference of the hand-written sweep adjoint."""
        ti.loop_config(serialize=self.sim._serial_rows)
        for r_ in range(self.sim.active.n_active[None]):
            e = self.sim.active.rows[r_]
            self._pgs_sweep_one(it, e)

    @ti.func
    def _pgs_sweep_one(self, it: ti.template(), e: ti.template()):
        mu = self.sim.ground.friction[e]
        new = [self.sim.ground.impulse[it, e, i] for i in ti.static(range(self.sim.ncon))]
        for i in ti.static(range(self.sim.ncon)):
            acc = self.sim._cvel(e, i) + mv3(self.sim._block(e, i, i), new[i])
            for j in ti.static(range(self.sim.ncon)):
                if ti.static(j != i):
                    acc += self.sim.ground.con_scale[e, j] * mv3(self.sim._block(e, i, j), new[j])
            y = new[i] - self.sim.ground.con_step[e, i] * acc
            new[i] = self.sim._project(y, mu) * self.sim.ground.con_active[e, i]
        for i in ti.static(range(self.sim.ncon)):
            self.sim.ground.impulse[it + 1, e, i] = new[i]

    @ti.kernel
    def pgs_sweep_adjoint(self, it: ti.i32):
        """Adjoint of one sweep, impulse[it] -> impulse[it + 1], by hand (``_pgs_sweep_adjoint_one``):
        what the reverse pass's adjoint of every sweep in one launch is tested against."""
        ti.loop_config(serialize=self.sim._serial_row_loops)
        for i_ in range(self.sim._row_items()):
            r_ = self.sim._row_of(i_)
            if r_ < self.sim.active.n_active[None]:
                self.sim._pgs_sweep_adjoint_one(it, self.sim.active.rows[r_])


@ti.data_oriented
class TreeReference:
    """The per-level and per-stage kernels over the fields of ``sim``: their generated ``.grad`` s are
    the reference of ``fk_adjoint``, ``velocity_adjoint`` and ``mass_bias_adjoint``."""

    def __init__(self, sim):
        self.sim = sim

    @ti.kernel
    def fk(self, s: ti.i32, off: ti.i32, cnt: ti.i32):
        ti.loop_config(serialize=self.sim._serial_rows)
        for r_, k in ti.ndrange(self.sim.active.n_active[None], cnt):
            e = self.sim.active.rows[r_]
            b = self.sim.mdl.level_bodies[off + k]
            self.sim._fk_body(s, e, b)

    @ti.kernel
    def velocity(self, s: ti.i32, off: ti.i32, cnt: ti.i32):
        ti.loop_config(serialize=self.sim._serial_rows)
        for r_, k in ti.ndrange(self.sim.active.n_active[None], cnt):
            e = self.sim.active.rows[r_]
            b = self.sim.mdl.level_bodies[off + k]
            self.sim._velocity_body(s, e, b)

    @ti.kernel
    def zero_composites(self):
        ti.loop_config(serialize=self.sim._serial_rows)
        for r_, b in ti.ndrange(self.sim.active.n_active[None], self.sim.nbody):
            e = self.sim.active.rows[r_]
            self.sim.dyn.crb_m[e, b] = 0.0
            self.sim.dyn.crb_h[e, b] = ti.Vector([0.0, 0.0, 0.0])
            self.sim.dyn.crb_rot_inertia[e, b] = ti.Matrix.zero(self.sim.fp, 3, 3)
            self.sim.dyn.sub_frc_ang[e, b] = ti.Vector([0.0, 0.0, 0.0])
            self.sim.dyn.sub_frc_lin[e, b] = ti.Vector([0.0, 0.0, 0.0])

    @ti.kernel
    def body_inertia(self):
        self.sim._body_inertia()

    @ti.kernel
    def composite(self):
        self.sim._composite_inertia()

    @ti.kernel
    def dof_forces(self):
        self.sim._dof_forces()

    @ti.kernel
    def mass(self):
        self.sim._mass_matrix()

    @ti.kernel
    def body_forces(self):
        self.sim._body_forces()

    @ti.kernel
    def subtree(self):
        self.sim._subtree_forces()

    @ti.kernel
    def bias(self):
        self.sim._bias()

    def mass_bias_stages(self):
        """The per-stage kernels from body inertias to mass matrix and bias forces, in forward order."""
        return [
            self.body_inertia,
            self.composite,
            self.dof_forces,
            self.mass,
            self.body_forces,
            self.subtree,
            self.bias,
        ]

    def fk_levels(self, s):
        for off, cnt in self.sim._levels:
            self.fk(s, off, cnt)

    def velocity_levels(self, s):
        for off, cnt in self.sim._levels:
            self.velocity(s, off, cnt)

    def mass_bias_all(self):
        for kernel in self.mass_bias_stages():
            kernel()

    def dynamics_parts(self, s, c):
        """[(stage, args)] of kinematics, velocities, mass matrix and bias, and joint forces in forward
        order, every one a kernel launch (what a ``ti.ad.Tape`` records, so its generated adjoints
        can be validated)."""
        sim = self.sim
        return [
            (sim._g_world, ()),
            (self.fk_levels, (s,)),
            (sim._g_dof_axes, ()),
            (self.velocity_levels, (s,)),
            (self.mass_bias_all, ()),
            (sim._g_actuation, (s, c)),
            (sim._g_total_force, (s, c)),
        ]


_REFERENCES = {}


def _reference(sim, cls):
    """``cls``'s reference of ``sim``, built once per simulator (each instance compiles its own)."""
    key = (cls, id(sim))
    if key not in _REFERENCES:
        _REFERENCES[key] = (sim, cls(sim))
    return _REFERENCES[key][1]


def contact_reference(sim) -> ContactReference:
    """The contact reference kernels of ``sim``."""
    return _reference(sim, ContactReference)


def tree_reference(sim) -> TreeReference:
    """The per-level and per-stage reference kernels of ``sim``."""
    return _reference(sim, TreeReference)
