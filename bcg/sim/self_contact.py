"""Penalty contact between two sets of the robot's own capsules, e.g. its two legs (ours: the paper's
simulator models foot-ground contact alone, so a swinging foot passes through the other leg, which in
MuJoCo and on the robot strikes it; see docs/validation.md).

For a capsule of set A (axis segment A(s), radius r_a) and one of set B (B(t), r_b), every substep:

    a = A(s*), b = B(t*)               the closest points of the two axes (Ericson, Real-Time
                                       Collision Detection, 5.1.9), MuJoCo's capsule-capsule distance
    d = r_a + r_b - |a - b|            depth (negative apart)
    delta = softplus(sigma d) / sigma  smoothed depth; exactly 0 where sigma d < -CUTOFF
    u = (a - b) / |a - b|              the normal, from b to a
    v_n = u . (v_A(a) - v_B(b))        normal velocity, positive while separating
    f = k delta max(0, 1 - c v_n)      Hunt and Crossley's damping: it grows with the depth and never
                                       pulls the capsules together
    F = L f / (L + f) u                on A at a, and -F on B at b: f while small against the
                                       limit L, never above it

Their generalised force tau_d = sum over pairs of J_A(a)_d . F - J_B(b)_d . F joins the actuator
and passive forces (``qfrc_total``), so the contact solve and the integrator see it as any applied
force. It is explicit in the substep, hence the bound L: however deep the legs cross, the force
stays in [0, L], where unbounded, legs crossed 10 cm deep (a policy trained without the contact
does that) met 2000 N and a damping of 2000 N s/m and blew the simulation up. At shallow depths
the force's slope is about k, stable at h = 5 ms for effective masses above k h^2 / 4 (31 g at the
default k).

A broad phase per body pair (bounding spheres in the bodies' frames) skips the capsule pairs of body
pairs far apart, and a row lists its active pairs (within CUTOFF / sigma, 9.2 mm at the default
sigma), which the force and its adjoint visit alone. The
reverse pass differentiates the pair stage with Taichi's generated adjoint (gated by each pair's
activity, fixed by the forward) and the generalised force with the hand-written
:meth:`SelfContactKernels.self_qfrc_adjoint`.
"""

import mujoco
import numpy as np
import taichi as ti

from bcg.core.geoms import geom_capsule
from bcg.sim.spatial import cross, mv3

CUTOFF = 9.2  # sigma d below -CUTOFF: out (softplus(-9.2) = 1e-4, a force of 1e-4 k / sigma)
_EPS = 1e-12
_PARALLEL = 1e-6  # sin^2 of the angle below which two axes count as parallel


def capsules_of(model: mujoco.MjModel, bodies) -> tuple:
    """The collision capsules and spheres (non-zero contype or conaffinity) of the named bodies of a
    compiled MuJoCo model, as :class:`bcg.sim.contact_config.SelfContactConfig` takes them. A collision
    geom of another type on those bodies is refused (its distance is not modelled)."""
    out = []
    for name in bodies:
        body = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, name)
        if body < 0:
            raise KeyError(f"the model has no body named {name!r}")
        for gid in np.flatnonzero(model.geom_bodyid == body):
            if not (model.geom_contype[gid] or model.geom_conaffinity[gid]):
                continue
            try:
                end_a, end_b, radius = geom_capsule(model, gid)
            except ValueError as exc:
                raise ValueError(f"self-contact handles {exc} (on body {name!r})") from None
            out.append((name, tuple(end_a), tuple(end_b), radius))
    return tuple(out)


def pair_tables(model, config) -> dict:
    """numpy tables of the simulator's :class:`bcg.sim.types.SelfContactFields` for ``config``:
    the capsule pairs grouped by body pair, each body pair's bounding spheres and reach."""
    margin = CUTOFF / config.smoothing
    groups: dict = {}
    for body_a, a0, a1, ra in config.capsules_a:
        for body_b, b0, b1, rb in config.capsules_b:
            ia, ib = model.body_id(body_a), model.body_id(body_b)
            if ia == ib:
                raise ValueError(f"SelfContactConfig: body {body_a!r} is in both capsule sets")
            groups.setdefault((ia, ib), []).append((a0, a1, b0, b1, ra + rb))

    def bound(body, side):
        caps = [(c[1], c[2], c[3]) for c in side if model.body_id(c[0]) == body]
        pts = np.array([p for e0, e1, _ in caps for p in (e0, e1)])
        centre = pts.mean(axis=0)
        radius = max(max(np.linalg.norm(np.array(e) - centre) for e in (e0, e1)) + r for e0, e1, r in caps)
        return centre, radius

    t = {k: [] for k in ("pair_body_a", "pair_body_b", "pair_a0", "pair_a1", "pair_b0", "pair_b1")}
    t.update(pair_radius=[], bp_body_a=[], bp_body_b=[], bp_centre_a=[], bp_centre_b=[], bp_reach=[])
    start = [0]
    for (ia, ib), pairs in groups.items():
        (ca, rad_a), (cb, rad_b) = bound(ia, config.capsules_a), bound(ib, config.capsules_b)
        t["bp_body_a"].append(ia)
        t["bp_body_b"].append(ib)
        t["bp_centre_a"].append(ca)
        t["bp_centre_b"].append(cb)
        t["bp_reach"].append(rad_a + rad_b + margin)
        for a0, a1, b0, b1, r in pairs:
            for key, value in (("pair_body_a", ia), ("pair_body_b", ib), ("pair_a0", a0), ("pair_a1", a1)):
                t[key].append(value)
            t["pair_b0"].append(b0)
            t["pair_b1"].append(b1)
            t["pair_radius"].append(r)
        start.append(start[-1] + len(pairs))
    out = {k: np.asarray(v) for k, v in t.items()}
    out["bp_start"] = np.asarray(start)
    return out


