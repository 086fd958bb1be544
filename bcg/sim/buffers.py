"""Simulator fields: model constants, per-environment parameters, time-indexed state, intermediates.

A mixin of :class:`bcg.sim.rollout.Simulator`. Every per-environment field has ``num_rows`` rows: the
``num_envs`` environments first, then the pool of bundle copies (see :mod:`bcg.sim.bundle`).
"""

import numpy as np
import taichi as ti

from bcg.sim.contact import SOLVE_BLOCK
from bcg.sim.model import JNT_FREE, dof_ancestor_lists, subtree_lists


class FieldsMixin:
    def _build_fields(self):
        n, nb, nv, nq, nj, fp = self.num_rows, self.nbody, self.nv, self.nq, self.njnt, self.fp
        grad = self.config.requires_grad
        nu = max(self.nu, 1)
        sub_s, ctl = self.nsub + 2, self.max_steps  # the last slot is scratch for kinematics queries
        v3 = lambda shape, g=grad: ti.Vector.field(3, fp, shape=shape, needs_grad=g)  # noqa: E731
        sc = lambda shape, g=grad: ti.field(fp, shape=shape, needs_grad=g)  # noqa: E731
        i32 = lambda shape: ti.field(ti.i32, shape=shape)  # noqa: E731
        # model (static)
        self.body_parentid, self.body_jntadr = i32(nb), i32(nb)
        self.body_dofadr, self.body_dofnum = i32(nb), i32(nb)
        self.body_pos = v3(nb, False)
        self.body_quat = ti.Vector.field(4, fp, shape=nb)
        self.body_iquat = ti.Vector.field(4, fp, shape=nb)
        self.jnt_type, self.jnt_qposadr, self.jnt_dofadr = i32(nj), i32(nj), i32(nj)
        self.jnt_axis, self.jnt_pos = v3(nj, False), v3(nj, False)
        self.dof_bodyid, self.dof_jntid, self.dof_act = i32(nv), i32(nv), i32(nv)
        self.dof_parentid = i32(nv)
        self.dof_sdot = sc(nv, False)
        self.qpos0 = sc(nq, False)
        self.gravity = ti.Vector.field(3, fp, shape=(), needs_grad=grad)
        self.level_bodies = i32(nb - 1)
        sub_start, sub_items = subtree_lists(self.model)
        anc_start, anc_items = dof_ancestor_lists(self.model)
        self.subtree_start, self.subtree_items = i32(len(sub_start)), i32(len(sub_items))
        self.subtree_start.from_numpy(sub_start)
        kids = [[c for c in range(1, nb) if self.model.body_parentid[c] == b] for b in range(nb)]
        self.child_start = i32(nb + 1)
        self.child_items = i32(max(nb - 1, 1))
        self.child_start.from_numpy(np.cumsum([0] + [len(k) for k in kids]).astype(np.int32))
        self.child_items.from_numpy(np.array(sum(kids, []) or [0], dtype=np.int32))
        self.subtree_items.from_numpy(sub_items)
        pi = np.repeat(np.arange(nv), np.diff(anc_start)).astype(np.int32)
        pj = anc_items.astype(np.int32)
        self.npairs = len(pi)
        self.pair_i, self.pair_j = i32(self.npairs), i32(self.npairs)
        self.pair_i.from_numpy(pi)
        self.pair_j.from_numpy(pj)
        self.act_dof, self.act_qadr = i32(nu), i32(nu)
        self.effort_limit = sc(nu, False)
        # model (per environment: domain randomisation)
        self.body_mass = sc((n, nb))
        self.body_ipos, self.body_inertia = v3((n, nb)), v3((n, nb))
        self.dof_armature, self.dof_damping, self.dof_frictionloss = sc((n, nv)), sc((n, nv)), sc((n, nv))
        self.kp, self.kd = sc((n, nu)), sc((n, nu))
        # state and control (time-indexed)
        self.qpos, self.qvel = sc((sub_s, n, nq)), sc((sub_s, n, nv))
        self.ctrl, self.qfrc_applied = sc((ctl, n, nu)), sc((ctl, n, nv))
        # intermediates (recomputed per substep)
        self.xpos, self.xanchor, self.xaxis = v3((n, nb)), v3((n, nb)), v3((n, nb))
        self.xquat = ti.Vector.field(4, fp, shape=(n, nb), needs_grad=grad)
        self.xmat = ti.Matrix.field(3, 3, fp, shape=(n, nb), needs_grad=grad)
        self.cdof_ang, self.cdof_lin = v3((n, nv)), v3((n, nv))
        self.cvel_ang, self.cvel_lin, self.cacc_ang, self.cacc_lin = (v3((n, nb)) for _ in range(4))
        self.body_m, self.crb_m = sc((n, nb)), sc((n, nb))
        self.body_h, self.crb_h = v3((n, nb)), v3((n, nb))
        self.body_rot_inertia = ti.Matrix.field(3, 3, fp, shape=(n, nb), needs_grad=grad)
        self.crb_rot_inertia = ti.Matrix.field(3, 3, fp, shape=(n, nb), needs_grad=grad)
        self.dof_f_ang, self.dof_f_lin = v3((n, nv)), v3((n, nv))
        self.mass = sc((n, nv, nv))
        self.cfrc_ang, self.cfrc_lin, self.sub_frc_ang, self.sub_frc_lin = (v3((n, nb)) for _ in range(4))
        self.qfrc_bias, self.qfrc_total, self.qacc = sc((n, nv)), sc((n, nv)), sc((n, nv))
        self.act_force = sc((n, nu))
        self.chol = sc((n, nv, nv), False)
        self.rhs, self.rhs_bar = sc((n, nv), False), sc((n, nv), False)
        self.rows = i32(n)
        self.n_active = ti.field(ti.i32, shape=())
        self._intermediates = [
            self.xpos, self.xanchor, self.xaxis, self.xquat, self.xmat, self.cdof_ang, self.cdof_lin,
            self.cvel_ang, self.cvel_lin, self.cacc_ang, self.cacc_lin, self.body_m, self.crb_m, self.body_h,
            self.crb_h, self.body_rot_inertia, self.crb_rot_inertia, self.dof_f_ang, self.dof_f_lin,
            self.mass, self.cfrc_ang, self.cfrc_lin, self.sub_frc_ang, self.sub_frc_lin, self.qfrc_bias,
            self.qfrc_total, self.qacc, self.act_force,
        ]  # fmt: skip
        self._build_contact_fields(n, fp, grad, v3, sc, i32)
        self._build_bundle_fields(fp, i32)
        self._params = {
            "body_mass": self.body_mass, "body_ipos": self.body_ipos, "body_inertia": self.body_inertia,
            "dof_armature": self.dof_armature, "dof_damping": self.dof_damping,
            "dof_frictionloss": self.dof_frictionloss, "kp": self.kp, "kd": self.kd,
        }  # fmt: skip

    def _upload_model(self, names, kp, kd, effort_limit):
        m = self.model
        f = self.np_fp
        self.body_parentid.from_numpy(m.body_parentid)
        self.body_jntadr.from_numpy(m.body_jntadr)
        self.body_dofadr.from_numpy(np.maximum(m.body_dofadr, 0).astype(np.int32))
        self.body_dofnum.from_numpy(m.body_dofnum)
        self.body_pos.from_numpy(m.body_pos.astype(f))
        self.body_quat.from_numpy(m.body_quat.astype(f))
        self.body_iquat.from_numpy(m.body_iquat.astype(f))
        self.jnt_type.from_numpy(m.jnt_type)
        self.jnt_qposadr.from_numpy(m.jnt_qposadr)
        self.jnt_dofadr.from_numpy(m.jnt_dofadr)
        self.jnt_axis.from_numpy(m.jnt_axis.astype(f))
        self.jnt_pos.from_numpy(m.jnt_pos.astype(f))
        self.dof_bodyid.from_numpy(m.dof_bodyid)
        self.dof_jntid.from_numpy(m.dof_jntid)
        self.dof_parentid.from_numpy(m.dof_parentid)
        jt = m.jnt_type[m.dof_jntid]
        local = np.arange(m.nv) - m.jnt_dofadr[m.dof_jntid]
        self.dof_sdot.from_numpy(np.where((jt == JNT_FREE) & (local < 3), 0.0, 1.0).astype(f))
        self.qpos0.from_numpy(m.qpos0.astype(f))
        self.gravity[None] = m.gravity.tolist()
        jid = [m.jnt_id(j) for j in names]
        act_dof = np.array([m.jnt_dofadr[j] for j in jid] or [0], dtype=np.int32)
        self.act_dof.from_numpy(act_dof)
        self.act_qadr.from_numpy(np.array([m.jnt_qposadr[j] for j in jid] or [0], dtype=np.int32))
        dof_act = -np.ones(m.nv, dtype=np.int32)
        dof_act[act_dof[: self.nu]] = np.arange(self.nu)
        self.dof_act.from_numpy(dof_act)
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
        self.effort_limit.from_numpy(np.asarray(lim, dtype=f))
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
            self.con_kappa[None] = cc.kappa
            self.con_radius[None] = self.sphere_radius
            self.con_ground[None] = cc.ground_height
            self.con_margin[None] = cc.margin
            self.con_dcorr[None] = cc.depth_correction
            self.sphere_body.from_numpy(np.array([m.body_id(b) for b, _ in self.spheres], dtype=np.int32))
            self.sphere_pos.from_numpy(np.array([p for _, p in self.spheres], dtype=f))
            anc = np.zeros((m.nbody, m.nv), dtype=f)
            for body in range(1, m.nbody):
                x = body
                while x > 0:
                    n0, k = m.body_dofadr[x], m.body_dofnum[x]
                    anc[body, n0 : n0 + k] = 1.0
                    x = m.body_parentid[x]
            self.body_dof_anc.from_numpy(anc)
            # the dofs that move each sphere (its body's ancestor dofs, ascending), and which blocks of
            # SOLVE_BLOCK dofs hold any: a sphere's Jacobian row is zero elsewhere, so the Delassus
            # adjoint forms J_bar at these alone and skips the blocks a sphere does not reach
            sb = [m.body_id(b) for b, _ in self.spheres]
            dofs = [np.flatnonzero(anc[b]) for b in sb]
            self.sphere_dof_start.from_numpy(np.cumsum([0] + [len(d) for d in dofs]).astype(np.int32))
            items = np.zeros(self.sphere_dof_items.shape, dtype=np.int32)
            flat = np.concatenate(dofs)
            items[: len(flat)] = flat
            self.sphere_dof_items.from_numpy(items)
            hit = np.array(
                [[anc[b, k : k + SOLVE_BLOCK].any() for k in range(0, m.nv, SOLVE_BLOCK)] for b in sb],
                dtype=np.int32,
            )
            self.sphere_block_hit.from_numpy(hit)
        self.friction.fill(self.contact.friction if self.contact is not None else 0.0)
        self.ctrl.fill(0)
        self.qfrc_applied.fill(0)

    def _build_contact_fields(self, n, fp, grad, v3, sc, i32):
        cc = self.contact
        self.friction = sc(n, False)
        self.con_force_max = sc(n, False)
        if cc is None:
            return
        nc, nv, nb = self.ncon, self.nv, self.nbody
        self.con_kappa, self.con_radius, self.con_ground, self.con_margin, self.con_dcorr = (
            sc((), False) for _ in range(5)
        )
        self.sphere_body = i32(nc)
        self.sphere_pos = v3(nc, False)
        self.body_dof_anc = sc((nb, nv), False)
        self.sphere_dof_start, self.sphere_dof_items = i32(nc + 1), i32(nc * nv)
        self.sphere_block_hit = i32((nc, -(-nv // SOLVE_BLOCK)))
        self.con_point = v3((n, nc))
        self.con_depth, self.con_scale, self.con_active, self.con_step = (sc((n, nc)) for _ in range(4))
        self.con_force = sc((n, nc), False)
        self.jac = sc((n, self.ncol, nv))
        self.rhs_m, self.sol_m = sc((n, self.nrhs, nv)), sc((n, self.nrhs, nv))
        self.tmp_m = sc((n, self.nrhs, nv), False)
        self.delassus = sc((n, self.ncol, self.ncol))
        self.con_vel = sc((n, self.ncol))
        self.impulse = v3((self.iterations + 1, n, nc))
        # the sweep adjoint's per-row working copies (contact impulses as read, their adjoints)
        self.pgs_cur, self.pgs_gnew = v3((n, nc), False), v3((n, nc), False)
        # the candidate spheres of each row in ascending order, and their count: the solve, the
        # Delassus products, the sweeps and their adjoints visit these alone
        self.con_list, self.con_count = i32((n, nc)), i32(n)
        self._intermediates += [
            self.con_point, self.con_depth, self.con_scale, self.con_active, self.con_step, self.jac,
            self.rhs_m, self.sol_m, self.delassus, self.con_vel, self.impulse,
        ]  # fmt: skip

    def _build_bundle_fields(self, fp, i32):
        nb_rows = max(self.pool_rows, 1)
        self.branch_src, self.branch_dst = i32(nb_rows), i32(nb_rows)
        self.branch_dq = ti.field(fp, shape=(nb_rows, self.nq))
        self.branch_dv = ti.field(fp, shape=(nb_rows, self.nv))
        self.n_branch, self.n_collapse = ti.field(ti.i32, shape=()), ti.field(ti.i32, shape=())
        nbun = max(self.max_bundles, 1)
        self.collapse_main, self.collapse_first = i32(nbun), i32(nbun)

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
                self.friction.from_numpy(self._rows_of(value, (), name))
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
            return self.friction.to_numpy()[: self.num_envs]
        return self._params[name].to_numpy()[: self.num_envs]
