"""Reference kernels of the simulator that only the tests run.

The forward step runs the solver sweep with its loops over contacts at run time
(``ContactKernels._pgs_sweep_rolled``) and the reverse pass every sweep's hand-written adjoint in one
launch (``pgs_adjoint``). The tests check those against the dense sweep unrolled over every pair of
spheres, which Taichi can differentiate, and against the hand-written adjoint of one sweep at a time.
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
        for r_ in range(self.sim.n_active[None]):
            e = self.sim.rows[r_]
            self._pgs_sweep_one(it, e)

    @ti.func
    def _pgs_sweep_one(self, it: ti.template(), e: ti.template()):
        mu = self.sim.friction[e]
        new = [self.sim.impulse[it, e, i] for i in ti.static(range(self.sim.ncon))]
        for i in ti.static(range(self.sim.ncon)):
            acc = self.sim._cvel(e, i) + mv3(self.sim._block(e, i, i), new[i])
            for j in ti.static(range(self.sim.ncon)):
                if ti.static(j != i):
                    acc += self.sim.con_scale[e, j] * mv3(self.sim._block(e, i, j), new[j])
            y = new[i] - self.sim.con_step[e, i] * acc
            new[i] = self.sim._project(y, mu) * self.sim.con_active[e, i]
        for i in ti.static(range(self.sim.ncon)):
            self.sim.impulse[it + 1, e, i] = new[i]

    @ti.kernel
    def pgs_sweep_adjoint(self, it: ti.i32):
        """Adjoint of one sweep, impulse[it] -> impulse[it + 1], by hand (``_pgs_sweep_adjoint_one``):
        what the reverse pass's adjoint of every sweep in one launch is tested against."""
        ti.loop_config(serialize=self.sim._serial_row_loops)
        for i_ in range(self.sim._row_items()):
            r_ = self.sim._row_of(i_)
            if r_ < self.sim.n_active[None]:
                self.sim._pgs_sweep_adjoint_one(it, self.sim.rows[r_])


_REFERENCES = {}


def contact_reference(sim) -> ContactReference:
    """The reference kernels of ``sim``, built once per simulator (each instance compiles its own)."""
    if id(sim) not in _REFERENCES:
        _REFERENCES[id(sim)] = (sim, ContactReference(sim))
    return _REFERENCES[id(sim)][1]
