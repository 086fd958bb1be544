"""Read-only queries of a :class:`bcg.sim.rollout.Simulator`: dynamics quantities, kinematics and its
vector-Jacobian product, contact forces and penetration, bundle statistics. A mixin.
"""

import numpy as np
import taichi as ti

from bcg.core.rotations import quat_to_matrix


class QueriesMixin:
    # ------------------------------------------------------------------ kinematics and dynamics queries
    def forward(self, qpos=None, qvel=None, qfrc_applied=None):
        """Kinematics and dynamics at the current state (or the one given, which starts a new window).

        Returns a dict of numpy arrays: xpos (N, nbody, 3), xquat (N, nbody, 4), qM (N, nv, nv) with
        armature, qfrc_bias (N, nv), and, without contact, qacc (N, nv) under the PD targets of the
        current control step, the applied forces ``qfrc_applied`` (N, nv), if given, and the
        self-contact's forces where the simulator has it.
        """
        if qpos is not None:
            self.set_state(qpos, np.zeros((self.num_envs, self.nv)) if qvel is None else qvel)
        c = min(self._t // self.substeps, self.max_steps - 1)
        if qfrc_applied is not None:
            self._write_control(self.state.qfrc_applied, c, qfrc_applied, self.nv, "qfrc_applied")
        self._set_rows(self._main_rows)
        self._run(self._dynamics_stages(self._t, c))
        out = {
            "xpos": self._rows_to_numpy(self.dyn.xpos),
            "xquat": self._rows_to_numpy(self.dyn.xquat),
            "qM": self._rows_to_numpy(self.dyn.mass),
            "qfrc_bias": self._rows_to_numpy(self.dyn.qfrc_bias),
        }
        if self.contact is None:
            self._factor()
            self._solve()
            out["qacc"] = self._rows_to_numpy(self.dyn.qacc)
        return out

    def _kinematics_ops(self, s):
        return self._dynamics_stages(s, 0)[:1]

    def _scratch(self, qpos) -> int:
        s = self.nsub + 1
        self._write_rows(
            self.state.qpos, s, np.broadcast_to(np.asarray(qpos, self.np_fp), (self.num_envs, self.nq))
        )
        self._set_rows(self._main_rows)
        return s

    def kinematics(self, qpos=None):
        """Forward kinematics: body origins xpos (N, nbody, 3) m and orientations xquat (N, nbody, 4)
        at ``qpos`` (N, nq), or at the current state when None. Does not touch the window."""
        s = self._t if qpos is None else self._scratch(qpos)
        self._set_rows(self._main_rows)
        self._run(self._kinematics_ops(s))
        return self._rows_to_numpy(self.dyn.xpos), self._rows_to_numpy(self.dyn.xquat)

    def kinematics_vjp(self, qpos, xpos_grad, xquat_grad=None) -> np.ndarray:
        """Vector-Jacobian product of :meth:`kinematics`: dL/dqpos (N, nq) from dL/dxpos (N, nbody, 3)
        and dL/dxquat (N, nbody, 4). Use it to carry gradients of body-position losses (observations,
        rewards) into the reverse pass (``qpos_grad`` / :meth:`add_state_grad`)."""
        s = self._scratch(qpos)
        ops = self._kinematics_ops(s)
        self._run(ops)
        self._set_grad_slice(self.state.qpos, s, np.zeros((self.num_envs, self.nq), self.np_fp))
        # the kinematics' outputs' gradients on the environments' rows (the adjoint reads no other):
        # the seeds, and zeros for the rest
        g_xpos = np.ascontiguousarray(np.broadcast_to(xpos_grad, (self.num_envs, self.nbody, 3)), self.np_fp)
        if xquat_grad is None:
            self._seed_kinematics_grad(g_xpos, g_xpos, False)
        else:
            g_xquat = np.broadcast_to(xquat_grad, (self.num_envs, self.nbody, 4))
            self._seed_kinematics_grad(g_xpos, np.ascontiguousarray(g_xquat, self.np_fp), True)
        self._run_adjoint(ops)
        return self._read_rows(self.state.qpos, s, grad=True)

    @ti.kernel
    def _seed_kinematics_grad(
        self, g_xpos: ti.types.ndarray(), g_xquat: ti.types.ndarray(), with_quat: ti.template()
    ):
        ti.loop_config(serialize=self._serial)
        for e, b in ti.ndrange(self.num_envs, self.nbody):
            for i in ti.static(range(3)):
                self.dyn.xpos.grad[e, b][i] = g_xpos[e, b, i]
            for i in ti.static(range(4)):
                if ti.static(with_quat):
                    self.dyn.xquat.grad[e, b][i] = g_xquat[e, b, i]
                else:
                    self.dyn.xquat.grad[e, b][i] = 0.0
            self.dyn.xmat.grad[e, b] = ti.Matrix.zero(self.dyn.xmat.dtype, 3, 3)
            self.dyn.xanchor.grad[e, b] = ti.Vector.zero(self.dyn.xanchor.dtype, 3)
            self.dyn.xaxis.grad[e, b] = ti.Vector.zero(self.dyn.xaxis.dtype, 3)

    # ------------------------------------------------------------------ statistics
    def reset_stats(self):
        """Restart the counts behind :meth:`bundle_stats`."""
        self._stat_steps = self._stat_triggers = self._stat_dropped = 0

    def bundle_stats(self) -> dict:
        """Environment-steps simulated, steps whose contact force crossed the threshold, their
        fraction (the trigger rate) and triggers dropped because the bundle pool was full."""
        steps = max(self._stat_steps, 1)
        return {
            "env_steps": self._stat_steps,
            "triggers": self._stat_triggers,
            "trigger_rate": self._stat_triggers / steps,
            "dropped": self._stat_dropped,
        }

    def contact_force(self) -> np.ndarray:
        """Per-sphere contact force |Lambda_i| / h, N (N, nspheres): the largest over the last control
        step's substeps (inside a bundle, the mean over its copies)."""
        if self.contact is None:
            raise RuntimeError("this simulator has no contact")
        f = self.ground.con_force.to_numpy()
        out = f[: self.num_envs].copy()
        for b in self._bundles + self._closed:  # bundles open after the step or closed by it
            out[b["env"]] = f[b["first"] : b["first"] + self.bundle_size].mean(axis=0)
        return out

    def sphere_positions(self, qpos=None) -> np.ndarray:
        """World positions (N, nspheres, 3) of the contact spheres' centres."""
        xpos, xquat = self.kinematics(qpos)
        out = np.zeros((self.num_envs, self.ncon, 3))
        for i, (body, pos) in enumerate(self.spheres):
            b = self.model.body_id(body)
            out[:, i] = xpos[:, b] + np.einsum(
                "nij,j->ni", quat_to_matrix(xquat[:, b].astype(np.float64)), np.asarray(pos)
            )
        return out

    def penetration(self, qpos=None) -> np.ndarray:
        """Depth below the ground of each sphere's lowest point, m, >= 0 (N, nspheres)."""
        z = self.sphere_positions(qpos)[..., 2] - self.sphere_radius - self.contact.ground_height
        return np.maximum(0.0, -z)