class SelfContactKernels:
    """The self-contact's kernels, a mixin of :class:`bcg.sim.rollout.Simulator`."""

    @ti.func
    def _self_pair_geometry(self, e, p):
        """(a, b, F, sigma d) of capsule pair p in row e (see the module's docstring)."""
        ba, bb = self.selfc.pair_body_a[p], self.selfc.pair_body_b[p]
        ra, rb = self.dyn.xmat[e, ba], self.dyn.xmat[e, bb]
        a0 = self.dyn.xpos[e, ba] + mv3(ra, self.selfc.pair_a0[p])
        da = self.dyn.xpos[e, ba] + mv3(ra, self.selfc.pair_a1[p]) - a0
        b0 = self.dyn.xpos[e, bb] + mv3(rb, self.selfc.pair_b0[p])
        db = self.dyn.xpos[e, bb] + mv3(rb, self.selfc.pair_b1[p]) - b0
        r = a0 - b0
        aa, ee, ab = da.dot(da), db.dot(db), da.dot(db)
        c, f = da.dot(r), db.dot(r)
        # aa ee - ab^2 as |da x db|^2: no cancellation in float32 for nearly parallel axes
        cr = cross(da, db)
        denom = cr.dot(cr)
        inv_a, inv_e = 1.0 / ti.max(aa, _EPS), 1.0 / ti.max(ee, _EPS)
        # Ericson's cases as selects (each branch finite, so the unused ones carry no NaN backwards):
        # axes within 1 mrad of parallel take s = 0 (the distance then errs by 1e-3 of the length at
        # most); a t outside [0, 1] is clamped and s recomputed from it
        s_gen = ti.select(
            denom > _PARALLEL * aa * ee,
            ti.min(ti.max((ab * f - c * ee) / ti.max(denom, _EPS), 0.0), 1.0),
            0.0,
        )
        t_gen = (ab * s_gen + f) * inv_e
        s_lo = ti.min(ti.max(-c * inv_a, 0.0), 1.0)
        s_hi = ti.min(ti.max((ab - c) * inv_a, 0.0), 1.0)
        s_both = ti.select(t_gen < 0.0, s_lo, ti.select(t_gen > 1.0, s_hi, s_gen))
        t_both = ti.min(ti.max(t_gen, 0.0), 1.0)
        t_only = ti.min(ti.max(f * inv_e, 0.0), 1.0)  # A a point
        s = ti.select(aa <= _EPS, 0.0, ti.select(ee <= _EPS, s_lo, s_both))
        t = ti.select(aa <= _EPS, ti.select(ee <= _EPS, 0.0, t_only), ti.select(ee <= _EPS, 0.0, t_both))
        pa, pb = a0 + s * da, b0 + t * db
        diff = pa - pb
        dist = ti.sqrt(diff.dot(diff) + _EPS)
        u = diff / dist
        x = self.selfc.sc_smoothing[None] * (self.selfc.pair_radius[p] - dist)
        delta = (ti.max(x, 0.0) + ti.log(1.0 + ti.exp(-ti.abs(x)))) / self.selfc.sc_smoothing[None]
        pref = self.dyn.xpos[e, self.ref_body]
        va = self.dyn.cvel_lin[e, ba] + cross(self.dyn.cvel_ang[e, ba], pa - pref)
        vb = self.dyn.cvel_lin[e, bb] + cross(self.dyn.cvel_ang[e, bb], pb - pref)
        damp = ti.max(1.0 - self.selfc.sc_damping[None] * u.dot(va - vb), 0.0)
        push = self.selfc.sc_stiffness[None] * delta * damp
        limit = self.selfc.sc_limit[None]
        return pa, pb, limit * push / (limit + push) * u, x

    @ti.func
    def _self_contact_env(self, e: ti.template()):
        """Row e's active pairs, their points and forces, and their generalised force ``qfrc_self``
        (forward only: plain accumulation)."""
        for d in range(self.nv):
            self.selfc.qfrc_self[e, d] = 0.0
        pref = self.dyn.xpos[e, self.ref_body]
        n = 0
        for q in range(self.selfc.bp_body_a.shape[0]):
            ba, bb = self.selfc.bp_body_a[q], self.selfc.bp_body_b[q]
            ca = self.dyn.xpos[e, ba] + mv3(self.dyn.xmat[e, ba], self.selfc.bp_centre_a[q])
            cb = self.dyn.xpos[e, bb] + mv3(self.dyn.xmat[e, bb], self.selfc.bp_centre_b[q])
            near = (ca - cb).norm() < self.selfc.bp_reach[q]
            for p in range(self.selfc.bp_start[q], self.selfc.bp_start[q + 1]):
                active = 0.0
                if near:
                    pa, pb, force, x = self._self_pair_geometry(e, p)
                    if x > -CUTOFF:
                        active = 1.0
                        self.selfc.pair_pa[e, p], self.selfc.pair_pb[e, p], self.selfc.pair_force[e, p] = (
                            pa,
                            pb,
                            force,
                        )
                        self.selfc.pair_list[e, n] = p
                        n += 1
                        self.selfc.force_max[e] = ti.max(self.selfc.force_max[e], force.norm())
                        ra, rb = pa - pref, pb - pref
                        for d in range(self.nv):
                            lin, ang = self.dyn.cdof_lin[e, d], self.dyn.cdof_ang[e, d]
                            self.selfc.qfrc_self[e, d] += self.selfc.dof_anc[ba, d] * (
                                lin.dot(force) + ang.dot(cross(ra, force))
                            ) - self.selfc.dof_anc[bb, d] * (lin.dot(force) + ang.dot(cross(rb, force)))
                self.selfc.pair_active[e, p] = active
        self.selfc.pair_count[e] = n

    @ti.kernel
    def _g_self_pairs(self):
        """The active pairs' points and forces, for its generated adjoint (the reverse pass runs only
        that: the forward computed them in :meth:`_self_contact_env`)."""
        ti.loop_config(serialize=self._serial_rows)
        for r_, p in ti.ndrange(self.active.n_active[None], self.selfc.npair):
            e = self.active.rows[r_]
            if self.selfc.pair_active[e, p] > 0.0:
                pa, pb, force, _ = self._self_pair_geometry(e, p)
                self.selfc.pair_pa[e, p] = pa
                self.selfc.pair_pb[e, p] = pb
                self.selfc.pair_force[e, p] = force

    @ti.kernel
    def self_qfrc_adjoint(self):
        """Adjoint of ``qfrc_self`` in :meth:`_self_contact_env`, by hand: with r = a - p_ref,
        d(ang . (r x F)) is (ang x r) dF + (F x ang) dr + (r x F) dang. Consumed gradients zeroed."""
        ti.loop_config(serialize=self._serial_row_loops)
        for i_ in range(self._row_items()):
            r_ = self._row_of(i_)
            if r_ < self.active.n_active[None]:
                e = self.active.rows[r_]
                pref = self.dyn.xpos[e, self.ref_body]
                g_pref = ti.Vector([0.0, 0.0, 0.0])
                for k in range(self.selfc.pair_count[e]):
                    p = self.selfc.pair_list[e, k]
                    ba, bb = self.selfc.pair_body_a[p], self.selfc.pair_body_b[p]
                    force = self.selfc.pair_force[e, p]
                    ra, rb = self.selfc.pair_pa[e, p] - pref, self.selfc.pair_pb[e, p] - pref
                    g_f = ti.Vector([0.0, 0.0, 0.0])
                    g_ra = ti.Vector([0.0, 0.0, 0.0])
                    g_rb = ti.Vector([0.0, 0.0, 0.0])
                    for d in range(self.nv):
                        g = self.selfc.qfrc_self.grad[e, d]
                        wa, wb = self.selfc.dof_anc[ba, d] * g, self.selfc.dof_anc[bb, d] * g
                        lin, ang = self.dyn.cdof_lin[e, d], self.dyn.cdof_ang[e, d]
                        g_f += (wa - wb) * lin + wa * cross(ang, ra) - wb * cross(ang, rb)
                        g_ra += wa * cross(force, ang)
                        g_rb -= wb * cross(force, ang)
                        self.dyn.cdof_lin.grad[e, d] = self.dyn.cdof_lin.grad[e, d] + (wa - wb) * force
                        self.dyn.cdof_ang.grad[e, d] = self.dyn.cdof_ang.grad[e, d] + (
                            wa * cross(ra, force) - wb * cross(rb, force)
                        )
                    self.selfc.pair_force.grad[e, p] = self.selfc.pair_force.grad[e, p] + g_f
                    self.selfc.pair_pa.grad[e, p] = self.selfc.pair_pa.grad[e, p] + g_ra
                    self.selfc.pair_pb.grad[e, p] = self.selfc.pair_pb.grad[e, p] + g_rb
                    g_pref -= g_ra + g_rb
                for d in range(self.nv):
                    self.selfc.qfrc_self.grad[e, d] = 0.0
                self.dyn.xpos.grad[e, self.ref_body] = self.dyn.xpos.grad[e, self.ref_body] + g_pref

    @ti.kernel
    def _clear_self_contact_stats(self):
        """Zero every row's largest pair force (a control step's statistics start here)."""
        ti.loop_config(serialize=self._serial)
        for e in range(self.num_rows):
            self.selfc.force_max[e] = 0.0
