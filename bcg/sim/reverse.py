"""The simulator's reverse pass: replaying the tape backwards, and the gradients it hands out.

:class:`ReversePassMixin` is part of :class:`bcg.sim.Simulator`. The forward pass (``rollout.py``)
records a tape of entries (:mod:`bcg.sim.tape`); the reverse pass walks it backwards one control step
at a time and runs each entry's adjoint. For a substep that recomputes the substep's intermediates from
its stored input state and runs the stages' adjoints in reverse order; for bundle entries it is the
adjoint of the copy-in, the control copy or the averaging; for a hold it carries the held environments'
gradient straight through.
"""

from dataclasses import dataclass, field

import numpy as np
import taichi as ti


@dataclass
class Gradients:
    """Gradients of a loss with respect to the window's inputs (numpy arrays).

    Attributes:
        qpos: (N, nq) at the window start (or the last detach).
        qvel: (N, nv) likewise.
        ctrl: (T, N, nu) PD targets of each control step of the window.
        qfrc_applied: (T, N, nv) applied joint forces of each control step.
        params: model parameters by name, e.g. ``body_mass (N, nbody)``, ``kp (N, nu)``.
    """

    qpos: np.ndarray
    qvel: np.ndarray
    ctrl: np.ndarray
    qfrc_applied: np.ndarray
    params: dict = field(default_factory=dict)


