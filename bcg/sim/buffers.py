"""Simulator fields: allocating the groups of :mod:`bcg.sim.types`, uploading the model, parameters.

A mixin of :class:`bcg.sim.rollout.Simulator`. Every per-environment field has ``num_rows`` rows: the
``num_envs`` environments first, then the pool of bundle copies (see :mod:`bcg.sim.bundle`).
"""

import numpy as np

from bcg.sim.contact import SOLVE_BLOCK
from bcg.sim.model import JNT_FREE
from bcg.sim.types import (
    Allocator,
    BundleFields,
    ContactFields,
    DynamicsFields,
    LimitFields,
    ModelFields,
    RowFields,
    SelfContactFields,
    StateFields,
)


def _ancestor_dofs(m, dtype) -> np.ndarray:
    """(nbody, nv): 1 where the dof moves the body (a dof of the body or of an ancestor), else 0."""
    anc = np.zeros((m.nbody, m.nv), dtype=dtype)
    for body in range(1, m.nbody):
        x = body
        while x > 0:
            n0, k = m.body_dofadr[x], m.body_dofnum[x]
            anc[body, n0 : n0 + k] = 1.0
            x = m.body_parentid[x]
    return anc


class FieldsMixin:
    def _build_fields(self):
        """Allocate the field groups of :mod:`bcg.sim.types`. Kernels read a field through its group, so
        a reader sees what a kernel takes from the model, the state, a substep's intermediates, the
        contact, the active rows and the bundles: ``self.mdl.body_pos``, ``self.state.qpos``,
        ``self.dyn.xpos``, ``self.ground.impulse``, ``self.active.rows``, ``self.bundle_rows.branch_src``."""
        n, fp = self.num_rows, self.fp
        al = Allocator(fp, self.config.requires_grad)
        nu = max(self.nu, 1)
        self.mdl = ModelFields.allocate(al, self.model, n, nu)
        # the last substep slot is scratch for kinematics queries
        self.state = StateFields.allocate(al, self.nsub + 2, self.max_steps, n, self.nq, self.nv, nu)
        self.dyn = DynamicsFields.allocate(al, n, self.nbody, self.nv, nu)
        self.active = RowFields.allocate(n)
        self.ground = ContactFields.allocate(
            al, n, self.nbody, self.nv, self.ncon, self.iterations,
            SOLVE_BLOCK,
        )  # fmt: skip
        self.bundle_rows = BundleFields.allocate(fp, self.pool_rows, self.max_bundles, self.nq, self.nv)
        self.selfc = SelfContactFields.allocate(al, n, self.nbody, self.nv, self.npair, self.nbp)
        self.limits = LimitFields.allocate(al, self.nv, self.joint_limits is not None)
        self._intermediates = (
            self.dyn.differentiated() + self.ground.differentiated() + self.selfc.differentiated()
        )
        self._params = self.mdl.randomised()

    def _upload_model(self, names, kp, kd, effort_limit):
        m = self.model
        f = self.np_fp
        self.mdl.body_parentid.from_numpy(m.body_parentid)
        self.mdl.body_jntadr.from_numpy(m.body_jntadr)
        self.mdl.body_dofadr.from_numpy(np.maximum(m.body_dofadr, 0).astype(np.int32))
        self.mdl.body_dofnum.from_numpy(m.body_dofnum)
        self.mdl.body_pos.from_numpy(m.body_pos.astype(f))
        self.mdl.body_quat.from_numpy(m.body_quat.astype(f))
        self.mdl.body_iquat.from_numpy(m.body_iquat.astype(f))
        self.mdl.jnt_type.from_numpy(m.jnt_type)
        self.mdl.jnt_qposadr.from_numpy(m.jnt_qposadr)
        self.mdl.jnt_dofadr.from_numpy(m.jnt_dofadr)
        self.mdl.jnt_axis.from_numpy(m.jnt_axis.astype(f))
        self.mdl.jnt_pos.from_numpy(m.jnt_pos.astype(f))
        self.mdl.dof_bodyid.from_numpy(m.dof_bodyid)
        self.mdl.dof_jntid.from_numpy(m.dof_jntid)
        self.mdl.dof_parentid.from_numpy(m.dof_parentid)
        jt = m.jnt_type[m.dof_jntid]
        local = np.arange(m.nv) - m.jnt_dofadr[m.dof_jntid]
        self.mdl.dof_sdot.from_numpy(np.where((jt == JNT_FREE) & (local < 3), 0.0, 1.0).astype(f))
        self.mdl.qpos0.from_numpy(m.qpos0.astype(f))
        self.mdl.gravity[None] = m.gravity.tolist()
        jid = [m.jnt_id(j) for j in names]
        act_dof = np.array([m.jnt_dofadr[j] for j in jid] or [0], dtype=np.int32)
        self.mdl.act_dof.from_numpy(act_dof)
        self.mdl.act_qadr.from_numpy(np.array([m.jnt_qposadr[j] for j in jid] or [0], dtype=np.int32))
        dof_act = -np.ones(m.nv, dtype=np.int32)
        dof_act[act_dof[: self.nu]] = np.arange(self.nu)
        self.mdl.dof_act.from_numpy(dof_act)
        nu = max(self.nu, 1)
        try:
            lim = np.full(nu, 1e30) if effort_limit is None else np.broadcast_to(effort_limit, (nu,))
        except ValueError:
            raise ValueError(
                f"effort_limit: expected one value or {nu} (one per actuated joint), got shape "
                f"{np.shape(effort_limit)}"
            ) from None
        if not np.all(np.asarray(lim) > 0):
            raise ValueError(f"effort_limit must be positive, got {effort_limit!r}")
        self.mdl.effort_limit.from_numpy(np.asarray(lim, dtype=f))
        self.set_params(
            body_mass=m.body_mass,
            body_ipos=m.body_ipos,
            body_inertia=m.body_inertia,
            dof_armature=m.dof_armature,
            dof_damping=m.dof_damping,
            dof_frictionloss=m.dof_frictionloss,
            kp=np.zeros(nu) if kp is None else kp,
            kd=np.zeros(nu) if kd is None else kd,
        )
        if self.contact is not None:
            cc = self.contact
            self.ground.con_kappa[None] = cc.kappa
            self.ground.con_radius[None] = self.sphere_radius
            self.ground.con_ground[None] = cc.ground_height
            self.ground.con_margin[None] = cc.margin
            self.ground.con_dcorr[None] = cc.depth_correction
            self.ground.sphere_body.from_numpy(
                np.array([m.body_id(b) for b, _ in self.spheres], dtype=np.int32)
            )
            self.ground.sphere_pos.from_numpy(np.array([p for _, p in self.spheres], dtype=f))
            anc = _ancestor_dofs(m, f)
            self.ground.body_dof_anc.from_numpy(anc)
            # the dofs that move each sphere (its body's ancestor dofs, ascending), and which blocks of
            # SOLVE_BLOCK dofs hold any: a sphere's Jacobian row is zero elsewhere, so the Delassus
            # adjoint forms J_bar at these alone and skips the blocks a sphere does not reach
            sb = [m.body_id(b) for b, _ in self.spheres]
            dofs = [np.flatnonzero(anc[b]) for b in sb]
            self.ground.sphere_dof_start.from_numpy(np.cumsum([0] + [len(d) for d in dofs]).astype(np.int32))
            items = np.zeros(self.ground.sphere_dof_items.shape, dtype=np.int32)
            flat = np.concatenate(dofs)
            items[: len(flat)] = flat
            self.ground.sphere_dof_items.from_numpy(items)
            hit = np.array(
                [[anc[b, k : k + SOLVE_BLOCK].any() for k in range(0, m.nv, SOLVE_BLOCK)] for b in sb],
                dtype=np.int32,
            )
            self.ground.sphere_block_hit.from_numpy(hit)
        if self.npair:
            self._upload_self_contact(_ancestor_dofs(m, f))
        self.ground.friction.fill(self.contact.friction if self.contact is not None else 0.0)
        self.state.ctrl.fill(0)
        self.state.qfrc_applied.fill(0)

    def _upload_self_contact(self, anc):
        sc, t, c = self.selfc, self._self_tables, self.self_contact
        sc.sc_stiffness[None], sc.sc_damping[None] = c.stiffness, c.damping
        sc.sc_smoothing[None], sc.sc_limit[None] = c.smoothing, c.force_limit
        for name in ("pair_body_a", "pair_body_b", "bp_body_a", "bp_body_b", "bp_start"):
            getattr(sc, name).from_numpy(t[name].astype(np.int32))
        for name in ("pair_a0", "pair_a1", "pair_b0", "pair_b1", "pair_radius", "bp_centre_a", "bp_centre_b"):
            getattr(sc, name).from_numpy(t[name].astype(self.np_fp))
        sc.bp_reach.from_numpy(t["bp_reach"].astype(self.np_fp))
        sc.dof_anc.from_numpy(anc)
        sc.force_max.fill(0)

    # ------------------------------------------------------------------ parameters and state
    def set_params(self, **values):
        """Set model parameters, one value for all environments or one per environment.

        Names: body_mass (*, nbody), body_ipos (*, nbody, 3), body_inertia (*, nbody, 3),
        dof_armature (*, nv), dof_damping (*, nv), dof_frictionloss (*, nv), kp (*, nu), kd (*, nu),
        friction (*,) (the ground friction coefficient, with contact).
        """
        for name, value in values.items():
            if name == "friction":
                if not np.all(np.isfinite(np.asarray(value, dtype=float))):
                    raise ValueError("set_params: friction holds non-finite values")
                self.ground.friction.from_numpy(self._rows_of(value, (), name))
                continue
            if name not in self._params:
                raise KeyError(f"unknown parameter {name!r}; one of {', '.join(self._params)}")
            fld = self._params[name]
            arr = np.asarray(value, dtype=self.np_fp)
            if not np.all(np.isfinite(arr)):
                raise ValueError(f"set_params: {name} holds non-finite values")
            if name in ("kp", "kd") and self.nu == 0:
                arr = np.zeros(1, dtype=self.np_fp)
            tail = fld.shape[1:] + ((3,) if name in ("body_ipos", "body_inertia") else ())
            fld.from_numpy(self._rows_of(arr, tail, name))

    def _rows_of(self, value, tail, name="value"):
        """One value, or one per environment, broadcast to every simulator row (copies included)."""
        arr = np.asarray(value, dtype=self.np_fp)
        given = arr.shape
        try:
            arr = np.broadcast_to(arr, (self.num_envs, *tail)) if arr.ndim < len(tail) + 1 else arr
            if arr.shape[0] == 1:
                arr = np.broadcast_to(arr, (self.num_envs, *tail))
        except ValueError:
            pass  # reported below
        if arr.shape != (self.num_envs, *tail):
            raise ValueError(f"{name}: expected shape {tail} or ({self.num_envs}, *{tail}), got {given}")
        out = np.empty((self.num_rows, *tail), dtype=self.np_fp)
        out[: self.num_envs] = arr
        out[self.num_envs :] = arr[0]
        return out

    def get_param(self, name: str) -> np.ndarray:
        """A parameter's values per environment."""
        if name == "friction":
            return self.ground.friction.to_numpy()[: self.num_envs]
        return self._params[name].to_numpy()[: self.num_envs]
