"""The tape of a window: typed entries, each with its forward and its adjoint.

:meth:`bcg.sim.rollout.Simulator.step` records entries and runs each one's :meth:`TapeEntry.forward`
as it records it; the reverse pass (:mod:`bcg.sim.reverse`) walks the tape backwards one control step
at a time and runs each one's :meth:`TapeEntry.adjoint`. An entry holds the indices it needs (substep
``s``, control step ``c``, rows); the fields it reads and writes are the simulator's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(eq=False)
class TapeEntry:
    """One recorded operation of control step ``c``."""

    c: int

    def forward(self, sim) -> None:
        raise NotImplementedError

    def adjoint(self, sim) -> None:
        raise NotImplementedError

    def before(self, cut: int) -> bool:
        """True for an entry that reads state from before substep ``cut`` (the reverse pass stops)."""
        return False


@dataclass(eq=False)
class Substep(TapeEntry):
    """One physics substep of ``rows``: reads state slot ``s``, writes slot ``s + 1``.

    Attributes:
        s: the substep.
        rows: the simulator rows it ran on (int32).
        grad_rows: the rows whose adjoint the reverse pass runs: ``rows`` less the environments whose
            nominal step a bundle replaced (:meth:`bcg.sim.rollout.Simulator._after_contact_step`).
    """

    s: int
    rows: np.ndarray
    grad_rows: np.ndarray

    def forward(self, sim):
        sim._set_rows(self.rows)
        sim._run(sim._substep_ops_cached(self.s, self.c))

    def adjoint(self, sim):
        """Recompute the substep's intermediates from its stored input state, then run its stages'
        adjoints in reverse order."""
        if len(self.grad_rows) == 0:
            return
        sim._set_rows(self.grad_rows)
        ops = sim._substep_ops_cached(self.s, self.c)
        sim._zero_intermediate_grads()
        sim._run(ops)
        sim._run_adjoint(ops)

    def before(self, cut):
        return self.s < cut


@dataclass(eq=False)
class Hold(TapeEntry):
    """Environments ``envs`` left out of the control step starting at substep ``s``: their state is held
    over its substeps, and their gradient carried straight through."""

    s: int
    envs: np.ndarray

    def forward(self, sim):
        sim._hold_rows(self.s, sim.substeps, self.envs)

    def adjoint(self, sim):
        sim._hold_rows_adjoint(self.s, sim.substeps, self.envs)

    def before(self, cut):
        return self.s < cut


@dataclass(eq=False)
class BranchInit(TapeEntry):
    """A bundle's start: copy ``dst[k]`` takes the state of row ``src[k]`` at substep ``s`` plus its
    perturbation (``dq`` (K, nq), ``dv`` (K, nv), no gradient), and the row's model parameters."""

    s: int
    src: np.ndarray
    dst: np.ndarray
    dq: np.ndarray
    dv: np.ndarray

    def forward(self, sim):
        sim._upload_pairs(self.src, self.dst, self.dq, self.dv)
        sim._copy_param_rows()  # each copy takes its environment's parameters
        sim._branch_init(self.s)

    def adjoint(self, sim):
        sim._upload_pairs(self.src, self.dst, self.dq, self.dv)
        sim._branch_init.grad(self.s)
        sim._return_param_grads()


@dataclass(eq=False)
class CtrlCopy(TapeEntry):
    """The control of step ``c`` (PD targets and applied forces) of row ``src[k]`` copied to copy
    ``dst[k]``."""

    src: np.ndarray
    dst: np.ndarray

    def forward(self, sim):
        sim._upload_pairs(self.src, self.dst)
        sim._branch_ctrl(self.c)

    def adjoint(self, sim):
        sim._upload_pairs(self.src, self.dst)
        sim._branch_ctrl.grad(self.c)


@dataclass(eq=False)
class Collapse(TapeEntry):
    """The state of environment row ``mains[g]`` at substep ``s`` becomes the mean of its bundle's
    copies, rows ``firsts[g]`` onwards."""

    s: int
    mains: np.ndarray
    firsts: np.ndarray

    def forward(self, sim):
        sim._upload_collapse(self.mains, self.firsts)
        sim._collapse(self.s)

    def adjoint(self, sim):
        sim._upload_collapse(self.mains, self.firsts)
        sim._collapse.grad(self.s)
        sim._clear_collapsed_grad(self.s)