class ReversePassMixin:
    """Reverse pass of :class:`bcg.sim.Simulator` (the tape and the fields are the simulator's)."""

    def zero_grad(self):
        """Zero every gradient buffer (state, controls, gravity and parameters)."""
        for f in [
            self.state.qpos,
            self.state.qvel,
            self.state.ctrl,
            self.state.qfrc_applied,
            self.mdl.gravity,
            *self._params.values(),
        ]:
            f.grad.fill(0)

    def backward(self, qpos_grad=None, qvel_grad=None) -> Gradients:
        """Reverse pass of the window from the current substep down to the cut.

        Args:
            qpos_grad: dL/dqpos, either (S+1, N, nq) over the window's substeps or a dict
                {substep: (N, nq)}.
            qvel_grad: the same for qvel.

        Returns:
            :class:`Gradients` at the cut (the window start unless :meth:`detach` was called).

        For losses whose gradient at a state depends on the gradient of later states (a policy
        acting on observations of the state), drive the pass one control step at a time with
        :meth:`backward_begin`, :meth:`backward_step`, :meth:`state_grad`, :meth:`add_state_grad`
        and :meth:`backward_end`.
        """
        self.backward_begin(qpos_grad, qvel_grad)
        while self.backward_pending():
            self.backward_step()
        return self.backward_end()

    def backward_begin(self, qpos_grad=None, qvel_grad=None):
        """Zero every gradient and seed dL/dqpos, dL/dqvel (same forms as :meth:`backward`)."""
        if not self.config.requires_grad:
            raise RuntimeError("this simulator was built with requires_grad=False")
        self.zero_grad()
        for fld, g, width in ((self.state.qpos, qpos_grad, self.nq), (self.state.qvel, qvel_grad, self.nv)):
            if g is None:
                continue
            name = "qpos_grad" if fld is self.state.qpos else "qvel_grad"
            if not isinstance(g, dict):
                g = np.asarray(g)
                if g.ndim == 0 or len(g) != self._t + 1:
                    raise ValueError(
                        f"backward: {name} as an array has one row per substep of the window, "
                        f"({self._t + 1}, {self.num_envs}, {width}); got shape {g.shape}"
                    )
            items = g.items() if isinstance(g, dict) else enumerate(g)
            for s, v in items:
                if not (isinstance(s, (int, np.integer)) and 0 <= s <= self._t):
                    raise ValueError(
                        f"backward: {name} seeds substep {s!r}, outside this window's substeps 0..{self._t}"
                    )
                arr = self._broadcast(v, width, f"backward: {name}[{s}]")
                self._set_grad_slice(fld, int(s), np.ascontiguousarray(arr))
        self._bwd = len(self._tape)
        self._bwd_t = self._t

    def backward_pending(self) -> bool:
        """True while control steps above the cut remain to be reversed."""
        return self._bwd_t > self._cut

    def backward_step(self) -> int:
        """Reverse the last control step not yet reversed; returns its index c. Afterwards
        :meth:`state_grad` (c) holds dL/d(state at the start of step c)."""
        c = (self._bwd_t - 1) // self.substeps
        while self._bwd > 0:
            entry = self._tape[self._bwd - 1]
            if entry.c != c or entry.before(self._cut):
                break
            entry.adjoint(self)
            self._bwd -= 1
        self._bwd_t = max(c * self.substeps, self._cut)
        return c

    def state_grad(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        """(dL/dqpos (N, nq), dL/dqvel (N, nv)) at the start of control step c so far."""
        s = c * self.substeps
        return self._read_rows(self.state.qpos, s, grad=True), self._read_rows(self.state.qvel, s, grad=True)

    def zero_state_grad(self, c: int, envs):
        """Set dL/d(state at the start of control step c) of the given environments to zero."""
        envs = np.asarray(envs, np.int32).reshape(-1)
        if len(envs):
            self._zero_grad_rows(c * self.substeps, np.ascontiguousarray(envs))

    @ti.kernel
    def _zero_grad_rows(self, s: ti.i32, envs: ti.types.ndarray()):
        ti.loop_config(serialize=self._serial)
        for k, i in ti.ndrange(envs.shape[0], self.nq):
            self.state.qpos.grad[s, envs[k], i] = 0.0
        ti.loop_config(serialize=self._serial)
        for k, i in ti.ndrange(envs.shape[0], self.nv):
            self.state.qvel.grad[s, envs[k], i] = 0.0

    def ctrl_grad(self, c: int) -> np.ndarray:
        """dL/dctrl (N, nu) of control step c (complete once step c has been reversed)."""
        return self._read_rows(self.state.ctrl, c, grad=True)

    @ti.kernel
    def _add_grad(self, s: ti.i32, gq: ti.types.ndarray(), gv: ti.types.ndarray()):
        ti.loop_config(serialize=self._serial)
        for e, i in ti.ndrange(self.num_envs, self.nq):
            self.state.qpos.grad[s, e, i] += gq[e, i]
        ti.loop_config(serialize=self._serial)
        for e, i in ti.ndrange(self.num_envs, self.nv):
            self.state.qvel.grad[s, e, i] += gv[e, i]

    def add_state_grad(self, c: int, qpos_grad=None, qvel_grad=None):
        """Add gradient to the state at the start of control step c (before reversing step c-1)."""
        gq = (
            np.zeros((self.num_envs, self.nq), self.np_fp)
            if qpos_grad is None
            else np.asarray(qpos_grad, self.np_fp)
        )
        gv = (
            np.zeros((self.num_envs, self.nv), self.np_fp)
            if qvel_grad is None
            else np.asarray(qvel_grad, self.np_fp)
        )
        self._add_grad(c * self.substeps, np.ascontiguousarray(gq), np.ascontiguousarray(gv))

    def backward_end(self) -> Gradients:
        """Finish a pass driven by :meth:`backward_step`: the :class:`Gradients` at the cut."""
        n = self.num_envs
        c0, c1 = self._cut // self.substeps, -(-self._t // self.substeps)
        return Gradients(
            qpos=self._read_rows(self.state.qpos, self._cut, grad=True),
            qvel=self._read_rows(self.state.qvel, self._cut, grad=True),
            ctrl=self._read_block(self.state.ctrl, c0, c1, grad=True),
            qfrc_applied=self._read_block(self.state.qfrc_applied, c0, c1, grad=True),
            params={k: f.grad.to_numpy()[:n] for k, f in self._params.items()},
        )

    @ti.kernel
    def _hold_rows_adjoint(self, s: ti.i32, n: ti.i32, envs: ti.types.ndarray()):
        ti.loop_config(serialize=self._serial)
        for k, i in ti.ndrange(envs.shape[0], self.nq):
            acc = ti.cast(0.0, self.fp)
            for j in range(1, n + 1):
                acc += self.state.qpos.grad[s + j, envs[k], i]
            self.state.qpos.grad[s, envs[k], i] += acc
        ti.loop_config(serialize=self._serial)
        for k, i in ti.ndrange(envs.shape[0], self.nv):
            acc = ti.cast(0.0, self.fp)
            for j in range(1, n + 1):
                acc += self.state.qvel.grad[s + j, envs[k], i]
            self.state.qvel.grad[s, envs[k], i] += acc
