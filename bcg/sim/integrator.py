"""PD actuation, passive joint forces and semi-implicit Euler time stepping (Taichi kernels).

Semi-implicit (symplectic) Euler, as MuJoCo's ``Euler`` integrator without implicit damping:
``qvel[s+1] = qvel[s] + h qacc``, then positions from the new velocity, ``qpos[s+1] = qpos[s] (+) h
qvel[s+1]``. Free and ball joints integrate their quaternion with the exact exponential map of the
body-frame angular velocity (as ``mju_quatIntegrate``) and renormalise. Kernels are a mixin of
:class:`bcg.sim.rollout.Simulator`.
"""

import taichi as ti

from bcg.sim.model import JNT_BALL, JNT_FREE
from bcg.sim.spatial import quat_exp, quat_mul, quat_normalize


class IntegratorKernels:
    @ti.func
    def _actuation(self, s: ti.template(), c: ti.template()):
        """PD torque per actuated joint, clipped to the effort limit (recomputed every substep)."""
        ti.loop_config(serialize=self._serial_rows)
        for r_, k in ti.ndrange(self.active.n_active[None], self.nu):
            e = self.active.rows[r_]
            self._actuation_one(s, c, e, k)

    @ti.func
    def _actuation_one(self, s: ti.template(), c: ti.template(), e: ti.template(), k: ti.template()):
        d = self.mdl.act_dof[k]
        a = self.mdl.act_qadr[k]
        tau = (
            self.mdl.kp[e, k] * (self.state.ctrl[c, e, k] - self.state.qpos[s, e, a])
            - self.mdl.kd[e, k] * self.state.qvel[s, e, d]
        )
        lim = self.mdl.effort_limit[k]
        # a select, not min/max: those return the other operand for a NaN, which would turn a
        # non-finite torque into a finite +-limit
        self.dyn.act_force[e, k] = ti.select(tau > lim, lim, ti.select(tau < -lim, -lim, tau))

    @ti.func
    def _total_force(self, s: ti.template(), c: ti.template()):
        """Actuator, applied and passive forces in joint space: damping and a smooth friction loss."""
        ti.loop_config(serialize=self._serial_rows)
        for r_, d in ti.ndrange(self.active.n_active[None], self.nv):
            e = self.active.rows[r_]
            self._total_force_one(s, c, e, d)

    @ti.func
    def _total_force_one(self, s: ti.template(), c: ti.template(), e: ti.template(), d: ti.template()):
        v = self.state.qvel[s, e, d]
        k = self.mdl.dof_act[d]
        act = ti.select(k >= 0, self.dyn.act_force[e, ti.max(k, 0)], 0.0)
        passive = -self.mdl.dof_damping[e, d] * v - self.mdl.dof_frictionloss[e, d] * ti.tanh(
            v / self.friction_velocity
        )
        total = act + self.state.qfrc_applied[c, e, d] + passive
        if ti.static(self.npair > 0):
            total += self.selfc.qfrc_self[e, d]
        if ti.static(self.limits.on):
            total += self._limit_force(s, e, d, v)
        self.dyn.qfrc_total[e, d] = total

    @ti.func
    def _limit_force(self, s: ti.template(), e: ti.template(), d: ti.template(), v):
        """The joint limit's force on dof d: -(k delta + c v) towards the range while the joint is
        past it by delta, clipped so that it never pulls outwards; 0 inside (and for a dof without a
        limit, whose range is infinite). Selects, not branches, keep the reverse pass a plain adjoint."""
        q = self.state.qpos[s, e, self.limits.lim_qadr[d]]
        k, c = self.limits.lim_stiffness[d], self.limits.lim_damping[d]
        above = ti.max(q - self.limits.lim_hi[d], 0.0)
        below = ti.max(self.limits.lim_lo[d] - q, 0.0)
        down = ti.min(-k * above - c * v, 0.0)
        up = ti.max(k * below - c * v, 0.0)
        return ti.select(above > 0.0, down, 0.0) + ti.select(below > 0.0, up, 0.0)

    @ti.func
    def _integrate_velocity(self, s: ti.template()):
        ti.loop_config(serialize=self._serial_rows)
        for r_, d in ti.ndrange(self.active.n_active[None], self.nv):
            e = self.active.rows[r_]
            self._integrate_velocity_one(s, e, d)

    @ti.func
    def _integrate_velocity_one(self, s: ti.template(), e: ti.template(), d: ti.template()):
        self.state.qvel[s + 1, e, d] = self.state.qvel[s, e, d] + self.dt * self.dyn.qacc[e, d]

    @ti.func
    def _integrate_position(self, s: ti.template()):
        ti.loop_config(serialize=self._serial_rows)
        for r_, j in ti.ndrange(self.active.n_active[None], self.njnt):
            e = self.active.rows[r_]
            self._integrate_position_one(s, e, j)

    @ti.func
    def _integrate_position_one(self, s: ti.template(), e: ti.template(), j: ti.template()):
        jt = self.mdl.jnt_type[j]
        a = self.mdl.jnt_qposadr[j]
        d = self.mdl.jnt_dofadr[j]
        h = self.dt
        if jt == JNT_FREE:
            for i in ti.static(range(3)):
                self.state.qpos[s + 1, e, a + i] = (
                    self.state.qpos[s, e, a + i] + h * self.state.qvel[s + 1, e, d + i]
                )
            q = ti.Vector(
                [
                    self.state.qpos[s, e, a + 3],
                    self.state.qpos[s, e, a + 4],
                    self.state.qpos[s, e, a + 5],
                    self.state.qpos[s, e, a + 6],
                ]
            )
            w = ti.Vector(
                [
                    self.state.qvel[s + 1, e, d + 3],
                    self.state.qvel[s + 1, e, d + 4],
                    self.state.qvel[s + 1, e, d + 5],
                ]
            )
            qn = quat_normalize(quat_mul(q, quat_exp(w, h)))
            for i in ti.static(range(4)):
                self.state.qpos[s + 1, e, a + 3 + i] = qn[i]
        elif jt == JNT_BALL:
            q = ti.Vector(
                [
                    self.state.qpos[s, e, a],
                    self.state.qpos[s, e, a + 1],
                    self.state.qpos[s, e, a + 2],
                    self.state.qpos[s, e, a + 3],
                ]
            )
            w = ti.Vector(
                [
                    self.state.qvel[s + 1, e, d],
                    self.state.qvel[s + 1, e, d + 1],
                    self.state.qvel[s + 1, e, d + 2],
                ]
            )
            qn = quat_normalize(quat_mul(q, quat_exp(w, h)))
            for i in ti.static(range(4)):
                self.state.qpos[s + 1, e, a + i] = qn[i]
        else:
            self.state.qpos[s + 1, e, a] = self.state.qpos[s, e, a] + h * self.state.qvel[s + 1, e, d]
